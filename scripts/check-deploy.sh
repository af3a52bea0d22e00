#!/usr/bin/env bash
# Render every kustomization in deploy/ with `kubectl kustomize`, validate each object against the
# Kubernetes schemas in strict mode (unknown fields rejected), and check the vigil.toml each
# ConfigMap carries with `vigil config check`. Needs kubectl, kubernetes-validate (PyPI, pinned
# in scripts/test.sh, which installs it) and a built `vigil` (target/debug/vigil, or $VIGIL).
set -euo pipefail
cd "$(dirname "$0")/.."
vigil=${VIGIL:-target/debug/vigil}
k8s_version=${K8S_VERSION:-1.33.0}
command -v kubectl >/dev/null || { echo "check-deploy: kubectl is missing" >&2; exit 1; }
command -v kubernetes-validate >/dev/null || { echo "check-deploy: kubernetes-validate is missing (pip install kubernetes-validate)" >&2; exit 1; }
[ -x "$vigil" ] || { echo "check-deploy: $vigil is not built" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for dir in deploy/base deploy/overlays/*/; do
  name=$(echo "${dir%/}" | tr '/' '-')
  kubectl kustomize "$dir" > "$out/$name.yaml"
  # NB: the PodMonitor is a Prometheus Operator CRD with no schema here; it is reported as a
  # warning and checked for its required fields below.
  kubernetes-validate --strict --quiet -k "$k8s_version" "$out/$name.yaml"
  python3 - "$out/$name.yaml" "$out/$name.toml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "vigil-config"]
assert len(cms) == 1, "exactly one vigil-config ConfigMap"
open(sys.argv[2], "w").write(cms[0]["data"]["vigil.toml"])
pm = [d for d in docs if d["kind"] == "PodMonitor"]
assert len(pm) == 1 and pm[0]["spec"]["podMetricsEndpoints"][0]["port"] == "metrics", "PodMonitor scrapes port metrics"
ds = [d for d in docs if d["kind"] == "DaemonSet"][0]
ports = [p["name"] for c in ds["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
assert "metrics" in ports, "the DaemonSet names its metrics port"
PY
  NODE_NAME=check-deploy "$vigil" config check --config "$out/$name.toml" > /dev/null
  echo "check-deploy: $dir ok"
done
