//! The Kubernetes Node: Vigil's labels, annotations and taints, and Events.
//!
//! Map:
//! - [`NodeDesired`] says which Vigil-owned keys should hold which values; nothing else on the
//!   Node is Vigil's to touch (other controllers, cloud agents and people write there too).
//! - [`merge_patch`] is the pure core: (Node as JSON, desired) → the smallest JSON merge patch
//!   (RFC 7386) that gets there, or `None` when the Node already matches, so a steady state costs
//!   one GET per cycle and no write.
//! - [`NodeApi`] is the side-effecting seam the agent calls; [`KubeNodeApi`] implements it with
//!   `kube`, and tests plug in either a fake API server (`tests/common/fake_kube.rs`) or their own
//!   implementation.
//!
//! - Events go through `kube`'s events.k8s.io [`Recorder`], which counts a repeat of an Event on
//!   the first one (`series.count`, one PATCH) instead of creating another object; see
//!   [`KubeNodeApi`]'s `event` for how Vigil keys its recorders.
//!
//! RBAC the agent needs (least privilege): `get` and `patch` on `nodes` (core API group `""`),
//! `create` and `patch` on `events` in `events.k8s.io`. A 403 names the missing rule (see
//! [`NodeError::Forbidden`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events as kev;
use serde_json::{Map, Value};

use crate::backoff::Backoff;

pub use crate::model::node::{EventType, NodeDesired, Taint};

/// The field manager and the Events' `reportingController` Vigil writes as, so `kubectl get node
/// -o yaml --show-managed-fields` and `kubectl get events` say who did it.
const COMPONENT: &str = "vigil";

/// How long `kube`'s [`kev::Recorder`] keeps an Event to count repeats on (its private
/// `CACHE_TTL`, six minutes in kube-runtime 5): a recorder idle longer holds nothing, so it is
/// dropped. Events about a Node (cluster-scoped) go to namespace `default`, the Recorder's choice
/// for a reference without a namespace and where `kubectl describe node` looks for them.
const RECORDER_TTL: Duration = Duration::from_secs(6 * 60);

/// The most an Event's `note` may hold (bytes), as the API server validates it.
const NOTE_LIMIT: usize = 1024;

/// Attempts for one reconcile when writes keep conflicting with other writers.
const DEFAULT_ATTEMPTS: u32 = 5;
/// Base of the exponential backoff between conflicting attempts.
const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(100);

/// The taint as the API writes it: `value` is omitted when empty (Go's `omitempty`), so a taint
/// we add compares equal to the same taint read back.
fn taint_json(t: &Taint) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), Value::String(t.key.clone()));
    if !t.value.is_empty() {
        m.insert("value".into(), Value::String(t.value.clone()));
    }
    m.insert("effect".into(), Value::String(t.effect.clone()));
    Value::Object(m)
}

/// Why a Node call failed, worded for the operator who has to fix it.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The Node does not exist: `NODE_NAME` is wrong, or the Node was deleted.
    #[error(
        "node {node:?} was not found by the Kubernetes API ({op}); check that NODE_NAME is this \
         machine's Node name (set it from spec.nodeName with the downward API)"
    )]
    NotFound {
        node: String,
        /// `get` or `patch`: which call found it missing.
        op: &'static str,
    },
    /// RBAC refused the call: the agent's ClusterRole lacks a rule.
    #[error(
        "the Kubernetes API refused to {verb} {resource} (403 Forbidden): the agent's \
         ClusterRole needs the rule {{apiGroups: [\"{group}\"], resources: [\"{resource}\"], \
         verbs: [\"{verb}\"]}} (Vigil needs get and patch on nodes, and create and patch on \
         events in events.k8s.io); the server said: {message}"
    )]
    Forbidden {
        /// The Kubernetes verb refused: `get`, `patch` or `create`.
        verb: &'static str,
        /// The resource: `nodes` or `events`.
        resource: &'static str,
        /// The API group: `""` (core) for nodes, `events.k8s.io` for events.
        group: &'static str,
        message: String,
    },
    /// Every attempt lost the race with another writer of the Node.
    #[error(
        "could not patch node {node:?}: {attempts} attempts in a row conflicted with other \
         writers (409 Conflict); the next cycle tries again"
    )]
    Conflict { node: String, attempts: u32 },
    /// The Node the API returned has taints to replace but no `metadata.resourceVersion`, so the
    /// replacement could not be made conditional and might clobber another writer's taints.
    #[error(
        "node {node:?} as returned by the API has no metadata.resourceVersion, so its taints \
         cannot be replaced safely; nothing was written"
    )]
    NoResourceVersion { node: String },
    /// Any other answer from the API server, or the server could not be reached.
    #[error("Kubernetes API call `{verb} {resource}` for node {node:?} failed: {source}")]
    Api {
        verb: &'static str,
        resource: &'static str,
        node: String,
        #[source]
        source: kube::Error,
    },
    /// The Node came back in a shape that could not be read as JSON.
    #[error("node {node:?} as returned by the API could not be read: {source}")]
    Decode {
        node: String,
        #[source]
        source: serde_json::Error,
    },
    /// No Kubernetes client could be built (no kubeconfig, not in a cluster, bad URL).
    #[error(
        "cannot build a Kubernetes client ({context}): {source}; in a cluster, check the \
         ServiceAccount token mount; outside, check KUBECONFIG"
    )]
    Client {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl NodeError {
    /// The call that failed, as a fixed metric label: `get`, `patch` (of the Node) or `event`
    /// (creating or counting an Event).
    ///
    /// Client construction counts as `get`: it is what the first GET would have needed.
    pub fn op(&self) -> &'static str {
        match self {
            NodeError::NotFound { op, .. } => op,
            NodeError::Forbidden { resource, .. } | NodeError::Api { resource, .. }
                if *resource == "events" =>
            {
                "event"
            }
            NodeError::Forbidden { verb, .. } | NodeError::Api { verb, .. } => match *verb {
                "patch" => "patch",
                _ => "get",
            },
            NodeError::Conflict { .. } | NodeError::NoResourceVersion { .. } => "patch",
            NodeError::Decode { .. } | NodeError::Client { .. } => "get",
        }
    }
}

/// Writes to this machine's Kubernetes Node.
#[async_trait]
pub trait NodeApi: Send + Sync {
    /// Makes the Vigil-owned labels, annotations and taints of `node` match `desired`, leaving
    /// everything else exactly as it is, including what other writers add meanwhile.
    ///
    /// Idempotent: when the Node already matches, nothing is written. Conflicts with other
    /// writers are retried (re-read, recompute) with backoff; giving up is
    /// [`NodeError::Conflict`], and the next call starts afresh.
    async fn reconcile(&self, node: &str, desired: &NodeDesired) -> Result<(), NodeError>;

    /// Records an Event about `node` (visible in `kubectl describe node`), with `reason` a short
    /// CamelCase word (e.g. `MaintenancePending`) and `message` for humans. A repeat of the same
    /// Event may be counted on the earlier one rather than recorded anew.
    async fn event(
        &self,
        node: &str,
        reason: &str,
        message: &str,
        kind: EventType,
    ) -> Result<(), NodeError>;
}

/// The smallest JSON merge patch (RFC 7386) that makes `node` (a Node as JSON) match `desired`,
/// or `None` when it already does.
///
/// Labels and annotations are maps, so a merge patch touches only the keys it names (`null`
/// removes) and other writers' keys survive. `spec.taints` is a list, and a list in a merge patch
/// replaces the whole list (Node taints have no strategic-merge key either), so when taints
/// change the patch carries the full new list — the existing taints minus `remove_taints`, plus
/// the missing `add_taints` — together with `metadata.resourceVersion` of the Node it was
/// computed from: the API server then refuses it (409) if anyone wrote in between, instead of
/// silently dropping their taint.
pub(crate) fn merge_patch(node: &Value, desired: &NodeDesired) -> Option<Value> {
    let mut metadata = Map::new();
    if let Some(labels) = map_patch(node.pointer("/metadata/labels"), &desired.labels) {
        metadata.insert("labels".into(), Value::Object(labels));
    }
    if let Some(annotations) =
        map_patch(node.pointer("/metadata/annotations"), &desired.annotations)
    {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }

    let mut patch = Map::new();
    if let Some(taints) = taints_patch(node.pointer("/spec/taints"), desired) {
        // NB: the precondition. Without it a taint added by someone else between our GET and
        // our PATCH would be erased by our whole-list replacement.
        if let Some(rv) = node.pointer("/metadata/resourceVersion") {
            metadata.insert("resourceVersion".into(), rv.clone());
        }
        let mut spec = Map::new();
        spec.insert("taints".into(), Value::Array(taints));
        patch.insert("spec".into(), Value::Object(spec));
    }
    if !metadata.is_empty() {
        patch.insert("metadata".into(), Value::Object(metadata));
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

/// The entries of a label or annotation map that must change: `Some` sets, `None` removes
/// (`null` in a merge patch). Keys not in `wanted` are never mentioned.
fn map_patch(
    current: Option<&Value>,
    wanted: &BTreeMap<String, Option<String>>,
) -> Option<Map<String, Value>> {
    let mut out = Map::new();
    for (key, want) in wanted {
        let have = current.and_then(|m| m.get(key)).filter(|v| !v.is_null());
        match want {
            Some(v) if have.and_then(Value::as_str) != Some(v.as_str()) => {
                out.insert(key.clone(), Value::String(v.clone()));
            }
            None if have.is_some() => {
                out.insert(key.clone(), Value::Null);
            }
            _ => {}
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The strategic-merge patch of the Node's status that makes Vigil's conditions match `desired`,
/// or `None` when they already do. Conditions merge by `type` (their strategic-merge key), so the
/// patch names only Vigil's and kubelet's `Ready` (or node-problem-detector's) are left alone.
/// `lastTransitionTime` moves only when the status changes; `lastHeartbeatTime` on every write.
pub(crate) fn conditions_patch(node: &Value, desired: &NodeDesired, now: &str) -> Option<Value> {
    let current = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut changed = Vec::new();
    for want in &desired.conditions {
        let have = current
            .iter()
            .find(|c| c["type"].as_str() == Some(want.kind.as_str()));
        let same = |field: &str, value: &str| have.and_then(|h| h[field].as_str()) == Some(value);
        let status = want.status.as_str();
        if same("status", status) && same("reason", &want.reason) && same("message", &want.message)
        {
            continue;
        }
        let transition = match have {
            Some(h) if same("status", status) => h["lastTransitionTime"].clone(),
            _ => Value::String(now.to_string()),
        };
        changed.push(serde_json::json!({
            "type": want.kind,
            "status": status,
            "reason": want.reason,
            "message": want.message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": transition,
        }));
    }
    (!changed.is_empty()).then(|| serde_json::json!({ "status": { "conditions": changed } }))
}

/// The whole new taint list, or `None` when it equals the current one. Taints that are not
/// Vigil's are copied through untouched (every field, in order).
fn taints_patch(current: Option<&Value>, desired: &NodeDesired) -> Option<Vec<Value>> {
    fn field<'a>(t: &'a Value, name: &str) -> Option<&'a str> {
        t.get(name).and_then(Value::as_str)
    }
    let matches = |t: &Value, want: &Taint| {
        field(t, "key") == Some(want.key.as_str())
            && field(t, "effect") == Some(want.effect.as_str())
    };

    let existing: Vec<Value> = current
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out: Vec<Value> = existing
        .iter()
        .filter(|t| match field(t, "key") {
            Some(key) if desired.remove_taints.iter().any(|r| r == key) => {
                desired.add_taints.iter().any(|want| matches(t, want))
            }
            _ => true,
        })
        .cloned()
        .collect();
    for want in &desired.add_taints {
        match out.iter_mut().find(|t| matches(t, want)) {
            // Kubernetes allows one taint per key and effect: a different value is updated in
            // place rather than added next to it (which the API server would reject).
            Some(t) if field(t, "value").unwrap_or("") != want.value => {
                if let Some(obj) = t.as_object_mut() {
                    if want.value.is_empty() {
                        obj.remove("value");
                    } else {
                        obj.insert("value".into(), Value::String(want.value.clone()));
                    }
                }
            }
            Some(_) => {}
            None => out.push(taint_json(want)),
        }
    }
    (out != existing).then_some(out)
}

/// The API calls Vigil makes, for error messages and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    GetNode,
    PatchNode,
    /// The strategic-merge PATCH of the Node's status (Vigil's conditions).
    PatchNodeStatus,
    /// The Recorder's POST of a new Event.
    CreateEvent,
    /// The Recorder's PATCH of an Event's `series`, counting a repeat.
    PatchEvent,
}

impl Call {
    fn verb(self) -> &'static str {
        match self {
            Call::GetNode => "get",
            Call::PatchNode | Call::PatchNodeStatus | Call::PatchEvent => "patch",
            Call::CreateEvent => "create",
        }
    }

    fn resource(self) -> &'static str {
        match self {
            Call::GetNode | Call::PatchNode => "nodes",
            Call::PatchNodeStatus => "nodes/status",
            Call::CreateEvent | Call::PatchEvent => "events",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Call::GetNode | Call::PatchNode | Call::PatchNodeStatus => "",
            Call::CreateEvent | Call::PatchEvent => "events.k8s.io",
        }
    }

    fn is_event(self) -> bool {
        matches!(self, Call::CreateEvent | Call::PatchEvent)
    }

    /// Turns a `kube` error into one the operator can act on.
    fn error(self, node: &str, err: kube::Error) -> NodeError {
        if let kube::Error::Api(status) = &err {
            // The code is the HTTP status kube parsed the Status body from; the reason is the
            // fallback for a body without a code.
            let code = status.code;
            if code == 404 || status.reason == "NotFound" {
                if !self.is_event() {
                    return NodeError::NotFound {
                        node: node.to_string(),
                        op: self.verb(),
                    };
                }
            } else if code == 403 || status.reason == "Forbidden" {
                return NodeError::Forbidden {
                    verb: self.verb(),
                    resource: self.resource(),
                    group: self.group(),
                    message: status.message.clone(),
                };
            }
        }
        NodeError::Api {
            verb: self.verb(),
            resource: self.resource(),
            node: node.to_string(),
            source: err,
        }
    }
}

/// Whether the API server refused a write because the object changed since it was read.
fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409 || status.reason == "Conflict")
}

/// Whether the API server answered 404.
fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404 || status.reason == "NotFound")
}

/// What makes two Events the same Event to Vigil: node, type (`Normal`/`Warning`), reason and
/// note.
type EventKey = (String, &'static str, String, String);

/// The [`kev::Recorder`] for one [`EventKey`].
struct RecorderSlot {
    recorder: kev::Recorder,
    /// When its last successful publish started: within [`RECORDER_TTL`] of it, the Recorder
    /// still holds that Event and a repeat is a PATCH of its `series`, not a POST.
    last_ok: Option<Instant>,
}

impl RecorderSlot {
    fn holds_event(&self, now: Instant) -> bool {
        self.last_ok
            .is_some_and(|t| now.saturating_duration_since(t) < RECORDER_TTL)
    }
}

/// [`NodeApi`] over the Kubernetes API with `kube`.
pub struct KubeNodeApi {
    /// Nodes as untyped objects, on purpose: taints are written back as a whole list, and a
    /// round trip through typed structs would drop any taint field this k8s-openapi does not know.
    nodes: Api<DynamicObject>,
    /// One Recorder per distinct Event (see the `event` method), dropped when idle.
    recorders: Mutex<HashMap<EventKey, RecorderSlot>>,
    attempts: u32,
    backoff_base: Duration,
    /// Node name → uid, learnt from the last GET, so Events point at this incarnation of the
    /// Node without an extra request.
    uids: Mutex<BTreeMap<String, String>>,
    client: kube::Client,
}

impl KubeNodeApi {
    /// Labels, annotations and taints (a merge patch with the resourceVersion precondition,
    /// retried on conflict); the Node as last read.
    async fn reconcile_metadata(
        &self,
        node: &str,
        desired: &NodeDesired,
    ) -> Result<Value, NodeError> {
        let params = PatchParams {
            field_manager: Some(COMPONENT.into()),
            ..PatchParams::default()
        };
        let mut attempt = 1;
        // Agents that conflicted with each other must not retry in lockstep: jittered.
        let mut backoff = Backoff::jittered(self.backoff_base, self.backoff_base * 64);
        loop {
            let current = self
                .nodes
                .get(node)
                .await
                .map_err(|e| Call::GetNode.error(node, e))?;
            self.remember_uid(node, current.metadata.uid.as_deref());
            let current = serde_json::to_value(&current).map_err(|source| NodeError::Decode {
                node: node.to_string(),
                source,
            })?;
            let Some(patch) = merge_patch(&current, desired) else {
                tracing::trace!(node, "node already as desired; nothing to write");
                return Ok(current);
            };
            if patch.pointer("/spec/taints").is_some()
                && patch.pointer("/metadata/resourceVersion").is_none()
            {
                return Err(NodeError::NoResourceVersion {
                    node: node.to_string(),
                });
            }
            match self.nodes.patch(node, &params, &Patch::Merge(&patch)).await {
                Ok(patched) => {
                    tracing::info!(node, %patch, "patched node");
                    return serde_json::to_value(&patched).map_err(|source| NodeError::Decode {
                        node: node.to_string(),
                        source,
                    });
                }
                Err(e) if is_conflict(&e) && attempt < self.attempts => {
                    let delay = backoff.next_delay();
                    tracing::debug!(
                        node,
                        attempt,
                        ?delay,
                        "node changed since it was read (409); re-reading"
                    );
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) if is_conflict(&e) => {
                    return Err(NodeError::Conflict {
                        node: node.to_string(),
                        attempts: attempt,
                    })
                }
                Err(e) => return Err(Call::PatchNode.error(node, e)),
            }
        }
    }

    /// Vigil's conditions, on the status subresource (RBAC `patch nodes/status`).
    async fn reconcile_conditions(
        &self,
        node: &str,
        current: &Value,
        desired: &NodeDesired,
    ) -> Result<(), NodeError> {
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let Some(patch) = conditions_patch(current, desired, &now) else {
            return Ok(());
        };
        let params = PatchParams {
            field_manager: Some(COMPONENT.into()),
            ..PatchParams::default()
        };
        self.nodes
            .patch_status(node, &params, &Patch::Strategic(&patch))
            .await
            .map_err(|e| Call::PatchNodeStatus.error(node, e))?;
        tracing::info!(node, %patch, "patched node conditions");
        Ok(())
    }

    /// From the environment: the in-cluster ServiceAccount, or the kubeconfig (`KUBECONFIG`,
    /// `~/.kube/config`) when run by hand.
    pub(crate) async fn infer() -> Result<Self, NodeError> {
        let mut config = kube::Config::infer().await.map_err(|e| NodeError::Client {
            context: "no in-cluster ServiceAccount and no usable kubeconfig".into(),
            source: Box::new(e),
        })?;
        with_deadlines(&mut config, CALL_TIMEOUT);
        Self::from_config(config, "inferred config")
    }

    /// Against an API server at `url` with no credentials, e.g. `http://127.0.0.1:8001` from
    /// `kubectl proxy`, or a fake in tests.
    ///
    /// Must be called inside a Tokio runtime (the client spawns its connection task there);
    /// outside one it returns an error rather than panicking.
    pub fn from_url(url: &str) -> Result<Self, NodeError> {
        Self::from_url_with_timeout(url, CALL_TIMEOUT)
    }

    /// [`Self::from_url`] with its own deadline for every call.
    pub fn from_url_with_timeout(url: &str, timeout: Duration) -> Result<Self, NodeError> {
        let parsed = url.parse().map_err(|e| NodeError::Client {
            context: format!("API server URL {url:?}"),
            source: Box::new(e),
        })?;
        let mut config = kube::Config::new(parsed);
        with_deadlines(&mut config, timeout);
        Self::from_config(config, url)
    }

    /// Retry policy for conflicting writes: `attempts` in all (at least 1), backoff from `base`.
    pub fn with_retry(mut self, attempts: u32, base: Duration) -> Self {
        self.attempts = attempts.max(1);
        self.backoff_base = base;
        self
    }

    fn from_config(config: kube::Config, context: &str) -> Result<Self, NodeError> {
        debug_assert!(config.read_timeout.is_some(), "every call has a deadline");
        // NB: `Client::try_from` spawns onto the current Tokio runtime and panics without one.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(NodeError::Client {
                context: context.to_string(),
                source: "not called from within a Tokio runtime".into(),
            });
        }
        let client = kube::Client::try_from(config).map_err(|e| NodeError::Client {
            context: context.to_string(),
            source: Box::new(e),
        })?;
        Ok(Self {
            nodes: Api::all_with(client.clone(), &ApiResource::erase::<Node>(&())),
            recorders: Mutex::new(HashMap::new()),
            client,
            attempts: DEFAULT_ATTEMPTS,
            backoff_base: DEFAULT_BACKOFF_BASE,
            uids: Mutex::new(BTreeMap::new()),
        })
    }

    /// Whether this agent's identity may `verb` the `resource` of API `group` (`""` for core; a
    /// SelfSubjectAccessReview, which every authenticated identity may create): `vigil doctor`
    /// checks the RBAC with it.
    pub(crate) async fn can_i(
        &self,
        group: &str,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> Result<bool, NodeError> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        };
        // `nodes/status` is the resource `nodes`, subresource `status`, to the authorizer.
        let (base, subresource) = match resource.split_once('/') {
            Some((r, sub)) => (r, Some(sub.to_string())),
            None => (resource, None),
        };
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.to_string()),
                    verb: Some(verb.to_string()),
                    resource: Some(base.to_string()),
                    subresource,
                    namespace: namespace.map(str::to_string),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|e| NodeError::Client {
                context: format!("access review of {verb} {resource} ({group:?})"),
                source: Box::new(e),
            })?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }

    /// Read the Node (for `vigil doctor`): its name and labels count, or the error.
    pub async fn get_node(&self, node: &str) -> Result<(), NodeError> {
        self.nodes
            .get(node)
            .await
            .map(|_| ())
            .map_err(|e| Call::GetNode.error(node, e))
    }

    fn remember_uid(&self, node: &str, uid: Option<&str>) {
        if let Some(uid) = uid {
            // A poisoned lock only means another thread panicked mid-insert; the map is still
            // a valid cache.
            let mut uids = self.uids.lock().unwrap_or_else(|e| e.into_inner());
            uids.insert(node.to_string(), uid.to_string());
        }
    }

    fn uid_of(&self, node: &str) -> Option<String> {
        let uids = self.uids.lock().unwrap_or_else(|e| e.into_inner());
        uids.get(node).cloned()
    }

    /// The Recorder for `key` (a new one with `fresh`, or when there is none), and whether it
    /// still holds the Event, so that publishing is a PATCH; idle recorders are dropped.
    fn recorder(&self, key: &EventKey, fresh: bool) -> (kev::Recorder, bool) {
        let now = Instant::now();
        let mut recorders = self.recorders.lock().unwrap_or_else(|e| e.into_inner());
        recorders.retain(|_, slot| slot.holds_event(now));
        if fresh {
            recorders.remove(key);
        }
        let slot = recorders
            .entry(key.clone())
            .or_insert_with(|| RecorderSlot {
                recorder: kev::Recorder::new(
                    self.client.clone(),
                    kev::Reporter {
                        controller: COMPONENT.into(),
                        instance: Some(key.0.clone()),
                    },
                ),
                last_ok: None,
            });
        (slot.recorder.clone(), slot.holds_event(now))
    }

    fn published(&self, key: &EventKey, started: Instant) {
        let mut recorders = self.recorders.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = recorders.get_mut(key) {
            slot.last_ok = Some(started);
        }
    }

    /// One publish through the Recorder for `key`; `Err` carries whether it was a PATCH.
    async fn publish(
        &self,
        key: &EventKey,
        fresh: bool,
        event: &kev::Event,
        regarding: &ObjectReference,
    ) -> Result<(), (Call, kube::Error)> {
        let (recorder, repeat) = self.recorder(key, fresh);
        let started = Instant::now();
        match recorder.publish(event, regarding).await {
            Ok(()) => {
                self.published(key, started);
                Ok(())
            }
            Err(e) if repeat => Err((Call::PatchEvent, e)),
            Err(e) => Err((Call::CreateEvent, e)),
        }
    }
}

/// The Event's `action` (what Vigil did to the Node), from its reason.
fn action_for(reason: &str) -> &'static str {
    match reason {
        "VigilCheckpoint" => "Checkpoint",
        "VigilPerformMaintenance" => "RequestMaintenance",
        _ => "UpdateNode",
    }
}

/// `message` cut to the [`NOTE_LIMIT`] the API server allows, on a char boundary, marked `…`.
fn note(message: &str) -> String {
    if message.len() <= NOTE_LIMIT {
        return message.to_string();
    }
    const MARK: &str = "…";
    let mut end = NOTE_LIMIT - MARK.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &message[..end])
}

#[async_trait]
impl NodeApi for KubeNodeApi {
    async fn reconcile(&self, node: &str, desired: &NodeDesired) -> Result<(), NodeError> {
        let current = self.reconcile_metadata(node, desired).await?;
        self.reconcile_conditions(node, &current, desired).await
    }

    /// Through `kube`'s events.k8s.io [`kev::Recorder`]: the first Event is a POST to
    /// `/apis/events.k8s.io/v1/namespaces/default/events` (named `<node>.<hex nanoseconds>`,
    /// `regarding` the Node, `reportingController` `vigil`, `reportingInstance` the node name,
    /// `action`, `reason`, `note`, `type`, `eventTime`), and a repeat within six minutes is a
    /// merge-patch PATCH of that Event's `series` (`count`, `lastObservedTime`) instead of a new
    /// object.
    ///
    /// NB: the Recorder takes two Events for the same one when type, action, reason and reporter
    /// agree, whatever their notes — and a repeat keeps the first note, which the API server
    /// forbids changing. Vigil's notes carry facts (a checkpoint round's counts, a maintenance
    /// window), so one Recorder is kept per (node, type, reason, note): an Event with a new
    /// note is a new object, an identical one is counted. If the counted Event is gone (deleted,
    /// or expired by the API server's `--event-ttl`), the PATCH's 404 starts afresh with a POST.
    async fn event(
        &self,
        node: &str,
        reason: &str,
        message: &str,
        kind: EventType,
    ) -> Result<(), NodeError> {
        let note = note(message);
        let key: EventKey = (
            node.to_string(),
            kind.as_str(),
            reason.to_string(),
            note.clone(),
        );
        let event = kev::Event {
            type_: match kind {
                EventType::Normal => kev::EventType::Normal,
                EventType::Warning => kev::EventType::Warning,
            },
            reason: reason.to_string(),
            note: Some(note),
            action: action_for(reason).to_string(),
            secondary: None,
        };
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: self.uid_of(node),
            ..ObjectReference::default()
        };
        let result = match self.publish(&key, false, &event, &regarding).await {
            Err((Call::PatchEvent, e)) if is_not_found(&e) => {
                tracing::debug!(
                    node,
                    reason,
                    "the Event to count on is gone; recording anew"
                );
                self.publish(&key, true, &event, &regarding).await
            }
            other => other,
        };
        result.map_err(|(call, e)| call.error(node, e))
    }
}

/// The deadline of one API call. kube's default (295 s, sized for watches) would hold the
/// maintenance controller that long on an API server that accepts and never answers; Vigil
/// makes no watch calls here, and a Node write that times out is retried on the next tick.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

fn with_deadlines(config: &mut kube::Config, timeout: Duration) {
    config.connect_timeout = Some(timeout.min(Duration::from_secs(5)));
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "n1",
                "uid": "u-1",
                "resourceVersion": "7",
                "labels": {"kubernetes.io/hostname": "n1", "vigil.dev/maintenance": "pending"},
                "annotations": {"other/note": "x", "vigil.dev/window-start": "t0"}
            },
            "spec": {
                "taints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
                ]
            }
        })
    }

    fn labels(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        }
    }

    const GPU: &str = r#"{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}"#;

    #[test]
    fn merge_patch_table() {
        let gpu: Value = serde_json::from_str(GPU).unwrap();
        let cases: Vec<(&str, Value, NodeDesired, Option<Value>)> = vec![
            ("nothing desired", node(), NodeDesired::default(), None),
            (
                "sets a new label, leaves foreign ones alone",
                node(),
                NodeDesired {
                    labels: labels(&[("vigil.dev/gpu", Some("ok"))]),
                    ..NodeDesired::default()
                },
                Some(json!({"metadata": {"labels": {"vigil.dev/gpu": "ok"}}})),
            ),
            (
                "changes a label value",
                node(),
                NodeDesired {
                    labels: labels(&[("vigil.dev/maintenance", Some("ongoing"))]),
                    ..NodeDesired::default()
                },
                Some(json!({"metadata": {"labels": {"vigil.dev/maintenance": "ongoing"}}})),
            ),
            (
                "label already right: no patch",
                node(),
                NodeDesired {
                    labels: labels(&[("vigil.dev/maintenance", Some("pending"))]),
                    ..NodeDesired::default()
                },
                None,
            ),
            (
                "removes a label with null",
                node(),
                NodeDesired {
                    labels: labels(&[("vigil.dev/maintenance", None)]),
                    ..NodeDesired::default()
                },
                Some(json!({"metadata": {"labels": {"vigil.dev/maintenance": null}}})),
            ),
            (
                "removing an absent label: no patch",
                node(),
                NodeDesired {
                    labels: labels(&[("vigil.dev/absent", None)]),
                    annotations: labels(&[("vigil.dev/absent", None)]),
                    ..NodeDesired::default()
                },
                None,
            ),
            (
                "sets and removes annotations",
                node(),
                NodeDesired {
                    annotations: labels(&[
                        ("vigil.dev/window-start", None),
                        ("vigil.dev/window-end", Some("t1")),
                    ]),
                    ..NodeDesired::default()
                },
                Some(json!({"metadata": {"annotations": {
                    "vigil.dev/window-start": null,
                    "vigil.dev/window-end": "t1"
                }}})),
            ),
            (
                "node without labels or annotations",
                json!({"metadata": {"name": "n1", "resourceVersion": "1"}}),
                NodeDesired {
                    labels: labels(&[("vigil.dev/a", Some("1")), ("vigil.dev/b", None)]),
                    annotations: labels(&[("vigil.dev/c", Some("2"))]),
                    ..NodeDesired::default()
                },
                Some(json!({"metadata": {
                    "labels": {"vigil.dev/a": "1"},
                    "annotations": {"vigil.dev/c": "2"}
                }})),
            ),
            (
                "adds a taint after the foreign one, with resourceVersion",
                node(),
                NodeDesired {
                    add_taints: vec![taint("vigil.dev/maintenance", "true", "NoSchedule")],
                    ..NodeDesired::default()
                },
                Some(json!({
                    "metadata": {"resourceVersion": "7"},
                    "spec": {"taints": [
                        gpu.clone(),
                        {"key": "vigil.dev/maintenance", "value": "true", "effect": "NoSchedule"}
                    ]}
                })),
            ),
            (
                "identical taint already there: not duplicated, no patch",
                node(),
                NodeDesired {
                    add_taints: vec![taint("nvidia.com/gpu", "present", "NoSchedule")],
                    ..NodeDesired::default()
                },
                None,
            ),
            (
                "same key and effect, other value: updated in place",
                node(),
                NodeDesired {
                    add_taints: vec![taint("nvidia.com/gpu", "absent", "NoSchedule")],
                    ..NodeDesired::default()
                },
                Some(json!({
                    "metadata": {"resourceVersion": "7"},
                    "spec": {"taints": [
                        {"key": "nvidia.com/gpu", "value": "absent", "effect": "NoSchedule"}
                    ]}
                })),
            ),
            (
                "removes only Vigil's taint key, keeps the others",
                json!({
                    "metadata": {"name": "n1", "resourceVersion": "9"},
                    "spec": {"taints": [
                        {"key": "vigil.dev/maintenance", "value": "true", "effect": "NoSchedule"},
                        gpu.clone(),
                        {"key": "vigil.dev/maintenance", "effect": "NoExecute",
                         "timeAdded": "2025-01-01T00:00:00Z"}
                    ]}
                }),
                NodeDesired {
                    remove_taints: vec!["vigil.dev/maintenance".into()],
                    ..NodeDesired::default()
                },
                Some(json!({
                    "metadata": {"resourceVersion": "9"},
                    "spec": {"taints": [gpu.clone()]}
                })),
            ),
            (
                "removing an absent taint: no patch",
                node(),
                NodeDesired {
                    remove_taints: vec!["vigil.dev/maintenance".into()],
                    ..NodeDesired::default()
                },
                None,
            ),
            (
                "removing the last taint sends an empty list",
                json!({
                    "metadata": {"name": "n1", "resourceVersion": "3"},
                    "spec": {"taints": [{"key": "vigil.dev/m", "effect": "NoSchedule"}]}
                }),
                NodeDesired {
                    remove_taints: vec!["vigil.dev/m".into()],
                    ..NodeDesired::default()
                },
                Some(json!({"metadata": {"resourceVersion": "3"}, "spec": {"taints": []}})),
            ),
            (
                "switching effect: remove key + add keeps the wanted effect only",
                json!({
                    "metadata": {"name": "n1", "resourceVersion": "4"},
                    "spec": {"taints": [{"key": "vigil.dev/m", "effect": "NoSchedule"}]}
                }),
                NodeDesired {
                    add_taints: vec![taint("vigil.dev/m", "", "NoExecute")],
                    remove_taints: vec!["vigil.dev/m".into()],
                    ..NodeDesired::default()
                },
                Some(json!({
                    "metadata": {"resourceVersion": "4"},
                    "spec": {"taints": [{"key": "vigil.dev/m", "effect": "NoExecute"}]}
                })),
            ),
            (
                "remove + add of the same present taint: no patch",
                json!({
                    "metadata": {"name": "n1", "resourceVersion": "4"},
                    "spec": {"taints": [{"key": "vigil.dev/m", "effect": "NoSchedule"}]}
                }),
                NodeDesired {
                    add_taints: vec![taint("vigil.dev/m", "", "NoSchedule")],
                    remove_taints: vec!["vigil.dev/m".into()],
                    ..NodeDesired::default()
                },
                None,
            ),
            (
                "no spec at all, labels and a taint together",
                json!({"metadata": {"name": "n1", "resourceVersion": "2"}}),
                NodeDesired {
                    labels: labels(&[("vigil.dev/maintenance", Some("terminating"))]),
                    add_taints: vec![taint("vigil.dev/maintenance", "", "NoSchedule")],
                    ..NodeDesired::default()
                },
                Some(json!({
                    "metadata": {
                        "resourceVersion": "2",
                        "labels": {"vigil.dev/maintenance": "terminating"}
                    },
                    "spec": {"taints": [{"key": "vigil.dev/maintenance", "effect": "NoSchedule"}]}
                })),
            ),
            (
                "odd API data (non-object taint, non-string label) is kept, not a panic",
                json!({
                    "metadata": {"name": "n1", "resourceVersion": "5", "labels": {"vigil.dev/x": 1}},
                    "spec": {"taints": ["weird", null]}
                }),
                NodeDesired {
                    labels: labels(&[("vigil.dev/x", Some("1"))]),
                    add_taints: vec![taint("vigil.dev/m", "", "NoSchedule")],
                    ..NodeDesired::default()
                },
                Some(json!({
                    "metadata": {"resourceVersion": "5", "labels": {"vigil.dev/x": "1"}},
                    "spec": {"taints": ["weird", null, {"key": "vigil.dev/m", "effect": "NoSchedule"}]}
                })),
            ),
        ];
        for (name, node, desired, want) in cases {
            assert_eq!(merge_patch(&node, &desired), want, "case: {name}");
        }
    }

    /// Applying the patch (RFC 7386) then computing again yields nothing: one write converges.
    #[test]
    fn merge_patch_converges_in_one_write() {
        fn apply(target: &mut Value, patch: &Value) {
            match (target.as_object_mut(), patch.as_object()) {
                (Some(t), Some(p)) => {
                    for (k, v) in p {
                        if v.is_null() {
                            t.remove(k);
                        } else {
                            apply(t.entry(k.clone()).or_insert(Value::Null), v);
                        }
                    }
                }
                _ => *target = patch.clone(),
            }
        }
        let desired = NodeDesired {
            labels: labels(&[
                ("vigil.dev/maintenance", None),
                ("vigil.dev/gpu", Some("ok")),
            ]),
            annotations: labels(&[("vigil.dev/window-end", Some("t1"))]),
            add_taints: vec![taint("vigil.dev/maintenance", "true", "NoSchedule")],
            remove_taints: vec!["vigil.dev/old".into()],
            conditions: vec![],
        };
        let mut n = node();
        let patch = merge_patch(&n, &desired).expect("a first patch");
        apply(&mut n, &patch);
        assert_eq!(merge_patch(&n, &desired), None);
    }

    #[test]
    fn notes_fit_the_api_limit_on_a_char_boundary() {
        assert_eq!(note("short"), "short");
        let exact = "a".repeat(NOTE_LIMIT);
        assert_eq!(note(&exact), exact);
        let long = "é".repeat(NOTE_LIMIT);
        let cut = note(&long);
        assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }

    #[test]
    fn actions_are_short_and_never_empty() {
        for reason in [
            "VigilCheckpoint",
            "VigilPerformMaintenance",
            "VigilGpuFailed",
            "",
        ] {
            let action = action_for(reason);
            assert!(
                !action.is_empty() && action.len() <= 128,
                "{reason}: {action}"
            );
        }
    }

    #[test]
    fn error_ops_are_fixed_labels() {
        let forbidden = |call: Call| NodeError::Forbidden {
            verb: call.verb(),
            resource: call.resource(),
            group: call.group(),
            message: String::new(),
        };
        assert_eq!(forbidden(Call::GetNode).op(), "get");
        assert_eq!(forbidden(Call::PatchNode).op(), "patch");
        assert_eq!(forbidden(Call::CreateEvent).op(), "event");
        assert_eq!(forbidden(Call::PatchEvent).op(), "event");
        let msg = forbidden(Call::PatchEvent).to_string();
        assert!(
            msg.contains(
                "{apiGroups: [\"events.k8s.io\"], resources: [\"events\"], verbs: [\"patch\"]}"
            ),
            "{msg}"
        );
        let nf = NodeError::NotFound {
            node: "n1".into(),
            op: "get",
        };
        assert_eq!(nf.op(), "get");
        assert!(nf.to_string().contains("NODE_NAME"), "{nf}");
        let msg = forbidden(Call::PatchNode).to_string();
        assert!(
            msg.contains("resources: [\"nodes\"], verbs: [\"patch\"]"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn bad_url_is_an_error_not_a_panic() {
        assert!(matches!(
            KubeNodeApi::from_url("not a url"),
            Err(NodeError::Client { .. })
        ));
    }

    #[test]
    fn outside_a_runtime_is_an_error_not_a_panic() {
        assert!(matches!(
            KubeNodeApi::from_url("http://127.0.0.1:1"),
            Err(NodeError::Client { .. })
        ));
    }
}
