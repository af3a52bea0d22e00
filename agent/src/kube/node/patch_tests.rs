//! Unit tests of the Node patches: merge patches, conditions, taints, the cleanup plan.

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
    pairs.iter().map(|(k, v)| (k.to_string(), v.map(str::to_string))).collect()
}

fn taint(key: &str, value: &str, effect: &str) -> Taint {
    Taint { key: key.into(), value: value.into(), effect: effect.into() }
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
            NodeDesired { remove_taints: vec!["vigil.dev/m".into()], ..NodeDesired::default() },
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
        labels: labels(&[("vigil.dev/maintenance", None), ("vigil.dev/gpu", Some("ok"))]),
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
    let keys =
        vec!["vigil.dev/termination-imminent".to_string(), "vigil.dev/gpu-failed".to_string()];
    let kinds = ["VigilGPUHealthy", "VigilMaintenance"];
    n["metadata"]["labels"]["cloud.google.com/perform-maintenance"] = json!("true");
    let shared = ["cloud.google.com/perform-maintenance"];
    let (plan, desired) = cleanup_plan(&n, "vigil.dev/", &keys, &kinds, &shared);
    assert_eq!(
        plan,
        Cleanup {
            labels: vec!["vigil.dev/gpu-health".into(), "vigil.dev/maintenance".into()],
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
    let (plan, desired) =
        cleanup_plan(&json!({"metadata": {"name": "n1"}}), "vigil.dev/", &keys, &kinds, &shared);
    assert!(plan.is_empty());
    assert_eq!(merge_patch(&json!({"metadata": {"name": "n1"}}), &desired), None);
}
