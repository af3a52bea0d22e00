//! A failed GPU as a DRA device taint (KEP-5055, `DeviceTaintRule`): on a cluster whose GPUs are
//! allocated through Dynamic Resource Allocation, one failed device is tainted and the node's other
//! devices stay schedulable — instead of a `NoSchedule` taint on the whole Node. Which rules this
//! node's agent wants ([`plan`]): pure, from the node's devices as its ResourceSlices list them,
//! the failed GPUs' UUIDs and the rules it made before. `crate::kube::device_taints` reads and
//! writes them.

use std::collections::BTreeSet;

/// A device as a ResourceSlice of this node lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub driver: String,
    pub pool: String,
    pub name: String,
    /// Its `uuid` attribute (NVIDIA's DRA driver publishes the GPU's UUID there).
    pub uuid: Option<String>,
}

/// A rule Vigil makes: its name, the device it selects, and the taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub device: Device,
    /// `NoSchedule`; `None` in observe mode (the taint is shown, nothing is kept off).
    pub effect: &'static str,
    /// The failed GPU's UUID, for the rule's annotation and the log.
    pub gpu: String,
}

/// What to change: rules to create, names of Vigil's rules of this node to delete, and failed
/// GPUs no device of the node's slices stands for (said, never guessed).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub create: Vec<Rule>,
    pub delete: Vec<String>,
    pub unmatched: Vec<String>,
}

/// The taint's key, on every rule Vigil makes.
pub const TAINT_KEY: &str = "vigil.dev/gpu-failed";

/// A rule's name: `vigil-<node>-<device>`, lowercased, anything outside `[a-z0-9.-]` as `-`, at
/// most 253 characters (a DNS subdomain, as the API requires of a cluster-scoped object's name).
pub fn rule_name(node: &str, device: &str) -> String {
    let raw = format!("vigil-{node}-{device}").to_ascii_lowercase();
    let mut name: String = raw
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '.' | '-' => c,
            _ => '-',
        })
        .collect();
    name.truncate(253);
    name.trim_end_matches(['-', '.']).to_string()
}

/// The rules this node wants: one per failed GPU that a device of its slices stands for (by the
/// device's `uuid`), created where missing; its rules for GPUs no longer failed, deleted.
pub fn plan(
    node: &str,
    devices: &[Device],
    failed: &[String],
    existing: &[String],
    dry_run: bool,
) -> Plan {
    let effect = if dry_run { "None" } else { "NoSchedule" };
    let mut plan = Plan::default();
    let mut wanted = BTreeSet::new();
    for gpu in failed {
        let Some(d) = devices
            .iter()
            .find(|d| d.uuid.as_deref() == Some(gpu.as_str()))
        else {
            plan.unmatched.push(gpu.clone());
            continue;
        };
        let name = rule_name(node, &d.name);
        wanted.insert(name.clone());
        if !existing.contains(&name) {
            plan.create.push(Rule {
                name,
                device: d.clone(),
                effect,
                gpu: gpu.clone(),
            });
        }
    }
    plan.delete = existing
        .iter()
        .filter(|n| !wanted.contains(*n))
        .cloned()
        .collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: u32) -> Device {
        Device {
            driver: "gpu.nvidia.com".into(),
            pool: "gpu-node-7".into(),
            name: format!("gpu-{i}"),
            uuid: Some(format!("GPU-{i:04}")),
        }
    }

    #[test]
    fn a_failed_gpu_is_one_rule_for_its_device_and_a_recovered_one_is_deleted() {
        let devices: Vec<Device> = (0..8).map(gpu).collect();
        let p = plan("gpu-node-7", &devices, &["GPU-0003".into()], &[], false);
        assert_eq!(p.create.len(), 1);
        assert_eq!(p.create[0].name, "vigil-gpu-node-7-gpu-3");
        assert_eq!(p.create[0].device, gpu(3));
        assert_eq!(p.create[0].effect, "NoSchedule");
        assert!(p.delete.is_empty() && p.unmatched.is_empty());
        // Already there: nothing to write.
        let existing = ["vigil-gpu-node-7-gpu-3".to_string()];
        let same = plan(
            "gpu-node-7",
            &devices,
            &["GPU-0003".into()],
            &existing,
            false,
        );
        assert_eq!(same, Plan::default());
        // Recovered: its rule goes.
        let healed = plan("gpu-node-7", &devices, &[], &existing, false);
        assert_eq!(healed.delete, existing);
    }

    #[test]
    fn observe_mode_shows_the_taint_without_keeping_anything_off() {
        let p = plan("n", &[gpu(0)], &["GPU-0000".into()], &[], true);
        assert_eq!(p.create[0].effect, "None");
    }

    #[test]
    fn a_failed_gpu_no_device_stands_for_is_said_not_guessed() {
        let mut unnamed = gpu(1);
        unnamed.uuid = None;
        let p = plan("n", &[unnamed], &["GPU-0001".into()], &[], false);
        assert!(p.create.is_empty());
        assert_eq!(p.unmatched, ["GPU-0001"]);
    }

    #[test]
    fn rule_names_are_dns_subdomains() {
        assert_eq!(rule_name("GKE_Node.1", "gpu-0"), "vigil-gke-node.1-gpu-0");
        assert_eq!(rule_name("n", "MIG 1g.10gb/0"), "vigil-n-mig-1g.10gb-0");
        let long = rule_name(&"x".repeat(300), "gpu-0");
        assert!(long.len() <= 253 && !long.ends_with('-'));
    }
}
