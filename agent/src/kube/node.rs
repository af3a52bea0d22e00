//! The Kubernetes Node: Vigil's labels, annotations and taints, and Events.
//!
//! Map:
//! - [`NodeDesired`] says which Vigil-owned keys should hold which values; nothing else on the
//!   Node is Vigil's to touch (other controllers, cloud agents and people write there too).
//! - [`merge_patch`] (node/patch.rs) is the pure core: (Node as JSON, desired) → the smallest JSON
//!   merge patch (RFC 7386) that gets there, or `None` when the Node already matches, so a steady
//!   state costs one GET per cycle and no write.
//! - [`NodeApi`] is the side-effecting seam the agent calls; [`KubeNodeApi`] implements it with
//!   `kube`, and tests plug in either a fake API server (`tests/common/fake_kube.rs`) or their own
//!   implementation.
//!
//! - Events go through `kube`'s events.k8s.io [`Recorder`](kube::runtime::events::Recorder), which counts a repeat of an Event on
//!   the first one (`series.count`, one PATCH) instead of creating another object; see
//!   [`KubeNodeApi`]'s `event` for how Vigil keys its recorders.
//!
//! RBAC the agent needs (least privilege): `get` and `patch` on `nodes` (core API group `""`),
//! `create` and `patch` on `events` in `events.k8s.io`. A 403 names the missing rule (see
//! [`NodeError::Forbidden`], node/error.rs).

// NB: real time on purpose: kube's Recorder forgets an Event on its own wall clock, so the mirror
// of that cache here (`RecorderSlot`) must run on real time too, not on a clock tests drive.
#![allow(clippy::disallowed_types)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events as kev;
use serde_json::Value;

use crate::backoff::Backoff;
use crate::kube::client::CALL_TIMEOUT;

mod error;
mod patch;

pub use error::NodeError;
use error::{is_conflict, is_not_found, Call};
pub(crate) use patch::Cleanup;
use patch::{cleanup_plan, conditions_patch, delete_conditions_patch, merge_patch};

pub use crate::vocab::node::{EventType, NodeDesired, Taint};

/// What a Node call gives: its answer, or the [`NodeError`] that stopped it.
type Result<T, E = NodeError> = std::result::Result<T, E>;

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

/// Writes to this machine's Kubernetes Node.
#[async_trait]
pub trait NodeApi: Send + Sync {
    /// Makes the Vigil-owned labels, annotations and taints of `node` match `desired`, leaving
    /// everything else exactly as it is, including what other writers add meanwhile.
    ///
    /// Idempotent: when the Node already matches, nothing is written. Conflicts with other
    /// writers are retried (re-read, recompute) with backoff; giving up is
    /// [`NodeError::Conflict`], and the next call starts afresh.
    async fn reconcile(&self, node: &str, desired: &NodeDesired) -> Result<()>;

    /// Records an Event about `node` (visible in `kubectl describe node`), with `reason` a short
    /// CamelCase word (e.g. `MaintenancePending`) and `message` for humans. A repeat of the same
    /// Event may be counted on the earlier one rather than recorded anew.
    async fn event(&self, node: &str, reason: &str, message: &str, kind: EventType) -> Result<()>;
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
        self.last_ok.is_some_and(|t| now.saturating_duration_since(t) < RECORDER_TTL)
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
    /// Read the Node, let `plan` compute a merge patch of its metadata and taints from it, and
    /// write it; on a conflict (someone wrote in between) read, recompute and write again, with
    /// jittered backoff. Returns the plan's value and the Node as written (or as read, when the
    /// plan asked for nothing).
    async fn patch_metadata<T>(
        &self,
        node: &str,
        what: &str,
        mut plan: impl FnMut(&Value) -> (T, Option<Value>),
    ) -> Result<(T, Value)> {
        // NB: `PatchParams::apply` only names the field manager (not a server-side apply).
        let params = PatchParams::apply(COMPONENT);
        let decode = |source| NodeError::Decode { node: node.to_string(), source };
        let mut attempt = 1;
        // Agents that conflicted with each other must not retry in lockstep: jittered.
        let mut backoff = Backoff::jittered(self.backoff_base, self.backoff_base * 64);
        loop {
            let current = self.nodes.get(node).await.map_err(|e| Call::GetNode.error(node, e))?;
            if let Some(uid) = current.metadata.uid.clone() {
                // A poisoned lock only means another thread panicked mid-insert; the map is
                // still a valid cache.
                self.uids.lock().unwrap_or_else(|e| e.into_inner()).insert(node.into(), uid);
            }
            let current = serde_json::to_value(&current).map_err(decode)?;
            let (planned, patch) = plan(&current);
            let Some(patch) = patch else {
                tracing::trace!(node, "node already as desired; nothing to write");
                return Ok((planned, current));
            };
            // NB: a patch of the taints replaces the whole list: it must carry the
            // `resourceVersion` it was planned from, so a concurrent writer's taint is never
            // dropped (the API server answers 409).
            let rewrites_taints = patch.pointer("/spec/taints").is_some();
            if rewrites_taints && patch.pointer("/metadata/resourceVersion").is_none() {
                return Err(NodeError::NoResourceVersion { node: node.to_string() });
            }
            match self.nodes.patch(node, &params, &Patch::Merge(&patch)).await {
                Ok(patched) => {
                    tracing::info!(node, %patch, "{what}");
                    return Ok((planned, serde_json::to_value(&patched).map_err(decode)?));
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
                    return Err(NodeError::Conflict { node: node.to_string(), attempts: attempt })
                }
                Err(e) => return Err(Call::PatchNode.error(node, e)),
            }
        }
    }

    /// A strategic-merge `patch` of the status subresource (Vigil's conditions; RBAC `patch
    /// nodes/status`), when there is one, logged as `what`.
    async fn patch_status(&self, node: &str, patch: Option<Value>, what: &str) -> Result<()> {
        let Some(patch) = patch else { return Ok(()) };
        let params = PatchParams::apply(COMPONENT);
        let patched = self.nodes.patch_status(node, &params, &Patch::Strategic(&patch)).await;
        patched.map_err(|e| Call::PatchNodeStatus.error(node, e))?;
        tracing::info!(node, %patch, "{what}");
        Ok(())
    }

    /// `vigil cleanup`: takes every label and annotation under `prefix`, the taints with
    /// `taint_keys` and the conditions of `condition_types` off `node`, and nothing else; returns
    /// what was (or, with `dry_run`, would be) removed — empty when nothing of Vigil's is left —
    /// and which of `shared_labels` are set (named, never removed).
    ///
    /// Labels, annotations and taints are one merge patch of the Node (RBAC `patch nodes`), the
    /// taint list written back whole with the resourceVersion precondition and re-read and
    /// recomputed on a conflict, as the agent's reconcile does; the conditions are one
    /// strategic-merge patch of the status (RBAC `patch nodes/status`) that deletes only them
    /// (`$patch: delete` by their merge key, `type`).
    pub async fn cleanup(
        &self,
        node: &str,
        prefix: &str,
        taint_keys: &[String],
        condition_types: &[&str],
        shared_labels: &[&str],
        dry_run: bool,
    ) -> Result<Cleanup> {
        let what = "removed Vigil's labels, annotations and taints";
        let plan = |current: &Value| {
            let (plan, desired) =
                cleanup_plan(current, prefix, taint_keys, condition_types, shared_labels);
            (plan, merge_patch(current, &desired).filter(|_| !dry_run))
        };
        let (plan, _) = self.patch_metadata(node, what, plan).await?;
        let patch = delete_conditions_patch(&plan.conditions).filter(|_| !dry_run);
        self.patch_status(node, patch, "removed Vigil's conditions").await?;
        Ok(plan)
    }

    /// Against `kubernetes.api_url` ([`Self::from_url_with_timeout`]), or (empty) from the
    /// environment: the in-cluster ServiceAccount, or the kubeconfig (`KUBECONFIG`,
    /// `~/.kube/config`) when run by hand.
    pub(crate) async fn connect(api_url: &str) -> Result<Self> {
        if !api_url.is_empty() {
            return Self::from_url_with_timeout(api_url, CALL_TIMEOUT);
        }
        let none = "no in-cluster ServiceAccount and no usable kubeconfig";
        let config = kube::Config::infer().await.map_err(|e| NodeError::client(none, e))?;
        Self::from_config(config, CALL_TIMEOUT, "inferred config")
    }

    /// Against an API server at `url` with no credentials, e.g. `http://127.0.0.1:8001` from
    /// `kubectl proxy`, or a fake in tests, with `timeout` the deadline of every call.
    ///
    /// Must be called inside a Tokio runtime (the client spawns its connection task there);
    /// outside one it returns an error rather than panicking.
    pub fn from_url_with_timeout(url: &str, timeout: Duration) -> Result<Self> {
        let parsed =
            url.parse().map_err(|e| NodeError::client(format!("API server URL {url:?}"), e))?;
        Self::from_config(kube::Config::new(parsed), timeout, url)
    }

    /// The client of `config`, every call bounded by `timeout` (the agent's: [`CALL_TIMEOUT`]).
    /// kube's default (295 s, sized for watches) would hold the maintenance controller that long
    /// on an API server that accepts and never answers; Vigil makes no watch calls here, and a
    /// Node write that times out is retried on the next tick.
    fn from_config(mut config: kube::Config, timeout: Duration, context: &str) -> Result<Self> {
        config.connect_timeout = Some(timeout.min(Duration::from_secs(5)));
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        // NB: `Client::try_from` spawns onto the current Tokio runtime and panics without one.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(NodeError::client(context, "not called from within a Tokio runtime"));
        }
        let client = kube::Client::try_from(config).map_err(|e| NodeError::client(context, e))?;
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
    ) -> Result<bool> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        };
        // `nodes/status` is the resource `nodes`, subresource `status`, to the authorizer.
        let (base, subresource) =
            resource.split_once('/').map_or((resource, None), |(r, sub)| (r, Some(sub)));
        let resource_attributes = Some(ResourceAttributes {
            group: Some(group.to_string()),
            verb: Some(verb.to_string()),
            resource: Some(base.to_string()),
            subresource: subresource.map(str::to_string),
            namespace: namespace.map(str::to_string),
            ..ResourceAttributes::default()
        });
        let spec = SelfSubjectAccessReviewSpec { resource_attributes, ..Default::default() };
        let review = SelfSubjectAccessReview { spec, ..Default::default() };
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let answer = api.create(&kube::api::PostParams::default(), &review).await.map_err(|e| {
            NodeError::client(format!("access review of {verb} {resource} ({group:?})"), e)
        })?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }

    /// Read the Node (for `vigil doctor`): `Ok` when it is readable, or the error.
    pub(crate) async fn get_node(&self, node: &str) -> Result<()> {
        self.nodes.get(node).await.map(|_| ()).map_err(|e| Call::GetNode.error(node, e))
    }

    /// The Recorder for `key` (a new one when there is none), and whether it still holds the
    /// Event, so that publishing is a PATCH; idle recorders are dropped.
    fn recorder(&self, key: &EventKey) -> (kev::Recorder, bool) {
        let now = Instant::now();
        let mut recorders = self.recorders.lock().unwrap_or_else(|e| e.into_inner());
        recorders.retain(|_, slot| slot.holds_event(now));
        let slot = recorders.entry(key.clone()).or_insert_with(|| RecorderSlot {
            recorder: kev::Recorder::new(
                self.client.clone(),
                kev::Reporter { controller: COMPONENT.into(), instance: Some(key.0.clone()) },
            ),
            last_ok: None,
        });
        (slot.recorder.clone(), slot.holds_event(now))
    }

    /// One publish through the Recorder for `key`; `Err` carries whether it was a PATCH.
    async fn publish(
        &self,
        key: &EventKey,
        event: &kev::Event,
        regarding: &ObjectReference,
    ) -> Result<(), (Call, kube::Error)> {
        let (recorder, repeat) = self.recorder(key);
        let started = Instant::now();
        if let Err(e) = recorder.publish(event, regarding).await {
            return Err((if repeat { Call::PatchEvent } else { Call::CreateEvent }, e));
        }
        let mut recorders = self.recorders.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = recorders.get_mut(key) {
            slot.last_ok = Some(started);
        }
        Ok(())
    }
}

/// The tests' constructors (the agent connects through `connect`).
#[cfg(any(test, feature = "bench"))]
impl KubeNodeApi {
    /// [`Self::from_url_with_timeout`] with the agent's deadline.
    pub fn from_url(url: &str) -> Result<Self> {
        Self::from_url_with_timeout(url, CALL_TIMEOUT)
    }

    /// Retry policy for conflicting writes: `attempts` in all (at least 1), backoff from `base`.
    pub fn with_retry(mut self, attempts: u32, base: Duration) -> Self {
        self.attempts = attempts.max(1);
        self.backoff_base = base;
        self
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
    format!("{}{MARK}", crate::vocab::node::truncate(message, NOTE_LIMIT - MARK.len()))
}

#[async_trait]
impl NodeApi for KubeNodeApi {
    async fn reconcile(&self, node: &str, desired: &NodeDesired) -> Result<()> {
        // Labels, annotations and taints (a merge patch with the resourceVersion precondition,
        // retried on conflict), then the conditions, planned from the Node as last read.
        let plan = |current: &Value| ((), merge_patch(current, desired));
        let ((), current) = self.patch_metadata(node, "patched node", plan).await?;
        let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let patch = conditions_patch(&current, desired, &now);
        self.patch_status(node, patch, "patched node conditions").await
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
    async fn event(&self, node: &str, reason: &str, message: &str, kind: EventType) -> Result<()> {
        let note = note(message);
        let key: EventKey = (node.to_string(), kind.as_str(), reason.to_string(), note.clone());
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
            uid: self.uids.lock().unwrap_or_else(|e| e.into_inner()).get(node).cloned(),
            ..ObjectReference::default()
        };
        let result = match self.publish(&key, &event, &regarding).await {
            Err((Call::PatchEvent, e)) if is_not_found(&e) => {
                tracing::debug!(node, reason, "the Event to count on is gone; recording anew");
                // A new Recorder, which knows nothing to count on: the next publish is a POST.
                self.recorders.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                self.publish(&key, &event, &regarding).await
            }
            other => other,
        };
        result.map_err(|(call, e)| call.error(node, e))
    }
}

#[cfg(test)]
mod tests;
