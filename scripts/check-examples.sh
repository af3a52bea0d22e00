#!/usr/bin/env bash
# Validate the worker manifests of deploy/examples/: each Pod and Job against the Kubernetes
# schemas in strict mode (kubernetes-validate, unknown fields rejected), the JobSet against the
# openAPIV3Schema of its CRD vendored in deploy/examples/schemas/, and every pod template for
# what Vigil needs of it (scripts/check-examples.py: the opt-in label, the downward API env, the
# projected token for the audience `vigil`, the restart policy, the termination grace).
# Needs the repository's .venv (scripts/setup.sh): kubernetes-validate, PyYAML, jsonschema.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then export PATH="$PWD/.venv/bin:$PATH"; fi
k8s_version=${K8S_VERSION:-1.33.0}
command -v kubernetes-validate >/dev/null || { echo "check-examples: kubernetes-validate is missing (bash scripts/setup.sh)" >&2; exit 1; }
crd=deploy/examples/schemas/jobset.x-k8s.io_jobsets.yaml
manifests=(deploy/examples/*.yaml)
[ ${#manifests[@]} -ge 3 ] || { echo "check-examples: expected the Pod, Job and JobSet examples in deploy/examples" >&2; exit 1; }
for f in "${manifests[@]}"; do
  if grep -q '^kind: JobSet' "$f"; then continue; fi  # a CRD: checked against its schema below
  kubernetes-validate --strict --quiet -k "$k8s_version" "$f"
done
python3 scripts/check-examples.py "$crd" "${manifests[@]}"
echo "check-examples: ${manifests[*]} ok"
