//! The DRA part of the fake Kubernetes API server (`fake_kube`): `resource.k8s.io`'s
//! ResourceSlices (listed, cluster-scoped, with a `fieldSelector` on `spec.nodeName` or
//! `spec.driver`) and DeviceTaintRules (listed with a `labelSelector`, created, read, deleted),
//! served at the versions a cluster serves them (rules at `v1alpha3`, `v1beta2`, `v1`; slices at
//! `v1beta1`, `v1beta2`, `v1`), as the real server does it:
//! - a DeviceTaintRule is validated against the API's own schema for its version, vendored from
//!   Kubernetes' OpenAPI v3 spec (`tests/fixtures/kubernetes/devicetaintrule-openapi.json`: types,
//!   required fields, and no field the schema does not name — as the server decodes with
//!   `fieldValidation=Strict`, so a client that sends a field the API would drop fails here
//!   rather than silently), its `apiVersion`/`kind` the request's; then as the API's validation
//!   does what the schema only describes (KEP-5055): `metadata.name` a DNS subdomain;
//!   `spec.taint.key` a qualified name, its `effect` `NoSchedule`, `NoExecute` or `None`
//!   (`PreferNoSchedule` is not one); `deviceSelector.all` alone. 422 Invalid (400 for a schema
//!   error) naming the field; a name taken is 409 AlreadyExists; the server sets
//!   `spec.taint.timeAdded`, a uid and a resourceVersion;
//! - a list's items carry no `kind`/`apiVersion`, a missing object is 404 NotFound, and a query
//!   parameter this fake does not implement is 400, so a change in the client fails loudly.

use serde_json::{json, Value};

/// The versions of `resource.k8s.io` that serve DeviceTaintRule (1.33–1.35, 1.36, 1.37).
pub const VERSIONS: &[&str] = &["v1alpha3", "v1beta2", "v1"];
/// The versions that serve ResourceSlice (no `v1alpha3` any more: 1.32 moved it to `v1beta1`).
pub const SLICE_VERSIONS: &[&str] = &["v1beta1", "v1beta2", "v1"];

/// Kubernetes' OpenAPI v3 schemas of DeviceTaintRule, by version (vendored: see the file's
/// `source`).
fn schemas() -> &'static Value {
    static SCHEMAS: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    SCHEMAS.get_or_init(|| {
        serde_json::from_str(include_str!("../fixtures/kubernetes/devicetaintrule-openapi.json"))
            .expect("the vendored DeviceTaintRule schema is JSON")
    })
}

/// Where `rule` breaks the schema of DeviceTaintRule at `version`: (field path, message).
pub fn schema_error(rule: &Value, version: &str) -> Option<(String, String)> {
    let v = &schemas()["versions"][version];
    let root = v["root"].as_str()?;
    let want = format!("resource.k8s.io/{version}");
    if rule["apiVersion"] != want.as_str() || rule["kind"] != "DeviceTaintRule" {
        return Some((
            "apiVersion".into(),
            format!(
                "the object is {} {}, not DeviceTaintRule of {want}",
                rule["apiVersion"], rule["kind"]
            ),
        ));
    }
    walk(&v["schemas"], &v["schemas"][root], rule, "").err()
}

/// `value` against `schema` (a `$ref`, an `allOf`, or a typed schema), at `path`.
fn walk(all: &Value, schema: &Value, value: &Value, path: &str) -> Result<(), (String, String)> {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return walk(all, &all[name], value, path);
    }
    if let Some(parts) = schema["allOf"].as_array() {
        return parts.iter().try_for_each(|p| walk(all, p, value, path));
    }
    let at = |f: &str| match path {
        "" => f.to_string(),
        p => format!("{p}.{f}"),
    };
    let wrong = |t: &str| Err((path.to_string(), format!("must be of type {t}, got {value}")));
    match schema["type"].as_str() {
        Some("object") => {
            let Some(obj) = value.as_object() else {
                return wrong("object");
            };
            for req in schema["required"].as_array().into_iter().flatten() {
                let f = req.as_str().unwrap_or_default();
                if !obj.contains_key(f) {
                    return Err((at(f), "Required value".into()));
                }
            }
            // A schema with no properties (the ObjectMeta stand-in) takes any.
            let Some(props) = schema["properties"].as_object() else {
                return Ok(());
            };
            for (f, v) in obj {
                match props.get(f) {
                    Some(p) => walk(all, p, v, &at(f))?,
                    None => {
                        return Err((
                            at(f),
                            format!("strict decoding error: unknown field \"{}\"", at(f)),
                        ))
                    }
                }
            }
            Ok(())
        }
        Some("array") => match value.as_array() {
            Some(items) => items
                .iter()
                .enumerate()
                .try_for_each(|(i, v)| walk(all, &schema["items"], v, &format!("{path}[{i}]"))),
            None => wrong("array"),
        },
        Some("string") if !value.is_string() => wrong("string"),
        Some("boolean") if !value.is_boolean() => wrong("boolean"),
        Some("integer") if !value.is_i64() && !value.is_u64() => wrong("integer"),
        _ => Ok(()),
    }
}

/// Why the server's validation refuses a DeviceTaintRule the schema takes: (field, message),
/// for a 422 Invalid.
pub fn invalid(rule: &Value) -> Option<(String, String)> {
    let name = rule["metadata"]["name"].as_str().unwrap_or_default();
    if !dns_subdomain(name) {
        return Some((
            "metadata.name".into(),
            format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"),
        ));
    }
    let sel = &rule["spec"]["deviceSelector"];
    if sel["all"] == true && ["driver", "pool", "device"].iter().any(|f| !sel[*f].is_null()) {
        return Some((
            "spec.deviceSelector.all".into(),
            "Invalid value: true: may not be combined with driver, pool or device".into(),
        ));
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
    selector.split(',').map(str::trim).filter(|t| !t.is_empty()).all(|t| match t.split_once("!=") {
        Some((k, v)) => o["metadata"]["labels"][k.trim()].as_str() != Some(v.trim()),
        None => {
            let (k, v) = t.split_once("==").or_else(|| t.split_once('=')).unwrap_or((t, ""));
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
                && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
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
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}
