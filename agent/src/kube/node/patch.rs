//! The pure core of the Node reconcile: (Node as JSON, desired) → the smallest patch that gets
//! there, or `None` when the Node already matches. No I/O, so every rule (foreign keys left alone,
//! one taint per key and effect, the resourceVersion precondition) is a table-driven test here.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{NodeDesired, Taint};

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
/// A type in `remove_conditions` that the Node has is deleted (`$patch: delete`, by its key).
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
    for kind in &desired.remove_conditions {
        if current
            .iter()
            .any(|c| c["type"].as_str() == Some(kind.as_str()))
        {
            changed.push(serde_json::json!({ "type": kind, "$patch": "delete" }));
        }
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
    let keys = |pointer: &str| -> Vec<String> {
        node.pointer(pointer)
            .and_then(Value::as_object)
            .map(|m| {
                m.keys()
                    .filter(|k| k.starts_with(prefix))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut labels = keys("/metadata/labels");
    labels.sort();
    let mut annotations = keys("/metadata/annotations");
    annotations.sort();
    let taints: Vec<String> = node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let key = t.get("key").and_then(Value::as_str)?;
            if !taint_keys.iter().any(|k| k == key) {
                return None;
            }
            let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
            Some(match t.get("value").and_then(Value::as_str) {
                Some(v) if !v.is_empty() => format!("{key}={v}:{effect}"),
                _ => format!("{key}:{effect}"),
            })
        })
        .collect();
    let conditions: Vec<String> = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("type").and_then(Value::as_str))
        .filter(|kind| condition_types.contains(kind))
        .map(str::to_string)
        .collect();
    let desired = NodeDesired {
        labels: labels.iter().map(|k| (k.clone(), None)).collect(),
        annotations: annotations.iter().map(|k| (k.clone(), None)).collect(),
        add_taints: Vec::new(),
        remove_taints: taint_keys.to_vec(),
        conditions: Vec::new(),
        remove_conditions: Vec::new(),
    };
    let kept = shared_labels
        .iter()
        .filter_map(|k| {
            let v = node.pointer("/metadata/labels")?.get(*k)?.as_str()?;
            Some(format!("{k}={v}"))
        })
        .collect();
    let plan = Cleanup {
        labels,
        annotations,
        taints,
        conditions,
        kept,
    };
    (plan, desired)
}

/// The strategic-merge patch of the Node's status that deletes the conditions of these types,
/// and only those (`$patch: delete` on the element with that merge key), or `None` for none.
pub(crate) fn delete_conditions_patch(types: &[String]) -> Option<Value> {
    let items: Vec<Value> = types
        .iter()
        .map(|t| serde_json::json!({ "type": t, "$patch": "delete" }))
        .collect();
    (!items.is_empty()).then(|| serde_json::json!({ "status": { "conditions": items } }))
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
            remove_conditions: vec![],
        };
        let mut n = node();
        let patch = merge_patch(&n, &desired).expect("a first patch");
        apply(&mut n, &patch);
        assert_eq!(merge_patch(&n, &desired), None);
    }

    /// A retired type comes off, only when present, beside the conditions that are set.
    #[test]
    fn conditions_patch_deletes_removed_types_that_are_there() {
        let n = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "VigilGPUHealthy", "status": "True"}
        ]}});
        let mut desired = NodeDesired {
            remove_conditions: vec!["VigilGPUHealthy".into(), "VigilTPUUnhealthy".into()],
            ..NodeDesired::default()
        };
        let want = json!({"type": "VigilGPUHealthy", "$patch": "delete"});
        let patch = conditions_patch(&n, &desired, "t").expect("a patch");
        assert_eq!(patch["status"]["conditions"], json!([want]));
        desired.remove_conditions = vec!["VigilTPUUnhealthy".into()];
        assert_eq!(conditions_patch(&n, &desired, "t"), None);
    }

    #[test]
    fn cleanup_takes_only_vigils_fields() {
        let mut n = node();
        n["metadata"]["labels"]["vigil.dev/gpu-health"] = json!("failed");
        n["metadata"]["labels"]["vigil.dev.example/other"] = json!("x");
        n["spec"]["taints"] = json!([
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "vigil.dev/gpu-failed", "value": "true", "effect": "NoSchedule"},
            {"key": "vigil.dev/termination-imminent", "effect": "NoExecute"},
            {"key": "other", "effect": "NoSchedule"}
        ]);
        n["status"] = json!({"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "VigilGPUHealthy", "status": "False"},
            {"type": "KernelDeadlock", "status": "False"}
        ]});
        let keys = vec![
            "vigil.dev/termination-imminent".to_string(),
            "vigil.dev/gpu-failed".to_string(),
        ];
        let kinds = ["VigilGPUHealthy", "VigilMaintenance"];
        n["metadata"]["labels"]["cloud.google.com/perform-maintenance"] = json!("true");
        let shared = ["cloud.google.com/perform-maintenance"];
        let (plan, desired) = cleanup_plan(&n, "vigil.dev/", &keys, &kinds, &shared);
        assert_eq!(
            plan,
            Cleanup {
                labels: vec![
                    "vigil.dev/gpu-health".into(),
                    "vigil.dev/maintenance".into()
                ],
                annotations: vec!["vigil.dev/window-start".into()],
                taints: vec![
                    "vigil.dev/gpu-failed=true:NoSchedule".into(),
                    "vigil.dev/termination-imminent:NoExecute".into()
                ],
                conditions: vec!["VigilGPUHealthy".into()],
                kept: vec!["cloud.google.com/perform-maintenance=true".into()],
            }
        );
        let patch = merge_patch(&n, &desired).expect("a patch");
        assert_eq!(
            patch,
            json!({
                "metadata": {
                    "labels": {"vigil.dev/gpu-health": null, "vigil.dev/maintenance": null},
                    "annotations": {"vigil.dev/window-start": null},
                    "resourceVersion": "7"
                },
                "spec": {"taints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                    {"key": "other", "effect": "NoSchedule"}
                ]}
            })
        );
        assert_eq!(
            delete_conditions_patch(&plan.conditions),
            Some(json!({"status": {"conditions": [
                {"type": "VigilGPUHealthy", "$patch": "delete"}
            ]}}))
        );
        assert_eq!(delete_conditions_patch(&[]), None);

        // Nothing of Vigil's: an empty plan and no write.
        let (plan, desired) = cleanup_plan(
            &json!({"metadata": {"name": "n1"}}),
            "vigil.dev/",
            &keys,
            &kinds,
            &shared,
        );
        assert!(plan.is_empty());
        assert_eq!(
            merge_patch(&json!({"metadata": {"name": "n1"}}), &desired),
            None
        );
    }
}
