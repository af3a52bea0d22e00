//! DRA device taints through the Kubernetes API (`resource.k8s.io`, `gpu.device_taints`): this
//! node's devices from its ResourceSlices (`list`, `fieldSelector=spec.nodeName=<node>`), Vigil's
//! `DeviceTaintRule`s of this node (`list`, labelled `vigil.dev/node=<node>`), and the rules
//! created and deleted as `crate::vocab::device_taint::plan` says. RBAC (the opt-in component
//! `deploy/components/dra-device-taints`): `list` on `resourceslices`; `list`, `create`, `delete`
//! on `devicetaintrules`.

use async_trait::async_trait;
use kube::api::PostParams;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use serde_json::{json, Value};

use crate::kube::client::{kube_client, ConnectError, PodError, CALL_TIMEOUT};
use crate::vocab::device_taint::{plan, Device, Plan, Rule, TAINT_KEY};

/// The label on every rule Vigil makes, with its node's name.
pub const NODE_LABEL: &str = "vigil.dev/node";

/// The slice of the DRA API the device taints need.
#[async_trait]
pub trait DeviceTaintApi: Send + Sync {
    /// The devices of `driver` this node's ResourceSlices list.
    async fn devices(&self, node: &str, driver: &str) -> Result<Vec<Device>, PodError>;
    /// The names of the rules Vigil made for this node.
    async fn rules(&self, node: &str) -> Result<Vec<String>, PodError>;
    async fn create(&self, node: &str, rule: &Rule) -> Result<(), PodError>;
    async fn delete(&self, name: &str) -> Result<(), PodError>;
}

/// Make this node's rules match its failed GPUs (`failed`, their UUIDs): the plan, carried out.
/// What it did, for the log; a failed GPU that no device stands for is in the plan's
/// `unmatched`.
pub async fn reconcile(
    api: &dyn DeviceTaintApi,
    node: &str,
    driver: &str,
    failed: &[String],
    dry_run: bool,
) -> Result<Plan, PodError> {
    let existing = api.rules(node).await?;
    let devices = match failed.is_empty() {
        // Nothing failed: only deletions, no slices to read.
        true => Vec::new(),
        false => api.devices(node, driver).await?,
    };
    let p = plan(node, &devices, failed, &existing, dry_run);
    for rule in &p.create {
        api.create(node, rule).await?;
    }
    for name in &p.delete {
        api.delete(name).await?;
    }
    Ok(p)
}

/// [`DeviceTaintApi`] through `kube`, at the API version `resource.k8s.io/<version>`.
pub struct KubeDeviceTaints {
    client: kube::Client,
    version: String,
}

impl KubeDeviceTaints {
    pub async fn connect(api_url: &str, version: &str) -> Result<Self, ConnectError> {
        Ok(KubeDeviceTaints {
            client: kube_client(api_url).await?,
            version: version.to_string(),
        })
    }

    fn api(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("resource.k8s.io", &self.version, kind);
        Api::all_with(
            self.client.clone(),
            &ApiResource::from_gvk_with_plural(&gvk, plural),
        )
    }
}

/// One call, bounded, its error worded for the operator.
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
    verb: &'static str,
    resource: &'static str,
) -> Result<T, PodError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Err(_) => Err(PodError::Timeout(CALL_TIMEOUT)),
        Ok(r) => r.map_err(|e| PodError::of(e, verb, resource)),
    }
}

#[async_trait]
impl DeviceTaintApi for KubeDeviceTaints {
    async fn devices(&self, node: &str, driver: &str) -> Result<Vec<Device>, PodError> {
        let api = self.api("ResourceSlice", "resourceslices");
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = bounded(api.list(&params), "list", "resourceslices").await?;
        let slices: Vec<Value> = list
            .items
            .into_iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .collect();
        Ok(devices_of(&slices, driver))
    }

    async fn rules(&self, node: &str) -> Result<Vec<String>, PodError> {
        let api = self.api("DeviceTaintRule", "devicetaintrules");
        let params = ListParams::default().labels(&format!("{NODE_LABEL}={node}"));
        let list = bounded(api.list(&params), "list", "devicetaintrules").await?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect())
    }

    async fn create(&self, node: &str, rule: &Rule) -> Result<(), PodError> {
        let api = self.api("DeviceTaintRule", "devicetaintrules");
        let object: DynamicObject = serde_json::from_value(rule_object(
            &format!("resource.k8s.io/{}", self.version),
            node,
            rule,
        ))
        .map_err(|_| PodError::Unsupported("a DeviceTaintRule that does not serialize"))?;
        match tokio::time::timeout(CALL_TIMEOUT, api.create(&PostParams::default(), &object)).await
        {
            Err(_) => Err(PodError::Timeout(CALL_TIMEOUT)),
            // Made meanwhile (another incarnation of this agent): it stands.
            Ok(Err(kube::Error::Api(e))) if e.code == 409 => Ok(()),
            Ok(r) => r
                .map(drop)
                .map_err(|e| PodError::of(e, "create", "devicetaintrules")),
        }
    }

    async fn delete(&self, name: &str) -> Result<(), PodError> {
        let api = self.api("DeviceTaintRule", "devicetaintrules");
        match tokio::time::timeout(CALL_TIMEOUT, api.delete(name, &DeleteParams::default())).await {
            Err(_) => Err(PodError::Timeout(CALL_TIMEOUT)),
            // Gone already: what was wanted.
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => Ok(()),
            Ok(r) => r
                .map(drop)
                .map_err(|e| PodError::of(e, "delete", "devicetaintrules")),
        }
    }
}

/// The devices of `driver` in ResourceSlices as the API serves them (`spec.driver`,
/// `spec.pool.name`, `spec.devices[].name`, the `uuid` attribute as `{"string": …}`; the
/// v1beta1 shape nests them under `basic`).
pub(crate) fn devices_of(slices: &[Value], driver: &str) -> Vec<Device> {
    let mut out = Vec::new();
    for s in slices.iter().filter(|s| s["spec"]["driver"] == driver) {
        let pool = s["spec"]["pool"]["name"].as_str().unwrap_or_default();
        for d in s["spec"]["devices"].as_array().into_iter().flatten() {
            let attrs = match &d["attributes"] {
                Value::Null => &d["basic"]["attributes"],
                a => a,
            };
            out.push(Device {
                driver: driver.to_string(),
                pool: pool.to_string(),
                name: d["name"].as_str().unwrap_or_default().to_string(),
                uuid: attrs["uuid"]["string"].as_str().map(str::to_string),
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
            "labels": {NODE_LABEL: node},
            "annotations": {"vigil.dev/gpu": rule.gpu},
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
                            {"name": "gpu-1", "basic": {"attributes": {"uuid": {"string": "GPU-b"}}}}]}}),
            json!({"spec": {"driver": "other.example.com", "pool": {"name": "n"}, "devices": [{"name": "nic-0"}]}}),
        ];
        let d = devices_of(&slices, "gpu.nvidia.com");
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].name.as_str(), d[0].uuid.as_deref()),
            ("gpu-0", Some("GPU-a"))
        );
        assert_eq!(d[1].uuid.as_deref(), Some("GPU-b"), "v1beta1's basic");
        assert_eq!(d[1].pool, "n");
    }

    #[test]
    fn a_rule_selects_one_device_and_says_whose_it_is() {
        let rule = Rule {
            name: "vigil-n-gpu-3".into(),
            device: Device {
                driver: "gpu.nvidia.com".into(),
                pool: "n".into(),
                name: "gpu-3".into(),
                uuid: Some("GPU-c".into()),
            },
            effect: "NoSchedule",
            gpu: "GPU-c".into(),
        };
        let o = rule_object("resource.k8s.io/v1beta2", "n", &rule);
        assert_eq!(o["spec"]["deviceSelector"]["device"], "gpu-3");
        assert_eq!(o["spec"]["taint"]["effect"], "NoSchedule");
        assert_eq!(o["metadata"]["labels"][NODE_LABEL], "n");
    }
}
