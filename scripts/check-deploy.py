"""What `kubernetes-validate --strict` cannot see in one rendered kustomization (called by
scripts/check-deploy.sh for each): the objects the agent relies on, and the DaemonSet against the
configuration it runs with.

    check-deploy.py DIR RENDERED.yaml EFFECTIVE.toml

DIR is the kustomization (deploy/base, deploy/overlays/NAME); RENDERED is `kubectl kustomize DIR`;
EFFECTIVE is what `vigil config check` printed for its ConfigMap's vigil.toml (every key, defaults
filled in). Exits 1 with one line per problem.
"""

import os
import re
import sys
import tomllib

import yaml

kdir, rendered, effective = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
base = kdir == "deploy/base"
problems = []


def check(ok, msg):
    if not ok:
        problems.append(msg)


docs = [d for d in yaml.safe_load_all(open(rendered)) if d]


def of_kind(kind):
    return [d for d in docs if d["kind"] == kind]


# `vigil config check` prints "config ok", then the effective configuration as TOML.
text = open(effective).read()
first, _, rest = text.partition("\n")
cfg = tomllib.loads(rest if first.strip() == "config ok" else text)

# The base holds built-in kinds only: a kind whose CRD a cluster lacks fails the whole apply. The
# scrape configuration comes from a component (deploy/components/gmp, .../kube-prometheus), whose
# objects scripts/check-monitoring.sh validates against their CRDs.
BUILTIN = {"v1", "apps/v1", "rbac.authorization.k8s.io/v1"}
if base:
    custom = sorted(f"{d['apiVersion']} {d['kind']}" for d in docs if d["apiVersion"] not in BUILTIN)
    check(not custom, f"the base holds kinds whose CRD a cluster may lack: {custom}")
for pm in of_kind("PodMonitor"):
    eps = pm["spec"]["podMetricsEndpoints"]
    check([e["port"] for e in eps] == ["metrics"], "the PodMonitor scrapes port metrics")
    check(all(any(r.get("sourceLabels") == ["__meta_kubernetes_pod_node_name"] and r.get("targetLabel") == "node"
                  for r in e.get("relabelings", [])) for e in eps),
          "the PodMonitor relabels __meta_kubernetes_pod_node_name onto `node`")
for pm in of_kind("PodMonitoring"):
    check([e["port"] for e in pm["spec"]["endpoints"]] == ["metrics"], "the PodMonitoring scrapes port metrics")
    check("node" in pm["spec"].get("targetLabels", {}).get("metadata", []),
          "the PodMonitoring puts the node's name on the series (targetLabels.metadata: node)")
dss = of_kind("DaemonSet")
check(len(dss) == 1, "exactly one DaemonSet")
ds = dss[0]
ns = ds["metadata"]["namespace"]
# The pool (and a multi-host TPU slice) is read from the Node's labels: a per-pool DaemonSet env
# is what the agent no longer needs, and would override the label on every node it runs on.
env_names = [e["name"] for c in ds["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])]
check("VIGIL_POOL" not in env_names and "VIGIL_SLICE" not in env_names,
      "the DaemonSet sets VIGIL_POOL/VIGIL_SLICE: the agent reads its pool from the Node's "
      "cloud.google.com/gke-nodepool label (set fleet.pool in the config only to override it)")
pod = ds["spec"]["template"]["spec"]
containers = {c["name"]: c for c in pod["containers"]}
c = containers["vigil"]
ports = [p["name"] for p in c.get("ports", [])]
check("metrics" in ports, "the DaemonSet names its metrics port")
# The worker API: token-authenticated on the node's IP, where a worker finds it (status.hostIP).
wapi = cfg.get("worker_api", {})
if wapi.get("listen"):
    host_ip, _, wport = wapi["listen"].rpartition(":")
    check(wapi.get("auth") == "kubernetes" or host_ip in ("127.0.0.1", "[::1]"),
          f"worker_api.listen {wapi['listen']} takes writes without a token")
    p = [p for p in c.get("ports", []) if p["name"] == "worker-api"]
    check(len(p) == 1 and p[0]["containerPort"] == int(wport)
          and (pod.get("hostNetwork") or p[0].get("hostPort") == int(wport)),
          f"the DaemonSet names its worker-api port {wport}, on the node's IP (hostPort or hostNetwork)")

# The pod's grace period outlasts checkpoint.grace (the kubelet's SIGKILL must not cut the agent's
# checkpoint round; the agent exits 1 s before the grace). Durations as `vigil config check`
# prints them (humantime: "1m 30s").
UNITS = {"year": 31557600, "years": 31557600, "month": 2630016, "months": 2630016, "day": 86400,
         "days": 86400, "h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
grace = cfg["checkpoint"]["grace"]
pod_grace = pod.get("terminationGracePeriodSeconds", 30)  # Kubernetes' default
check(pod_grace > sum(int(n) * UNITS[u] for n, u in re.findall(r"(\d+)([a-z]+)", grace)),
      f"terminationGracePeriodSeconds {pod_grace} does not exceed checkpoint.grace {grace}: the "
      f"agent's checkpoint round at SIGTERM would be cut by SIGKILL (set it to the grace plus 5 s)")

# The image: set through kustomize `images:` (name `vigil`) by every overlay, never a moving tag.
image = c["image"]
if base:
    check(image == "vigil", f"the base's image is the bare name `vigil` for overlays to set, not {image!r}")
else:
    check(image != "vigil" and not image.startswith("vigil:"),
          f"image {image!r}: set it with `images:` (name `vigil`, newName, newTag)")
check(not image.endswith(":latest"), f"image {image!r}: pin a tag, not latest")

# The configuration file, for `vigil run` and every command exec'd in the pod (`vigil doctor`).
mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
cm_vol = [v["name"] for v in pod.get("volumes", []) if v.get("configMap", {}).get("name") == "vigil-config"]
want_cfg = [mounts[n].rstrip("/") + "/vigil.toml" for n in cm_vol if n in mounts]
env = {e["name"]: e for e in c.get("env", [])}
check(env.get("VIGIL_CONFIG", {}).get("value") in want_cfg,
      f"env VIGIL_CONFIG names the mounted ConfigMap's vigil.toml ({want_cfg}), so `vigil doctor` in the pod reads it")
check("--config" not in c.get("args", []) and "-c" not in c.get("args", []),
      "the config path is set once, by VIGIL_CONFIG")

# One Secret, `vigil`: redis-url (required); webhook-url, alertmanager-url, pagerduty-routing-key
# and webhook-headers (optional).
refs = {n: e["valueFrom"]["secretKeyRef"] for n, e in env.items() if "secretKeyRef" in e.get("valueFrom", {})}
check(set(r["name"] for r in refs.values()) == {"vigil"}, f"every Secret reference names Secret `vigil`: {refs}")
check(refs.get("REDIS_URL", {}).get("key") == "redis-url" and not refs["REDIS_URL"].get("optional"),
      "REDIS_URL comes from Secret vigil, key redis-url")
check(refs.get("VIGIL_WEBHOOK_URL", {}).get("key") == "webhook-url"
      and refs["VIGIL_WEBHOOK_URL"].get("optional") is True,
      "VIGIL_WEBHOOK_URL comes from Secret vigil, key webhook-url, optional")
check(refs.get("VIGIL_ALERTMANAGER_URL", {}).get("key") == "alertmanager-url"
      and refs["VIGIL_ALERTMANAGER_URL"].get("optional") is True,
      "VIGIL_ALERTMANAGER_URL comes from Secret vigil, key alertmanager-url, optional")
for var, key in (("VIGIL_PAGERDUTY_ROUTING_KEY", "pagerduty-routing-key"), ("VIGIL_WEBHOOK_HEADERS", "webhook-headers")):
    check(refs.get(var, {}).get("key") == key and refs[var].get("optional") is True,
          f"{var} comes from Secret vigil, key {key}, optional")

# A critical priority class is admitted outside kube-system only with a ResourceQuota selecting it.
pc = pod.get("priorityClassName", "")
if pc in ("system-node-critical", "system-cluster-critical") and ns != "kube-system":
    def admits(q):
        if q["metadata"].get("namespace") != ns:
            return False
        for e in q["spec"].get("scopeSelector", {}).get("matchExpressions", []):
            if e["scopeName"] == "PriorityClass" and (
                e["operator"] == "Exists" or (e["operator"] == "In" and pc in e.get("values", []))):
                return True
        return False
    check(any(admits(q) for q in of_kind("ResourceQuota")),
          f"priorityClassName {pc} in namespace {ns} needs a ResourceQuota there that selects it")

# RBAC: exactly the rules the agent uses, bound to its ServiceAccount.
want = {("", "nodes", "get"), ("", "nodes", "patch"), ("", "nodes/status", "patch"), ("", "pods", "get"), ("", "pods", "list"),
        ("batch", "jobs", "get"), ("jobset.x-k8s.io", "jobsets", "get"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets", "get"),
        ("authentication.k8s.io", "tokenreviews", "create"), ("events.k8s.io", "events", "create"), ("events.k8s.io", "events", "patch")}
roles = [r for r in of_kind("ClusterRole") if r["metadata"]["name"] == "vigil"]
got = {(g, res, v) for r in roles for rule in r["rules"] for g in rule["apiGroups"]
       for res in rule["resources"] for v in rule["verbs"]}
check(got == want, f"ClusterRole vigil grants {sorted(got)}, not exactly {sorted(want)}")
sa = pod["serviceAccountName"]
check(any(s.get("kind") == "ServiceAccount" and s["name"] == sa and s.get("namespace") == ns
          for b in of_kind("ClusterRoleBinding") for s in b.get("subjects", [])),
      f"a ClusterRoleBinding binds ServiceAccount {ns}/{sa}")

# Host paths: mounted at the same path inside (the runtime reports host paths: log_path), but for
# a directory under /host/, where the agent reads nothing the runtime names by path (the Docker
# socket's directory: /var/run cannot be mounted at its own path, the ServiceAccount token is
# mounted inside it).
vols = {v["name"]: v for v in pod.get("volumes", [])}
host = {}  # mount path -> (hostPath type, readOnly, mountPropagation)
for m in c.get("volumeMounts", []):
    hp = vols[m["name"]].get("hostPath")
    if hp:
        check(m["mountPath"] == hp["path"] or m["mountPath"].startswith("/host/"),
              f"hostPath {hp['path']} is mounted at {m['mountPath']}, not the same path (nor under /host/)")
        host[m["mountPath"].rstrip("/")] = (hp.get("type", ""), m.get("readOnly", False),
                                            m.get("mountPropagation", "None"))
sc = c.get("securityContext", {})
psc = pod.get("securityContext", {})
root = sc.get("runAsUser", psc.get("runAsUser")) == 0
groups = psc.get("supplementalGroups", [])
if sc.get("privileged"):
    check(sc.get("allowPrivilegeEscalation") is not False,
          "privileged with allowPrivilegeEscalation: false is refused by the API server")
if pod.get("hostNetwork"):
    check(pod.get("dnsPolicy") == "ClusterFirstWithHostNet",
          "hostNetwork without dnsPolicy ClusterFirstWithHostNet loses cluster DNS")


def socket_problem(path):
    """Why the runtime's socket at `path` (as the agent sees it) is not mounted as it must be:
    by its directory, so a restarted runtime's new socket file is seen (a mount of the file keeps
    the old inode: runtime-down until the pod is deleted); read-only; HostToContainer, so the
    mounts the runtime makes and removes under that directory (containers' root file systems,
    network namespaces) are not held by the pod. None when it is."""
    if path in host:
        return (f"{path} is mounted as a file: mount its directory (hostPath type Directory) instead, "
                f"or a restart of the runtime leaves the pod with the old socket")
    parents = [p for p in host if path.startswith(p + "/")]
    if not parents:
        return f"mount the directory of {path} (hostPath, type Directory)"
    kind, ro, propagation = host[max(parents, key=len)]
    if kind != "Directory":
        return f"the mount holding {path} is hostPath type {kind or 'unset'!r}: type Directory"
    if not ro:
        return f"the mount holding {path} is read-write: readOnly: true (a socket is connected to, not written)"
    if propagation != "HostToContainer":
        return f"the mount holding {path} needs mountPropagation: HostToContainer (the runtime mounts and unmounts under it)"
    return None


def socket(path):
    return socket_problem(path) is None


rt = cfg["runtime"]
docker_sock = cfg["docker"]["host"].removeprefix("unix://") if cfg["docker"]["host"].startswith("unix://") else None
cri_socks = [rt["cri_socket"]] if rt["cri_socket"] else ["/run/containerd/containerd.sock", "/var/run/crio/crio.sock"]
state_file = cfg["gpu"].get("state_file", "")
state_dir = state_file.rsplit("/", 1)[0] if "/" in state_file else ""
if base:
    # Runtime-neutral: no runtime socket, no host log directory, no host namespace; only the
    # directory of gpu.state_file (failed GPUs kept across pod replacements).
    extra = sorted(p for p in host if p != state_dir)
    check(not extra, f"the base mounts no host path but gpu.state_file's directory (overlays add the runtime's): {extra}")
    check(not pod.get("hostPID") and not pod.get("hostNetwork"), "the base joins no host namespace")
elif rt["kind"] == "docker":
    check(docker_sock is None or socket(docker_sock), f"runtime.kind = docker: {docker_sock and socket_problem(docker_sock)}")
    check(root or groups, "the Docker socket needs root or its group (securityContext.supplementalGroups)")
elif rt["kind"] == "podman":
    check(socket(rt["podman_socket"]), f"runtime.kind = podman: {socket_problem(rt['podman_socket'])}")
    check(root or groups, "Podman's socket needs root or its group")
elif rt["kind"] == "cri":
    mounted = [s for s in cri_socks if socket(s)]
    check(mounted, "runtime.kind = cri: " + "; ".join(str(socket_problem(s)) for s in cri_socks))
    check(root or groups, "the CRI socket needs root or its group")
    check(host.get("/var/log/pods", ("", False))[1] is True,
          "runtime.kind = cri: mount /var/log/pods read-only at the same path (CRI log files)")
    check(pod.get("hostPID") is True, "runtime.kind = cri: hostPID: true (checkpoint signals go to host PIDs)")
    pr = rt.get("pod_resources_socket", "")
    if pr and cfg["gpu"]["enabled"] != "off":
        pr_dir = pr.rsplit("/", 1)[0]
        check(host.get(pr_dir, ("", False))[1] is True,
              f"runtime.kind = cri: mount {pr_dir} read-only at the same path (the kubelet's PodResources "
              f"socket, each worker's GPUs), or set runtime.pod_resources_socket = \"\"")
else:
    check((docker_sock and socket(docker_sock)) or socket(rt["podman_socket"]) or any(socket(s) for s in cri_socks),
          "runtime.kind = auto: an overlay mounts a runtime socket's directory")

lib = cfg["gpu"]["library_path"]
if lib and cfg["gpu"]["enabled"] != "off":
    check(any(lib.startswith(p.rstrip("/") + "/") for p in host),
          f"gpu.library_path {lib} is on no mounted host path")

# TPU: a device directory other than the container's own /dev is the host's /dev, mounted
# read-only (the chips' device files are listed, never opened: no write, no privilege needed).
tpu = cfg["tpu"]
if not base and tpu["enabled"] != "off" and tpu["device_dir"].rstrip("/") != "/dev":
    d = tpu["device_dir"].rstrip("/")
    src = [vols[m["name"]].get("hostPath", {}).get("path") for m in c.get("volumeMounts", [])
           if m["mountPath"].rstrip("/") == d]
    check(src == ["/dev"] and host.get(d, ("", False))[1] is True,
          f"tpu.device_dir {d} is the host's /dev mounted read-only (hostPath /dev): {src}")
if kdir == "deploy/overlays/tpu":
    check(not sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False,
          "the tpu overlay is not privileged (no NVML; device files are listed, not opened)")
    check(cfg["gpu"]["enabled"] == "off" and not any("nvidia" in p for p in host),
          f"the tpu overlay turns GPU monitoring off and mounts no NVIDIA driver: {sorted(host)}")
    check(tpu["enabled"] != "off", "the tpu overlay runs the TPU source")
    terms = pod.get("affinity", {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    check(terms and all({"key": "cloud.google.com/gke-tpu-accelerator", "operator": "Exists"}
                        in t.get("matchExpressions", []) for t in terms),
          "the tpu overlay runs only on nodes with label cloud.google.com/gke-tpu-accelerator")
    tols = pod.get("tolerations", [])
    check(any(t.get("operator") == "Exists" and t.get("key") in (None, "google.com/tpu") for t in tols),
          "the tpu overlay tolerates GKE's google.com/tpu taint")
# The agent tolerates its own taints (`vigil::vocab::node::taint_keys`): the slow taint may be
# NoExecute (gang.pace.taint), and an agent evicted by it would never lift it.
prefix = cfg.get("kubernetes", {}).get("label_prefix", "vigil.dev/")
own = [prefix + t for t in ("termination-imminent", "gpu-failed", "tpu-failed", "slow")]
tols = pod.get("tolerations", [])
untolerated = [k for k in own if not any(
    t.get("operator") == "Exists" and t.get("key") in (None, k) for t in tols)]
check(not untolerated, f"the agent does not tolerate Vigil's own taints {untolerated}: a NoExecute "
      "slow taint would evict it, and nobody would lift the taint")
# gpu.state_file outlives the pod only on a host path, written by the agent.
if state_file and cfg["gpu"]["enabled"] != "off":
    holders = [p for p in host if state_file.startswith(p + "/")]
    check(holders, f"gpu.state_file {state_file} is on no mounted host path: a failed GPU would be forgotten with the pod")
    check(all(not host[p][1] for p in holders), f"the host path holding gpu.state_file {state_file} is read-only")

# Every overlay is documented.
if not base:
    guide = open("docs/kubernetes.md").read()
    check(kdir in guide, f"docs/kubernetes.md does not mention {kdir}")

for p in problems:
    print(f"check-deploy: {kdir}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
