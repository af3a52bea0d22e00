//! The Vigil-owned state of the Kubernetes Node — labels, annotations, taints and conditions
//! Vigil wants, the type of the Events it records — and the names of Vigil's taints and
//! conditions. The features' policies compute it (maintenance, GPU and TPU health); the Node
//! adapter (`crate::kube::node`) makes the API server show it; `vigil cleanup` removes it.

use std::collections::BTreeMap;

use crate::config::{KubernetesConfig, PaceConfig};

/// A taint Vigil owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// The state of Vigil-owned fields Vigil wants on the Node. Everything else on the Node
/// (labels, annotations, taints owned by others) must be left exactly as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeDesired {
    /// `Some(v)` sets, `None` removes. Only keys listed here are touched.
    pub labels: BTreeMap<String, Option<String>>,
    pub annotations: BTreeMap<String, Option<String>>,
    /// Taints to ensure present (matched by key + effect).
    pub add_taints: Vec<Taint>,
    /// Taint keys to ensure absent (any effect).
    ///
    /// A taint that `add_taints` asks for (same key and effect) is kept even when its key is
    /// listed here, so switching Vigil's taint from one effect to another is one change.
    pub remove_taints: Vec<String>,
    /// Node conditions Vigil owns (on the Node's status subresource), by type; other conditions
    /// (kubelet's `Ready`, node-problem-detector's) are never touched.
    pub conditions: Vec<NodeCondition>,
    /// Condition types Vigil wants off the Node (a retired type, or one with no verdict now);
    /// like [`NodeDesired::conditions`], only Vigil's own types are ever listed.
    pub remove_conditions: Vec<String>,
}

/// The status of a Node condition, as Kubernetes spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// A Node condition as node-problem-detector publishes them: remediation tools (medik8s NHC,
/// cluster autoscalers, dashboards) read conditions, not labels. Every Vigil condition has one
/// polarity, theirs: `True` means a problem (docs/kubernetes.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCondition {
    /// e.g. `VigilGPUUnhealthy`.
    pub kind: String,
    pub status: ConditionStatus,
    /// CamelCase, e.g. `Failed`, `Pending`.
    pub reason: String,
    pub message: String,
}

/// `Normal` or `Warning`, as Kubernetes Events have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
pub enum EventType {
    Normal,
    Warning,
}

as_str!(pub ConditionStatus, EventType);

/// The taint (after the label prefix) while termination is imminent.
pub(crate) const TERMINATION_TAINT: &str = "termination-imminent";
/// The taint (after the label prefix) while a GPU has failed.
pub(crate) const GPU_FAILED_TAINT: &str = "gpu-failed";
/// The taint (after the label prefix) while the node's TPU chips have failed.
pub(crate) const TPU_FAILED_TAINT: &str = "tpu-failed";
/// The taint (after the label prefix) while a slow gang names this node (`gang.pace.taint`).
pub(crate) const SLOW_TAINT: &str = "slow";

/// The keys of every taint Vigil may set on its Node (`vigil cleanup` removes these, whatever
/// their effect).
pub fn taint_keys(k: &KubernetesConfig) -> Vec<String> {
    let taints = [TERMINATION_TAINT, GPU_FAILED_TAINT, TPU_FAILED_TAINT, SLOW_TAINT];
    taints.iter().map(|t| format!("{}{t}", k.label_prefix)).collect()
}

/// The types of every Node condition Vigil sets (`vigil cleanup` removes these).
pub const CONDITIONS: [&str; 4] =
    [MAINTENANCE_CONDITION, GPU_CONDITION, TPU_CONDITION, SLOW_CONDITION];

// NB: one polarity for every Vigil condition, node-problem-detector's and the kubelet's pressure
// conditions': `True` means a problem (docs/kubernetes.md says why).

/// The condition type of the maintenance state: True while a notice stands.
pub(crate) const MAINTENANCE_CONDITION: &str = "VigilMaintenance";
/// The condition type of the GPU health: True while a GPU has failed.
pub(crate) const GPU_CONDITION: &str = "VigilGPUUnhealthy";
/// The condition type of the TPU health: True while the TPU chips have failed.
pub(crate) const TPU_CONDITION: &str = "VigilTPUUnhealthy";
/// The condition type of a gang's pace: True while a slow gang names this node's member as the
/// one it waits for (`gang.pace`).
pub(crate) const SLOW_CONDITION: &str = "VigilSlow";

/// The slow gangs that name a member on this node, as its agent found them: gang id → what the
/// episode says.
pub type SlowNamed = BTreeMap<String, Named>;

/// A slow gang's episode naming a member on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// How slow, which worker, why: the `VigilSlow` condition's message.
    pub line: String,
    /// Its evidence is strong enough to evict (`crate::hang::policy_pace::STRONG`: its compute
    /// time, or two signals) and this node shows a slowdown no workload causes
    /// (`crate::accel::gpu::policy_slow::machine_slow`, or the hypervisor's CPU steal).
    pub strong: bool,
}

/// Whether the slow taint stands now (named, or within `gang.pace.taint_for`; never in observe
/// mode) and whether it may be `NoExecute` (strong evidence named the node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlowTaintNow {
    pub on: bool,
    pub evict: bool,
}

/// The Node's `VigilSlow` condition while a slow gang names this node and, with `gang.pace.taint`,
/// its taint while `tainted` (named, or named within `gang.pace.taint_for`); both off the Node
/// when `gang.pace` is off.
pub fn slow_desired(
    k: &KubernetesConfig,
    pace: &PaceConfig,
    named: &SlowNamed,
    taint: SlowTaintNow,
    d: &mut NodeDesired,
) {
    let key = format!("{}{SLOW_TAINT}", k.label_prefix);
    if !pace.enabled {
        d.remove_conditions.push(SLOW_CONDITION.into());
        d.remove_taints.push(key);
        return;
    }
    let slow = !named.is_empty();
    let (reason, message) = if slow {
        let lines: Vec<&str> = named.values().map(|n| n.line.as_str()).collect();
        ("SlowGang", format!("vigil: {}", lines.join("; ")))
    } else {
        ("AtPace", "vigil: no slow gang names this node".to_string())
    };
    let message = truncate(&message, 1024);
    d.conditions.push(problem_condition(SLOW_CONDITION, Some(slow), reason, message));
    // NB: NoExecute evicts: only on strong evidence; weaker evidence keeps placement away
    // (NoSchedule). The key is listed for removal too, so a taint of another effect (the
    // config changed) goes while this one stands.
    let effect = match pace.taint {
        crate::config::SlowTaint::NoExecute if !taint.evict => Some("NoSchedule"),
        t => t.effect(),
    };
    if let Some(effect) = effect.filter(|_| taint.on) {
        d.add_taints.push(Taint { key: key.clone(), value: "true".into(), effect: effect.into() });
    }
    d.remove_taints.push(key);
}

/// A condition in Vigil's polarity: `problem` Some(true) is `True`, Some(false) `False`, and
/// `None` (no verdict) `Unknown`.
pub(crate) fn problem_condition(
    kind: &str,
    problem: Option<bool>,
    reason: &str,
    message: String,
) -> NodeCondition {
    let status = match problem {
        Some(true) => ConditionStatus::True,
        Some(false) => ConditionStatus::False,
        None => ConditionStatus::Unknown,
    };
    NodeCondition { kind: kind.into(), status, reason: reason.into(), message }
}

/// `s` cut to at most `max` bytes on a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    let cut = (0..=s.len().min(max)).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
    s[..cut].to_string()
}

/// A `<key>=true:NoSchedule` taint on the Node while `on`, removed otherwise (the GPU and TPU
/// failure taints, and the termination taint).
pub(crate) fn no_schedule_taint(d: &mut NodeDesired, key: String, on: bool) {
    match on {
        true => d.add_taints.push(Taint { key, value: "true".into(), effect: "NoSchedule".into() }),
        false => d.remove_taints.push(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SlowTaint;

    fn named(list: &[(&str, &str, bool)]) -> SlowNamed {
        list.iter()
            .map(|(g, l, strong)| {
                let n = Named { line: l.to_string(), strong: *strong };
                (g.to_string(), n)
            })
            .collect()
    }

    fn slow_of(enabled: bool, taint: SlowTaint, n: &SlowNamed, now: SlowTaintNow) -> NodeDesired {
        let k = KubernetesConfig::default();
        let pace = PaceConfig { enabled, taint, ..PaceConfig::default() };
        let mut d = NodeDesired::default();
        slow_desired(&k, &pace, n, now, &mut d);
        d
    }

    const ON: SlowTaintNow = SlowTaintNow { on: true, evict: true };

    #[test]
    fn a_slow_gang_naming_the_node_sets_vigil_slow_and_only_opted_in_its_taint() {
        let key = format!("{}slow", KubernetesConfig::default().label_prefix);
        let one = named(&[("ml/c", "gang ml/c runs at 82 %", true)]);
        let d = slow_of(true, SlowTaint::Off, &one, ON);
        assert_eq!(d.conditions.len(), 1);
        let c = &d.conditions[0];
        assert_eq!(
            (c.kind.as_str(), c.status, c.reason.as_str()),
            ("VigilSlow", ConditionStatus::True, "SlowGang")
        );
        assert_eq!(c.message, "vigil: gang ml/c runs at 82 %");
        assert!(d.add_taints.is_empty());
        assert_eq!(d.remove_taints, vec![key.clone()]);

        let d = slow_of(true, SlowTaint::NoSchedule, &one, ON);
        assert_eq!(d.add_taints.len(), 1);
        assert_eq!(
            (d.add_taints[0].key.as_str(), d.add_taints[0].effect.as_str()),
            (key.as_str(), "NoSchedule")
        );
        // Listed for removal too: a taint of another effect (the config changed) goes.
        assert_eq!(d.remove_taints, vec![key.clone()]);

        // Nobody names it: False (node-problem-detector's polarity), the taint off.
        let off = SlowTaintNow::default();
        let d = slow_of(true, SlowTaint::NoSchedule, &SlowNamed::new(), off);
        assert_eq!(d.conditions[0].status, ConditionStatus::False);
        assert_eq!(d.conditions[0].reason, "AtPace");
        assert!(d.add_taints.is_empty());

        // Pace off: neither stays on the Node.
        let d = slow_of(false, SlowTaint::NoSchedule, &one, ON);
        assert!(d.conditions.is_empty() && d.add_taints.is_empty());
        assert_eq!(d.remove_conditions, vec!["VigilSlow".to_string()]);
        assert_eq!(d.remove_taints, vec![key]);
    }

    #[test]
    fn no_execute_needs_strong_evidence_and_is_held_after_the_node_was_named() {
        // Held (no gang names it now, one did within taint_for): the condition False, the
        // taint stays.
        let d = slow_of(true, SlowTaint::NoExecute, &SlowNamed::new(), ON);
        assert_eq!(d.conditions[0].status, ConditionStatus::False);
        assert_eq!(d.add_taints[0].effect, "NoExecute");
        // Weak evidence (one signal): placement avoids the node, nothing is evicted.
        let weak = named(&[("ml/c", "its node shows host CPU pressure 31 %", false)]);
        let now = SlowTaintNow { on: true, evict: false };
        let d = slow_of(true, SlowTaint::NoExecute, &weak, now);
        assert_eq!(d.add_taints[0].effect, "NoSchedule");
        // Not on (the hold over, or observe mode): no taint.
        let d = slow_of(true, SlowTaint::NoExecute, &weak, SlowTaintNow::default());
        assert!(d.add_taints.is_empty());
        assert_eq!(d.remove_taints.len(), 1);
    }

    #[test]
    fn cleanup_knows_the_slow_condition_and_taint() {
        let k = KubernetesConfig::default();
        assert!(CONDITIONS.contains(&SLOW_CONDITION));
        assert!(taint_keys(&k).contains(&format!("{}{SLOW_TAINT}", k.label_prefix)));
    }
}
