"""Check the worker manifests in deploy/examples/ (called by scripts/check-examples.sh, after
`kubernetes-validate --strict` has checked the built-in kinds):

1. A JobSet against the openAPIV3Schema of its CRD, vendored in deploy/examples/schemas/ (strict:
   a field the schema does not name is an error, as the API server's field validation makes it).
   The check proves it has teeth first: a copy with an unknown field and one with a wrong type
   must both fail.
2. What no schema can see, for every pod template (Pod, Job, JobSet): the opt-in label
   `vigil.worker` with a valid id (the reserved `pod-name` on a template of several pods); a valid `vigil.checkpoint` annotation; a restartPolicy Vigil
   can restart under; a termination grace above the agent's checkpoint budget; the worker
   container's downward API env (VIGIL_WORKER from the label, or `<namespace>.<pod>` for `pod-name`;
   NODE_NAME; VIGIL_AGENT from
   status.hostIP) and the projected token for the audience `vigil` mounted where
   VIGIL_TOKEN_FILE says.

    check-examples.py CRD.yaml MANIFEST.yaml...

Needs PyYAML and jsonschema (the repository's .venv, scripts/setup.sh). Exits 1 with one line per
problem.
"""

from __future__ import annotations

import copy
import os
import re
import sys
from typing import Any, Dict, Iterator, List, Tuple

import jsonschema
import yaml

WORKER_ID = re.compile(r"[A-Za-z0-9._-]{1,128}\Z")
CHECKPOINT = re.compile(r"(record|signal|signal:SIG[A-Z0-9]+|https?://\S+)\Z")
# The agent's checkpoint.preemption_budget and sigterm_budget (25 s): the pod must outlive them.
MIN_GRACE = 30
# safety.breaker_per_day: a Job's backoffLimit must leave room for Vigil's restarts.
BREAKER_PER_DAY = 3

problems: List[str] = []


def problem(where: str, msg: str) -> None:
    problems.append(f"{where}: {msg}")


def strict(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists its properties
    (unless it preserves unknown fields): unknown fields are errors."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_schemas(path: str) -> Dict[Tuple[str, str], Dict[str, Any]]:
    out: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for doc in yaml.safe_load_all(open(path)):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for v in spec["versions"]:
            if v.get("served"):
                api_version = f"{spec['group']}/{v['name']}"
                out[(api_version, spec["names"]["kind"])] = strict(v["schema"]["openAPIV3Schema"])
    return out


def schema_errors(validator: Any, doc: Dict[str, Any]) -> List[str]:
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
    body["apiVersion"], body["kind"] = doc["apiVersion"], doc["kind"]
    errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def pod_templates(doc: Dict[str, Any]) -> Iterator[Tuple[str, Dict[str, Any], Dict[str, Any], Dict[str, Any]]]:
    """(where, pod metadata, pod spec, the owning Job spec or {}) of every pod a doc makes."""
    name = f"{doc['kind']}/{doc['metadata']['name']}"
    if doc["kind"] == "Pod":
        yield name, doc["metadata"], doc["spec"], {}
    elif doc["kind"] == "Job":
        t = doc["spec"]["template"]
        yield name, t.get("metadata", {}), t["spec"], doc["spec"]
    elif doc["kind"] == "JobSet":
        for rj in doc["spec"]["replicatedJobs"]:
            job = dict(rj["template"]["spec"])
            t = job["template"]
            job["replicas"] = rj.get("replicas", 1)
            yield f"{name} replicatedJob {rj['name']}", t.get("metadata", {}), t["spec"], job


def field_ref(env: Dict[str, Any], name: str) -> Any:
    item = env.get(name) or {}
    return ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")


def check_pod(where: str, meta: Dict[str, Any], spec: Dict[str, Any], job: Dict[str, Any]) -> None:
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    worker = labels.get("vigil.worker")
    if worker is None:
        problem(where, "no `vigil.worker` label: the agent never watches it")
    elif not WORKER_ID.match(str(worker)):
        problem(where, f"`vigil.worker: {worker}` is not a worker id (1-128 of [A-Za-z0-9._-])")
    elif job and worker != "pod-name" and job.get("replicas", 1) * max(job.get("parallelism", 1), job.get("completions", 1)) > 1:
        problem(where, f"`vigil.worker: {worker}` on a template of several pods: they would be one, ambiguous, "
                       "worker; use the reserved value `pod-name`")
    method = annotations.get("vigil.checkpoint")
    if method is not None and not CHECKPOINT.match(str(method)):
        problem(where, f"`vigil.checkpoint: {method}`: record, signal, signal:SIGNAME or an http(s) URL")
    policy = spec.get("restartPolicy", "Always")
    if policy not in ("Always", "OnFailure"):
        problem(where, f"restartPolicy {policy}: Vigil stops a hung container for the kubelet to start again; "
                       "with Never it can only alert")
    if job and policy == "OnFailure" and job.get("backoffLimit", 6) <= BREAKER_PER_DAY:
        problem(where, f"backoffLimit {job.get('backoffLimit')}: every restart counts against it; "
                       f"keep it above safety.breaker_per_day ({BREAKER_PER_DAY})")
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is None or grace < MIN_GRACE:
        problem(where, f"terminationGracePeriodSeconds {grace}: at least {MIN_GRACE} (the agent's checkpoint "
                       "budget, 25 s, must fit in it)")

    containers = spec.get("containers") or []
    named = annotations.get("vigil.dev/worker-container")
    if len(containers) > 1 and not named:
        problem(where, "several containers and no `vigil.dev/worker-container` annotation naming the worker's")
        return
    c = next((c for c in containers if c["name"] == named), None) if named else (containers or [None])[0]
    if c is None:
        problem(where, f"no container {named!r}")
        return
    env = {e["name"]: e for e in c.get("env") or []}
    # The worker id the client publishes under: `<namespace>.<pod name>` for `pod-name` (built
    # with $(VAR) from variables listed before it: Kubernetes expands only those), else the label.
    refs = [("NODE_NAME", "spec.nodeName"), ("VIGIL_AGENT", "status.hostIP")]
    if worker == "pod-name":
        names = [e["name"] for e in c.get("env") or []]
        refs += [("POD_NAMESPACE", "metadata.namespace"), ("POD_NAME", "metadata.name")]
        value = (env.get("VIGIL_WORKER") or {}).get("value")
        if value != "$(POD_NAMESPACE).$(POD_NAME)" or not (
                "POD_NAMESPACE" in names and "POD_NAME" in names and "VIGIL_WORKER" in names
                and max(names.index("POD_NAMESPACE"), names.index("POD_NAME")) < names.index("VIGIL_WORKER")):
            problem(where, f"container {c['name']}: with `vigil.worker: pod-name`, env VIGIL_WORKER must be "
                           "\"$(POD_NAMESPACE).$(POD_NAME)\", after POD_NAMESPACE and POD_NAME")
    else:
        refs.append(("VIGIL_WORKER", "metadata.labels['vigil.worker']"))
    for var, path in refs:
        if field_ref(env, var) != path:
            problem(where, f"container {c['name']}: env {var} must come from the downward API fieldPath {path}")
    token_file = (env.get("VIGIL_TOKEN_FILE") or {}).get("value")
    if not token_file:
        problem(where, f"container {c['name']}: no VIGIL_TOKEN_FILE")
        return
    directory, filename = os.path.dirname(token_file), os.path.basename(token_file)
    mount = next((m for m in c.get("volumeMounts") or [] if m.get("mountPath") == directory), None)
    if mount is None:
        problem(where, f"container {c['name']}: nothing mounted at {directory} (VIGIL_TOKEN_FILE)")
        return
    volume = next((v for v in spec.get("volumes") or [] if v["name"] == mount["name"]), None)
    sources = ((volume or {}).get("projected") or {}).get("sources") or []
    tokens = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    if not any(t.get("audience") == "vigil" and t.get("path") == filename for t in tokens):
        problem(where, f"volume {mount['name']}: a projected serviceAccountToken with audience `vigil` "
                       f"and path `{filename}` is needed")


def main() -> None:
    crd, manifests = sys.argv[1], sys.argv[2:]
    schemas = crd_schemas(crd)
    if not schemas:
        problem(crd, "no served version in the CRD")
    validators = {k: jsonschema.Draft7Validator(v) for k, v in schemas.items()}
    seen_crd = False
    for path in manifests:
        for doc in yaml.safe_load_all(open(path)):
            if not doc:
                continue
            key = (doc.get("apiVersion"), doc.get("kind"))
            where = f"{path} {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
            if doc.get("kind") not in ("Pod", "Job", "JobSet"):
                problem(where, "unexpected kind (Pod, Job or JobSet)")
                continue
            if doc["kind"] == "JobSet":
                if key not in validators:
                    problem(where, f"{key[0]} is not a served version of the vendored CRD")
                    continue
                seen_crd = True
                v = validators[key]
                for e in schema_errors(v, doc):
                    problem(where, e)
                # Teeth: an unknown field and a wrong type must both be caught.
                bad = copy.deepcopy(doc)
                bad["spec"]["replicatedJobs"][0]["replicaz"] = 1
                if not schema_errors(v, bad):
                    problem(where, "self-test: an unknown field passed the schema check")
                bad = copy.deepcopy(doc)
                bad["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = "four"
                if not schema_errors(v, bad):
                    problem(where, "self-test: a wrong type passed the schema check")
            for where_pod, meta, spec, job in pod_templates(doc):
                check_pod(f"{path} {where_pod}", meta, spec, job)
    if not seen_crd:
        problem("deploy/examples", "no JobSet was checked against its CRD")
    for p in problems:
        print(f"check-examples: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
