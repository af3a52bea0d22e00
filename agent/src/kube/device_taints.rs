//! DRA device taints through the Kubernetes API (`resource.k8s.io`, `gpu.device_taints`): this
//! node's devices from its ResourceSlices (`list`, `fieldSelector=spec.nodeName=<node>`), Vigil's
//! `DeviceTaintRule`s of this node (`list`, labelled `vigil.dev/node`), and the rules created and
//! deleted as `crate::vocab::device_taint::plan` says. RBAC (the opt-in component
//! `deploy/components/dra-device-taints`): `list` on `resourceslices`; `list`, `get`, `create`,
//! `delete` on `devicetaintrules`.

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use serde_json::{json, Value};

use crate::kube::client::{kube_client, ConnectError, PodError};
use crate::vocab::device_taint::{node_label, plan, Device, Existing, Plan, Rule, TAINT_KEY};

/// The label on every rule Vigil makes: its node ([`node_label`]).
pub const NODE_LABEL: &str = "vigil.dev/node";
/// The annotations on every rule: the failed GPU's UUID, and the node's full name.
pub const GPU_ANNOTATION: &str = "vigil.dev/gpu";
pub const NODE_ANNOTATION: &str = "vigil.dev/node-name";

/// The rules' resource (plural), as the API calls and their errors name it.
const RULES: &str = "devicetaintrules";

/// Make this node's rules match its failed GPUs (`failed`, their UUIDs): the plan, carried out
/// (deletions first: a rule of another effect is replaced). What it did, for the log; a failed
/// GPU that no device stands for is in the plan's `unmatched`.
pub async fn reconcile(
    api: &KubeDeviceTaints,
    node: &str,
    driver: &str,
    failed: &[String],
    dry_run: bool,
) -> Result<Plan, PodError> {
    let existing = api.rules(node).await?;
    // Nothing failed: only deletions, no slices to read.
    let devices = if failed.is_empty() { Vec::new() } else { api.devices(node, driver).await? };
    let p = plan(node, &devices, failed, &existing, dry_run);
    for name in &p.delete {
        api.delete(name).await?;
    }
    for rule in &p.create {
        api.create(node, rule).await?;
    }
    Ok(p)
}

/// The slice of the DRA API the device taints need, through `kube`: DeviceTaintRules at
/// `resource.k8s.io/<version>`, ResourceSlices at the version a cluster that serves those rules
/// serves them (`v1alpha3` rules: `v1beta1` slices, 1.33–1.35).
pub struct KubeDeviceTaints {
    client: kube::Client,
    version: String,
}

impl KubeDeviceTaints {
    pub async fn connect(api_url: &str, version: &str) -> Result<Self, ConnectError> {
        Ok(KubeDeviceTaints { client: kube_client(api_url).await?, version: version.to_string() })
    }

    fn api(&self, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("resource.k8s.io", version, kind);
        Api::all_with(self.client.clone(), &ApiResource::from_gvk_with_plural(&gvk, plural))
    }

    fn rules_api(&self) -> Api<DynamicObject> {
        self.api(&self.version, "DeviceTaintRule", RULES)
    }

    /// The devices of `driver` this node's ResourceSlices list, read at the rules' version
    /// (`v1beta1` for `v1alpha3` rules: the clusters serving those have no `v1alpha3` slices).
    pub async fn devices(&self, node: &str, driver: &str) -> Result<Vec<Device>, PodError> {
        let version = if self.version == "v1alpha3" { "v1beta1" } else { &self.version };
        let api = self.api(version, "ResourceSlice", "resourceslices");
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = PodError::bounded(api.list(&params), "list", "resourceslices").await?;
        let slices: Vec<Value> = list.items.into_iter().map(value_of).collect();
        Ok(devices_of(&slices, driver))
    }

    /// The rules Vigil made for this node.
    pub async fn rules(&self, node: &str) -> Result<Vec<Existing>, PodError> {
        let params = ListParams::default().labels(&format!("{NODE_LABEL}={}", node_label(node)));
        let list = PodError::bounded(self.rules_api().list(&params), "list", RULES).await?;
        Ok(list.items.into_iter().map(|o| existing(&value_of(o))).collect())
    }

    async fn create(&self, node: &str, rule: &Rule) -> Result<(), PodError> {
        let api = self.rules_api();
        let version = format!("resource.k8s.io/{}", self.version);
        let object: DynamicObject = serde_json::from_value(rule_object(&version, node, rule))
            .map_err(|_| PodError::Unsupported("a DeviceTaintRule that does not serialize"))?;
        let params = PostParams::default();
        match PodError::bounded(api.create(&params, &object), "create", RULES).await {
            // A rule of that name exists: it stands if it is this node's (another incarnation
            // of this agent made it meanwhile); else it is someone else's, and said.
            Err(PodError::Api { source: kube::Error::Api(e), .. }) if e.code == 409 => {
                let theirs = PodError::bounded(api.get(&rule.name), "get", RULES).await?;
                if value_of(theirs)["metadata"]["labels"][NODE_LABEL] == node_label(node) {
                    return Ok(());
                }
                Err(PodError::Taken(format!(
                    "a DeviceTaintRule named {} exists and is not this node's: the failed GPU {} is not tainted",
                    rule.name, rule.gpu
                )))
            }
            r => r.map(drop),
        }
    }

    async fn delete(&self, name: &str) -> Result<(), PodError> {
        let api = self.rules_api();
        match PodError::bounded(api.delete(name, &DeleteParams::default()), "delete", RULES).await {
            // Gone already: what was wanted.
            Err(PodError::Api { source: kube::Error::Api(e), .. }) if e.code == 404 => Ok(()),
            r => r.map(drop),
        }
    }
}

fn value_of(o: DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or_default()
}

/// A rule as listed: its name, the GPU it was made for, its effect.
fn existing(rule: &Value) -> Existing {
    let text = |v: &Value| v.as_str().map(str::to_string);
    Existing {
        name: text(&rule["metadata"]["name"]).unwrap_or_default(),
        gpu: text(&rule["metadata"]["annotations"][GPU_ANNOTATION]),
        effect: text(&rule["spec"]["taint"]["effect"]),
    }
}

/// The devices of `driver` in ResourceSlices as the API serves them (`spec.driver`,
/// `spec.pool.name`, `spec.devices[].name`, the `uuid` and `parentUUID` attributes as
/// `{"string": …}`; the v1beta1 shape nests them under `basic`).
pub(crate) fn devices_of(slices: &[Value], driver: &str) -> Vec<Device> {
    let mut out = Vec::new();
    for s in slices.iter().filter(|s| s["spec"]["driver"] == driver) {
        let pool = s["spec"]["pool"]["name"].as_str().unwrap_or_default();
        for d in s["spec"]["devices"].as_array().into_iter().flatten() {
            let attrs = match &d["attributes"] {
                Value::Null => &d["basic"]["attributes"],
                a => a,
            };
            let attr = |k: &str| attrs[k]["string"].as_str().map(str::to_string);
            out.push(Device {
                driver: driver.to_string(),
                pool: pool.to_string(),
                name: d["name"].as_str().unwrap_or_default().to_string(),
                uuid: attr("uuid"),
                parent_uuid: attr("parentUUID"),
            });
        }
    }
    out
}

/// The `DeviceTaintRule` for `rule`, as created.
pub(crate) fn rule_object(api_version: &str, node: &str, rule: &Rule) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule.name,
            "labels": {NODE_LABEL: node_label(node)},
            "annotations": {GPU_ANNOTATION: rule.gpu, NODE_ANNOTATION: node},
        },
        "spec": {
            "deviceSelector": {
                "driver": rule.device.driver,
                "pool": rule.device.pool,
                "device": rule.device.name,
            },
            "taint": {"key": TAINT_KEY, "value": "true", "effect": rule.effect},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_read_from_the_slices_of_the_driver_in_either_shape() {
        let slices = [
            json!({"spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}, "index": {"int": 0}}},
                            {"name": "gpu-1", "basic": {"attributes": {"uuid": {"string": "GPU-b"}}}},
                            {"name": "gpu-0-mig-1", "attributes": {"uuid": {"string": "MIG-x"}, "parentUUID": {"string": "GPU-a"}}}]}}),
            json!({"spec": {"driver": "other.example.com", "pool": {"name": "n"}, "devices": [{"name": "nic-0"}]}}),
        ];
        let d = devices_of(&slices, "gpu.nvidia.com");
        assert_eq!(d.len(), 3);
        assert_eq!((d[0].name.as_str(), d[0].uuid.as_deref()), ("gpu-0", Some("GPU-a")));
        assert_eq!(d[1].uuid.as_deref(), Some("GPU-b"), "v1beta1's basic");
        assert_eq!(d[2].parent_uuid.as_deref(), Some("GPU-a"), "a MIG device");
        assert_eq!(d[1].pool, "n");
    }

    #[test]
    fn a_rule_selects_one_device_and_says_whose_it_is() {
        let rule = Rule {
            name: "vigil-n-gpu-3-0000abcd".into(),
            device: Device {
                driver: "gpu.nvidia.com".into(),
                pool: "n".into(),
                name: "gpu-3".into(),
                uuid: Some("GPU-c".into()),
                parent_uuid: None,
            },
            effect: "NoSchedule",
            gpu: "GPU-c".into(),
        };
        let o = rule_object("resource.k8s.io/v1beta2", "n", &rule);
        assert_eq!(o["spec"]["deviceSelector"]["device"], "gpu-3");
        assert_eq!(o["spec"]["taint"]["effect"], "NoSchedule");
        assert_eq!(o["metadata"]["labels"][NODE_LABEL], "n");
        assert_eq!(existing(&o).gpu.as_deref(), Some("GPU-c"));
        assert_eq!(existing(&o).effect.as_deref(), Some("NoSchedule"));
    }
}
