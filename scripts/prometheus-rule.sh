#!/usr/bin/env bash
# Writes the Prometheus Operator's form of deploy/prometheus/accel.rules.yml
# (the one source of the alerts), one PrometheusRule per group, beside what
# it watches: the `accel-server` group to deploy/kubernetes/monitoring (with
# the server), the `accel-agents` group to deploy/kubeflow/monitoring (with the runtime,
# which may run no server: server alerts there would watch nothing).
# scripts/check-kubernetes.sh fails when they differ.
# Usage: scripts/prometheus-rule.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
"${PYTHON:-python3}" - "${1:-}" <<'PY'
import os
import sys

import yaml

src = "deploy/prometheus/accel.rules.yml"
outs = {
    "accel-server": ("deploy/kubernetes/monitoring/prometheusrule.yaml", "accel-server"),
    "accel-agents": ("deploy/kubeflow/monitoring/prometheusrule.yaml", "accel-agents"),
}
groups = {g["name"]: g for g in yaml.safe_load(open(src))["groups"]}
if set(groups) != set(outs):
    sys.exit(f"{src} has the groups {sorted(groups)}; this script writes {sorted(outs)}")
stale = []
for group, (out, name) in outs.items():
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "accel"}},
        "spec": {"groups": [groups[group]]},
    }
    text = (f"# Generated from {src} (group {group}) by scripts/prometheus-rule.sh: edit\n"
            "# that file, then run the script. docs/src/metrics.md explains each alert.\n"
            + yaml.safe_dump(doc, sort_keys=False, width=100))
    if sys.argv[1] == "--check":
        current = open(out).read() if os.path.exists(out) else ""
        if current != text:
            stale.append(out)
    else:
        open(out, "w").write(text)
if stale:
    sys.exit(f"{', '.join(stale)}: not {src}'s rules: run scripts/prometheus-rule.sh")
PY
