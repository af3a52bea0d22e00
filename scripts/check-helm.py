"""The Helm chart (deploy/helm/vigil) with real Helm (Helm 4's own Go SDK, through the PyPI package
helm-python-sdk): lint it strictly (no warning), render it for every documented set of values,
and check that each rendering is the matching kustomize overlay's objects — one source of truth
checked both ways: the overlays are what `kubectl apply -k` users get, the chart what Helm users
get, and this fails the moment the two drift. Also: a bad value fails with Helm's schema error,
and `helm upgrade` with the same values changes nothing (the rendering is deterministic), and the
DaemonSet's grace period outlasts checkpoint.grace, with the defaults and with a user's own.

    check-helm.py OUT_DIR VIGIL_BINARY

writes each rendering to OUT_DIR/helm-<name>.yaml (scripts/check-helm.sh validates them with
kubernetes-validate --strict and the monitoring CRDs).

Equal means: the same objects (kind, name, namespace), field by field, except
- the labels Helm adds to every object (app.kubernetes.io/instance, version, managed-by,
  helm.sh/chart; app.kubernetes.io/name where the overlay's object has none) and the pod
  template's checksum/config annotation (a new configuration rolls the pods);
- lists of objects compared whatever their order (volumes, mounts, env, tolerations);
- the ConfigMap's vigil.toml compared as the agent reads it: `vigil config check` prints the
  effective configuration of each, and those must be equal (comments and key order differ).
"""

import copy
import difflib
import json
import os
import subprocess
import sys
import tempfile
import tomllib

import helm_python
import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CHART = os.path.join(ROOT, "deploy/helm/vigil")

# Each overlay, and the values files that render it (later files win, as with `helm -f a -f b`).
DOCUMENTED = {
    "deploy/base": [],
    "deploy/overlays/gke": ["values-gke.yaml"],
    "deploy/overlays/tpu": ["values-gke.yaml", "values-tpu.yaml"],
    "deploy/overlays/docker": ["values-docker.yaml"],
    "deploy/overlays/production": ["values-gke.yaml", "values-production.yaml"],
}
# And with the Prometheus Operator: an overlay plus deploy/components/kube-prometheus (as
# docs/alerts.md adds it) is the chart with monitoring.prometheusOperator.enabled.
WITH_COMPONENT = {
    "deploy/overlays/docker": ("deploy/components/kube-prometheus",
                               {"monitoring": {"prometheusOperator": {"enabled": True}}}),
}
# The overlays create the namespace as an object; Helm users pass --create-namespace instead.
AS_THE_OVERLAYS = {"namespace": {"create": True}}
HELM_LABELS = {"app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/managed-by", "helm.sh/chart"}
# Bad values, each refused by values.schema.json with Helm's own error.
BAD_VALUES = [
    ({"runtime": {"kind": "containerd"}}, "/runtime/kind"),
    ({"observe": "yes"}, "/observe"),
    ({"accelerater": "nvidia"}, "accelerater"),
    ({"ports": {"metrics": 70000}}, "/ports/metrics"),
    ({"monitoring": {"interval": "soon"}}, "/monitoring/interval"),
]
# checkpoint.grace as the agent reads it (`vigil config check`), and in seconds: the chart's
# default, and a user's own.
GRACES = [({}, "30s", 30), ({"config": {"checkpoint": {"grace": "90s"}}}, "1m 30s", 90)]


def merge(base, over):
    """Helm's coalescing of values files: maps merge, anything else (a list too) is replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def values_of(files, extra=None):
    vals = {}
    for f in files:
        with open(os.path.join(CHART, f)) as fh:
            vals = merge(vals, yaml.safe_load(fh) or {})
    return merge(vals, extra or {})


def render(values):
    chart = helm_python.Chart.load(CHART)
    out = chart.render(values, name="vigil", namespace="vigil")
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def kustomize(overlay, component=None):
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(ROOT, overlay)
        if component:
            rel = lambda p: os.path.relpath(os.path.join(ROOT, p), tmp)  # noqa: E731
            with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
                yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1",
                                "kind": "Kustomization", "resources": [rel(overlay)],
                                "components": [rel(component)]}, f)
            target = tmp
        text = subprocess.run(["kubectl", "kustomize", target], check=True,
                              capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def effective(vigil, toml):
    """`vigil config check`'s effective configuration of a vigil.toml."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(toml)
    try:
        env = dict(os.environ, NODE_NAME="check-helm", KUBERNETES_SERVICE_HOST="10.96.0.1")
        r = subprocess.run([vigil, "config", "check", "--config", f.name], capture_output=True,
                           text=True, env=env)
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        sys.exit(f"check-helm: vigil config check refused a vigil.toml:\n{toml}\n{r.stderr}")
    return r.stdout


def normalized(obj, vigil, own_labels):
    obj = copy.deepcopy(obj)
    meta = obj.get("metadata", {})
    labels = meta.get("labels") or {}
    for k in HELM_LABELS | ({"app.kubernetes.io/name"} - own_labels):
        labels.pop(k, None)
    if labels:
        meta["labels"] = labels
    else:
        meta.pop("labels", None)
    tmpl = obj.get("spec", {}).get("template", {}).get("metadata")
    if tmpl is not None:
        for k in HELM_LABELS:
            tmpl.get("labels", {}).pop(k, None)
        ann = tmpl.get("annotations") or {}
        ann.pop("checksum/config", None)
        if not ann:
            tmpl.pop("annotations", None)
    if obj.get("kind") == "ConfigMap" and "vigil.toml" in obj.get("data", {}):
        obj["data"]["vigil.toml"] = effective(vigil, obj["data"]["vigil.toml"]).splitlines()
    return sort_lists(obj)


def sort_lists(v):
    if isinstance(v, dict):
        return {k: sort_lists(x) for k, x in v.items()}
    if isinstance(v, list):
        items = [sort_lists(x) for x in v]
        if all(isinstance(x, dict) for x in items):
            return sorted(items, key=lambda x: json.dumps(x, sort_keys=True))
        return items
    return v


def key(obj):
    m = obj.get("metadata", {})
    return (obj.get("kind"), m.get("namespace", ""), m.get("name"))


def compare(overlay, files, vigil, out_dir, component=None, extra=None):
    chart_docs = render(values_of(files, merge(AS_THE_OVERLAYS, extra or {})))
    kust_docs = kustomize(overlay, component)
    name = overlay.replace("/", "-") + ("-" + component.split("/")[-1] if component else "")
    as_users = render(values_of(files, extra))
    with open(os.path.join(out_dir, f"helm-{name}.yaml"), "w") as f:
        yaml.safe_dump_all(as_users, f, sort_keys=False)
    kust = {key(d): d for d in kust_docs}
    chart = {key(d): d for d in chart_docs}
    problems = []
    # `helm upgrade` with the same values changes nothing: the rendering is deterministic.
    if render(values_of(files, extra)) != as_users:
        problems.append(f"{overlay}: two renderings of the same values differ")
    for k in sorted(set(kust) | set(chart), key=str):
        if k not in chart:
            problems.append(f"{overlay}: the chart renders no {k} (the overlay has it)")
            continue
        if k not in kust:
            problems.append(f"{overlay}: the chart renders {k}, which the overlay does not have")
            continue
        own = set((kust[k].get("metadata", {}).get("labels") or {}).keys())
        a = normalized(kust[k], vigil, own)
        b = normalized(chart[k], vigil, own)
        if overlay == "deploy/base" and k[0] == "DaemonSet":
            # NB: the base names no image (each overlay's `images:` sets it); the chart's
            # default is values.yaml's placeholder, as the overlays'.
            for d in (a, b):
                d["spec"]["template"]["spec"]["containers"][0]["image"] = "(set by the overlay)"
        if a != b:
            da = yaml.safe_dump(a, sort_keys=True).splitlines()
            db = yaml.safe_dump(b, sort_keys=True).splitlines()
            diff = "\n".join(difflib.unified_diff(da, db, "kustomize", "helm", lineterm=""))
            problems.append(f"{overlay}: {k} differs:\n{diff}")
    return problems, len(chart)


def grace_problems(vigil):
    """The DaemonSet's grace period outlasts the checkpoint.grace its vigil.toml gives the agent,
    which exits 1 s before that grace: a SIGKILL must not cut the agent's checkpoint round."""
    problems = []
    for extra, shown, secs in GRACES:
        docs = render(values_of([], extra))
        pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
        toml = next(d["data"]["vigil.toml"] for d in docs if d["kind"] == "ConfigMap")
        got = tomllib.loads(effective(vigil, toml).partition("\n")[2])["checkpoint"]["grace"]
        pod_grace = pod.get("terminationGracePeriodSeconds")
        if got != shown or not isinstance(pod_grace, int) or pod_grace <= secs:
            problems.append(f"with {extra or 'the defaults'}: checkpoint.grace is {got!r} (want "
                            f"{shown!r}, {secs} s), terminationGracePeriodSeconds {pod_grace}: it "
                            f"must exceed the grace")
    # An older chart's value (its default 30, kept by `helm upgrade --reuse-values`) renders,
    # and only ever lengthens the period.
    for set_, want in [(30, 35), (120, 120)]:
        docs = render(values_of([], {"terminationGracePeriodSeconds": set_}))
        pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
        if pod.get("terminationGracePeriodSeconds") != want:
            problems.append(f"terminationGracePeriodSeconds: {set_}: the pod's grace period is "
                            f"{pod.get('terminationGracePeriodSeconds')}, want {want}")
    return problems


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out_dir, vigil = sys.argv[1], sys.argv[2]
    problems = []
    report = helm_python.lint(CHART, strict=True)
    for m in report.get("messages", []):
        if m["severity"] >= 2:
            problems.append(f"helm lint --strict: {m['path']}: {m['error']}")
    problems += [f"helm lint --strict: {e}" for e in report.get("errors", [])]
    for files in DOCUMENTED.values():
        report = helm_python.lint(CHART, values_of(files), strict=True)
        for m in report.get("messages", []):
            if m["severity"] >= 2:
                problems.append(f"helm lint --strict with {files}: {m['path']}: {m['error']}")
    total = 0
    for overlay, files in DOCUMENTED.items():
        p, n = compare(overlay, files, vigil, out_dir)
        problems += p
        total += n
    for overlay, (component, extra) in WITH_COMPONENT.items():
        p, n = compare(overlay, DOCUMENTED[overlay], vigil, out_dir, component, extra)
        problems += p
        total += n
    for bad, where in BAD_VALUES:
        try:
            render(values_of(["values-gke.yaml"], bad))
            problems.append(f"the bad value {bad} was rendered without an error")
        except helm_python.HelmError as e:
            if where not in str(e):
                problems.append(f"the bad value {bad}: Helm's error does not name {where}: {e}")
    problems += grace_problems(vigil)
    # What the schema cannot say, the templates refuse with a sentence.
    for bad, says in [({"runtime": {"kind": "docker"}}, "socketGroup"),
                      ({"accelerator": "nvidia"}, "platform: gke"),
                      ({"config": {"checkpoint": {"grace": "2d"}}}, "config.checkpoint.grace")]:
        try:
            render(bad)
            problems.append(f"{bad} was rendered without an error")
        except helm_python.HelmError as e:
            if says not in str(e):
                problems.append(f"{bad}: the error does not say {says}: {e}")
    for p in problems:
        print(f"check-helm: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"check-helm: lint clean; {len(DOCUMENTED) + len(WITH_COMPONENT)} documented values "
          f"sets render their overlays' {total} objects; {len(BAD_VALUES) + 3} bad values refused; "
          f"the pod's grace outlasts checkpoint.grace ({len(GRACES)} values sets)")


if __name__ == "__main__":
    main()
