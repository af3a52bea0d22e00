#![allow(dead_code)]
//! A faithful fake of the slice of the Kubernetes API server Vigil uses: one Node (GET, PATCH with
//! JSON merge patch), events.k8s.io/v1 Events (POST, and PATCH with JSON merge patch, as kube's
//! event `Recorder` counts a repeat), SelfSubjectAccessReviews and TokenReviews, and pods (GET one,
//! list every namespace's with a `fieldSelector`: `fake_pods.rs`), served over real HTTP on
//! `127.0.0.1:0`.
//!
//! Faithful where it matters to the code under test:
//! - error answers are `Status` objects with the real server's reasons, codes and wording
//!   (`NotFound`, `Conflict`, `Forbidden`, `UnsupportedMediaType`, `Invalid`, `AlreadyExists`);
//! - PATCH applies RFC 7386 for real (maps merge, `null` deletes, lists are replaced whole);
//!   a `metadata.resourceVersion` in the patch is a precondition (409 when stale); every write
//!   bumps the resourceVersion, from one counter shared by all objects, as etcd's revision is;
//! - what the server stores is normalised as Go's `omitempty` would (an empty taint list or label
//!   map disappears), and taints are validated (known effect, no duplicate key + effect: 422);
//! - the Node's status subresource takes a strategic merge patch: conditions merge by `type`,
//!   and the list directives `$patch: delete` (one condition, by type) and `$patch: replace` are
//!   applied as the real server applies them; `capacity` and `allocatable` quantities are stored
//!   as strings (`"4"`), as the server writes them;
//! - a Node takes `application/merge-patch+json`, and a strategic merge patch only where it
//!   means the same (no `$` directive, no list that merges by key: what `kubectl label`,
//!   `annotate` and `taint` send); other patch types answer 415 rather than being silently
//!   treated as merge, so a change of patch type in the client fails loudly;
//! - legacy discovery (`/api`, `/apis`, `/api/v1`) lists nodes and nodes/status, so `kubectl`
//!   itself can be run against the fake;
//! - Events are validated as the events.k8s.io/v1 API validates them (required `eventTime`,
//!   `reportingController`, `reportingInstance`, `action`, `reason`; the length limits; the
//!   deprecated core/v1 fields unset; an Event about a cluster-scoped object lives in `default` or
//!   `kube-system`), a duplicate name is 409 AlreadyExists, and a PATCH may only move `series`
//!   and metadata: `regarding`, `note`, `reason`, `action`, `type`, `eventTime` and the reporter
//!   are immutable (422), as on a real server;
//! - RBAC is the ClusterRole of `deploy/base/rbac.yaml` ([`ROLE`]) less what a test forbids: a
//!   403 names the verb, resource and API group as the real authorizer does, and access reviews
//!   answer from the same rules. The core/v1 Events endpoint is not served: nothing uses it.
//!
//! Test hooks (Rust methods, and the same over HTTP under `/fake/...` for another process):
//! `node`, `events`, `requests`, `foreign_write`, `status_write`, `conflict_next`,
//! `race_next_get`, `forbid`, `allow`, `expire_events`; `kubelet_status` (the kubelet's write of
//! allocatable resources), `mint` and `revoke` for ServiceAccount tokens, `put_pod` and
//! `remove_pod` (Rust only).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::Router;
use serde_json::{json, Map, Value};

/// The pods part, in its own file (this one is included alone by `#[path]` too).
#[path = "fake_pods.rs"]
pub mod fake_pods;

/// The DRA part (ResourceSlices, DeviceTaintRules), in its own file.
#[path = "fake_dra.rs"]
pub mod fake_dra;

/// The identity the fake pretends the agent's ServiceAccount has, for 403 messages.
const USER: &str = "system:serviceaccount:vigil:vigil";

/// The agent's ClusterRole as `deploy/base/rbac.yaml` grants it: (API group, resource, verb).
pub const ROLE: &[(&str, &str, &str)] = &[
    ("", "nodes", "get"),
    ("", "nodes", "patch"),
    ("", "nodes/status", "patch"),
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("batch", "jobs", "get"),
    ("jobset.x-k8s.io", "jobsets", "get"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets", "get"),
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
];

/// What `deploy/components/dra-device-taints` grants on top (`gpu.device_taints`).
pub const DRA_ROLE: &[(&str, &str, &str)] = &[
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "devicetaintrules", "list"),
    ("resource.k8s.io", "devicetaintrules", "get"),
    ("resource.k8s.io", "devicetaintrules", "create"),
    ("resource.k8s.io", "devicetaintrules", "delete"),
];

/// The events.k8s.io group and version Events are served under.
const EVENTS_GROUP: &str = "events.k8s.io";
const EVENTS_API_VERSION: &str = "events.k8s.io/v1";

/// One request as the server saw it: (method, path, content type or "").
pub type Seen = (String, String, String);

/// A running fake API server; stops when dropped.
pub struct FakeKube {
    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

type Shared = Arc<Mutex<World>>;

struct World {
    node_name: String,
    node: Value,
    events: Vec<Value>,
    /// The cluster-wide resourceVersion counter.
    revision: u64,
    /// PATCHes still to be answered with 409 (someone else "wrote in between").
    conflicts: u32,
    /// A foreign merge patch to apply right after the next GET of the node is answered, so the
    /// reader's copy is stale by the time it writes.
    race_after_get: Option<Value>,
    /// What RBAC refuses on top of [`ROLE`]: a verb (`get`, `patch`, `create`) on every resource,
    /// or `"<verb> <resource>"` (e.g. `"patch events"`) on one.
    forbidden: BTreeSet<String>,
    requests: Vec<Seen>,
    uids: u64,
    /// ServiceAccount tokens this "cluster" minted, for TokenReviews.
    tokens: Vec<Minted>,
    /// Pods, as stored after create (see `fake_pods`), in the order they were placed.
    pods: Vec<Value>,
    /// Jobs, JobSets and LeaderWorkerSets: (API group, resource, object as stored).
    objects: Vec<(String, String, Value)>,
    /// ResourceSlices, and DeviceTaintRules as stored.
    slices: Vec<Value>,
    taint_rules: Vec<Value>,
}

/// A projected ServiceAccount token as the kubelet would have requested it for a pod.
#[derive(Debug, Clone)]
pub struct Minted {
    pub token: String,
    pub namespace: String,
    pub service_account: String,
    /// The pod it is bound to (name, uid); `None` for a legacy Secret-based token.
    pub pod: Option<(String, String)>,
    /// The node the pod runs on (Kubernetes ≥ 1.30 puts it in the token).
    pub node: Option<String>,
    /// Its `aud` claim; empty means the API server's own audience.
    pub audiences: Vec<String>,
}

/// The API server's own audience, which a token minted without one carries.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// An API answer: status code and JSON body.
type Answer = (StatusCode, Value);

impl FakeKube {
    /// Starts the server with one Node called `node_name` carrying some foreign labels and
    /// annotations, `resourceVersion` "1" and an empty taint list.
    pub async fn start(node_name: &str) -> FakeKube {
        let node = json!({
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": node_name,
                "uid": "7d3c1f0e-0000-4000-8000-000000000001",
                "resourceVersion": "1",
                "creationTimestamp": "2025-01-01T00:00:00Z",
                "labels": {
                    "kubernetes.io/hostname": node_name,
                    "kubernetes.io/os": "linux"
                },
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0"
                }
            },
            "spec": {
                "podCIDR": "10.0.0.0/24",
                "taints": []
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        });
        let shared: Shared = Arc::new(Mutex::new(World {
            node_name: node_name.to_string(),
            node,
            events: Vec::new(),
            revision: 1,
            conflicts: 0,
            race_after_get: None,
            forbidden: BTreeSet::new(),
            requests: Vec::new(),
            uids: 1,
            tokens: Vec::new(),
            pods: Vec::new(),
            objects: Vec::new(),
            slices: Vec::new(),
            taint_rules: Vec::new(),
        }));
        let app = Router::new()
            .route("/api/v1/nodes/{name}", get(get_node).patch(patch_node))
            .route("/api/v1/nodes/{name}/status", get(get_node).patch(patch_node_status))
            .route("/api/v1/pods", get(list_pods))
            .route("/api/v1/namespaces/{ns}/pods/{name}", get(get_pod))
            .route("/api/v1/namespaces/{ns}/pods", get(list_namespaced_pods))
            .route("/apis/batch/v1/namespaces/{ns}/jobs/{name}", get(get_job))
            .route("/apis/resource.k8s.io/{version}/resourceslices", get(list_slices))
            .route(
                "/apis/resource.k8s.io/{version}/devicetaintrules",
                get(list_taint_rules).post(create_taint_rule),
            )
            .route(
                "/apis/resource.k8s.io/{version}/devicetaintrules/{name}",
                get(get_taint_rule).delete(delete_taint_rule),
            )
            .route("/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/{name}", get(get_jobset))
            .route(
                "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/{name}",
                get(get_lws),
            )
            .route("/apis/events.k8s.io/v1/namespaces/{ns}/events", post(create_event))
            .route("/apis/events.k8s.io/v1/namespaces/{ns}/events/{name}", patch(patch_event))
            .route("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", post(access_review))
            .route("/apis/authentication.k8s.io/v1/tokenreviews", post(token_review))
            // Legacy discovery, so that `kubectl label/annotate/patch node` find the resource.
            .route("/api", get(discovery_versions))
            .route("/apis", get(discovery_groups))
            .route("/api/v1", get(discovery_core))
            .route("/fake/node", get(hook_node))
            .route("/fake/events", get(hook_events))
            .route("/fake/requests", get(hook_requests))
            .route("/fake/foreign_write", post(hook_foreign_write))
            .route("/fake/status_write", post(hook_status_write))
            .route("/fake/race_next_get", post(hook_race_next_get))
            .route("/fake/conflict_next/{n}", post(hook_conflict_next))
            .route("/fake/forbid/{verb}", post(hook_forbid))
            .route("/fake/allow/{verb}", post(hook_allow))
            .route("/fake/expire_events", post(hook_expire_events))
            .fallback(unknown)
            .with_state(shared.clone());
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind fake kube API");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeKube { url: format!("http://{addr}"), shared, task }
    }

    /// The stored Node, as a GET would return it.
    pub fn node(&self) -> Value {
        lock(&self.shared).node.clone()
    }

    /// Every Event stored (created, then perhaps counted by PATCHes of its `series`), as a GET
    /// would return it, in creation order.
    pub fn events(&self) -> Vec<Value> {
        lock(&self.shared).events.clone()
    }

    /// Deletes every Event, as the API server's `--event-ttl` (1 h by default) does.
    pub fn expire_events(&self) {
        lock(&self.shared).events.clear();
    }

    /// Mints a token, as the kubelet's TokenRequest for a projected volume would: bound to `pod`
    /// (name, uid) on `node` for `audiences` (empty: the API server's own); its text.
    pub fn mint(
        &self,
        namespace: &str,
        pod: Option<(&str, &str)>,
        node: Option<&str>,
        audiences: &[&str],
    ) -> String {
        let token = format!(
            "eyJhbGciOiJSUzI1NiJ9.fake-{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        lock(&self.shared).tokens.push(Minted {
            token: token.clone(),
            namespace: namespace.into(),
            service_account: "default".into(),
            pod: pod.map(|(n, u)| (n.to_string(), u.to_string())),
            node: node.map(str::to_string),
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
        });
        token
    }

    /// Invalidates a token, as deleting its pod does to a bound token.
    pub fn revoke(&self, token: &str) {
        lock(&self.shared).tokens.retain(|t| t.token != token);
    }

    /// Every API request so far (not the `/fake` hooks), in order.
    pub fn requests(&self) -> Vec<Seen> {
        lock(&self.shared).requests.clone()
    }

    /// Applies `patch` (a JSON merge patch) as another writer would, bumping the resourceVersion.
    /// Panics if the real server would refuse it: the test itself is wrong then.
    pub fn foreign_write(&self, patch: Value) -> Value {
        let mut world = lock(&self.shared);
        match world.write(&patch) {
            Ok(node) => node,
            Err((code, status)) => panic!("foreign_write refused ({code}): {status}"),
        }
    }

    /// Applies `patch` (a strategic merge patch carrying `status`) to the Node's status
    /// subresource as another writer would: the kubelet (`status.allocatable`, `capacity`, its
    /// conditions) or an earlier Vigil (its conditions). Panics if the real server would refuse
    /// it.
    pub fn status_write(&self, patch: Value) -> Value {
        let mut world = lock(&self.shared);
        match world.write_status(&patch) {
            Ok(node) => node,
            Err((code, status)) => panic!("status_write refused ({code}): {status}"),
        }
    }

    /// Writes the Node's status as the kubelet does (a strategic-merge patch of the status
    /// subresource with `{"status": status}`), e.g. `{"allocatable": {"google.com/tpu": "4"}}`:
    /// quantities are stored as strings. Panics if the real server would refuse it.
    pub fn kubelet_status(&self, status: Value) -> Value {
        self.status_write(json!({ "status": status }))
    }

    /// Answers the next `n` PATCHes with 409 Conflict, bumping the resourceVersion each time as
    /// if another writer had written in between (so a re-read sees a new version).
    pub fn conflict_next(&self, n: u32) {
        lock(&self.shared).conflicts += n;
    }

    /// Applies `patch` as a foreign write right after the next GET of the node has been
    /// answered: the reader then writes from a stale copy, the natural way to meet a conflict.
    pub fn race_next_get(&self, patch: Value) {
        lock(&self.shared).race_after_get = Some(patch);
    }

    /// Makes RBAC refuse with 403 until [`FakeKube::allow`]: `rule` is a verb (`get`, `patch`,
    /// `create`) on every resource, or `"<verb> <resource>"` (`"patch events"`) on one.
    pub fn forbid(&self, rule: &str) {
        lock(&self.shared).forbidden.insert(rule.to_string());
    }

    /// Lifts [`FakeKube::forbid`] of the same `rule`.
    pub fn allow(&self, rule: &str) {
        lock(&self.shared).forbidden.remove(rule);
    }

    /// Creates (or replaces) a pod, as `kubectl apply` of `pod` would leave it stored: see
    /// `fake_pods::stored` (a pod the real server would refuse panics: the test is wrong).
    pub fn put_pod(&self, pod: Value) {
        let mut world = lock(&self.shared);
        world.uids += 1;
        let uid = world.uids;
        let rv = world.next_revision();
        let pod = fake_pods::stored(pod, uid, &rv).unwrap_or_else(|e| panic!("put_pod: {e}"));
        let key = |p: &Value| (p["metadata"]["namespace"].clone(), p["metadata"]["name"].clone());
        let k = key(&pod);
        world.pods.retain(|p| key(p) != k);
        world.pods.push(pod);
    }

    /// Creates (or replaces) a Job (`batch`, `jobs`), JobSet (`jobset.x-k8s.io`, `jobsets`) or
    /// LeaderWorkerSet (`leaderworkerset.x-k8s.io`, `leaderworkersets`), stored with a uid (where
    /// it has none) and a resourceVersion, as the server would after create or a controller's
    /// status write.
    pub fn put_object(&self, group: &str, resource: &str, mut object: Value) {
        let mut world = lock(&self.shared);
        world.uids += 1;
        let uid = world.uids;
        object["metadata"]["resourceVersion"] = json!(world.next_revision());
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("5c2e0000-0000-4000-8000-{uid:012x}"));
        }
        let key = |o: &Value| (o["metadata"]["namespace"].clone(), o["metadata"]["name"].clone());
        let k = key(&object);
        world
            .objects
            .retain(|(g, r, o)| (g.as_str(), r.as_str()) != (group, resource) || key(o) != k);
        world.objects.push((group.into(), resource.into(), object));
    }

    /// Publishes a ResourceSlice (as a DRA driver's kubelet plugin does).
    pub fn put_slice(&self, slice: Value) {
        lock(&self.shared).slices.push(slice);
    }

    /// The DeviceTaintRules as stored.
    pub fn taint_rules(&self) -> Vec<Value> {
        lock(&self.shared).taint_rules.clone()
    }

    /// Stores a DeviceTaintRule as someone else (a person, another controller) made it.
    pub fn put_taint_rule(&self, rule: Value) {
        let mut world = lock(&self.shared);
        world.uids += 1;
        let uid = world.uids;
        let rv = world.next_revision();
        world.taint_rules.push(fake_dra::stored(rule, uid, &rv));
    }

    /// Deletes a pod (gone at once, as after its grace period).
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        let mut world = lock(&self.shared);
        world
            .pods
            .retain(|p| p["metadata"]["namespace"] != namespace || p["metadata"]["name"] != name);
        world.next_revision();
    }
}

/// A label of a Node (as [`FakeKube::node`] returns it).
pub fn label(node: &Value, key: &str) -> Option<String> {
    node["metadata"]["labels"][key].as_str().map(str::to_string)
}

/// An annotation of a Node.
pub fn annotation(node: &Value, key: &str) -> Option<String> {
    node["metadata"]["annotations"][key].as_str().map(str::to_string)
}

/// A Node's taints, as stored.
pub fn taints(node: &Value) -> Vec<Value> {
    node["spec"]["taints"].as_array().cloned().unwrap_or_default()
}

/// The keys of a Node's taints.
pub fn taint_keys(node: &Value) -> Vec<String> {
    taints(node).iter().filter_map(|t| t["key"].as_str().map(str::to_string)).collect()
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, World> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

impl World {
    /// Whether RBAC lets the agent `verb` the `resource` of API `group`.
    fn allows(&self, group: &str, resource: &str, verb: &str) -> bool {
        (ROLE.contains(&(group, resource, verb)) || DRA_ROLE.contains(&(group, resource, verb)))
            && !self.forbidden.contains(verb)
            && !self.forbidden.contains(&format!("{verb} {resource}"))
    }

    fn record(&mut self, method: &Method, uri: &Uri, headers: &HeaderMap) {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        self.requests.push((method.to_string(), uri.path().to_string(), content_type));
    }

    fn next_revision(&mut self) -> String {
        self.revision += 1;
        self.revision.to_string()
    }

    /// Someone else wrote the node: only its resourceVersion moves.
    fn bump(&mut self) {
        let rv = self.next_revision();
        if let Some(meta) = self.node.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv));
        }
    }

    /// A strategic-merge write of the node's status subresource: only `status` changes, and
    /// `status.conditions` merge by `type` (their patchMergeKey), as the real server does,
    /// with the list directives: an element `{"type": X, "$patch": "delete"}` removes the
    /// condition of type X (and only it; none there is no error), an element
    /// `{"$patch": "replace"}` makes the list the patch's other elements, an unknown `$patch`
    /// is 400; `$setElementOrder/conditions` (which kubectl sends) is accepted and ignored.
    fn write_status(&mut self, patch: &Value) -> Result<Value, Answer> {
        let Some(status) = patch.get("status").and_then(Value::as_object) else {
            return Err(bad_request("a status patch must carry status".into()));
        };
        let mut next = self.node.clone();
        if !next["status"].is_object() {
            next["status"] = json!({});
        }
        for (field, value) in status {
            // kubectl's `$setElementOrder/<list>` only orders the list; the fake keeps its order.
            if field.starts_with("$setElementOrder/") {
                continue;
            }
            if field != "conditions" {
                merge(&mut next["status"][field.as_str()], value);
                continue;
            }
            let Some(items) = value.as_array() else {
                return Err(bad_request("status.conditions must be a list".into()));
            };
            let mut conditions =
                next["status"]["conditions"].as_array().cloned().unwrap_or_default();
            // `{"$patch": "replace"}` as an element: the list becomes the patch's other elements.
            let replace = items.iter().any(|i| i.get("$patch") == Some(&json!("replace")));
            if replace {
                conditions.clear();
            }
            for item in items {
                let mut item = item.clone();
                let directive = item.as_object_mut().and_then(|m| m.remove("$patch"));
                let directive = match &directive {
                    None => "merge",
                    Some(Value::String(d))
                        if ["merge", "delete", "replace"].contains(&d.as_str()) =>
                    {
                        d.as_str()
                    }
                    Some(other) => {
                        return Err(bad_request(format!("Unknown patch type: {other}")));
                    }
                };
                if directive == "replace" {
                    continue;
                }
                let Some(kind) = item["type"].as_str().map(str::to_string) else {
                    return Err(bad_request(if directive == "delete" {
                        "delete patch type with no merge key defined".into()
                    } else {
                        "a condition needs its type (the merge key)".into()
                    }));
                };
                if directive == "delete" {
                    // The element with that merge key goes, whatever else the patch says of
                    // it; deleting one that is not there is no error.
                    conditions.retain(|c| c["type"].as_str() != Some(kind.as_str()));
                    continue;
                }
                match conditions.iter_mut().find(|c| c["type"].as_str() == Some(kind.as_str())) {
                    Some(existing) => merge(existing, &item),
                    None => conditions.push(item),
                }
            }
            next["status"]["conditions"] = Value::Array(conditions);
        }
        quantities(&mut next)?;
        let rv = self.next_revision();
        next["metadata"]["resourceVersion"] = Value::String(rv);
        self.node = next.clone();
        Ok(next)
    }

    /// A merge-patch write of the node, with the real server's precondition, immutability,
    /// validation and normalisation rules.
    fn write(&mut self, patch: &Value) -> Result<Value, Answer> {
        let name = self.node_name.clone();
        if !patch.is_object() {
            return Err(bad_request(
                "json: cannot unmarshal a non-object patch into a Node".into(),
            ));
        }
        let stored_rv = self.node.pointer("/metadata/resourceVersion").cloned();
        if let Some(rv) = patch.pointer("/metadata/resourceVersion") {
            if !rv.is_null() && Some(rv) != stored_rv.as_ref() {
                return Err(conflict(&name));
            }
        }
        let mut next = self.node.clone();
        merge(&mut next, patch);
        if next.pointer("/metadata/name") != Some(&Value::String(name.clone())) {
            return Err(bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                next.pointer("/metadata/name").unwrap_or(&Value::Null)
            )));
        }
        // Fields the server owns: a patch cannot change them.
        for field in ["uid", "creationTimestamp"] {
            if let (Some(old), Some(meta)) = (
                self.node.pointer(&format!("/metadata/{field}")).cloned(),
                next.get_mut("metadata").and_then(Value::as_object_mut),
            ) {
                meta.insert(field.into(), old);
            }
        }
        next["kind"] = json!("Node");
        next["apiVersion"] = json!("v1");
        validate(&name, &next)?;
        normalise(&mut next);
        let rv = self.next_revision();
        next["metadata"]["resourceVersion"] = Value::String(rv);
        self.node = next.clone();
        Ok(next)
    }

    fn find_event(&self, ns: &str, name: &str) -> Option<usize> {
        self.events.iter().position(|e| {
            e.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
                && e.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
        })
    }

    /// POST of an events.k8s.io/v1 Event, validated as the real server does on create.
    fn create_event(&mut self, ns: &str, body: &[u8]) -> Result<Value, Answer> {
        let mut event: Value = serde_json::from_slice(body)
            .map_err(|e| bad_request(format!("the object provided is unrecognized: {e}")))?;
        if !event.is_object() {
            return Err(bad_request(
                "the object provided is unrecognized: not a JSON object".into(),
            ));
        }
        check_type_meta(&event)?;
        if !event.get("metadata").is_some_and(Value::is_object) {
            event["metadata"] = json!({});
        }
        match event.pointer("/metadata/namespace").and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != ns => {
                return Err(bad_request(
                    "the namespace of the provided object does not match the namespace sent on \
                     the request"
                        .into(),
                ))
            }
            _ => event["metadata"]["namespace"] = json!(ns),
        }
        let name = match (
            event.pointer("/metadata/name").and_then(Value::as_str),
            event.pointer("/metadata/generateName").and_then(Value::as_str),
        ) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(g)) if !g.is_empty() => format!("{g}{:05x}", self.uids & 0xfffff),
            _ => {
                return Err(invalid_event(
                    "",
                    vec!["metadata.name: Required value: name or generateName is required".into()],
                ))
            }
        };
        let mut causes = Vec::new();
        if let Some(why) = dns_subdomain_error(&name) {
            causes.push(format!("metadata.name: Invalid value: \"{name}\": {why}"));
        }
        causes.extend(validate_event(ns, &event));
        causes.extend(validate_series(&event));
        if event_time(&event)?.is_none() {
            causes.push("eventTime: Required value".into());
        }
        for (field, path) in [
            ("deprecatedFirstTimestamp", "firstTimestamp"),
            ("deprecatedLastTimestamp", "lastTimestamp"),
            ("deprecatedCount", "count"),
            ("deprecatedSource", "source"),
        ] {
            if event.get(field).is_some_and(is_set) {
                causes.push(format!("{path}: Invalid value: \"\": needs to be unset"));
            }
        }
        if !causes.is_empty() {
            return Err(invalid_event(&name, causes));
        }
        if self.find_event(ns, &name).is_some() {
            return Err(status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("events.{EVENTS_GROUP} \"{name}\" already exists"),
                Some(json!({"name": name, "group": EVENTS_GROUP, "kind": "events"})),
            ));
        }
        self.uids += 1;
        let uid = format!("7d3c1f0e-0000-4000-8000-{:012x}", self.uids);
        let rv = self.next_revision();
        let meta = &mut event["metadata"];
        meta["name"] = json!(name);
        meta["uid"] = json!(uid);
        meta["resourceVersion"] = json!(rv);
        meta["creationTimestamp"] = json!("2025-01-01T00:00:01Z");
        event["kind"] = json!("Event");
        event["apiVersion"] = json!(EVENTS_API_VERSION);
        self.events.push(event.clone());
        Ok(event)
    }

    /// JSON merge PATCH of a stored Event, validated as the real server validates an update
    /// through events.k8s.io/v1: only `series` and metadata may move.
    fn patch_event(&mut self, ns: &str, name: &str, patch: &Value) -> Result<Value, Answer> {
        let Some(at) = self.find_event(ns, name) else {
            return Err(status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("events.{EVENTS_GROUP} \"{name}\" not found"),
                Some(json!({"name": name, "group": EVENTS_GROUP, "kind": "events"})),
            ));
        };
        if !patch.is_object() {
            return Err(bad_request(
                "json: cannot unmarshal a non-object patch into an Event".into(),
            ));
        }
        let old = self.events[at].clone();
        if let Some(rv) = patch.pointer("/metadata/resourceVersion") {
            if !rv.is_null() && Some(rv) != old.pointer("/metadata/resourceVersion") {
                return Err(status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on events.{EVENTS_GROUP} \"{name}\": the \
                         object has been modified; please apply your changes to the latest \
                         version and try again"
                    ),
                    Some(json!({"name": name, "group": EVENTS_GROUP, "kind": "events"})),
                ));
            }
        }
        let mut next = old.clone();
        merge(&mut next, patch);
        check_type_meta(&next)?;
        if next.pointer("/metadata/name") != Some(&json!(name)) {
            return Err(bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                next.pointer("/metadata/name").unwrap_or(&Value::Null)
            )));
        }
        if next.pointer("/metadata/namespace") != Some(&json!(ns)) {
            return Err(bad_request(
                "the namespace of the provided object does not match the namespace sent on the \
                 request"
                    .into(),
            ));
        }
        // Fields the server owns: a patch cannot change them.
        for field in ["uid", "creationTimestamp"] {
            next["metadata"][field] = old["metadata"][field].clone();
        }
        next["kind"] = json!("Event");
        next["apiVersion"] = json!(EVENTS_API_VERSION);
        let mut causes = validate_event(ns, &next);
        if next.get("series") != old.get("series") {
            causes.extend(validate_series(&next));
        }
        // The Go validation names the internal (core) fields.
        for (field, path) in [
            ("regarding", "involvedObject"),
            ("reason", "reason"),
            ("note", "message"),
            ("deprecatedSource", "source"),
            ("deprecatedFirstTimestamp", "firstTimestamp"),
            ("deprecatedLastTimestamp", "lastTimestamp"),
            ("deprecatedCount", "count"),
            ("type", "type"),
            ("action", "action"),
            ("related", "related"),
            ("reportingController", "reportingController"),
            ("reportingInstance", "reportingInstance"),
        ] {
            if next.get(field) != old.get(field) {
                causes.push(immutable(path, next.get(field)));
            }
        }
        // eventTime may only change below a microsecond.
        let micros = |t: Option<jiff::Timestamp>| t.map(|t| t.as_microsecond());
        if micros(event_time(&next)?) != micros(event_time(&old)?) {
            causes.push(immutable("eventTime", next.get("eventTime")));
        }
        if !causes.is_empty() {
            return Err(invalid_event(name, causes));
        }
        let rv = self.next_revision();
        next["metadata"]["resourceVersion"] = json!(rv);
        self.events[at] = next.clone();
        Ok(next)
    }
}

/// What the API server's decoding refuses in an Event body's `kind` and `apiVersion`.
fn check_type_meta(event: &Value) -> Result<(), Answer> {
    if let Some(kind) = event.get("kind").and_then(Value::as_str) {
        if kind != "Event" {
            return Err(bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind Event"
            )));
        }
    }
    if let Some(version) = event.get("apiVersion").and_then(Value::as_str) {
        if version != EVENTS_API_VERSION {
            return Err(bad_request(format!(
                "the API version in the data ({version}) does not match the expected API \
                 version ({EVENTS_API_VERSION})"
            )));
        }
    }
    Ok(())
}

/// A JSON value Go would not see as its zero value.
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::Object(m) => m.values().any(is_set),
        Value::Array(a) => !a.is_empty(),
        Value::Bool(b) => *b,
    }
}

/// The Event's `eventTime`, `None` when unset; a malformed one is refused as Go's decoder does.
fn event_time(event: &Value) -> Result<Option<jiff::Timestamp>, Answer> {
    match event.get("eventTime") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => s.parse().map(Some).map_err(|e| {
            bad_request(format!("parsing time {s:?} as \"2006-01-02T15:04:05.000000Z07:00\": {e}"))
        }),
        Some(other) => Err(bad_request(format!(
            "json: cannot unmarshal {other} into Go struct field Event.eventTime of type string"
        ))),
    }
}

/// The field checks every Event must pass, created or updated (the Go `legacyValidateEvent`
/// for an Event with an `eventTime`), worded and named as the real server words them.
fn validate_event(ns: &str, event: &Value) -> Vec<String> {
    let text = |field: &str| event.get(field).and_then(Value::as_str).unwrap_or("");
    let mut causes = Vec::new();
    let regarding_ns = event.pointer("/regarding/namespace").and_then(Value::as_str).unwrap_or("");
    if regarding_ns.is_empty() && ns != "default" && ns != "kube-system" {
        causes.push(
            "involvedObject.namespace: Invalid value: \"\": does not match event.namespace".into(),
        );
    }
    let controller = text("reportingController");
    if controller.is_empty() {
        causes.push("reportingController: Required value".into());
    } else if let Some(why) = qualified_name_error(controller) {
        causes.push(format!("reportingController: Invalid value: \"{controller}\": {why}"));
    }
    for (field, limit) in [("reportingInstance", 128), ("action", 128), ("reason", 128)] {
        let value = text(field);
        if value.is_empty() {
            causes.push(format!("{field}: Required value"));
        } else if value.len() > limit {
            causes
                .push(format!("{field}: Invalid value: \"\": can have at most {limit} characters"));
        }
    }
    if text("note").len() > 1024 {
        causes.push("message: Invalid value: \"\": can have at most 1024 characters".into());
    }
    match text("type") {
        "Normal" | "Warning" => {}
        other => causes.push(format!("type: Invalid value: \"\": has invalid value: {other}")),
    }
    causes
}

/// A `series`, when there is one, counts at least two and says when it was last seen.
fn validate_series(event: &Value) -> Vec<String> {
    let Some(series) = event.get("series").filter(|s| !s.is_null()) else {
        return Vec::new();
    };
    let mut causes = Vec::new();
    if series.get("count").and_then(Value::as_i64).unwrap_or(0) < 2 {
        causes.push("series.count: Invalid value: \"\": should be at least 2".into());
    }
    if !series.get("lastObservedTime").is_some_and(is_set) {
        causes.push("series.lastObservedTime: Required value".into());
    }
    causes
}

/// Why `name` is not a DNS-1123 subdomain (an object name), or `None`.
fn dns_subdomain_error(name: &str) -> Option<String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let alnum = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let labels_ok = name.split('.').all(|l| alnum(l.bytes().next()) && alnum(l.bytes().last()));
    if name.len() > 253 {
        Some("must be no more than 253 characters".into())
    } else if !(ok_chars && labels_ok) {
        Some(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character"
                .into(),
        )
    } else {
        None
    }
}

/// Why `value` is not a qualified name (`[prefix/]name`, as label keys are), or `None`.
fn qualified_name_error(value: &str) -> Option<String> {
    let (prefix, name) = match value.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, value),
    };
    if let Some(why) = prefix.and_then(dns_subdomain_error) {
        return Some(format!("prefix part {why}"));
    }
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    let ok = !name.is_empty()
        && name.len() <= 63
        && edge(name.bytes().next())
        && edge(name.bytes().last())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    (!ok).then(|| {
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and \
         end with an alphanumeric character (at most 63 characters)"
            .into()
    })
}

fn immutable(path: &str, value: Option<&Value>) -> String {
    format!("{path}: Invalid value: {}: field is immutable", value.unwrap_or(&Value::Null))
}

/// 422 for an Event, one cause or several as the real server lists them.
fn invalid_event(name: &str, causes: Vec<String>) -> Answer {
    let listed = match causes.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("Event.{EVENTS_GROUP} \"{name}\" is invalid: {listed}"),
        Some(json!({"name": name, "group": EVENTS_GROUP, "kind": "Event"})),
    )
}

/// RFC 7386: objects merge key by key, `null` deletes, anything else (lists included) replaces.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Some(t) = target.as_object_mut() {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// What the API server's decoding and Node validation would refuse.
fn validate(name: &str, node: &Value) -> Result<(), Answer> {
    for map in ["labels", "annotations"] {
        match node.pointer(&format!("/metadata/{map}")) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) if m.values().all(Value::is_string) => {}
            Some(other) => {
                return Err(bad_request(format!("json: cannot unmarshal {other} into Go struct field ObjectMeta.metadata.{map} of type string")))
            }
        }
    }
    let taints = match node.pointer("/spec/taints") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(t)) => t,
        Some(other) => {
            return Err(bad_request(format!("json: cannot unmarshal {other} into Go struct field NodeSpec.spec.taints of type []v1.Taint")))
        }
    };
    let mut seen = BTreeSet::new();
    for (i, t) in taints.iter().enumerate() {
        let key = t.get("key").and_then(Value::as_str).unwrap_or("");
        let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
        if key.is_empty() {
            return Err(invalid("Node", name, &format!("spec.taints[{i}].key: Required value")));
        }
        if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
            return Err(invalid(
                "Node",
                name,
                &format!(
                    "spec.taints[{i}].effect: Unsupported value: \"{effect}\": supported values: \
                     \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""
                ),
            ));
        }
        if !seen.insert((key.to_string(), effect.to_string())) {
            return Err(invalid(
                "Node",
                name,
                &format!(
                    "spec.taints[{i}]: Duplicate value: core.Taint{{Key:\"{key}\", Effect:\"{effect}\"}}: \
                     taints must be unique by key and effect pair"
                ),
            ));
        }
    }
    Ok(())
}

/// Go's `omitempty`: empty maps and lists are not stored (nor returned).
/// `status.capacity` and `status.allocatable` as the API server stores them: every quantity a
/// string (Go's `resource.Quantity` decodes a JSON number too, and always encodes a string: `4`
/// is written back as `"4"`); anything else is refused as the server refuses it (400).
fn quantities(node: &mut Value) -> Result<(), Answer> {
    for field in ["capacity", "allocatable"] {
        let Some(map) = node["status"].get_mut(field).and_then(Value::as_object_mut) else {
            continue;
        };
        for (name, q) in map.iter_mut() {
            match q {
                Value::String(_) => {}
                Value::Number(n) => *q = Value::String(n.to_string()),
                other => {
                    return Err(bad_request(format!(
                        "status.{field}[{name}]: quantities must match the regular expression \
                         '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$', got {other}"
                    )))
                }
            }
        }
    }
    Ok(())
}

fn normalise(node: &mut Value) {
    for (section, field) in
        [("metadata", "labels"), ("metadata", "annotations"), ("spec", "taints")]
    {
        if let Some(obj) = node.get_mut(section).and_then(Value::as_object_mut) {
            let empty = match obj.get(field) {
                Some(Value::Object(m)) => m.is_empty(),
                Some(Value::Array(a)) => a.is_empty(),
                Some(Value::Null) => true,
                _ => false,
            };
            if empty {
                obj.remove(field);
            }
        }
    }
}

fn status(code: StatusCode, reason: &str, message: String, details: Option<Value>) -> Answer {
    let mut body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    if let Some(d) = details {
        body["details"] = d;
    }
    (code, body)
}

fn bad_request(message: String) -> Answer {
    status(StatusCode::BAD_REQUEST, "BadRequest", message, None)
}

/// A request body that is not JSON, as the server refuses it.
fn decode_patch(body: &[u8]) -> Result<Value, Answer> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("error decoding patch: {e}")))
}

/// A body in a media type the endpoint does not take; `accepted` lists what it does, `note`
/// (empty, or ending in "; ") says more.
fn unsupported_media_type(accepted: &str, note: &str, headers: &HeaderMap) -> Answer {
    status(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UnsupportedMediaType",
        format!(
            "the body of the request was in an unknown format - accepted media types \
             include: {accepted} ({note}got {:?})",
            media_type(headers)
        ),
        None,
    )
}

fn not_found(name: &str) -> Answer {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("nodes \"{name}\" not found"),
        Some(json!({"name": name, "kind": "nodes"})),
    )
}

fn conflict(name: &str) -> Answer {
    status(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on nodes \"{name}\": the object has been modified; \
             please apply your changes to the latest version and try again"
        ),
        Some(json!({"name": name, "kind": "nodes"})),
    )
}

fn invalid(kind: &str, name: &str, cause: &str) -> Answer {
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("{kind} \"{name}\" is invalid: {cause}"),
        Some(json!({"name": name, "kind": format!("{}s", kind.to_lowercase())})),
    )
}

/// RBAC's refusal, worded as the real authorizer words it (`group` is `""` for core).
fn forbidden(
    verb: &str,
    resource: &str,
    group: &str,
    name: Option<&str>,
    ns: Option<&str>,
) -> Answer {
    let qualified =
        if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") };
    let subject = match name {
        Some(n) => format!("{qualified} \"{n}\""),
        None => qualified,
    };
    let scope = match ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        format!(
            "{subject} is forbidden: User \"{USER}\" cannot {verb} resource \"{resource}\" in API \
             group \"{group}\" {scope}"
        ),
        Some(json!({"name": name.unwrap_or(""), "group": group, "kind": resource})),
    )
}

fn respond((code, body): Answer) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// `code` with the object, or the refusal.
fn respond_with(code: StatusCode, result: Result<Value, Answer>) -> Response {
    respond(result.map_or_else(|refused| refused, |object| (code, object)))
}

fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

async fn get_node(
    State(shared): State<Shared>,
    Path(name): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if !world.allows("", "nodes", "get") {
        return respond(forbidden("get", "nodes", "", Some(&name), None));
    }
    if name != world.node_name {
        return respond(not_found(&name));
    }
    let answer = world.node.clone();
    if let Some(race) = world.race_after_get.take() {
        if let Err((code, s)) = world.write(&race) {
            panic!("race_next_get patch refused ({code}): {s}");
        }
    }
    respond((StatusCode::OK, answer))
}

async fn patch_node(
    State(shared): State<Shared>,
    Path(name): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if !world.allows("", "nodes", "patch") {
        return respond(forbidden("patch", "nodes", "", Some(&name), None));
    }
    let media = media_type(&headers);
    let strategic = media == "application/strategic-merge-patch+json";
    if media != "application/merge-patch+json" && !strategic {
        return respond(unsupported_media_type(
            "application/merge-patch+json",
            "this fake implements only merge patch (and strategic merge where it is the same); ",
            &headers,
        ));
    }
    if name != world.node_name {
        return respond(not_found(&name));
    }
    let patch = match decode_patch(&body) {
        Ok(p) => p,
        Err(answer) => return respond(answer),
    };
    if strategic && !strategic_is_merge(&patch) {
        return respond(unsupported_media_type(
            "application/merge-patch+json",
            "this fake implements strategic merge of a Node only where it equals merge patch \
             (no $ directive, no list with a merge strategy); ",
            &headers,
        ));
    }
    if world.conflicts > 0 {
        world.conflicts -= 1;
        world.bump();
        return respond(conflict(&name));
    }
    respond_with(StatusCode::OK, world.write(&patch))
}

async fn patch_node_status(
    State(shared): State<Shared>,
    Path(name): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if !world.allows("", "nodes/status", "patch") {
        return respond(forbidden("patch", "nodes/status", "", Some(&name), None));
    }
    let media = media_type(&headers);
    if media != "application/strategic-merge-patch+json" && media != "application/merge-patch+json"
    {
        return respond(unsupported_media_type(
            "application/strategic-merge-patch+json",
            "this fake implements strategic merge (conditions by type) for node status; ",
            &headers,
        ));
    }
    if media == "application/merge-patch+json" {
        // NB: a JSON merge patch replaces the whole conditions list: kubelet's Ready would go.
        // The real server does exactly that; the fake does too, so a test would see it.
        let patch = match decode_patch(&body) {
            Ok(p) => p,
            Err(answer) => return respond(answer),
        };
        let mut next = world.node.clone();
        merge(&mut next, &json!({ "status": patch["status"].clone() }));
        world.node = next.clone();
        return respond((StatusCode::OK, next));
    }
    if name != world.node_name {
        return respond(not_found(&name));
    }
    let patch = match decode_patch(&body) {
        Ok(p) => p,
        Err(answer) => return respond(answer),
    };
    respond_with(StatusCode::OK, world.write_status(&patch))
}

/// SelfSubjectAccessReview, as the real server answers it: the review echoed back with a
/// `status.allowed` that follows the RBAC this fake enforces ([`ROLE`] less
/// [`FakeKube::forbid`]), by API group, resource and verb.
async fn access_review(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    let Ok(mut review) = serde_json::from_slice::<Value>(&body) else {
        return respond(bad_request("the body is not a SelfSubjectAccessReview".into()));
    };
    let attribute =
        |name: &str| review["spec"]["resourceAttributes"][name].as_str().unwrap_or("").to_string();
    let resource = match attribute("subresource").as_str() {
        "" => attribute("resource"),
        sub => format!("{}/{sub}", attribute("resource")),
    };
    let allowed = world.allows(&attribute("group"), &resource, &attribute("verb"));
    review["status"] = serde_json::json!({ "allowed": allowed });
    respond((StatusCode::CREATED, review))
}

/// TokenReview as the real API server answers it (`authentication.k8s.io/v1`, 201 Created):
/// `status.authenticated`, the ServiceAccount user with its groups and, for a token bound to a
/// pod, `user.extra` with the pod's name and uid (and the node, as Kubernetes ≥ 1.30 adds);
/// `status.audiences` is the intersection of the token's and the request's audiences (the
/// request's default: the API server's own), and an empty intersection is not authenticated.
async fn token_review(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if !world.allows("authentication.k8s.io", "tokenreviews", "create") {
        return respond(forbidden("create", "tokenreviews", "authentication.k8s.io", None, None));
    }
    let Ok(mut review) = serde_json::from_slice::<Value>(&body) else {
        return respond(bad_request("the body is not a TokenReview".into()));
    };
    if review["apiVersion"] != "authentication.k8s.io/v1" || review["kind"] != "TokenReview" {
        return respond(bad_request(format!(
            "expected authentication.k8s.io/v1 TokenReview, got {} {}",
            review["apiVersion"], review["kind"]
        )));
    }
    let token = review["spec"]["token"].as_str().unwrap_or("").to_string();
    let wanted: Vec<String> = match review["spec"]["audiences"].as_array() {
        Some(a) if !a.is_empty() => {
            a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()
        }
        _ => vec![API_AUDIENCE.to_string()],
    };
    let minted = world.tokens.iter().find(|t| t.token == token).cloned();
    review["status"] = match minted {
        None => {
            json!({"user": {}, "error": "[invalid bearer token, square/go-jose: error in cryptographic primitive]"})
        }
        Some(m) => {
            let theirs: Vec<String> = if m.audiences.is_empty() {
                vec![API_AUDIENCE.to_string()]
            } else {
                m.audiences.clone()
            };
            let both: Vec<&String> = wanted.iter().filter(|a| theirs.contains(a)).collect();
            if both.is_empty() {
                json!({"user": {}, "error": format!("[invalid bearer token, token audiences {theirs:?} is invalid for the target audiences {wanted:?}]")})
            } else {
                let mut extra = serde_json::Map::new();
                if let Some((name, uid)) = &m.pod {
                    extra.insert("authentication.kubernetes.io/pod-name".into(), json!([name]));
                    extra.insert("authentication.kubernetes.io/pod-uid".into(), json!([uid]));
                }
                if let Some(node) = &m.node {
                    extra.insert("authentication.kubernetes.io/node-name".into(), json!([node]));
                }
                json!({
                    "authenticated": true,
                    "user": {
                        "username": format!("system:serviceaccount:{}:{}", m.namespace, m.service_account),
                        "uid": "5d6f7a8b-0000-4000-8000-00000000000a",
                        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", m.namespace), "system:authenticated"],
                        "extra": extra,
                    },
                    "audiences": both,
                })
            }
        }
    };
    respond((StatusCode::CREATED, review))
}

async fn create_event(
    State(shared): State<Shared>,
    Path(ns): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if !world.allows(EVENTS_GROUP, "events", "create") {
        return respond(forbidden("create", "events", EVENTS_GROUP, None, Some(&ns)));
    }
    if media_type(&headers) != "application/json" {
        return respond(unsupported_media_type("application/json", "", &headers));
    }
    respond_with(StatusCode::CREATED, world.create_event(&ns, &body))
}

async fn patch_event(
    State(shared): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if !world.allows(EVENTS_GROUP, "events", "patch") {
        return respond(forbidden("patch", "events", EVENTS_GROUP, Some(&name), Some(&ns)));
    }
    if media_type(&headers) != "application/merge-patch+json" {
        return respond(unsupported_media_type(
            "application/merge-patch+json",
            "this fake implements only merge patch; ",
            &headers,
        ));
    }
    let patch = match decode_patch(&body) {
        Ok(p) => p,
        Err(answer) => return respond(answer),
    };
    respond_with(StatusCode::OK, world.patch_event(&ns, &name, &patch))
}

/// `GET /api/v1/pods`: every namespace's pods, filtered by `fieldSelector` (see `fake_pods`).
async fn list_pods(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if !world.allows("", "pods", "list") {
        return respond(forbidden("list", "pods", "", None, None));
    }
    let mut terms = Vec::new();
    for (key, value) in fake_pods::query_params(uri.query()) {
        match key.as_str() {
            "fieldSelector" => match fake_pods::field_selector(&value) {
                Ok(t) => terms = t,
                Err(message) => return respond(bad_request(message)),
            },
            other => {
                return respond(bad_request(format!(
                    "fake API server: the query parameter {other} is not implemented"
                )))
            }
        }
    }
    let items: Vec<Value> = world
        .pods
        .iter()
        .filter(|p| fake_pods::selected(p, &terms))
        .map(fake_pods::list_item)
        .collect();
    respond((
        StatusCode::OK,
        json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": world.revision.to_string()},
            "items": items
        }),
    ))
}

/// `GET /api/v1/namespaces/{ns}/pods` with a `labelSelector` of equality terms
/// (`key=value`, `key==value`, `key!=value`, comma-separated: what the agent sends for a Job's
/// pods); anything else is refused with 400, as by [`list_pods`].
async fn list_namespaced_pods(
    State(shared): State<Shared>,
    Path(ns): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if !world.allows("", "pods", "list") {
        return respond(forbidden("list", "pods", "", None, Some(&ns)));
    }
    let mut terms: Vec<fake_pods::Term> = Vec::new();
    for (key, value) in fake_pods::query_params(uri.query()) {
        if key != "labelSelector" {
            return respond(bad_request(format!(
                "fake API server: the query parameter {key} is not implemented"
            )));
        }
        for raw in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (k, eq, v) = match (raw.split_once("!="), raw.split_once("==")) {
                (Some((k, v)), _) => (k, false, v),
                (None, Some((k, v))) => (k, true, v),
                _ => match raw.split_once('=') {
                    Some((k, v)) => (k, true, v),
                    None => {
                        return respond(bad_request(format!(
                            "fake API server: the label selector term {raw:?} is not implemented"
                        )))
                    }
                },
            };
            terms.push((k.trim().to_string(), eq, v.trim().to_string()));
        }
    }
    let items: Vec<Value> = world
        .pods
        .iter()
        .filter(|p| p["metadata"]["namespace"] == ns.as_str())
        .filter(|p| {
            terms.iter().all(|(k, eq, v)| {
                (p["metadata"]["labels"][k.as_str()].as_str() == Some(v.as_str())) == *eq
            })
        })
        .map(fake_pods::list_item)
        .collect();
    respond((
        StatusCode::OK,
        json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": world.revision.to_string()},
            "items": items
        }),
    ))
}

/// 404 for a version of `resource.k8s.io` that does not serve `versions`' resource.
fn dra_version(version: &str, versions: &[&str]) -> Result<(), Answer> {
    match versions.contains(&version) {
        true => Ok(()),
        false => Err(status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource".into(),
            None,
        )),
    }
}

/// The one query parameter a DRA list takes (`fieldSelector` or `labelSelector`), or a 400.
fn only_param(uri: &Uri, name: &str) -> Result<String, Answer> {
    let mut found = String::new();
    for (k, v) in fake_pods::query_params(uri.query()) {
        if k != name {
            return Err(bad_request(format!(
                "fake API server: the query parameter {k} is not implemented"
            )));
        }
        found = v;
    }
    Ok(found)
}

/// `GET /apis/resource.k8s.io/{version}/resourceslices[?fieldSelector=…]`.
async fn list_slices(
    State(shared): State<Shared>,
    Path(version): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if let Err(r) = dra_version(&version, fake_dra::SLICE_VERSIONS) {
        return respond(r);
    }
    if !world.allows("resource.k8s.io", "resourceslices", "list") {
        return respond(forbidden("list", "resourceslices", "resource.k8s.io", None, None));
    }
    let selector = match only_param(&uri, "fieldSelector") {
        Ok(s) => s,
        Err(r) => return respond(r),
    };
    let mut items = Vec::new();
    for s in &world.slices {
        match fake_dra::slice_selected(s, &selector) {
            Ok(true) => items.push(fake_dra::item(s)),
            Ok(false) => {}
            Err(message) => return respond(bad_request(message)),
        }
    }
    let kind = json!({"kind": "ResourceSliceList", "apiVersion": format!("resource.k8s.io/{version}"),
                      "metadata": {"resourceVersion": world.revision.to_string()}, "items": items});
    respond((StatusCode::OK, kind))
}

/// `GET /apis/resource.k8s.io/{version}/devicetaintrules[?labelSelector=…]`.
async fn list_taint_rules(
    State(shared): State<Shared>,
    Path(version): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if let Err(r) = dra_version(&version, fake_dra::VERSIONS) {
        return respond(r);
    }
    if !world.allows("resource.k8s.io", "devicetaintrules", "list") {
        return respond(forbidden("list", "devicetaintrules", "resource.k8s.io", None, None));
    }
    let selector = match only_param(&uri, "labelSelector") {
        Ok(s) => s,
        Err(r) => return respond(r),
    };
    let items: Vec<Value> = world
        .taint_rules
        .iter()
        .filter(|r| fake_dra::labels_match(r, &selector))
        .map(fake_dra::item)
        .collect();
    let list = json!({"kind": "DeviceTaintRuleList", "apiVersion": format!("resource.k8s.io/{version}"),
                      "metadata": {"resourceVersion": world.revision.to_string()}, "items": items});
    respond((StatusCode::OK, list))
}

/// `POST /apis/resource.k8s.io/{version}/devicetaintrules`.
async fn create_taint_rule(
    State(shared): State<Shared>,
    Path(version): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if let Err(r) = dra_version(&version, fake_dra::VERSIONS) {
        return respond(r);
    }
    if !world.allows("resource.k8s.io", "devicetaintrules", "create") {
        return respond(forbidden("create", "devicetaintrules", "resource.k8s.io", None, None));
    }
    let rule: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return respond(bad_request(format!("error decoding body: {e}"))),
    };
    let name = rule["metadata"]["name"].as_str().unwrap_or_default().to_string();
    if let Some((field, why)) = fake_dra::schema_error(&rule, &version) {
        return respond(bad_request(format!(
            "DeviceTaintRule in version \"{version}\" cannot be handled as a DeviceTaintRule: {field}: {why}"
        )));
    }
    if let Some((field, why)) = fake_dra::invalid(&rule) {
        return respond(status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("DeviceTaintRule.resource.k8s.io \"{name}\" is invalid: {field}: {why}"),
            Some(json!({"name": name, "group": "resource.k8s.io", "kind": "DeviceTaintRule"})),
        ));
    }
    if world.taint_rules.iter().any(|r| r["metadata"]["name"] == name.as_str()) {
        return respond(status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("devicetaintrules.resource.k8s.io \"{name}\" already exists"),
            Some(json!({"name": name, "group": "resource.k8s.io", "kind": "devicetaintrules"})),
        ));
    }
    world.uids += 1;
    let uid = world.uids;
    let rv = world.next_revision();
    let stored = fake_dra::stored(rule, uid, &rv);
    world.taint_rules.push(stored.clone());
    respond((StatusCode::CREATED, stored))
}

/// `GET /apis/resource.k8s.io/{version}/devicetaintrules/{name}`.
async fn get_taint_rule(
    State(shared): State<Shared>,
    Path((version, name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if let Err(r) = dra_version(&version, fake_dra::VERSIONS) {
        return respond(r);
    }
    if !world.allows("resource.k8s.io", "devicetaintrules", "get") {
        return respond(forbidden("get", "devicetaintrules", "resource.k8s.io", Some(&name), None));
    }
    match world.taint_rules.iter().find(|r| r["metadata"]["name"] == name.as_str()) {
        Some(r) => respond((StatusCode::OK, r.clone())),
        None => respond(status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("devicetaintrules.resource.k8s.io \"{name}\" not found"),
            Some(json!({"name": name, "group": "resource.k8s.io", "kind": "devicetaintrules"})),
        )),
    }
}

/// `DELETE /apis/resource.k8s.io/{version}/devicetaintrules/{name}`.
async fn delete_taint_rule(
    State(shared): State<Shared>,
    Path((version, name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if let Err(r) = dra_version(&version, fake_dra::VERSIONS) {
        return respond(r);
    }
    if !world.allows("resource.k8s.io", "devicetaintrules", "delete") {
        return respond(forbidden(
            "delete",
            "devicetaintrules",
            "resource.k8s.io",
            Some(&name),
            None,
        ));
    }
    let Some(i) = world.taint_rules.iter().position(|r| r["metadata"]["name"] == name.as_str())
    else {
        return respond(status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("devicetaintrules.resource.k8s.io \"{name}\" not found"),
            Some(json!({"name": name, "group": "resource.k8s.io", "kind": "devicetaintrules"})),
        ));
    };
    let gone = world.taint_rules.remove(i);
    world.next_revision();
    respond((StatusCode::OK, gone))
}

type ObjectPath = Path<(String, String)>;

async fn get_job(st: State<Shared>, p: ObjectPath, m: Method, u: Uri, h: HeaderMap) -> Response {
    get_object(st, p, &m, &u, &h, ("batch", "jobs"))
}

async fn get_jobset(st: State<Shared>, p: ObjectPath, m: Method, u: Uri, h: HeaderMap) -> Response {
    get_object(st, p, &m, &u, &h, ("jobset.x-k8s.io", "jobsets"))
}

async fn get_lws(st: State<Shared>, p: ObjectPath, m: Method, u: Uri, h: HeaderMap) -> Response {
    let what = ("leaderworkerset.x-k8s.io", "leaderworkersets");
    get_object(st, p, &m, &u, &h, what)
}

/// `GET /apis/<group>/<version>/namespaces/{ns}/<resource>/{name}`: a Job, JobSet or
/// LeaderWorkerSet; 404 NotFound for one not stored, 403 as RBAC says.
fn get_object(
    State(shared): State<Shared>,
    Path((ns, name)): ObjectPath,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    (group, resource): (&str, &str),
) -> Response {
    let mut world = lock(&shared);
    world.record(method, uri, headers);
    if !world.allows(group, resource, "get") {
        return respond(forbidden("get", resource, group, Some(&name), Some(&ns)));
    }
    let found = world.objects.iter().find(|(g, r, o)| {
        g == group
            && r == resource
            && o["metadata"]["namespace"] == ns.as_str()
            && o["metadata"]["name"] == name.as_str()
    });
    match found {
        Some((_, _, o)) => respond((StatusCode::OK, o.clone())),
        None => respond(status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{resource}.{group} \"{name}\" not found"),
            Some(json!({"name": name, "group": group, "kind": resource})),
        )),
    }
}

/// `GET /api/v1/namespaces/{ns}/pods/{name}`.
async fn get_pod(
    State(shared): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    if !world.allows("", "pods", "get") {
        return respond(forbidden("get", "pods", "", Some(&name), Some(&ns)));
    }
    let found = world.pods.iter().find(|p| {
        p["metadata"]["namespace"] == ns.as_str() && p["metadata"]["name"] == name.as_str()
    });
    match found {
        Some(p) => respond((StatusCode::OK, p.clone())),
        None => respond(status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("pods \"{name}\" not found"),
            Some(json!({"name": name, "kind": "pods"})),
        )),
    }
}

async fn unknown(
    method: Method,
    uri: Uri,
    State(shared): State<Shared>,
    headers: HeaderMap,
) -> Response {
    let mut world = lock(&shared);
    world.record(&method, &uri, &headers);
    respond(status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource".into(),
        None,
    ))
}

/// Whether a strategic-merge patch of a Node means exactly what the same JSON as a merge patch
/// means: it carries no `$` directive and names none of the Node's lists that merge by key
/// (`metadata.finalizers`, `metadata.ownerReferences`, `spec.podCIDRs`, and `status`, which this
/// endpoint does not write). Labels and annotations are maps and `spec.taints` has no merge
/// strategy (a list in the patch replaces it), so `kubectl taint`, `label` and `annotate` are.
fn strategic_is_merge(patch: &Value) -> bool {
    fn no_directive(v: &Value) -> bool {
        match v {
            Value::Object(m) => m.iter().all(|(k, v)| !k.starts_with('$') && no_directive(v)),
            Value::Array(items) => items.iter().all(no_directive),
            _ => true,
        }
    }
    no_directive(patch)
        && patch.get("status").is_none()
        && patch.pointer("/metadata/finalizers").is_none()
        && patch.pointer("/metadata/ownerReferences").is_none()
        && patch.pointer("/spec/podCIDRs").is_none()
}

/// `GET /api`: the core group's versions (legacy discovery; kubectl falls back to it when the
/// answer is not the aggregated kind it asked for first). Not recorded: Vigil never asks.
async fn discovery_versions() -> Response {
    respond((
        StatusCode::OK,
        json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}
        ]}),
    ))
}

/// `GET /apis`: no named group is discoverable (kubectl needs none for nodes).
async fn discovery_groups() -> Response {
    respond((StatusCode::OK, json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})))
}

/// `GET /api/v1`: the core resources this fake serves, with the verbs it implements.
async fn discovery_core() -> Response {
    respond((
        StatusCode::OK,
        json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "nodes", "singularName": "node", "namespaced": false, "kind": "Node",
             "verbs": ["get", "patch"], "shortNames": ["no"]},
            {"name": "nodes/status", "singularName": "", "namespaced": false, "kind": "Node",
             "verbs": ["get", "patch"]},
            {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
             "verbs": ["get", "list"], "shortNames": ["po"]}
        ]}),
    ))
}

async fn hook_node(State(shared): State<Shared>) -> Response {
    respond((StatusCode::OK, lock(&shared).node.clone()))
}

async fn hook_events(State(shared): State<Shared>) -> Response {
    respond((StatusCode::OK, Value::Array(lock(&shared).events.clone())))
}

async fn hook_requests(State(shared): State<Shared>) -> Response {
    let seen: Vec<Value> =
        lock(&shared).requests.iter().map(|(m, p, c)| json!([m, p, c])).collect();
    respond((StatusCode::OK, Value::Array(seen)))
}

async fn hook_foreign_write(State(shared): State<Shared>, body: Bytes) -> Response {
    let patch = match decode_patch(&body) {
        Ok(p) => p,
        Err(answer) => return respond(answer),
    };
    respond_with(StatusCode::OK, lock(&shared).write(&patch))
}

async fn hook_status_write(State(shared): State<Shared>, body: Bytes) -> Response {
    let patch = match decode_patch(&body) {
        Ok(p) => p,
        Err(answer) => return respond(answer),
    };
    respond_with(StatusCode::OK, lock(&shared).write_status(&patch))
}

async fn hook_race_next_get(State(shared): State<Shared>, body: Bytes) -> Response {
    match decode_patch(&body) {
        Ok(patch) => {
            lock(&shared).race_after_get = Some(patch);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(answer) => respond(answer),
    }
}

async fn hook_conflict_next(State(shared): State<Shared>, Path(n): Path<u32>) -> StatusCode {
    lock(&shared).conflicts += n;
    StatusCode::NO_CONTENT
}

async fn hook_forbid(State(shared): State<Shared>, Path(verb): Path<String>) -> StatusCode {
    lock(&shared).forbidden.insert(verb);
    StatusCode::NO_CONTENT
}

async fn hook_allow(State(shared): State<Shared>, Path(verb): Path<String>) -> StatusCode {
    lock(&shared).forbidden.remove(&verb);
    StatusCode::NO_CONTENT
}

async fn hook_expire_events(State(shared): State<Shared>) -> StatusCode {
    lock(&shared).events.clear();
    StatusCode::NO_CONTENT
}
