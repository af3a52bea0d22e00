//! The DRA part of the fake Kubernetes API server (`fake_kube`): `resource.k8s.io`'s
//! ResourceSlices (listed, cluster-scoped, with a `fieldSelector` on `spec.nodeName` or
//! `spec.driver`) and DeviceTaintRules (listed with a `labelSelector`, created, read, deleted),
//! served at the versions a cluster serves them (rules at `v1alpha3`, `v1beta2`, `v1`; slices at
//! `v1beta1`, `v1beta2`, `v1`), as the real server does it:
//! - a DeviceTaintRule is validated as the API validates it (KEP-5055, `resource/v1beta2`
//!   `types.go` and its validation): `metadata.name` a DNS subdomain; `spec.deviceSelector`'s
//!   `driver`, `pool`, `device` strings where set; `spec.taint` required, its `key` a qualified
//!   name, its `effect` `NoSchedule`, `NoExecute` or `None` (`PreferNoSchedule` is not one):
//!   422 Invalid naming the field otherwise; a name taken is 409 AlreadyExists; the server sets
//!   `spec.taint.timeAdded`, a uid and a resourceVersion;
//! - a list's items carry no `kind`/`apiVersion`, a missing object is 404 NotFound, and a query
//!   parameter this fake does not implement is 400, so a change in the client fails loudly.

use serde_json::{json, Value};

/// The versions of `resource.k8s.io` that serve DeviceTaintRule (1.33–1.35, 1.36, 1.37).
pub const VERSIONS: &[&str] = &["v1alpha3", "v1beta2", "v1"];
/// The versions that serve ResourceSlice (no `v1alpha3` any more: 1.32 moved it to `v1beta1`).
pub const SLICE_VERSIONS: &[&str] = &["v1beta1", "v1beta2", "v1"];

/// Why the server refuses a DeviceTaintRule: (field, message), for a 422 Invalid.
pub fn invalid(rule: &Value) -> Option<(String, String)> {
    let name = rule["metadata"]["name"].as_str().unwrap_or_default();
    if !dns_subdomain(name) {
        return Some((
            "metadata.name".into(),
            format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"),
        ));
    }
    let sel = &rule["spec"]["deviceSelector"];
    for f in ["driver", "pool", "device"] {
        if !(sel[f].is_null() || sel[f].is_string()) {
            return Some((
                format!("spec.deviceSelector.{f}"),
                "must be a string".into(),
            ));
        }
    }
    let taint = &rule["spec"]["taint"];
    if !taint.is_object() {
        return Some(("spec.taint".into(), "Required value".into()));
    }
    let key = taint["key"].as_str().unwrap_or_default();
    if !qualified_name(key) {
        return Some((
            "spec.taint.key".into(),
            format!("Invalid value: {key:?}: must be a qualified name"),
        ));
    }
    let effect = taint["effect"].as_str().unwrap_or_default();
    if !matches!(effect, "NoSchedule" | "NoExecute" | "None") {
        return Some((
            "spec.taint.effect".into(),
            format!("Unsupported value: {effect:?}: supported values: \"NoSchedule\", \"NoExecute\", \"None\""),
        ));
    }
    None
}

/// The rule as stored after create: uid, resourceVersion, `timeAdded`.
pub fn stored(mut rule: Value, uid: u64, resource_version: &str) -> Value {
    rule["metadata"]["uid"] = json!(format!("7e110000-0000-4000-8000-{uid:012x}"));
    rule["metadata"]["resourceVersion"] = json!(resource_version);
    rule["spec"]["taint"]["timeAdded"] = json!("2026-12-06T00:00:00Z");
    rule
}

/// Whether every `k=v` / `k!=v` term of a label selector holds for `o`.
pub fn labels_match(o: &Value, selector: &str) -> bool {
    selector
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|t| match t.split_once("!=") {
            Some((k, v)) => o["metadata"]["labels"][k.trim()].as_str() != Some(v.trim()),
            None => {
                let (k, v) = t
                    .split_once("==")
                    .or_else(|| t.split_once('='))
                    .unwrap_or((t, ""));
                o["metadata"]["labels"][k.trim()].as_str() == Some(v.trim())
            }
        })
}

/// Whether a slice matches a field selector on `spec.nodeName` / `spec.driver`; `Err` names a
/// field ResourceSlices do not support.
pub fn slice_selected(slice: &Value, selector: &str) -> Result<bool, String> {
    let mut ok = true;
    for t in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (k, v) = t.split_once('=').unwrap_or((t, ""));
        let v = v.trim_start_matches('=');
        let field = match k.trim() {
            "spec.nodeName" => &slice["spec"]["nodeName"],
            "spec.driver" => &slice["spec"]["driver"],
            other => return Err(format!("field label not supported: {other}")),
        };
        ok &= field.as_str() == Some(v);
    }
    Ok(ok)
}

/// A list item: without `kind` and `apiVersion`.
pub fn item(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    o
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    prefix.is_none_or(dns_subdomain)
        && !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}
