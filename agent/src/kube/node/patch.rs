//! The pure core of the Node reconcile: (Node as JSON, desired) → the smallest patch that gets
//! there, or `None` when the Node already matches. No I/O, so every rule (foreign keys left alone,
//! one taint per key and effect, the resourceVersion precondition) is a table-driven test here.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{NodeDesired, Taint};

/// The taint as the API writes it: `value` is omitted when empty (Go's `omitempty`), so a taint
/// we add compares equal to the same taint read back.
fn taint_json(t: &Taint) -> Value {
    let mut taint = json!({ "key": t.key, "effect": t.effect });
    if !t.value.is_empty() {
        taint["value"] = Value::String(t.value.clone());
    }
    taint
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
    for (key, wanted) in [("labels", &desired.labels), ("annotations", &desired.annotations)] {
        if let Some(changes) = map_patch(&node["metadata"][key], wanted) {
            metadata.insert(key.into(), changes);
        }
    }

    let mut patch = Map::new();
    if let Some(taints) = taints_patch(node.pointer("/spec/taints"), desired) {
        // NB: the precondition. Without it a taint added by someone else between our GET and
        // our PATCH would be erased by our whole-list replacement.
        if let Some(rv) = node.pointer("/metadata/resourceVersion") {
            metadata.insert("resourceVersion".into(), rv.clone());
        }
        patch.insert("spec".into(), json!({ "taints": taints }));
    }
    if !metadata.is_empty() {
        patch.insert("metadata".into(), Value::Object(metadata));
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

/// The entries of a label or annotation map (`current`, `null` when absent) that must change:
/// `Some` sets, `None` removes (`null` in a merge patch). Keys not in `wanted` are never mentioned.
fn map_patch(current: &Value, wanted: &BTreeMap<String, Option<String>>) -> Option<Value> {
    let mut out = Map::new();
    for (key, want) in wanted {
        let have = current.get(key).filter(|v| !v.is_null());
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
    (!out.is_empty()).then_some(Value::Object(out))
}

/// The strategic-merge patch of the Node's status that makes Vigil's conditions match `desired`,
/// or `None` when they already do. Conditions merge by `type` (their strategic-merge key), so the
/// patch names only Vigil's and kubelet's `Ready` (or node-problem-detector's) are left alone.
/// `lastTransitionTime` moves only when the status changes; `lastHeartbeatTime` on every write.
/// A type in `remove_conditions` that the Node has is deleted (`$patch: delete`, by its key).
pub(crate) fn conditions_patch(node: &Value, desired: &NodeDesired, now: &str) -> Option<Value> {
    let current: Vec<&Value> = items(node, "/status/conditions").collect();
    let mut changed = Vec::new();
    for want in &desired.conditions {
        let have = current.iter().find(|c| c["type"].as_str() == Some(want.kind.as_str()));
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
        changed.push(json!({
            "type": want.kind,
            "status": status,
            "reason": want.reason,
            "message": want.message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": transition,
        }));
    }
    for kind in &desired.remove_conditions {
        if current.iter().any(|c| c["type"].as_str() == Some(kind.as_str())) {
            changed.push(json!({ "type": kind, "$patch": "delete" }));
        }
    }
    (!changed.is_empty()).then(|| json!({ "status": { "conditions": changed } }))
}

/// The whole new taint list, or `None` when it equals the current one. Taints that are not
/// Vigil's are copied through untouched (every field, in order).
fn taints_patch(current: Option<&Value>, desired: &NodeDesired) -> Option<Vec<Value>> {
    let matches = |t: &Value, want: &Taint| t["key"] == want.key && t["effect"] == want.effect;

    let existing: Vec<Value> = current.and_then(Value::as_array).cloned().unwrap_or_default();
    let removed = |t: &Value| desired.remove_taints.iter().any(|key| t["key"] == *key);
    let wanted = |t: &Value| desired.add_taints.iter().any(|want| matches(t, want));
    let mut out: Vec<_> = existing.iter().filter(|t| !removed(t) || wanted(t)).cloned().collect();
    for want in &desired.add_taints {
        match out.iter_mut().find(|t| matches(t, want)) {
            // Kubernetes allows one taint per key and effect: a different value is updated in
            // place rather than added next to it (which the API server would reject).
            Some(t) if t["value"].as_str().unwrap_or("") != want.value => {
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

/// What `vigil cleanup` takes off a Node: every label and annotation under Vigil's prefix, the
/// taints with Vigil's keys (whatever their effect), and Vigil's conditions. Everything else
/// (other writers' keys, a foreign taint with an effect Vigil also uses, kubelet's `Ready`, a
/// node-problem-detector condition) is left as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cleanup {
    pub(crate) labels: Vec<String>,
    pub(crate) annotations: Vec<String>,
    /// `key=value:effect` (or `key:effect`), as `kubectl describe node` shows a taint.
    pub taints: Vec<String>,
    /// Condition types.
    pub(crate) conditions: Vec<String>,
    /// `key=value` of labels Vigil may have set but that are not its alone (GKE's
    /// `cloud.google.com/perform-maintenance`): left on the Node, named so a person can decide.
    pub(crate) kept: Vec<String>,
}

impl Cleanup {
    /// Nothing of Vigil's is on the Node ([`Cleanup::kept`] aside).
    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty()
            && self.annotations.is_empty()
            && self.taints.is_empty()
            && self.conditions.is_empty()
    }
}

/// Vigil's fields on `node` (pure): labels and annotations whose key starts with `prefix`, taints
/// whose key is one of `taint_keys`, conditions whose type is one of `condition_types` (and, to
/// be named but kept, the `shared_labels` that are set); and the
/// [`NodeDesired`] that removes them (for [`merge_patch`], which adds the resourceVersion
/// precondition when the taint list is rewritten).
pub(crate) fn cleanup_plan(
    node: &Value,
    prefix: &str,
    taint_keys: &[String],
    condition_types: &[&str],
    shared_labels: &[&str],
) -> (Cleanup, NodeDesired) {
    let keys = |pointer: &str| {
        let all = node.pointer(pointer).and_then(Value::as_object).into_iter().flat_map(Map::keys);
        let mut ours: Vec<String> = all.filter(|k| k.starts_with(prefix)).cloned().collect();
        ours.sort();
        ours
    };
    let labels = keys("/metadata/labels");
    let annotations = keys("/metadata/annotations");
    let taints = taints_of(node, taint_keys);
    let types = items(node, "/status/conditions").filter_map(|c| c["type"].as_str());
    let conditions = types.filter(|t| condition_types.contains(t)).map(str::to_string).collect();
    let desired = NodeDesired {
        labels: labels.iter().map(|k| (k.clone(), None)).collect(),
        annotations: annotations.iter().map(|k| (k.clone(), None)).collect(),
        remove_taints: taint_keys.to_vec(),
        ..Default::default()
    };
    let label = |k: &&str| node["metadata"]["labels"][k].as_str().map(|v| format!("{k}={v}"));
    let kept = shared_labels.iter().filter_map(label).collect();
    (Cleanup { labels, annotations, taints, conditions, kept }, desired)
}

/// Vigil's taints on the Node, as `kubectl taint` writes them (`key[=value]:effect`).
fn taints_of(node: &Value, taint_keys: &[String]) -> Vec<String> {
    items(node, "/spec/taints")
        .filter_map(|t| {
            let key = t["key"].as_str().filter(|key| taint_keys.iter().any(|k| k == key))?;
            let effect = t["effect"].as_str().unwrap_or("");
            Some(match t["value"].as_str() {
                Some(v) if !v.is_empty() => format!("{key}={v}:{effect}"),
                _ => format!("{key}:{effect}"),
            })
        })
        .collect()
}

/// The elements of the array at `pointer` in `node`; none where there is no array.
fn items<'a>(node: &'a Value, pointer: &str) -> impl Iterator<Item = &'a Value> {
    node.pointer(pointer).and_then(Value::as_array).into_iter().flatten()
}

/// The strategic-merge patch of the Node's status that deletes the conditions of these types,
/// and only those (`$patch: delete` on the element with that merge key), or `None` for none.
pub(crate) fn delete_conditions_patch(types: &[String]) -> Option<Value> {
    let items: Vec<_> = types.iter().map(|t| json!({ "type": t, "$patch": "delete" })).collect();
    (!items.is_empty()).then(|| json!({ "status": { "conditions": items } }))
}

#[cfg(test)]
#[path = "patch_tests.rs"]
mod tests;
