#!/usr/bin/env bash
# The Helm chart deploy/helm/vigil with real Helm (helm-python-sdk bundles Helm 4's Go SDK; no
# helm binary): lint it strictly, render it for every documented values file and check each
# rendering is its kustomize overlay's objects, refuse bad values with Helm's schema error
# (scripts/check-helm.py), then validate every rendering against the Kubernetes schemas in
# strict mode and its monitoring objects against their vendored CRDs.
# Needs kubectl, the .venv of scripts/setup.sh (helm-python-sdk, kubernetes-validate, PyYAML,
# jsonschema) and a built `vigil` (target/debug/vigil, or $VIGIL).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then export PATH="$PWD/.venv/bin:$PATH"; fi
vigil=${VIGIL:-target/debug/vigil}
k8s_version=${K8S_VERSION:-1.33.0}
[ -x "$vigil" ] || { echo "check-helm: $vigil is not built" >&2; exit 1; }
python3 -c 'import helm_python' 2>/dev/null || { echo "check-helm: helm-python-sdk is missing (bash scripts/setup.sh)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 scripts/check-helm.py "$out" "$vigil"
for f in "$out"/helm-*.yaml; do
  # NB: custom resources (PodMonitoring, ClusterRules) are warnings here; validate-crs below
  # checks them against their CRDs.
  kubernetes-validate --strict --quiet -k "$k8s_version" "$f"
done
python3 scripts/monitoring.py validate-crs "$out"/helm-*.yaml
echo "check-helm: every rendering valid"
