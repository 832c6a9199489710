#!/usr/bin/env bash
# Writes deploy/kubeflow/prometheusrule.yaml, the Prometheus Operator's form
# of deploy/prometheus/accel.rules.yml (the one source of the alerts).
# scripts/check-kubernetes.sh fails when the two differ.
# Usage: scripts/prometheus-rule.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
"${PYTHON:-python3}" - "${1:-}" <<'PY'
import sys

import yaml

src = "deploy/prometheus/accel.rules.yml"
out = "deploy/kubeflow/prometheusrule.yaml"
rules = yaml.safe_load(open(src))
doc = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {"name": "accel", "labels": {"app.kubernetes.io/name": "accel"}},
    "spec": {"groups": rules["groups"]},
}
text = (f"# Generated from {src} by scripts/prometheus-rule.sh: edit that file, then\n"
        "# run the script. docs/src/metrics.md explains each alert.\n"
        + yaml.safe_dump(doc, sort_keys=False, width=100))
if sys.argv[1] == "--check":
    current = open(out).read() if __import__("os").path.exists(out) else ""
    if current != text:
        sys.exit(f"{out} is not {src}'s rules: run scripts/prometheus-rule.sh")
else:
    open(out, "w").write(text)
PY
