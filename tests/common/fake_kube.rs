#![allow(dead_code)]
//! A faithful fake of the slice of the Kubernetes API server Vigil uses: one Node (GET, PATCH with
//! JSON merge patch) and Events (POST), served over real HTTP on `127.0.0.1:0`.
//!
//! Faithful where it matters to the code under test:
//! - error answers are `Status` objects with the real server's reasons, codes and wording
//!   (`NotFound`, `Conflict`, `Forbidden`, `UnsupportedMediaType`, `Invalid`, `AlreadyExists`);
//! - PATCH applies RFC 7386 for real (maps merge, `null` deletes, lists are replaced whole);
//!   a `metadata.resourceVersion` in the patch is a precondition (409 when stale); every write
//!   bumps the resourceVersion, from one counter shared by all objects, as etcd's revision is;
//! - what the server stores is normalised as Go's `omitempty` would (an empty taint list or label
//!   map disappears), and taints are validated (known effect, no duplicate key + effect: 422);
//! - only `application/merge-patch+json` is implemented; other patch types answer 415 rather than
//!   being silently treated as merge, so a change of patch type in the client fails loudly.
//!
//! Test hooks (Rust methods, and the same over HTTP under `/fake/...` for another process):
//! `node`, `events`, `requests`, `foreign_write`, `conflict_next`, `race_next_get`, `forbid`,
//! `allow`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Map, Value};

/// The identity the fake pretends the agent's ServiceAccount has, for 403 messages.
const USER: &str = "system:serviceaccount:vigil:vigil";

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
    /// Kubernetes verbs (`get`, `patch`, `create`) that RBAC refuses.
    forbidden: BTreeSet<String>,
    requests: Vec<Seen>,
    uids: u64,
}

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
        }));
        let app = Router::new()
            .route("/api/v1/nodes/{name}", get(get_node).patch(patch_node))
            .route("/api/v1/namespaces/{ns}/events", post(create_event))
            .route(
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                post(access_review),
            )
            .route("/fake/node", get(hook_node))
            .route("/fake/events", get(hook_events))
            .route("/fake/requests", get(hook_requests))
            .route("/fake/foreign_write", post(hook_foreign_write))
            .route("/fake/race_next_get", post(hook_race_next_get))
            .route("/fake/conflict_next/{n}", post(hook_conflict_next))
            .route("/fake/forbid/{verb}", post(hook_forbid))
            .route("/fake/allow/{verb}", post(hook_allow))
            .fallback(unknown)
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake kube API");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeKube {
            url: format!("http://{addr}"),
            shared,
            task,
        }
    }

    /// The stored Node, as a GET would return it.
    pub fn node(&self) -> Value {
        lock(&self.shared).node.clone()
    }

    /// Every Event created so far, as stored.
    pub fn events(&self) -> Vec<Value> {
        lock(&self.shared).events.clone()
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

    /// Makes RBAC refuse `verb` (`get`, `patch`, `create`) with 403 until [`FakeKube::allow`].
    pub fn forbid(&self, verb: &str) {
        lock(&self.shared).forbidden.insert(verb.to_string());
    }

    /// Lifts [`FakeKube::forbid`].
    pub fn allow(&self, verb: &str) {
        lock(&self.shared).forbidden.remove(verb);
    }
}

/// A label of a Node (as [`FakeKube::node`] returns it).
pub fn label(node: &Value, key: &str) -> Option<String> {
    node["metadata"]["labels"][key].as_str().map(str::to_string)
}

/// An annotation of a Node.
pub fn annotation(node: &Value, key: &str) -> Option<String> {
    node["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_string)
}

/// A Node's taints, as stored.
pub fn taints(node: &Value) -> Vec<Value> {
    node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The keys of a Node's taints.
pub fn taint_keys(node: &Value) -> Vec<String> {
    taints(node)
        .iter()
        .filter_map(|t| t["key"].as_str().map(str::to_string))
        .collect()
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
    fn record(&mut self, method: &Method, uri: &Uri, headers: &HeaderMap) {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        self.requests
            .push((method.to_string(), uri.path().to_string(), content_type));
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

    fn create_event(&mut self, ns: &str, body: &[u8]) -> Result<Value, Answer> {
        let mut event: Value = serde_json::from_slice(body)
            .map_err(|e| bad_request(format!("the object provided is unrecognized: {e}")))?;
        if !event.is_object() {
            return Err(bad_request(
                "the object provided is unrecognized: not a JSON object".into(),
            ));
        }
        if event
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k != "Event")
        {
            return Err(bad_request(
                "the API version in the data (v1) does not match the expected kind Event".into(),
            ));
        }
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
            event
                .pointer("/metadata/generateName")
                .and_then(Value::as_str),
        ) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(g)) if !g.is_empty() => format!("{g}{:05x}", self.uids & 0xfffff),
            _ => {
                return Err(invalid(
                    "Event",
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ))
            }
        };
        // Legacy (core/v1) event validation: an event about a cluster-scoped object such as a
        // Node must live in "default" (or have no namespace).
        let involved_ns = event
            .pointer("/involvedObject/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        if involved_ns.is_empty() && ns != "default" {
            return Err(invalid(
                "Event",
                &name,
                "involvedObject.namespace: Invalid value: \"\": does not match event.namespace",
            ));
        }
        if !involved_ns.is_empty() && involved_ns != ns {
            return Err(invalid(
                "Event",
                &name,
                &format!(
                    "involvedObject.namespace: Invalid value: \"{involved_ns}\": does not match \
                     event.namespace"
                ),
            ));
        }
        let exists = self.events.iter().any(|e| {
            e.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
                && e.pointer("/metadata/name").and_then(Value::as_str) == Some(name.as_str())
        });
        if exists {
            return Err(status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("events \"{name}\" already exists"),
                Some(json!({"name": name, "kind": "events"})),
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
        event["apiVersion"] = json!("v1");
        self.events.push(event.clone());
        Ok(event)
    }
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
            return Err(invalid(
                "Node",
                name,
                &format!("spec.taints[{i}].key: Required value"),
            ));
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
fn normalise(node: &mut Value) {
    for (section, field) in [
        ("metadata", "labels"),
        ("metadata", "annotations"),
        ("spec", "taints"),
    ] {
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

/// RBAC's refusal, worded as the real authorizer words it.
fn forbidden(verb: &str, resource: &str, name: Option<&str>, ns: Option<&str>) -> Answer {
    let subject = match name {
        Some(n) => format!("{resource} \"{n}\""),
        None => resource.to_string(),
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
             group \"\" {scope}"
        ),
        Some(json!({"name": name.unwrap_or(""), "kind": resource})),
    )
}

fn respond((code, body): Answer) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
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
    if world.forbidden.contains("get") {
        return respond(forbidden("get", "nodes", Some(&name), None));
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
    if world.forbidden.contains("patch") {
        return respond(forbidden("patch", "nodes", Some(&name), None));
    }
    if media_type(&headers) != "application/merge-patch+json" {
        return respond(unsupported_media_type(
            "application/merge-patch+json",
            "this fake implements only merge patch; ",
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
    if world.conflicts > 0 {
        world.conflicts -= 1;
        world.bump();
        return respond(conflict(&name));
    }
    respond_with(StatusCode::OK, world.write(&patch))
}

/// SelfSubjectAccessReview, as the real server answers it: the review echoed back with a
/// `status.allowed` that follows the RBAC this fake enforces (see [`FakeKube::forbid`]).
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
        return respond(bad_request(
            "the body is not a SelfSubjectAccessReview".into(),
        ));
    };
    let verb = review["spec"]["resourceAttributes"]["verb"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let allowed = !world.forbidden.contains(&verb);
    review["status"] = serde_json::json!({ "allowed": allowed });
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
    if world.forbidden.contains("create") {
        return respond(forbidden("create", "events", None, Some(&ns)));
    }
    if media_type(&headers) != "application/json" {
        return respond(unsupported_media_type("application/json", "", &headers));
    }
    respond_with(StatusCode::CREATED, world.create_event(&ns, &body))
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

async fn hook_node(State(shared): State<Shared>) -> Response {
    respond((StatusCode::OK, lock(&shared).node.clone()))
}

async fn hook_events(State(shared): State<Shared>) -> Response {
    respond((StatusCode::OK, Value::Array(lock(&shared).events.clone())))
}

async fn hook_requests(State(shared): State<Shared>) -> Response {
    let seen: Vec<Value> = lock(&shared)
        .requests
        .iter()
        .map(|(m, p, c)| json!([m, p, c]))
        .collect();
    respond((StatusCode::OK, Value::Array(seen)))
}

async fn hook_foreign_write(State(shared): State<Shared>, body: Bytes) -> Response {
    let patch = match decode_patch(&body) {
        Ok(p) => p,
        Err(answer) => return respond(answer),
    };
    respond_with(StatusCode::OK, lock(&shared).write(&patch))
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
