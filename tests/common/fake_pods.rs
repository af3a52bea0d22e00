//! The pods part of the fake Kubernetes API server (`fake_kube`), as the real server does it:
//! - a pod the test places is stored as the API server would have stored it after create: the
//!   defaults applied (`spec.restartPolicy: Always`, `spec.terminationGracePeriodSeconds: 30`,
//!   `spec.priority: 0`, `status.phase: Pending`), a uid (the test's, where it gives the one its
//!   kubelet's sandbox carries), a resourceVersion from the shared counter;
//! - a list (`GET /api/v1/pods`, every namespace) answers a `PodList` whose items carry no
//!   `kind` / `apiVersion` (the real server leaves them out of list items), filtered by a
//!   `fieldSelector`: comma-separated `field=value`, `field==value` or `field!=value` terms,
//!   all of which must hold, on the fields pods support; another field is 400 BadRequest
//!   `field label not supported: <field>`, as the real server answers;
//! - query parameters this fake does not implement (`labelSelector`, `limit`, `continue`,
//!   `watch`) are refused with 400 rather than ignored, so a change in the client fails loudly.

use serde_json::{json, Value};

/// The fields a pod field selector may name (the API server's pod field label conversion).
const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

/// One term of a field selector: (field, equal?, value).
pub type Term = (String, bool, String);

/// `a%3Db+c` → `a=b c` (the form encoding clients put a query value in).
pub fn url_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query's parameters, decoded.
pub fn query_params(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (url_decode(k), url_decode(v))
        })
        .collect()
}

/// Parse a pod field selector; `Err` is the real server's message.
pub fn field_selector(sel: &str) -> Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    for raw in sel.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (field, eq, value) = if let Some((f, v)) = raw.split_once("!=") {
            (f, false, v)
        } else if let Some((f, v)) = raw.split_once("==") {
            (f, true, v)
        } else if let Some((f, v)) = raw.split_once('=') {
            (f, true, v)
        } else {
            return Err(format!("invalid selector: '{sel}'; can't understand '{raw}'"));
        };
        let field = field.trim();
        if !POD_FIELDS.contains(&field) {
            return Err(format!("field label not supported: {field}"));
        }
        terms.push((field.to_string(), eq, value.trim().to_string()));
    }
    Ok(terms)
}

/// A pod's value for a selectable field ("" where unset, as the server compares it).
fn field_value(pod: &Value, field: &str) -> String {
    let pointer = format!("/{}", field.replace('.', "/"));
    match pod.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => String::new(),
    }
}

/// Whether `pod` satisfies every term.
pub fn selected(pod: &Value, terms: &[Term]) -> bool {
    terms.iter().all(|(field, eq, value)| (field_value(pod, field) == *value) == *eq)
}

/// The pod as the API server stores it after create (see the module header); `Err` names what
/// the real server's validation would refuse.
pub fn stored(mut pod: Value, uid: u64, resource_version: &str) -> Result<Value, String> {
    let name = pod.pointer("/metadata/name").and_then(Value::as_str);
    let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str);
    if name.is_none_or(str::is_empty) || ns.is_none_or(str::is_empty) {
        return Err("metadata.name and metadata.namespace are required".into());
    }
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array);
    if containers.is_none_or(|c| c.is_empty()) {
        return Err("spec.containers: Required value".into());
    }
    pod["kind"] = json!("Pod");
    pod["apiVersion"] = json!("v1");
    // NB: a uid the test gives is the one the server assigned at create: the test's kubelet
    // ran the pod's sandbox first, under that uid (the real order is the other way round).
    if !pod["metadata"]["uid"].is_string() {
        pod["metadata"]["uid"] = json!(format!("9b1d0000-0000-4000-8000-{uid:012x}"));
    }
    pod["metadata"]["resourceVersion"] = json!(resource_version);
    let defaults = [
        ("/spec", "restartPolicy", json!("Always")),
        ("/spec", "terminationGracePeriodSeconds", json!(30)),
        ("/spec", "priority", json!(0)),
        ("/spec", "schedulerName", json!("default-scheduler")),
        ("/spec", "dnsPolicy", json!("ClusterFirst")),
    ];
    for (at, key, value) in defaults {
        let obj = pod.pointer_mut(at).and_then(Value::as_object_mut).unwrap();
        obj.entry(key).or_insert(value);
    }
    if pod.get("status").is_none() {
        pod["status"] = json!({});
    }
    let status = pod["status"].as_object_mut().unwrap();
    status.entry("phase").or_insert(json!("Pending"));
    Ok(pod)
}

/// A list item: the stored pod without `kind` and `apiVersion`.
pub fn list_item(pod: &Value) -> Value {
    let mut item = pod.clone();
    if let Some(o) = item.as_object_mut() {
        o.remove("kind");
        o.remove("apiVersion");
    }
    item
}

/// A pod bound to `node` with one container `main` that requests and limits these resources
/// (e.g. `[("nvidia.com/gpu", "1")]`), labelled `labels`.
pub fn pod_json(
    namespace: &str,
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
    resources: &[(&str, &str)],
) -> Value {
    let labels: serde_json::Map<String, Value> =
        labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    let quantities: serde_json::Map<String, Value> =
        resources.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "main",
                "image": "registry.example/trainer:1",
                "resources": {"requests": quantities.clone(), "limits": quantities}
            }]
        },
        "status": {"phase": "Running"}
    })
}
