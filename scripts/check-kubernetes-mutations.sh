#!/usr/bin/env bash
# Shows that scripts/check-kubernetes.sh catches what it claims to: each
# mutation below breaks one rule in a copy of deploy/ (and the scripts), and
# the check must then fail, naming that rule. A rule that no mutation breaks
# could be checking nothing.
#
# Usage: scripts/check-kubernetes-mutations.sh   (after check-kubernetes.sh
# installed its tools; one Kubernetes version, to keep it short)
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${ACCEL_CACHE:-$HOME/.cache/accel}"
PY="$(ls -d "$CACHE"/k8s-tools-validate*/bin/python 2>/dev/null | tail -n 1)"
[ -x "$PY" ] || { echo "check-kubernetes-mutations: run scripts/check-kubernetes.sh first (it installs the tools)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# name | file under deploy/ | Python editing `s` (the file's text) | what the failure must say
mutations=(
  "a job's alert made critical|kubeflow/monitoring/prometheusrule.yaml|s = s.replace('severity: warning\n        owner: job', 'severity: critical\n        owner: job', 1)|a job's problem is never critical"
  "an alert without its owner|kubernetes/monitoring/prometheusrule.yaml|s = s.replace('        owner: cluster\n', '', 1)|needs the label owner"
  "an aggregation without the namespace|kubernetes/monitoring/prometheusrule.yaml|s = s.replace('sum by (namespace) (increase(accel_rdzv_jobs_ended_total', 'sum by (instance) (increase(accel_rdzv_jobs_ended_total', 1)|every aggregation must be \`by (namespace, ...)\`"
  "server alerts in the runtime's kit|kubeflow/monitoring/prometheusrule.yaml|s = s.replace('  - name: accel-agents', '  - name: accel-server', 1)|must hold the alert group(s) ['accel-agents'] only"
  "the job's metrics port closed to Prometheus|kubernetes/training/job/networkpolicy.yaml|s = s.replace('        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring\n', '', 1)|must admit the namespace \`monitoring\`"
  "the Job's grace shorter than the agent's shutdown|kubernetes/training/job/job.yaml|s = s.replace('terminationGracePeriodSeconds: 130', 'terminationGracePeriodSeconds: 45', 1)|must outlast the shutdown timeout"
  "the runtime's shutdown timeout left out|kubeflow/runtime/cluster-training-runtime.yaml|s = s.replace('- name: PET_SHUTDOWN_TIMEOUT', '- name: PET_SHUTDOWN_TIMEOUT_UNUSED', 1)|needs PET_SHUTDOWN_TIMEOUT"
  "the JobSet's shutdown timeout too short to save|kubernetes/training/jobset/jobset.yaml|s = s.replace('value: \"110\"', 'value: \"30\"', 1)|is under 90 s"
  "the Job's agents known by their pod name|kubernetes/training/job/job.yaml|s = s.replace('fieldPath: spec.nodeName', 'fieldPath: metadata.name', 1)|PET_NODE_IDENTITY must come from spec.nodeName"
  "the runtime's agents known by their pod name|kubeflow/runtime/cluster-training-runtime.yaml|s = s.replace('- name: PET_NODE_IDENTITY', '- name: PET_NODE_IDENTITY_UNUSED', 1)|PET_NODE_IDENTITY must come from spec.nodeName"
  "the Job's HOME unbounded|kubernetes/training/job/job.yaml|s = s.replace('emptyDir:\n            sizeLimit: 20Gi', 'emptyDir: {}', 1)|needs a sizeLimit"
  "the GPU JobSet's /dev/shm left at 1Gi|kubernetes/components/gpu-node/kustomization.yaml|s = s.replace('path: /spec/replicatedJobs/0/template/spec/template/spec/volumes/2/emptyDir/sizeLimit\n        value: 128Gi', 'path: /spec/replicatedJobs/0/template/spec/template/spec/volumes/2/emptyDir/sizeLimit\n        value: 1Gi', 1)|/dev/shm must be in memory and at least 16Gi"
  "the GPU runtime without GPUs|kubernetes/components/gpu-node/kustomization.yaml|s = s.replace('resources/limits/nvidia.com~1gpu\n        value: \"8\"\n      - op: test\n        path: /spec/template', 'resources/limits/nvidia.com~1gpu\n        value: \"4\"\n      - op: test\n        path: /spec/template', 1)|needs nvidia.com/gpu in limits and requests, equal"
  "the RDMA JobSet without IPC_LOCK|kubernetes/components/rdma/kustomization.yaml|s = s.replace('value: [IPC_LOCK]', 'value: [NET_RAW]', 2)|RDMA needs IPC_LOCK"
  "the static runtime's Jobs left to JobSet's backoff|kubeflow/runtime/cluster-training-runtime.yaml|s = s.replace('              backoffLimit: 0\n', '', 1)|needs backoffLimit: 0"
  "the c10d runtime's pods left to JobSet's restartPolicy|kubeflow/runtime-c10d/cluster-training-runtime.yaml|s = s.replace('                  restartPolicy: Never\n', '', 1)|restartPolicy"
  "the c10d runtime without the token|kubeflow/runtime-c10d/cluster-training-runtime.yaml|s = s.replace('token_file=/etc/accel/token/token,', '', 1)|must give token_file=/etc/accel/token/token"
  "the c10d runtime advertising its pod name|kubeflow/runtime-c10d/cluster-training-runtime.yaml|s = s.replace('- name: PET_LOCAL_ADDR', '- name: PET_LOCAL_ADDR_UNUSED', 1)|PET_LOCAL_ADDR must come from status.podIP"
  "the c10d runtime's metrics closed to Prometheus|kubeflow/runtime-c10d/networkpolicy.yaml|s = s.replace('        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring\n', '', 1)|must admit the namespace \`monitoring\`"
  "the server without its priority|kubernetes/overlays/single/deployment.yaml|s = s.replace('      priorityClassName: accel-rendezvous\n', '', 1)|needs a priorityClassName"
  "the server's replicas Burstable|kubernetes/overlays/ha/statefulset.yaml|s = s.replace('requests:\n              cpu: \"1\"', 'requests:\n              cpu: 100m', 1)|requests must equal their limits"
  "a queued Job not suspended|kubernetes/components/kueue/kustomization.yaml|s = s.replace('value: true', 'value: false', 1)|spec.suspend must be true"
  "a queued JobSet in a queue that does not exist|kubernetes/components/kueue/kustomization.yaml|i = s.index('kind: JobSet'); s = s[:i] + s[i:].replace('queue-name: accel-training', 'queue-name: team-queue', 1)|must name a LocalQueue"
  "a ClusterQueue without memory|kubernetes/kueue/queues.yaml|s = s.replace('[cpu, memory, nvidia.com/gpu]', '[cpu, nvidia.com/gpu]', 1)|does not cover"
  "the server without an operate token|kubernetes/overlays/single/deployment.yaml|s = s.replace('            - --operate-token-file=/etc/accel/operate/token\n', '', 1)|must give --operate-token-file"
  "the agents' token mounted with subPath|kubernetes/training/job/job.yaml|s = s.replace('mountPath: /etc/accel/token\n', 'mountPath: /etc/accel/token\n              subPath: token\n', 1)|without subPath"
  "the replicas sharing one etcd user|kubernetes/overlays/ha/statefulset.yaml|s = s.replace('--etcd-user=accel-\$(POD_NAMESPACE)', '--etcd-user=accel', 1)|an etcd user per namespace"
  "a second installation on the first one's etcd prefix|kubernetes/overlays/ha-next/kustomization.yaml|s = s.replace('/accel/\$(POD_NAMESPACE)/installs/next', '/accel/\$(POD_NAMESPACE)', 1)|the etcd prefix must be /accel/\$(POD_NAMESPACE)/installs/next"
  "a second installation selecting the first one's pods|kubernetes/overlays/ha-next/named/kustomization.yaml|s = s.replace('      app.kubernetes.io/name: rdzv-server-next\n', '', 1)|selects overlays-ha"
  "a second installation advertising the first one's names|kubernetes/overlays/ha-next/kustomization.yaml|s = s.replace('rdzv-server-peers-next:29400\n', 'rdzv-server-peers:29400\n', 1)|must advertise"
  "a replica's prefix expanded before the namespace is known|kubernetes/overlays/ha/statefulset.yaml|i = s.index('            - name: POD_NAMESPACE'); j = s.index('            - name: RDZV_ETCD_PREFIX'); k = s.index('          args:'); s = s[:i] + s[j:k] + s[i:j] + s[k:]|before POD_NAMESPACE is defined"
  "the gang runtime without its pod group|kubernetes/components/gang/kustomization.yaml|s = s.replace('scheduleTimeoutSeconds: 900', 'scheduleTimeoutSeconds: 0', 1)|needs podGroupPolicy.coscheduling"
  "the JobSet's metrics port closed to Prometheus|kubernetes/training/jobset/networkpolicy.yaml|s = s.replace('        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring\n', '', 1)|must admit the namespace \`monitoring\`"
)

failed=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file edit expect <<<"$m"
  rm -rf "$work/tree" && mkdir -p "$work/tree"
  cp -r deploy scripts "$work/tree/"
  target="$work/tree/deploy/$file"
  "$PY" - "$target" "$edit" <<'PY'
import sys
path, edit = sys.argv[1], sys.argv[2]
s = open(path).read()
before = s
exec(edit)
if s == before:
    sys.exit(f"the mutation changed nothing in {path}: its text moved; fix the mutation")
open(path, "w").write(s)
PY
  status=0
  ACCEL_K8S_VERSIONS="${ACCEL_K8S_VERSIONS:-1.37.0}" "$work/tree/scripts/check-kubernetes.sh" >"$work/out" 2>&1 || status=$?
  if [ "$status" -eq 0 ]; then
    echo "check-kubernetes-mutations: FAIL: $name: the check passed" >&2
    failed=1
  elif ! grep -qF -- "$expect" "$work/out"; then
    echo "check-kubernetes-mutations: FAIL: $name: the check failed without saying \"$expect\":" >&2
    tail -n 20 "$work/out" >&2
    failed=1
  else
    echo "check-kubernetes-mutations: $name: caught ($(grep -m1 -F -- "$expect" "$work/out" | cut -c1-160))"
  fi
done
[ "$failed" -eq 0 ] || exit 1
echo "check-kubernetes-mutations: ok: ${#mutations[@]} mutations, each caught"
