//! A failed GPU as a DRA device taint (KEP-5055, `DeviceTaintRule`): on a cluster whose GPUs are
//! allocated through Dynamic Resource Allocation, one failed device is tainted and the node's other
//! devices stay schedulable — instead of a `NoSchedule` taint on the whole Node. Which rules this
//! node's agent wants ([`plan`]): pure, from the node's devices as its ResourceSlices list them,
//! the failed GPUs' UUIDs and the rules it made before. `crate::kube::device_taints` reads and
//! writes them.

use std::collections::BTreeMap;

/// A device as a ResourceSlice of this node lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub driver: String,
    pub pool: String,
    pub name: String,
    /// Its `uuid` attribute (NVIDIA's DRA driver publishes the GPU's UUID there; a MIG
    /// device's own).
    pub uuid: Option<String>,
    /// Its `parentUUID` attribute: the GPU a MIG device is a slice of.
    pub parent_uuid: Option<String>,
}

impl Device {
    /// Whether the device is (or is a slice of) GPU `uuid`.
    fn is_on(&self, uuid: &str) -> bool {
        self.uuid.as_deref() == Some(uuid) || self.parent_uuid.as_deref() == Some(uuid)
    }
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

/// A rule Vigil made before, as listed: its name, the GPU it was made for (its annotation) and
/// its effect.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Existing {
    pub name: String,
    pub gpu: Option<String>,
    pub effect: Option<String>,
}

/// What to change: names of Vigil's rules of this node to delete (first), rules to create, and
/// failed GPUs no device of the node's slices stands for (said, never guessed).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub delete: Vec<String>,
    pub create: Vec<Rule>,
    pub unmatched: Vec<String>,
}

/// The taint's key, on every rule Vigil makes.
pub const TAINT_KEY: &str = "vigil.dev/gpu-failed";

/// FNV-1a, 64 bits: a short, stable digest for names and label values.
fn digest(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// `s` lowercased, anything outside `[a-z0-9-]` as `-`, at most `max` characters, no `-` at
/// either end.
fn dns_part(s: &str, max: usize) -> String {
    let mut out = s.to_ascii_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "-");
    out.truncate(max);
    out.trim_matches('-').to_string()
}

/// A rule's name: `vigil-<node>-<device>-<digest of driver/pool/device>` — readable, at most
/// 253 characters (a DNS subdomain, as the API requires of a cluster-scoped object), and one
/// device's name whatever the truncation or the dashes in node and device names.
pub fn rule_name(node: &str, d: &Device) -> String {
    let id = digest(&format!("{}/{}/{}", d.driver, d.pool, d.name));
    format!("vigil-{}-{}-{:08x}", dns_part(node, 150), dns_part(&d.name, 80), id as u32)
}

/// The value of the `vigil.dev/node` label on this node's rules: the node's name when it is a
/// valid label value (63 characters at most), else `h-` and a digest of it (a Node's name may
/// be 253 characters; the full name is in an annotation).
pub fn node_label(node: &str) -> String {
    let valid = !node.is_empty()
        && node.len() <= 63
        && node.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && node.starts_with(|c: char| c.is_ascii_alphanumeric())
        && node.ends_with(|c: char| c.is_ascii_alphanumeric());
    match valid {
        true => node.to_string(),
        false => format!("h-{:016x}", digest(node)),
    }
}

/// The rules this node wants: one per device of its slices that is (or is a slice of) a failed
/// GPU, created where missing or of another effect; its other rules deleted — except a rule of
/// a GPU still failed that no device stands for now (the slices gone for a moment, a driver
/// restarting: the rule stands rather than a failed GPU going untainted).
pub fn plan(
    node: &str,
    devices: &[Device],
    failed: &[String],
    existing: &[Existing],
    dry_run: bool,
) -> Plan {
    let effect = if dry_run { "None" } else { "NoSchedule" };
    let mut plan = Plan::default();
    let mut wanted: BTreeMap<String, Rule> = BTreeMap::new();
    for gpu in failed {
        let on: Vec<&Device> = devices.iter().filter(|d| d.is_on(gpu)).collect();
        if on.is_empty() {
            plan.unmatched.push(gpu.clone());
        }
        for d in on {
            let name = rule_name(node, d);
            wanted.insert(name.clone(), Rule { name, device: d.clone(), effect, gpu: gpu.clone() });
        }
    }
    for e in existing {
        let kept = match wanted.get(&e.name) {
            Some(_) => e.effect.as_deref() == Some(effect),
            None => e.gpu.as_ref().is_some_and(|g| plan.unmatched.contains(g)),
        };
        if !kept {
            plan.delete.push(e.name.clone());
        }
    }
    let standing =
        |name: &str| existing.iter().any(|e| e.name == name && e.effect.as_deref() == Some(effect));
    plan.create = wanted.into_values().filter(|r| !standing(&r.name)).collect();
    plan
}

#[cfg(test)]
#[path = "device_taint_tests.rs"]
mod tests;
