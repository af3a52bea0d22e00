#!/usr/bin/env bash
# Check Vigil's monitoring files (called by scripts/test.sh):
#   - the alert rules (deploy/monitoring/rules/vigil.rules.yaml): `promtool check rules`, and
#     `promtool test rules` on vigil.rules.test.yaml; every alert has severity, summary,
#     description, a runbook heading in docs/alerts.md, and promtool cases where it fires and
#     where it does not (scripts/monitoring.py check-rules);
#   - the PrometheusRule and GMP ClusterRules are generated from those rules, unchanged;
#   - the example prometheus.yml: `promtool check config`;
#   - the Grafana dashboard: every PromQL expression (panels and template variables) parses
#     (`promtool check rules` over recording rules generated from them) and names only metrics
#     docs/metrics.md documents;
#   - the components' custom resources (PodMonitor, PrometheusRule, PodMonitoring, ClusterRules),
#     rendered with kustomize into the overlays, against their CRDs' schemas (deploy/monitoring/schemas/).
# Needs promtool (Debian's prometheus), kubectl, python3 with PyYAML and jsonschema (in .venv:
# scripts/requirements.txt, installed by scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then export PATH="$PWD/.venv/bin:$PATH"; fi
command -v promtool >/dev/null || { echo "check-monitoring: promtool is missing (apt-get install prometheus)" >&2; exit 1; }
command -v kubectl >/dev/null || { echo "check-monitoring: kubectl is missing" >&2; exit 1; }
python3 -c 'import yaml, jsonschema' 2>/dev/null \
  || { echo "check-monitoring: python3 needs PyYAML and jsonschema (bash scripts/setup.sh puts them in .venv)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

rules=deploy/monitoring/rules
promtool check rules "$rules/vigil.rules.yaml"
promtool test rules "$rules/vigil.rules.test.yaml"
python3 scripts/monitoring.py check-rules
python3 scripts/monitoring.py check-generated
promtool check config deploy/monitoring/prometheus/prometheus.yml

python3 scripts/monitoring.py dashboard-rules "$out/dashboard.rules.yaml"
promtool check rules "$out/dashboard.rules.yaml"

# The components, as an overlay includes them: gmp through the gke overlay (and production and
# tpu, on top of it), kube-prometheus added to the docker overlay by a kustomization written here.
here=$(python3 -c 'import os, sys; print(os.path.relpath(os.getcwd(), sys.argv[1]))' "$out/kp")
mkdir "$out/kp"
cat > "$out/kp/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $here/deploy/overlays/docker
components:
  - $here/deploy/components/kube-prometheus
EOF
kubectl kustomize "$out/kp" > "$out/kube-prometheus.yaml"
kubectl kustomize deploy/overlays/gke > "$out/gke.yaml"
kubectl kustomize deploy/overlays/production > "$out/production.yaml"
kubectl kustomize deploy/overlays/tpu > "$out/tpu.yaml"
python3 scripts/monitoring.py validate-crs "$out/kube-prometheus.yaml" "$out/gke.yaml" "$out/production.yaml" "$out/tpu.yaml"
python3 - "$out/kube-prometheus.yaml" "$out/gke.yaml" <<'PY'
import sys, yaml
kinds = [sorted(d["kind"] for d in yaml.safe_load_all(open(f)) if d and "monitoring." in d["apiVersion"])
         for f in sys.argv[1:]]
assert kinds == [["PodMonitor", "PrometheusRule"], ["ClusterRules", "PodMonitoring"]], kinds
PY
echo "check-monitoring: ok"
