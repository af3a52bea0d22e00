//! `KubeNodeApi` against a faithful fake Kubernetes API server over real HTTP: Vigil's labels,
//! annotations and taints are written without clobbering anyone else's, conflicts are retried,
//! a steady state costs no write, errors say what to fix, and the requests on the wire are exactly
//! the ones the code claims (GET, then PATCH as `application/merge-patch+json`). Events go through
//! kube's events.k8s.io `Recorder`: a POST, then a repeat is counted on it by a merge PATCH of its
//! `series`.

use crate::common::fake_kube;

use std::collections::BTreeMap;
use std::time::Duration;

use fake_kube::{annotation, label, taints, FakeKube};
use serde_json::{json, Value};
use vigil::kube::node::{EventType, KubeNodeApi, NodeApi, NodeDesired, NodeError, Taint};

const NODE: &str = "gpu-node-1";
const MERGE: &str = "application/merge-patch+json";
const NODE_PATH: &str = "/api/v1/nodes/gpu-node-1";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

async fn setup() -> (FakeKube, KubeNodeApi) {
    let fake = FakeKube::start(NODE).await;
    let api = KubeNodeApi::from_url(&fake.url)
        .expect("client for the fake")
        // Fast retries: the backoff itself is unit-tested in node.rs.
        .with_retry(5, Duration::from_millis(2));
    (fake, api)
}

fn keys(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.map(str::to_string))).collect()
}

fn maintenance_taint() -> Taint {
    Taint {
        key: "vigil.dev/maintenance".into(),
        value: "terminating".into(),
        effect: "NoSchedule".into(),
    }
}

fn seen(method: &str, path: &str, content_type: &str) -> (String, String, String) {
    (method.into(), path.into(), content_type.into())
}

/// Only Vigil's maintenance label, set to `value`.
fn maintenance_label(value: &str) -> NodeDesired {
    NodeDesired {
        labels: keys(&[("vigil.dev/maintenance", Some(value))]),
        ..NodeDesired::default()
    }
}

/// How many PATCHes the server has seen.
fn patches(fake: &FakeKube) -> usize {
    fake.requests().into_iter().filter(|(m, _, _)| m == "PATCH").count()
}

#[tokio::test]
async fn labels_and_annotations_set_then_removed_while_foreign_keys_survive() {
    let (fake, api) = setup().await;
    fake.foreign_write(json!({"metadata": {
        "labels": {"team": "ml"},
        "annotations": {"owner": "infra"}
    }}));

    let set = NodeDesired {
        labels: keys(&[("vigil.dev/maintenance", Some("pending"))]),
        annotations: keys(&[("vigil.dev/window-start", Some("2025-06-01T10:00:00Z"))]),
        ..NodeDesired::default()
    };
    api.reconcile(NODE, &set).await.expect("set");
    let node = fake.node();
    assert_eq!(label(&node, "vigil.dev/maintenance").as_deref(), Some("pending"));
    assert_eq!(
        annotation(&node, "vigil.dev/window-start").as_deref(),
        Some("2025-06-01T10:00:00Z")
    );

    let remove = NodeDesired {
        labels: keys(&[("vigil.dev/maintenance", None)]),
        annotations: keys(&[("vigil.dev/window-start", None)]),
        ..NodeDesired::default()
    };
    api.reconcile(NODE, &remove).await.expect("remove");
    let node = fake.node();
    assert_eq!(label(&node, "vigil.dev/maintenance"), None);
    assert_eq!(annotation(&node, "vigil.dev/window-start"), None);
    // Everyone else's keys, including the server-set ones, are exactly as they were.
    assert_eq!(label(&node, "team").as_deref(), Some("ml"));
    assert_eq!(label(&node, "kubernetes.io/hostname").as_deref(), Some(NODE));
    assert_eq!(annotation(&node, "owner").as_deref(), Some("infra"));
    assert_eq!(annotation(&node, "node.alpha.kubernetes.io/ttl").as_deref(), Some("0"));
    assert_eq!(node["spec"]["podCIDR"], "10.0.0.0/24");
}

#[tokio::test]
async fn maintenance_taint_added_next_to_foreign_taint_then_removed() {
    let (fake, api) = setup().await;
    let foreign = json!({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"});
    fake.foreign_write(json!({"spec": {"taints": [foreign.clone()]}}));

    let add = NodeDesired { add_taints: vec![maintenance_taint()], ..NodeDesired::default() };
    api.reconcile(NODE, &add).await.expect("add taint");
    assert_eq!(
        taints(&fake.node()),
        vec![
            foreign.clone(),
            json!({"key": "vigil.dev/maintenance", "value": "terminating", "effect": "NoSchedule"})
        ]
    );

    let remove = NodeDesired {
        remove_taints: vec!["vigil.dev/maintenance".into()],
        ..NodeDesired::default()
    };
    api.reconcile(NODE, &remove).await.expect("remove taint");
    assert_eq!(taints(&fake.node()), vec![foreign]);
}

#[tokio::test]
async fn taint_patches_carry_the_resource_version_they_were_computed_from() {
    let (fake, api) = setup().await;
    // A foreign writer adds a taint right after our GET: our whole-list replacement would erase
    // it, unless the precondition makes the server refuse our stale write.
    fake.race_next_get(json!({"spec": {"taints": [
        {"key": "example.com/drain", "effect": "NoExecute"}
    ]}}));
    let add = NodeDesired { add_taints: vec![maintenance_taint()], ..NodeDesired::default() };
    api.reconcile(NODE, &add).await.expect("add taint despite the race");

    let keys: Vec<Value> = taints(&fake.node()).iter().map(|t| t["key"].clone()).collect();
    assert_eq!(keys, vec![json!("example.com/drain"), json!("vigil.dev/maintenance")]);
    // GET, PATCH (409: stale), GET, PATCH (ok).
    assert_eq!(
        fake.requests(),
        vec![
            seen("GET", NODE_PATH, ""),
            seen("PATCH", NODE_PATH, MERGE),
            seen("GET", NODE_PATH, ""),
            seen("PATCH", NODE_PATH, MERGE),
        ]
    );
}

#[tokio::test]
async fn conflict_with_a_concurrent_label_writer_is_retried_and_both_labels_survive() {
    let (fake, api) = setup().await;
    // Someone labels the node, and our next write loses the race with them.
    fake.foreign_write(json!({"metadata": {"labels": {"cloud.google.com/gke-spot": "true"}}}));
    fake.conflict_next(1);

    let desired = maintenance_label("ongoing");
    api.reconcile(NODE, &desired).await.expect("retried");
    let node = fake.node();
    assert_eq!(label(&node, "cloud.google.com/gke-spot").as_deref(), Some("true"));
    assert_eq!(label(&node, "vigil.dev/maintenance").as_deref(), Some("ongoing"));
    assert_eq!(patches(&fake), 2, "one refused, one accepted");
}

#[tokio::test]
async fn endless_conflicts_give_up_after_the_configured_attempts() {
    let (fake, api) = setup().await;
    let api = api.with_retry(3, Duration::from_millis(1));
    fake.conflict_next(100);
    let desired = maintenance_label("ongoing");
    let err = api.reconcile(NODE, &desired).await.expect_err("gives up");
    assert!(matches!(err, NodeError::Conflict { attempts: 3, .. }), "{err:?}");
    assert_eq!(err.op(), "patch");
    assert_eq!(patches(&fake), 3);
}

#[tokio::test]
async fn reconciling_the_same_desired_state_twice_writes_once() {
    let (fake, api) = setup().await;
    let desired = NodeDesired {
        labels: keys(&[("vigil.dev/maintenance", Some("pending")), ("vigil.dev/gone", None)]),
        annotations: keys(&[("vigil.dev/can-reschedule", Some("true"))]),
        add_taints: vec![maintenance_taint()],
        remove_taints: vec!["vigil.dev/old".into()],
        conditions: vec![],
        remove_conditions: vec![],
    };
    api.reconcile(NODE, &desired).await.expect("first");
    let version = fake.node()["metadata"]["resourceVersion"].clone();
    api.reconcile(NODE, &desired).await.expect("second");

    assert_eq!(
        fake.requests(),
        vec![
            seen("GET", NODE_PATH, ""),
            seen("PATCH", NODE_PATH, MERGE),
            seen("GET", NODE_PATH, ""),
        ],
        "the second reconcile only reads"
    );
    assert_eq!(fake.node()["metadata"]["resourceVersion"], version);
}

#[tokio::test]
async fn a_missing_node_is_not_found_and_points_at_node_name() {
    let (fake, api) = setup().await;
    let desired = maintenance_label("pending");
    let err = api.reconcile("no-such-node", &desired).await.expect_err("404");
    assert!(matches!(err, NodeError::NotFound { .. }), "{err:?}");
    assert_eq!(err.op(), "get");
    let msg = err.to_string();
    assert!(msg.contains("no-such-node") && msg.contains("NODE_NAME"), "{msg}");
    assert_eq!(fake.requests(), vec![seen("GET", "/api/v1/nodes/no-such-node", "")]);
}

#[tokio::test]
async fn forbidden_calls_name_the_missing_rbac_rule() {
    let (fake, api) = setup().await;
    let desired = maintenance_label("pending");
    // (what the fake refuses, verb, op label, resource, API group)
    let cases = [
        ("get", "get", "get", "nodes", ""),
        ("patch nodes", "patch", "patch", "nodes", ""),
        ("create", "create", "event", "events", "events.k8s.io"),
        ("patch events", "patch", "event", "events", "events.k8s.io"),
    ];
    for (rule, verb, op, resource, group) in cases {
        fake.forbid(rule);
        let err = match resource {
            "events" => {
                // A repeat is what the Recorder PATCHes: the first one went through.
                let kind = if verb == "patch" { EventType::Warning } else { EventType::Normal };
                api.event(NODE, "MaintenancePending", "m", kind).await.expect_err("forbidden event")
            }
            _ => api.reconcile(NODE, &desired).await.expect_err("forbidden"),
        };
        fake.allow(rule);
        assert!(
            matches!(err, NodeError::Forbidden { verb: v, resource: r, group: g, .. }
                if v == verb && r == resource && g == group),
            "{rule}: {err:?}"
        );
        assert_eq!(err.op(), op);
        let msg = err.to_string();
        let want = format!(
            "{{apiGroups: [\"{group}\"], resources: [\"{resource}\"], verbs: [\"{verb}\"]}}"
        );
        assert!(msg.contains(&want), "{msg}");
        assert!(msg.contains("403"), "{msg}");
        if !group.is_empty() {
            assert!(msg.contains(&format!("in API group \"{group}\"")), "{msg}");
        }
        if rule == "create" {
            // Nothing was stored; record the Warning Event whose repeat the next case PATCHes.
            assert!(fake.events().is_empty());
            api.event(NODE, "MaintenancePending", "m", EventType::Warning)
                .await
                .expect("allowed again");
        }
    }
    let events = fake.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].get("series").is_none(), "the refused count left no trace");
    assert_eq!(label(&fake.node(), "vigil.dev/maintenance"), None);
}

#[tokio::test]
async fn events_are_events_k8s_io_events_about_the_node() {
    let (fake, api) = setup().await;
    // A reconcile first, so the agent knows the Node's uid.
    api.reconcile(NODE, &NodeDesired::default()).await.expect("read");
    api.event(
        NODE,
        "MaintenanceTerminating",
        "host maintenance will terminate this VM; checkpointing workers",
        EventType::Warning,
    )
    .await
    .expect("event");
    api.event(NODE, "MaintenanceDone", "back to normal", EventType::Normal)
        .await
        .expect("second event");

    let events = fake.events();
    assert_eq!(events.len(), 2);
    let e = &events[0];
    assert_eq!(e["apiVersion"], "events.k8s.io/v1");
    assert_eq!(e["kind"], "Event");
    assert_eq!(e["metadata"]["namespace"], "default");
    // The Recorder's name: the regarding object's name, a dot, the time in hex nanoseconds.
    let name = e["metadata"]["name"].as_str().expect("name");
    let suffix = name.strip_prefix("gpu-node-1.").expect(name);
    assert!(!suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
    assert_ne!(events[1]["metadata"]["name"], e["metadata"]["name"]);
    assert_eq!(e["regarding"]["apiVersion"], "v1");
    assert_eq!(e["regarding"]["kind"], "Node");
    assert_eq!(e["regarding"]["name"], NODE);
    assert_eq!(e["regarding"]["uid"], fake.node()["metadata"]["uid"]);
    assert!(e["regarding"].get("namespace").is_none(), "a Node is cluster-scoped");
    assert_eq!(e["reason"], "MaintenanceTerminating");
    assert_eq!(e["note"], "host maintenance will terminate this VM; checkpointing workers");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["action"], "UpdateNode");
    assert_eq!(e["reportingController"], "vigil");
    assert_eq!(e["reportingInstance"], NODE);
    assert!(e["eventTime"].is_string(), "eventTime missing: {e}");
    for legacy in [
        "message",
        "involvedObject",
        "source",
        "count",
        "series",
        "deprecatedCount",
        "deprecatedSource",
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
    ] {
        assert!(e.get(legacy).is_none(), "{legacy} set: {e}");
    }
    assert_eq!(events[1]["type"], "Normal");
    assert_eq!(events[1]["note"], "back to normal");

    let writes: Vec<_> = fake.requests().into_iter().filter(|(m, _, _)| m != "GET").collect();
    assert_eq!(
        writes,
        vec![
            seen("POST", EVENTS_PATH, "application/json"),
            seen("POST", EVENTS_PATH, "application/json"),
        ]
    );
}

/// The point of the Recorder: a repeated Event is counted on the first (`series`), one merge
/// PATCH each, not stored again; an Event with another note is its own object.
#[tokio::test]
async fn a_repeated_event_is_counted_on_the_first_not_stored_again() {
    let (fake, api) = setup().await;
    for _ in 0..3 {
        api.event(NODE, "VigilGpuDegraded", "GPU 0: ECC", EventType::Warning).await.expect("event");
    }
    let events = fake.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    let name = e["metadata"]["name"].as_str().expect("name").to_string();
    assert_eq!(e["series"]["count"], 3, "{e}");
    assert!(e["series"]["lastObservedTime"].is_string(), "{e}");
    assert_eq!(e["note"], "GPU 0: ECC");
    let patch_path = format!("{EVENTS_PATH}/{name}");
    assert_eq!(
        fake.requests(),
        vec![
            seen("POST", EVENTS_PATH, "application/json"),
            seen("PATCH", &patch_path, MERGE),
            seen("PATCH", &patch_path, MERGE),
        ]
    );

    // Another note, another type, another reason: each a new object, never a changed note.
    api.event(NODE, "VigilGpuDegraded", "GPU 1: ECC", EventType::Warning)
        .await
        .expect("other note");
    api.event(NODE, "VigilGpuDegraded", "GPU 0: ECC", EventType::Normal).await.expect("other type");
    api.event(NODE, "VigilGpuFailed", "GPU 0: ECC", EventType::Warning)
        .await
        .expect("other reason");
    let events = fake.events();
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(events[0]["series"]["count"], 3);
    assert_eq!(events[0]["note"], "GPU 0: ECC");
    assert_eq!(events[1]["note"], "GPU 1: ECC");
    assert!(events[1..].iter().all(|e| e.get("series").is_none()));

    // The counted Event is gone (the API server's --event-ttl): the next repeat starts afresh.
    fake.expire_events();
    api.event(NODE, "VigilGpuDegraded", "GPU 0: ECC", EventType::Warning)
        .await
        .expect("after expiry");
    let events = fake.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].get("series").is_none(), "{}", events[0]);
    assert_ne!(events[0]["metadata"]["name"], json!(name));
    let tail: Vec<_> = fake.requests().into_iter().rev().take(2).collect();
    assert_eq!(
        tail,
        vec![seen("POST", EVENTS_PATH, "application/json"), seen("PATCH", &patch_path, MERGE),],
        "a 404 on the count, then a new Event"
    );
}

#[tokio::test]
async fn a_long_note_is_cut_to_what_the_api_server_accepts() {
    let (fake, api) = setup().await;
    let long = "x".repeat(5000);
    api.event(NODE, "VigilCheckpoint", &long, EventType::Normal)
        .await
        .expect("a long note is not refused");
    let events = fake.events();
    let note = events[0]["note"].as_str().expect("note");
    assert!(note.len() <= 1024 && note.ends_with('…'), "{}", note.len());
    assert_eq!(events[0]["action"], "Checkpoint");
}

#[tokio::test]
async fn the_wire_requests_are_a_get_then_a_merge_patch_of_that_node() {
    let (fake, api) = setup().await;
    let desired = maintenance_label("pending");
    api.reconcile(NODE, &desired).await.expect("reconcile");
    assert_eq!(fake.requests(), vec![seen("GET", NODE_PATH, ""), seen("PATCH", NODE_PATH, MERGE)]);
    // A label-only patch carries no resourceVersion, so it never conflicts needlessly: the
    // fake bumped the version on its own write only.
    assert_eq!(fake.node()["metadata"]["resourceVersion"], "2");
}

/// The same hooks over HTTP, for tests that drive the `vigil` binary from another process; and
/// the fake's own faithfulness on the points the client relies on.
#[tokio::test]
async fn fake_hooks_over_http_and_faithful_refusals() {
    let fake = FakeKube::start(NODE).await;
    let http = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", fake.url);

    let r = http
        .post(url("/fake/foreign_write"))
        .body(json!({"metadata": {"labels": {"team": "ml"}}}).to_string())
        .send()
        .await
        .expect("foreign_write");
    assert_eq!(r.status(), 200);
    let node: Value =
        http.get(url("/fake/node")).send().await.expect("node").json().await.expect("json");
    assert_eq!(node["metadata"]["labels"]["team"], "ml");
    assert_eq!(node["metadata"]["resourceVersion"], "2");

    // A stale resourceVersion precondition is refused like the real server does.
    let r = http
        .patch(url(NODE_PATH))
        .header("content-type", MERGE)
        .body(json!({"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}}).to_string())
        .send()
        .await
        .expect("patch");
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.expect("status");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Conflict");
    assert_eq!(body["code"], 409);

    // Patch types the fake does not implement are refused, not misapplied: a JSON patch, and a
    // strategic merge patch with a directive or a list that merges by key.
    for (media, body) in [
        ("application/json-patch+json", json!([])),
        ("application/strategic-merge-patch+json", json!({"spec": {"podCIDRs": ["10.0.1.0/24"]}})),
        (
            "application/strategic-merge-patch+json",
            json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule", "$patch": "delete"}]}}),
        ),
    ] {
        let r = http
            .patch(url(NODE_PATH))
            .header("content-type", media)
            .body(body.to_string())
            .send()
            .await
            .expect("patch");
        assert_eq!(r.status(), 415, "{media} {body}");
    }

    // Duplicate taints (same key and effect) are invalid, as on a real server.
    let r = http
        .patch(url(NODE_PATH))
        .header("content-type", MERGE)
        .body(
            json!({"spec": {"taints": [
                {"key": "k", "effect": "NoSchedule"},
                {"key": "k", "value": "v", "effect": "NoSchedule"}
            ]}})
            .to_string(),
        )
        .send()
        .await
        .expect("patch");
    assert_eq!(r.status(), 422);

    for hook in ["/fake/conflict_next/1", "/fake/forbid/get"] {
        let r = http.post(url(hook)).send().await.expect("hook");
        assert!(r.status().is_success(), "{hook}: {}", r.status());
    }
    let r = http.get(url(NODE_PATH)).send().await.expect("get");
    assert_eq!(r.status(), 403);
    let r = http.post(url("/fake/allow/get")).send().await.expect("allow");
    assert!(r.status().is_success());
    let r = http
        .patch(url(NODE_PATH))
        .header("content-type", MERGE)
        .body("{}")
        .send()
        .await
        .expect("patch");
    assert_eq!(r.status(), 409, "conflict_next over HTTP");

    let requests: Value =
        http.get(url("/fake/requests")).send().await.expect("requests").json().await.expect("json");
    // The hooks themselves are not API requests and are not recorded.
    assert_eq!(
        requests,
        json!([
            ["PATCH", NODE_PATH, MERGE],
            ["PATCH", NODE_PATH, "application/json-patch+json"],
            ["PATCH", NODE_PATH, "application/strategic-merge-patch+json"],
            ["PATCH", NODE_PATH, "application/strategic-merge-patch+json"],
            ["PATCH", NODE_PATH, MERGE],
            ["GET", NODE_PATH, ""],
            ["PATCH", NODE_PATH, MERGE],
        ])
    );
    let events: Value =
        http.get(url("/fake/events")).send().await.expect("events").json().await.expect("json");
    assert_eq!(events, json!([]));
}

/// The Events endpoints refuse what the real events.k8s.io/v1 API refuses.
#[tokio::test]
async fn fake_events_api_is_faithful() {
    let fake = FakeKube::start(NODE).await;
    let http = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", fake.url);
    let event = json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "gpu-node-1.abc"},
        "eventTime": "2025-01-01T00:00:00.000001Z",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        "reportingController": "vigil",
        "reportingInstance": NODE,
        "action": "UpdateNode",
        "reason": "VigilMaintenancePending",
        "note": "n",
        "type": "Normal"
    });
    let post = |ns: &str, body: &Value| {
        http.post(url(&format!("/apis/events.k8s.io/v1/namespaces/{ns}/events")))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let r = post("default", &event).await.expect("post");
    assert_eq!(r.status(), 201);
    let stored: Value = r.json().await.expect("json");
    assert_eq!(stored["metadata"]["namespace"], "default");
    assert_eq!(stored["metadata"]["resourceVersion"], "2");

    let r = post("default", &event).await.expect("duplicate");
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.expect("status");
    assert_eq!(body["reason"], "AlreadyExists");

    // A Node's Events live in default (or kube-system) only.
    let mut elsewhere = event.clone();
    elsewhere["metadata"]["name"] = json!("other");
    let r = post("vigil", &elsewhere).await.expect("post");
    assert_eq!(r.status(), 422);

    // What events.k8s.io/v1 requires, and the core/v1 fields it refuses.
    let mut bare = event.clone();
    bare["metadata"]["name"] = json!("bare");
    for field in ["action", "reportingController", "reportingInstance", "eventTime"] {
        bare.as_object_mut().unwrap().remove(field);
    }
    bare["deprecatedCount"] = json!(1);
    let r = post("default", &bare).await.expect("post");
    assert_eq!(r.status(), 422);
    let msg =
        r.json::<Value>().await.expect("status")["message"].as_str().unwrap_or("").to_string();
    for want in [
        "action: Required value",
        "reportingController: Required value",
        "reportingInstance: Required value",
        "eventTime: Required value",
        "count: Invalid value",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }

    let patch = |name: &str, body: Value| {
        http.patch(url(&format!("/apis/events.k8s.io/v1/namespaces/default/events/{name}")))
            .header("content-type", MERGE)
            .body(body.to_string())
            .send()
    };
    // A series may be added (a real merge: the rest stays) ...
    let r = patch(
        "gpu-node-1.abc",
        json!({"series": {"count": 2, "lastObservedTime": "2025-01-01T00:01:00.000000Z"}}),
    )
    .await
    .expect("patch");
    assert_eq!(r.status(), 200);
    let counted: Value = r.json().await.expect("json");
    assert_eq!(counted["series"]["count"], 2);
    assert_eq!(counted["note"], "n");
    assert_eq!(fake.events()[0]["series"]["count"], 2);
    // ... but not a count below 2, and never a new note, reason or regarding.
    for bad in [
        json!({"series": {"count": 1, "lastObservedTime": "2025-01-01T00:02:00Z"}}),
        json!({"note": "changed"}),
        json!({"reason": "Other"}),
        json!({"regarding": {"name": "other-node"}}),
        json!({"eventTime": "2025-01-01T00:00:01Z"}),
    ] {
        let r = patch("gpu-node-1.abc", bad.clone()).await.expect("patch");
        assert_eq!(r.status(), 422, "{bad}");
    }
    let r = patch("missing", json!({})).await.expect("patch");
    assert_eq!(r.status(), 404);
    let r = http
        .patch(url("/apis/events.k8s.io/v1/namespaces/default/events/gpu-node-1.abc"))
        .header("content-type", "application/strategic-merge-patch+json")
        .body("{}")
        .send()
        .await
        .expect("patch");
    assert_eq!(r.status(), 415);

    // RBAC by group: the core/v1 Events endpoint is not Vigil's and is not served.
    let r = http
        .post(url("/api/v1/namespaces/default/events"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 404);
    let r = http.post(url("/fake/forbid/patch%20events")).send().await.expect("forbid");
    assert!(r.status().is_success());
    let r = patch("gpu-node-1.abc", json!({})).await.expect("patch");
    assert_eq!(r.status(), 403);
    let msg =
        r.json::<Value>().await.expect("status")["message"].as_str().unwrap_or("").to_string();
    assert!(
        msg.starts_with("events.events.k8s.io \"gpu-node-1.abc\" is forbidden")
            && msg.contains("in API group \"events.k8s.io\" in the namespace \"default\""),
        "{msg}"
    );
    // Only events are refused: the Node may still be patched.
    let r = http
        .patch(url(NODE_PATH))
        .header("content-type", MERGE)
        .body("{}")
        .send()
        .await
        .expect("patch");
    assert_eq!(r.status(), 200);

    let r = http.post(url("/fake/expire_events")).send().await.expect("expire");
    assert!(r.status().is_success());
    assert!(fake.events().is_empty());
}

/// Vigil's conditions from the policy for a maintenance state and a GPU report.
fn with_conditions(phase: vigil::vocab::maintenance::Phase, failed: bool) -> NodeDesired {
    use vigil::accel::gpu::model::{GpuHealth, GpuReport};
    use vigil::vocab::maintenance::MaintenanceState;
    let k = vigil::config::KubernetesConfig::default();
    let st = MaintenanceState {
        phase,
        reasons: vec!["upcoming-pending"],
        ..MaintenanceState::default()
    };
    let mut d = vigil::maintenance::policy::node_desired(&k, &st, None, None);
    let report = GpuReport {
        state: vigil::accel::gpu::model::GpuMonitorState::On,
        node: if failed { GpuHealth::Failed } else { GpuHealth::Healthy },
        node_reasons: if failed {
            vec!["GPU 0: XID 79 (fallen off the bus)".into()]
        } else {
            vec![]
        },
        ..GpuReport::default()
    };
    vigil::accel::policy::desired(&k, &report, false, &mut d);
    d
}

fn condition(node: &Value, kind: &str) -> Value {
    node["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind).cloned())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn node_conditions_follow_the_labels_and_leave_kubelets_alone() {
    use vigil::vocab::maintenance::Phase;
    let (fake, api) = setup().await;
    api.reconcile(NODE, &with_conditions(Phase::Pending, false)).await.expect("first write");
    let node = fake.node();
    let m = condition(&node, "VigilMaintenance");
    assert_eq!((m["status"].as_str(), m["reason"].as_str()), (Some("True"), Some("Pending")));
    // One polarity: True is the problem, so a healthy GPU is False.
    let g = condition(&node, "VigilGPUUnhealthy");
    assert_eq!((g["status"].as_str(), g["reason"].as_str()), (Some("False"), Some("Healthy")));
    assert_eq!(condition(&node, "Ready")["status"], "True", "kubelet's condition survives");
    assert_eq!(
        label(&node, "vigil.dev/maintenance").as_deref(),
        Some("pending"),
        "the label says the same"
    );
    let status_patches = |fake: &FakeKube| {
        fake.requests()
            .into_iter()
            .filter(|(m, p, ct)| {
                m == "PATCH"
                    && p.ends_with("/status")
                    && ct.starts_with("application/strategic-merge-patch+json")
            })
            .count()
    };
    assert_eq!(status_patches(&fake), 1);

    // A steady state writes nothing.
    api.reconcile(NODE, &with_conditions(Phase::Pending, false)).await.unwrap();
    assert_eq!(status_patches(&fake), 1, "no write when the conditions match");

    // The GPU fails: its condition flips, with a new transition time; the maintenance
    // condition's transition time stays.
    let before = condition(&fake.node(), "VigilMaintenance")["lastTransitionTime"].clone();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    api.reconcile(NODE, &with_conditions(Phase::Pending, true)).await.unwrap();
    let node = fake.node();
    let g = condition(&node, "VigilGPUUnhealthy");
    assert_eq!((g["status"].as_str(), g["reason"].as_str()), (Some("True"), Some("Failed")));
    assert!(g["message"].as_str().unwrap().contains("XID 79"), "{g}");
    assert_eq!(condition(&node, "VigilMaintenance")["lastTransitionTime"], before);
    assert_eq!(condition(&node, "Ready")["status"], "True");

    // As an operator reads it: kubectl against the same API server.
    // NB: async, so this test's runtime keeps serving the fake while kubectl waits on it.
    let out = tokio::process::Command::new("kubectl")
        .args(["--server", &fake.url, "get", "--raw", NODE_PATH])
        .output()
        .await
        .expect("kubectl runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(condition(&seen, "VigilGPUUnhealthy")["reason"], "Failed");
    assert_eq!(condition(&seen, "VigilMaintenance")["reason"], "Pending");
}

#[tokio::test]
async fn a_missing_status_permission_names_the_rule() {
    use vigil::vocab::maintenance::Phase;
    let (fake, api) = setup().await;
    fake.forbid("patch nodes/status");
    let err = api.reconcile(NODE, &with_conditions(Phase::Ongoing, false)).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("nodes/status") && text.contains("patch"), "{text}");
    assert!(matches!(err, NodeError::Forbidden { .. }), "{err:?}");
    assert_eq!(
        label(&fake.node(), "vigil.dev/maintenance").as_deref(),
        Some("ongoing"),
        "the labels were written before the status was refused"
    );
}

/// An API server that accepts connections and never answers (overloaded, or a dead apiserver
/// behind a live load balancer) and one that is not there at all: each Node write is an error
/// within its deadline, never a hang, and the next write against a live server converges.
#[tokio::test]
async fn a_silent_or_absent_api_server_is_an_error_within_the_deadline() {
    let wedged = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", wedged.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = wedged.accept().await {
            conns.push(c); // held open, never read, never answered
        }
    });
    let api = KubeNodeApi::from_url_with_timeout(&url, Duration::from_secs(1)).unwrap();
    let started = std::time::Instant::now();
    let err = api.reconcile(NODE, &maintenance_label("pending")).await;
    assert!(err.is_err(), "a silent API server is an error");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the call deadline, took {:?}",
        started.elapsed()
    );
    held.abort();

    let gone = format!("http://127.0.0.1:{}", {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    });
    let api = KubeNodeApi::from_url_with_timeout(&gone, Duration::from_secs(1)).unwrap();
    let err = api.reconcile(NODE, &maintenance_label("pending")).await.unwrap_err();
    assert!(!err.to_string().is_empty());

    let (fake, api) = setup().await;
    api.reconcile(NODE, &maintenance_label("pending")).await.unwrap();
    assert_eq!(label(&fake.node(), "vigil.dev/maintenance").as_deref(), Some("pending"));
}

const STRATEGIC: &str = "application/strategic-merge-patch+json";

/// The fake applies the strategic-merge list directives of a status patch as the real server
/// does: `$patch: delete` takes exactly the condition with that type (the merge key) and no
/// other; deleting one that is not there is no error; a delete without the merge key and an
/// unknown directive are 400.
#[tokio::test]
async fn fake_status_patch_deletes_one_condition_by_its_merge_key() {
    let fake = FakeKube::start(NODE).await;
    fake.foreign_write(json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
        {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock"},
        {"type": "VigilGPUHealthy", "status": "False", "reason": "Failed"}
    ]}}));
    let http = reqwest::Client::new();
    let status_patch = |body: Value| {
        http.patch(format!("{}{NODE_PATH}/status", fake.url))
            .header("content-type", STRATEGIC)
            .body(body.to_string())
            .send()
    };
    let types = |node: &Value| -> Vec<String> {
        node["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap().to_string())
            .collect()
    };
    let delete_gpu = json!({"status": {"conditions": [
        {"type": "VigilGPUHealthy", "$patch": "delete"}
    ]}});
    let r = status_patch(delete_gpu.clone()).await.unwrap();
    assert_eq!(r.status(), 200);
    let node = fake.node();
    assert_eq!(types(&node), ["Ready", "KernelDeadlock"]);
    assert_eq!(condition(&node, "Ready")["reason"], "KubeletReady", "untouched");
    assert!(!node.to_string().contains("$patch"), "a directive is never stored: {node}");

    // Again: nothing to delete, no error, nothing else moves.
    let r = status_patch(delete_gpu).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(types(&fake.node()), ["Ready", "KernelDeadlock"]);

    // A delete and a merge in one patch, with kubectl's ordering directive.
    let r = status_patch(json!({"status": {
        "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "VigilMaintenance"}],
        "conditions": [
            {"type": "KernelDeadlock", "$patch": "delete"},
            {"type": "VigilMaintenance", "status": "True"}
        ]
    }}))
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(types(&fake.node()), ["Ready", "VigilMaintenance"]);

    for bad in [
        json!({"status": {"conditions": [{"$patch": "delete"}]}}),
        json!({"status": {"conditions": [{"type": "Ready", "$patch": "remove"}]}}),
    ] {
        let r = status_patch(bad.clone()).await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    assert_eq!(types(&fake.node()), ["Ready", "VigilMaintenance"]);
}

/// A Node with everything Vigil writes (maintenance labels and annotations, the termination,
/// GPU and slow taints, three conditions, from the real policy) next to foreign ones that look
/// alike: a
/// foreign taint with Vigil's effect, keys under a prefix that merely starts like Vigil's,
/// kubelet's `Ready` and a node-problem-detector condition.
async fn node_with_vigil_and_foreign_fields() -> (FakeKube, KubeNodeApi) {
    use vigil::accel::gpu::model::{GpuHealth, GpuReport};
    use vigil::vocab::maintenance::{MaintenanceState, Phase};
    let (fake, api) = setup().await;
    let k = vigil::config::KubernetesConfig::default();
    let st = MaintenanceState {
        phase: Phase::Terminating,
        reasons: vec!["preempted"],
        window_start: Some("2026-01-01T00:00:00Z".into()),
        window_end: Some("2026-01-01T01:00:00Z".into()),
        ..MaintenanceState::default()
    };
    let mut d = vigil::maintenance::policy::node_desired(&k, &st, Some("step-100"), None);
    let report = GpuReport {
        state: vigil::accel::gpu::model::GpuMonitorState::On,
        node: GpuHealth::Failed,
        node_reasons: vec!["GPU 0: XID 79".into()],
        ..GpuReport::default()
    };
    vigil::accel::policy::desired(&k, &report, true, &mut d);
    let pace = vigil::config::PaceConfig {
        enabled: true,
        taint: vigil::config::SlowTaint::NoSchedule,
        ..Default::default()
    };
    let n = vigil::vocab::node::Named { line: "gang ml/c runs at 70 %".into(), strong: true };
    let named = [("ml/c".to_string(), n)].into();
    let on = vigil::vocab::node::SlowTaintNow { on: true, evict: true };
    vigil::vocab::node::slow_desired(&k, &pace, &named, on, &mut d);
    fake.foreign_write(json!({
        "metadata": {
            "labels": {"team": "ml", "vigil.dev.example.com/x": "1", "notvigil.dev/y": "2"},
            "annotations": {"team.example.com/owner": "alice"}
        },
        "spec": {"taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "example.com/dedicated", "effect": "NoExecute"}
        ]},
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock"}
        ]}
    }));
    api.reconcile(NODE, &d).await.expect("Vigil's fields written");
    let node = fake.node();
    assert_eq!(taints(&node).len(), 5, "{node}");
    assert_eq!(node["status"]["conditions"].as_array().unwrap().len(), 5);
    (fake, api)
}

/// The Node with Vigil's fields taken off by hand, to compare with what cleanup leaves.
fn without_vigil(node: &Value) -> Value {
    let mut n = node.clone();
    for map in ["labels", "annotations"] {
        n["metadata"][map].as_object_mut().unwrap().retain(|k, _| !k.starts_with("vigil.dev/"));
    }
    n["spec"]["taints"]
        .as_array_mut()
        .unwrap()
        .retain(|t| !t["key"].as_str().unwrap().starts_with("vigil.dev/"));
    n["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .retain(|c| !c["type"].as_str().unwrap().starts_with("Vigil"));
    n["metadata"]["resourceVersion"] = Value::Null;
    n
}

fn ignoring_version(node: &Value) -> Value {
    let mut n = node.clone();
    n["metadata"]["resourceVersion"] = Value::Null;
    n
}

/// `vigil cleanup` (the real binary) against the fake: a dry run writes nothing and lists what
/// would go; the cleanup takes Vigil's labels, annotations, taints and conditions off and leaves
/// every foreign one exactly as it was; a second run writes nothing and says so.
#[tokio::test]
async fn vigil_cleanup_removes_only_vigils_fields_and_is_idempotent() {
    let (fake, _api) = node_with_vigil_and_foreign_fields().await;
    // GKE's label, which Vigil sets while it holds the opportunistic-maintenance claim: not
    // under the prefix, so named and left alone.
    fake.foreign_write(json!({"metadata": {"labels": {
        "cloud.google.com/perform-maintenance": "true"
    }}}));
    let before = fake.node();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("vigil.toml");
    std::fs::write(
        &cfg,
        format!(
            "node_name = \"some-other-node\"\n[kubernetes]\nenabled = \"on\"\napi_url = \"{}\"\n",
            fake.url
        ),
    )
    .unwrap();
    let cleanup = |extra: &'static [&'static str]| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_vigil"));
        cmd.args(["cleanup", "--config", cfg.to_str().unwrap(), "--node", NODE])
            .args(extra)
            .env_remove("NODE_NAME")
            .env_remove("VIGIL_CONFIG")
            .env_remove("REDIS_URL");
        // NB: async, so this test's runtime keeps serving the fake while the binary waits on it.
        async move {
            let out = cmd.output().await.expect("vigil runs");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).to_string(),
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        }
    };
    let writes =
        |fake: &FakeKube| fake.requests().into_iter().filter(|(m, _, _)| m == "PATCH").count();
    let writes_before = writes(&fake);

    let (code, out, err) = cleanup(&["--dry-run"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    for line in [
        &format!("node {NODE}: would remove"),
        "  label vigil.dev/maintenance",
        "  label vigil.dev/gpu-health",
        "  annotation vigil.dev/last-checkpoint",
        "  annotation vigil.dev/maintenance-window-start",
        "  taint vigil.dev/termination-imminent=true:NoSchedule",
        "  taint vigil.dev/gpu-failed=true:NoSchedule",
        "  taint vigil.dev/slow=true:NoSchedule",
        "  condition VigilMaintenance",
        "  condition VigilGPUUnhealthy",
        "  condition VigilSlow",
    ] {
        assert!(out.contains(line), "{line:?} missing:\n{out}");
    }
    for foreign in [
        "team",
        "vigil.dev.example.com",
        "notvigil",
        "nvidia.com",
        "Ready",
        "Kernel",
        "  label cloud.google.com",
    ] {
        assert!(!out.contains(foreign), "{foreign} listed:\n{out}");
    }
    assert_eq!(fake.node(), before, "a dry run writes nothing");
    assert_eq!(writes(&fake), writes_before);

    let (code, out, err) = cleanup(&[]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with(&format!("node {NODE}: removed\n")), "{out}");
    assert!(
        out.contains("note: label cloud.google.com/perform-maintenance=true left alone"),
        "{out}"
    );
    assert_eq!(
        label(&fake.node(), "cloud.google.com/perform-maintenance").as_deref(),
        Some("true")
    );
    let after = fake.node();
    assert_eq!(ignoring_version(&after), without_vigil(&before), "only Vigil's fields went");
    assert!(!after.to_string().contains("\"vigil.dev/"), "{after}");
    assert_eq!(condition(&after, "Ready")["reason"], "KubeletReady");
    assert_eq!(condition(&after, "KernelDeadlock")["reason"], "KernelHasNoDeadlock");
    assert_eq!(
        taints(&after),
        vec![
            json!({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}),
            json!({"key": "example.com/dedicated", "effect": "NoExecute"})
        ]
    );
    // One merge patch of the Node (taints with the precondition), one strategic patch of status.
    let requests = fake.requests();
    assert_eq!(
        requests[requests.len() - 3..],
        [
            seen("GET", NODE_PATH, ""),
            seen("PATCH", NODE_PATH, MERGE),
            seen("PATCH", &format!("{NODE_PATH}/status"), STRATEGIC)
        ]
    );

    let writes_done = writes(&fake);
    let (code, out, err) = cleanup(&[]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("nothing of Vigil's to remove"), "{out}");
    assert_eq!(writes(&fake), writes_done, "a second run writes nothing");
    assert_eq!(fake.node(), after);

    // RBAC: the agent's own rules suffice; without one, the error names it.
    fake.forbid("patch nodes/status");
    fake.foreign_write(json!({"status": {"conditions": [
        {"type": "Ready", "status": "True"},
        {"type": "VigilMaintenance", "status": "False"}
    ]}}));
    let (code, out, err) = cleanup(&[]).await;
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("{apiGroups: [\"\"], resources: [\"nodes/status\"], verbs: [\"patch\"]}"),
        "{err}"
    );
    fake.allow("patch nodes/status");
    fake.forbid("get nodes");
    let (code, _, err) = cleanup(&["--dry-run"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("{apiGroups: [\"\"], resources: [\"nodes\"], verbs: [\"get\"]}"), "{err}");
    fake.allow("get nodes");

    // Conflicts on every attempt: a clear failure, and the next run finishes the job.
    fake.foreign_write(json!({
        "metadata": {"labels": {"vigil.dev/maintenance": "none"}},
        "spec": {"taints": [{"key": "vigil.dev/gpu-failed", "value": "true", "effect": "NoSchedule"}]}
    }));
    fake.conflict_next(5);
    let (code, _, err) = cleanup(&[]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("409 Conflict") && err.contains("run it again"), "{err}");
    let (code, out, err) = cleanup(&[]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("  taint vigil.dev/gpu-failed=true:NoSchedule"), "{out}");
    assert!(!fake.node().to_string().contains("\"vigil.dev/"));
}

/// Another writer adds a taint between cleanup's read and its write: the whole-list write is
/// refused (409, the resourceVersion precondition), re-read and recomputed, and their taint
/// survives.
#[tokio::test]
async fn cleanup_retries_a_conflict_and_keeps_a_taint_added_meanwhile() {
    let (fake, api) = node_with_vigil_and_foreign_fields().await;
    fake.race_next_get(json!({"spec": {"taints": [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "example.com/dedicated", "effect": "NoExecute"},
        {"key": "vigil.dev/gpu-failed", "value": "true", "effect": "NoSchedule"},
        {"key": "vigil.dev/termination-imminent", "value": "true", "effect": "NoSchedule"},
        {"key": "late.example.com/drain", "effect": "NoSchedule"}
    ]}}));
    let keys = vigil::vocab::node::taint_keys(&vigil::config::KubernetesConfig::default());
    let removed = api
        .cleanup(NODE, "vigil.dev/", &keys, &vigil::vocab::node::CONDITIONS, &[], false)
        .await
        .expect("cleanup");
    assert_eq!(removed.taints.len(), 2);
    let keys: Vec<_> =
        taints(&fake.node()).iter().map(|t| t["key"].as_str().unwrap().to_string()).collect();
    assert_eq!(keys, ["nvidia.com/gpu", "example.com/dedicated", "late.example.com/drain"]);
    let node_patches =
        fake.requests().iter().filter(|r| **r == seen("PATCH", NODE_PATH, MERGE)).count();
    // The reconcile that set the scene wrote once; cleanup twice: refused (409), then done.
    assert_eq!(node_patches, 3, "{:?}", fake.requests());
}

/// The `kubectl`-only uninstall of docs/kubernetes.md ("Uninstall"), run as written (bash, the
/// machine's kubectl and jq) against the fake: Vigil's labels, annotations, taints and conditions
/// go, every foreign one stays.
#[tokio::test]
async fn the_documented_kubectl_uninstall_removes_only_vigils_fields() {
    let (fake, _api) = node_with_vigil_and_foreign_fields().await;
    let before = fake.node();
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/kubernetes.md"))
            .unwrap();
    let section = page.split("## Uninstall").nth(1).expect("an Uninstall section");
    let script = section
        .split("```sh\n")
        .nth(2)
        .and_then(|s| s.split("```").next())
        .expect("the kubectl-only script");
    assert!(script.contains("N=NODE"), "{script}");
    let script = script.replace("N=NODE", &format!("N={NODE}"));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            fake.url
        ),
    )
    .unwrap();
    // NB: async, so this test's runtime keeps serving the fake while kubectl waits on it.
    let out = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", dir.path())
        .output()
        .await
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{}\n{}\n{:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        fake.requests()
    );
    let after = fake.node();
    assert_eq!(ignoring_version(&after), without_vigil(&before), "{after}");
}
