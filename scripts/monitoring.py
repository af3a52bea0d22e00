"""Vigil's monitoring files: generate the Kubernetes forms of the alert rules from the plain rules
file, and check what promtool and kubernetes-validate cannot see. Called by
scripts/check-monitoring.sh; needs python3 with PyYAML and jsonschema (scripts/requirements.txt,
in the .venv scripts/setup.sh makes).

    monitoring.py generate [--runbook-base URL]   write the generated files (below)
    monitoring.py check-generated                 they are what `generate` writes
    monitoring.py check-rules                     every alert: severity, summary, description, a
                                                  runbook anchor in docs/alerts.md, and promtool
                                                  tests where it fires and where it does not
    monitoring.py dashboard-rules OUT.yaml        every PromQL expression of the dashboard (panels
                                                  and template variables) as recording rules, for
                                                  `promtool check rules`; every vigil_ metric it
                                                  names is one docs/metrics.md documents
    monitoring.py validate-crs RENDERED.yaml...   every custom resource of a rendered kustomization
                                                  against its vendored CRD's openAPIV3Schema
                                                  (deploy/monitoring/schemas/), unknown fields
                                                  refused; first proves, on a copy of each, that
                                                  an unknown field and a wrong type are caught

The source is deploy/monitoring/rules/vigil.rules.yaml; generated from it:
deploy/components/kube-prometheus/prometheusrule.yaml (Prometheus Operator),
deploy/components/gmp/clusterrules.yaml (Google Managed Prometheus) and the Helm chart's
deploy/helm/vigil/files/vigil.rules.yaml.
"""

import copy
import glob
import json
import os
import re
import sys

import jsonschema
import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RULES = "deploy/monitoring/rules/vigil.rules.yaml"
TESTS = "deploy/monitoring/rules/vigil.rules.test.yaml"
DASHBOARD = "deploy/monitoring/dashboards/vigil.json"
ALERTS_DOC = "docs/alerts.md"
METRICS_DOC = "docs/metrics.md"
RUNBOOK_SECTION = "# Alert rules"
SEVERITIES = {"critical", "warning", "info"}
HEADER = ("# Generated from {src}\n"
          "# by `python3 scripts/monitoring.py generate`: edit the source and run it again\n"
          "# (scripts/check-monitoring.sh fails when this file differs).\n")


def path(rel):
    return os.path.join(ROOT, rel)


def load_yaml(rel):
    with open(path(rel)) as f:
        return yaml.safe_load(f)


class Dumper(yaml.SafeDumper):
    pass


def _str(dumper, s):
    # Multi-line strings (PromQL) as literal blocks, so the generated files read like the source.
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


Dumper.add_representer(str, _str)


def dump(obj):
    return yaml.dump(obj, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)


def rules_with_base(groups, base):
    groups = copy.deepcopy(groups)
    if base:
        for g in groups:
            for r in g["rules"]:
                url = r.get("annotations", {}).get("runbook_url", "")
                if url.startswith(ALERTS_DOC):
                    r["annotations"]["runbook_url"] = base.rstrip("/") + url[len(ALERTS_DOC):]
    return groups


def generated(base=None):
    """{path: text} of every generated file."""
    groups = rules_with_base(load_yaml(RULES)["groups"], base)
    labels = {"app.kubernetes.io/name": "vigil"}
    prometheusrule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "vigil", "namespace": "vigil",
                     "labels": dict(labels, release="kube-prometheus-stack")},
        "spec": {"groups": groups},
    }
    clusterrules = {
        "apiVersion": "monitoring.googleapis.com/v1",
        "kind": "ClusterRules",
        "metadata": {"name": "vigil", "labels": labels},
        "spec": {"groups": groups},
    }
    head = HEADER.format(src=RULES)
    return {
        "deploy/components/kube-prometheus/prometheusrule.yaml": head + dump(prometheusrule),
        "deploy/components/gmp/clusterrules.yaml": head + dump(clusterrules),
        # The Helm chart's copy (a chart reads no file outside its directory): its templates
        # put these groups in the PrometheusRule or the ClusterRules.
        "deploy/helm/vigil/files/vigil.rules.yaml": head + dump({"groups": groups}),
    }


def cmd_generate(args):
    base = None
    if args[:1] == ["--runbook-base"] and len(args) == 2:
        base = args[1]
    elif args:
        sys.exit("usage: monitoring.py generate [--runbook-base URL]")
    for rel, text in generated(base).items():
        with open(path(rel), "w") as f:
            f.write(text)
        print(f"monitoring: wrote {rel}")


def cmd_check_generated(_args):
    bad = []
    for rel, text in generated().items():
        try:
            with open(path(rel)) as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if not same:
            bad.append(rel)
    if bad:
        sys.exit(f"monitoring: {', '.join(bad)} differ from {RULES}: run `python3 scripts/monitoring.py generate`")
    print(f"monitoring: the PrometheusRule and ClusterRules carry the rules of {RULES}")


def headings(text, section):
    """The `## ` headings (and their GitHub anchors) inside the level-1 `section` of a page."""
    out, inside, fenced = {}, False, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("# "):
            inside = line.rstrip() == section
        elif inside and line.startswith("## "):
            title = line[3:].strip()
            anchor = "".join(c for c in title.lower() if c.isalnum() or c in " -_").replace(" ", "-")
            out[anchor] = title
    return out


def cmd_check_rules(_args):
    problems = []
    alerts = [r for g in load_yaml(RULES)["groups"] for r in g["rules"] if "alert" in r]
    names = [r["alert"] for r in alerts]
    if len(set(names)) != len(names):
        problems.append(f"alert names repeat: {names}")
    with open(path(ALERTS_DOC)) as f:
        runbooks = headings(f.read(), RUNBOOK_SECTION)
    for r in alerts:
        a = r["alert"]
        sev = r.get("labels", {}).get("severity")
        if sev not in SEVERITIES:
            problems.append(f"{a}: severity {sev!r} is not one of {sorted(SEVERITIES)}")
        ann = r.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not ann.get(key, "").strip():
                problems.append(f"{a}: no {key} annotation")
        url = ann.get("runbook_url", "")
        want = f"{ALERTS_DOC}#{a.lower()}"
        if url != want:
            problems.append(f"{a}: runbook_url {url!r}, want {want!r}")
        if runbooks.get(a.lower()) != a:
            problems.append(f"{a}: {ALERTS_DOC} has no heading `## {a}` under `{RUNBOOK_SECTION}`")
    stale = sorted(set(runbooks.values()) - set(names))
    if stale:
        problems.append(f"{ALERTS_DOC} has runbooks for alerts the rules do not have: {stale}")
    # promtool cases: each alert fires in one and stays quiet in another.
    fires, quiet = set(), set()
    for t in load_yaml(TESTS)["tests"]:
        for c in t.get("alert_rule_test", []):
            (fires if c.get("exp_alerts") else quiet).add(c["alertname"])
    for a in names:
        if a not in fires:
            problems.append(f"{a}: no promtool case in {TESTS} where it fires")
        if a not in quiet:
            problems.append(f"{a}: no promtool case in {TESTS} where it does not fire")
    unknown = sorted((fires | quiet) - set(names))
    if unknown:
        problems.append(f"{TESTS} tests alerts the rules do not have: {unknown}")
    for p in problems:
        print(f"monitoring: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"monitoring: {len(names)} alerts, each with severity, summary, description, runbook and "
          f"promtool cases firing and not firing")


def documented_metrics():
    """Every series name docs/metrics.md documents (histograms with their _bucket/_sum/_count)."""
    with open(path(METRICS_DOC)) as f:
        text = f.read()
    names = set()
    for line in text.splitlines():
        if not line.startswith("| `vigil_"):
            continue
        cells = line.split("|")
        for n in cells[1].split(","):
            n = n.strip().strip("`")
            names.add(n)
            if cells[2].strip() == "histogram":
                names.update(n + s for s in ("_bucket", "_sum", "_count"))
    return names


GRAFANA_VARS = re.compile(r"\$\{?(__\w+|\w+)(?::\w+)?\}?")


def promql(expr):
    """A panel's expression with Grafana's variables replaced, as promtool can parse it:
    intervals (`$__rate_interval`, ...) by a duration, template variables by a regex that
    matches anything (they only ever stand inside a label matcher's quotes)."""
    return GRAFANA_VARS.sub(lambda m: "5m" if m.group(1).startswith("__") else ".*", expr)


def dashboard_exprs(dash):
    """(where, expr) of every PromQL expression: panel targets (rows' panels too) and template
    variables (`label_values(SELECTOR, label)`: the selector; `query_result(EXPR)`: EXPR)."""
    out = []

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash.get("panels", [])):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append((f"panel {p.get('id')} {p.get('title')!r} ref {t.get('refId')}", t["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", q, re.S)
        if m:
            out.append((f"variable {v['name']}", m.group(1)))
            continue
        m = re.fullmatch(r"\s*query_result\((.*)\)\s*", q, re.S)
        if m:
            out.append((f"variable {v['name']}", m.group(1)))
            continue
        if not re.fullmatch(r"\s*label_values\(\s*\w+\s*\)\s*", q):
            out.append((f"variable {v['name']}", q))
    return out


def cmd_dashboard_rules(args):
    if len(args) != 1:
        sys.exit("usage: monitoring.py dashboard-rules OUT.yaml")
    with open(path(DASHBOARD)) as f:
        dash = json.load(f)
    problems = []
    known = documented_metrics()
    rules = []
    exprs = dashboard_exprs(dash)
    if not exprs:
        problems.append(f"{DASHBOARD} has no PromQL expression")
    for i, (where, expr) in enumerate(exprs):
        for name in set(re.findall(r"\bvigil_[a-z0-9_]+", expr)):
            if name not in known:
                problems.append(f"{DASHBOARD}: {where} uses {name}, which {METRICS_DOC} does not document")
        rules.append({"record": f"dashboard:expr_{i}", "expr": promql(expr),
                      "labels": {"dashboard_source": where}})
    # Every panel that shows data has a query, and every query names the datasource variable.
    for p in dash.get("panels", []):
        if p.get("type") != "row" and not p.get("targets"):
            problems.append(f"{DASHBOARD}: panel {p.get('title')!r} has no query")
        ds = json.dumps(p.get("datasource", {}))
        if p.get("type") != "row" and "${datasource}" not in ds:
            problems.append(f"{DASHBOARD}: panel {p.get('title')!r} does not use the ${{datasource}} variable")
    for p in problems:
        print(f"monitoring: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    with open(args[0], "w") as f:
        f.write(dump({"groups": [{"name": "vigil-dashboard", "rules": rules}]}))
    print(f"monitoring: {len(rules)} dashboard expressions, each metric documented")


def strict(schema):
    """An openAPIV3Schema as the API server's strict field validation reads it: an object with
    `properties` accepts no other field unless it says so."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_schemas():
    """{(apiVersion, kind): (schema, namespaced)} of the vendored CRDs."""
    out = {}
    for f in sorted(glob.glob(path("deploy/monitoring/schemas/*.yaml"))):
        with open(f) as fh:
            crd = yaml.safe_load(fh)
        spec = crd["spec"]
        for v in spec["versions"]:
            if v.get("served", True):
                key = (f"{spec['group']}/{v['name']}", spec["names"]["kind"])
                out[key] = (strict(v["schema"]["openAPIV3Schema"]), spec["scope"] == "Namespaced")
    return out


BUILTIN_GROUPS = {"v1", "apps/v1", "rbac.authorization.k8s.io/v1", "policy/v1", "batch/v1",
                  "scheduling.k8s.io/v1", "networking.k8s.io/v1"}


def cmd_validate_crs(args):
    schemas = crd_schemas()
    problems, seen = [], 0
    for rendered in args:
        with open(rendered) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for d in docs:
            api, kind = d.get("apiVersion", ""), d.get("kind", "")
            name = f"{os.path.basename(rendered)}: {kind}/{d.get('metadata', {}).get('name')}"
            if api in BUILTIN_GROUPS:
                continue
            if (api, kind) not in schemas:
                problems.append(f"{name}: {api} {kind} has no vendored CRD in deploy/monitoring/schemas/")
                continue
            schema, namespaced = schemas[(api, kind)]
            seen += 1
            v = jsonschema.Draft7Validator(schema)
            # The check must be able to fail: a field the CRD does not have, a wrong type.
            unknown, wrong = copy.deepcopy(d), copy.deepcopy(d)
            unknown["spec"]["vigilNoSuchField"] = True
            wrong["spec"] = "not an object"
            for bad, what in ((unknown, "an unknown field"), (wrong, "a wrong type")):
                if v.is_valid(bad):
                    problems.append(f"{name}: its schema accepts {what}: the check would prove nothing")
            for e in sorted(v.iter_errors(d), key=lambda e: list(e.absolute_path)):
                where = ".".join(str(p) for p in e.absolute_path) or "(object)"
                problems.append(f"{name}: {where}: {e.message}")
            has_ns = bool(d.get("metadata", {}).get("namespace"))
            if has_ns != namespaced:
                problems.append(f"{name}: {'namespaced' if namespaced else 'cluster-scoped'} kind "
                                f"{'without' if namespaced else 'with'} a namespace")
    for p in problems:
        print(f"monitoring: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"monitoring: {seen} custom resources valid against their CRDs")


COMMANDS = {
    "generate": cmd_generate,
    "check-generated": cmd_check_generated,
    "check-rules": cmd_check_rules,
    "dashboard-rules": cmd_dashboard_rules,
    "validate-crs": cmd_validate_crs,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](sys.argv[2:])
