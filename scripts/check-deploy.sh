#!/usr/bin/env bash
# Render every kustomization in deploy/ (the base and each overlay) with `kubectl kustomize`,
# validate each object against the Kubernetes schemas in strict mode (unknown fields rejected),
# check the vigil.toml each ConfigMap carries with `vigil config check`, and check what the
# schemas cannot see with scripts/check-deploy.py (the DaemonSet against that configuration: the
# runtime's socket and log mounts, the image, the Secret, the priority class's quota, RBAC; the
# tpu overlay: unprivileged, no NVML, the host's /dev read-only, TPU nodes only).
# Needs kubectl, kubernetes-validate (PyPI, pinned in scripts/requirements.txt; scripts/setup.sh installs it into .venv),
# python3 (3.11 or later: tomllib) with PyYAML, and a built `vigil` (target/debug/vigil, or $VIGIL).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python tools scripts/setup.sh installs (kubernetes-validate, PyYAML) are in .venv.
if [ -x .venv/bin/python ]; then export PATH="$PWD/.venv/bin:$PATH"; fi
vigil=${VIGIL:-target/debug/vigil}
k8s_version=${K8S_VERSION:-1.33.0}
command -v kubectl >/dev/null || { echo "check-deploy: kubectl is missing" >&2; exit 1; }
command -v kubernetes-validate >/dev/null || { echo "check-deploy: kubernetes-validate is missing (pip install kubernetes-validate)" >&2; exit 1; }
[ -x "$vigil" ] || { echo "check-deploy: $vigil is not built" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
dirs=(deploy/base)
for d in deploy/overlays/*/; do dirs+=("${d%/}"); done
[ ${#dirs[@]} -gt 1 ] || { echo "check-deploy: no overlay in deploy/overlays" >&2; exit 1; }
for dir in "${dirs[@]}"; do
  [ -f "$dir/kustomization.yaml" ] || { echo "check-deploy: $dir has no kustomization.yaml" >&2; exit 1; }
  name=$(echo "$dir" | tr '/' '-')
  kubectl kustomize "$dir" > "$out/$name.yaml"
  # NB: custom resources (the gke overlay's PodMonitoring and ClusterRules) have no schema here:
  # kubernetes-validate reports them as warnings; scripts/check-monitoring.sh validates them
  # against their vendored CRDs.
  kubernetes-validate --strict --quiet -k "$k8s_version" "$out/$name.yaml"
  python3 - "$out/$name.yaml" "$out/$name.toml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "vigil-config"]
assert len(cms) == 1, "exactly one vigil-config ConfigMap"
open(sys.argv[2], "w").write(cms[0]["data"]["vigil.toml"])
PY
  # NB: as in the pod, which runs in a cluster (the worker API's token reviews need one).
  NODE_NAME=check-deploy KUBERNETES_SERVICE_HOST=10.96.0.1 "$vigil" config check --config "$out/$name.toml" > "$out/$name.effective"
  python3 scripts/check-deploy.py "$dir" "$out/$name.yaml" "$out/$name.effective"
  echo "check-deploy: $dir ok"
done
