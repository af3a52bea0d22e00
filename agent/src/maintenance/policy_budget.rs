//! Whether the checkpoint budgets fit in what the platform gives a worker (pure).
//!
//! A checkpoint round is only as good as the time the worker has to finish it. The limits, each
//! with a stable code (shown by `vigil doctor` and `vigil explain`):
//! - `preemption-notice`: Compute Engine stops a Spot or preemptible VM 30 s after its preemption
//!   notice, so `checkpoint.preemption_budget` + `checkpoint.worker_stop` must fit in 30 s;
//! - `maintenance-notice`: a VM that terminates on host maintenance (GPU VMs) gets 60 s notice,
//!   so `checkpoint.maintenance_budget` + `checkpoint.worker_stop` must fit in 60 s;
//! - `pod-grace`: when the node shuts down or drains, the worker's pod is sent SIGTERM at the same
//!   time as the agent asks it to checkpoint, and killed when its
//!   `terminationGracePeriodSeconds` ends: `checkpoint.sigterm_budget` (when
//!   `checkpoint.on_sigterm`) and `checkpoint.preemption_budget`, each plus
//!   `checkpoint.worker_stop`, must fit in it;
//! - `gke-node-shutdown`: at a Spot or preemptible node's shutdown, GKE's kubelet gives
//!   non-system pods at most 15 s, whatever their `terminationGracePeriodSeconds` (a pod whose
//!   priority is system-critical is stopped in the later, critical phase): the preemption budget
//!   plus the stop must fit in 15 s for every worker pod that is not critical.
//!
//! Sources: docs/maintenance.md ("Budgets that fit the platform").

use std::time::Duration;

use crate::config::{CheckpointConfig, OnSigterm};

/// Compute Engine stops a Spot or preemptible VM this long after the preemption notice.
pub(crate) const PREEMPTION_NOTICE: Duration = Duration::from_secs(30);

/// Compute Engine's notice before a host maintenance that terminates the VM.
pub(crate) const MAINTENANCE_NOTICE: Duration = Duration::from_secs(60);

/// What GKE's graceful node shutdown gives non-system pods on a Spot or preemptible node
/// (GKE later than 1.22.8-gke.200).
pub(crate) const GKE_NON_CRITICAL_SHUTDOWN: Duration = Duration::from_secs(15);

/// A worker's pod, as the check needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkerPod {
    /// `namespace/name`.
    pub(crate) pod: String,
    /// Its `terminationGracePeriodSeconds`.
    pub(crate) grace: Duration,
    /// Its priority is system-critical (graceful node shutdown stops it last).
    pub(crate) critical: bool,
}

/// One budget that cannot be met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shortfall {
    /// `preemption-notice`, `maintenance-notice`, `pod-grace` or `gke-node-shutdown`.
    pub(crate) code: &'static str,
    /// The budget's config key.
    pub(crate) key: &'static str,
    /// What to do about it, for the operator: the budget plus the worker's stop, what the
    /// platform gives, and the worker pod for the per-pod limits.
    pub(crate) detail: String,
}

/// Every budget that cannot be met by these worker pods (empty: they all fit).
///
/// `preemptible`: whether the node can be preempted (a Spot, preemptible or flex-start VM, from
/// GKE's node labels); `Some(false)` for a node known to be on-demand, where no preemption
/// comes and the preemption limits (`preemption-notice`, `gke-node-shutdown`, and `pod-grace` for
/// the preemption budget) do not apply; `None` when unknown: every limit is checked.
pub(crate) fn budget_shortfalls(
    c: &CheckpointConfig,
    pods: &[WorkerPod],
    preemptible: Option<bool>,
) -> Vec<Shortfall> {
    let stop = c.worker_stop;
    let preempt = c.preemption_budget + stop;
    let preemptions = preemptible != Some(false);
    let mut out = Vec::new();
    if preemptions && preempt > PREEMPTION_NOTICE {
        let why = format!(
            "Compute Engine stops a Spot/preemptible VM {} after the notice: lower the budget",
            secs(PREEMPTION_NOTICE)
        );
        out.push(over("preemption-notice", "checkpoint.preemption_budget", preempt, why));
    }
    let maint = c.maintenance_budget + stop;
    if maint > MAINTENANCE_NOTICE {
        let why = format!(
            "Compute Engine gives {} notice before a host maintenance that terminates the VM: lower the budget",
            secs(MAINTENANCE_NOTICE)
        );
        out.push(over("maintenance-notice", "checkpoint.maintenance_budget", maint, why));
    }
    // The limits each worker pod sets (the preemption ones only where preemptions can come).
    let budgets = [
        (preemptions, "checkpoint.preemption_budget", c.preemption_budget),
        (c.on_sigterm != OnSigterm::Never, "checkpoint.sigterm_budget", c.sigterm_budget),
    ];
    for p in pods {
        for (_, key, budget) in budgets.into_iter().filter(|&(on, _, b)| on && b + stop > p.grace) {
            let (pod, grace) = (&p.pod, secs(p.grace));
            let why = format!("worker pod {pod} is killed {grace} after its SIGTERM (terminationGracePeriodSeconds): raise its grace period or lower the budget");
            out.push(over("pod-grace", key, budget + stop, why));
        }
        // NB: a pod whose own grace is already too short is said once, above.
        if preemptions && !p.critical && preempt <= p.grace && preempt > GKE_NON_CRITICAL_SHUTDOWN {
            let (pod, limit) = (&p.pod, secs(GKE_NON_CRITICAL_SHUTDOWN));
            let why = format!("on a GKE Spot/preemptible node the kubelet gives non-system pod {pod} at most {limit} at preemption, whatever its grace period: lower the budget to fit");
            out.push(over("gke-node-shutdown", "checkpoint.preemption_budget", preempt, why));
        }
    }
    out
}

/// The budget `key` plus the worker's stop, `needed`, is more than the platform gives: `why`.
fn over(code: &'static str, key: &'static str, needed: Duration, why: String) -> Shortfall {
    let detail = format!("{key} + checkpoint.worker_stop = {} but {why}", secs(needed));
    Shortfall { code, key, detail }
}

/// A duration as the details say it: `30s`, `1m 5s`.
fn secs(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn pod(grace: u64, critical: bool) -> WorkerPod {
        WorkerPod { pod: "ml/trainer-0".into(), grace: s(grace), critical }
    }

    fn cfg(preemption: u64, sigterm: u64, maintenance: u64, stop: u64) -> CheckpointConfig {
        CheckpointConfig {
            preemption_budget: s(preemption),
            sigterm_budget: s(sigterm),
            maintenance_budget: s(maintenance),
            worker_stop: s(stop),
            ..CheckpointConfig::default()
        }
    }

    fn codes(c: &CheckpointConfig, pods: &[WorkerPod]) -> Vec<(&'static str, &'static str)> {
        budget_shortfalls(c, pods, None).iter().map(|f| (f.code, f.key)).collect()
    }

    #[test]
    fn the_defaults_fit_gce_and_a_default_pod_but_not_gke_spot_shutdown() {
        let c = CheckpointConfig::default(); // 25 s, 25 s, 50 s, stop 5 s
        assert_eq!(codes(&c, &[]), vec![]);
        assert_eq!(codes(&c, &[pod(30, true)]), vec![]);
        assert_eq!(
            codes(&c, &[pod(30, false)]),
            vec![("gke-node-shutdown", "checkpoint.preemption_budget")]
        );
        // 10 s + 5 s fits every limit.
        assert_eq!(codes(&cfg(10, 25, 50, 5), &[pod(30, false)]), vec![]);
    }

    /// (what, config, worker pods, the (code, key) of each shortfall).
    type Case = (&'static str, CheckpointConfig, Vec<WorkerPod>, Vec<(&'static str, &'static str)>);

    #[test]
    fn each_limit_alone() {
        let cases: &[Case] = &[
            (
                "preemption budget past GCE's 30 s",
                cfg(28, 10, 50, 5),
                vec![],
                vec![("preemption-notice", "checkpoint.preemption_budget")],
            ),
            (
                "maintenance budget past GCE's 60 s",
                cfg(10, 10, 58, 5),
                vec![],
                vec![("maintenance-notice", "checkpoint.maintenance_budget")],
            ),
            (
                "SIGTERM budget past the pod's grace",
                cfg(5, 25, 50, 5),
                vec![pod(20, false)],
                vec![("pod-grace", "checkpoint.sigterm_budget")],
            ),
            (
                "preemption budget past the pod's grace: said once, not again for GKE",
                cfg(12, 5, 50, 5),
                vec![pod(15, false)],
                vec![("pod-grace", "checkpoint.preemption_budget")],
            ),
            (
                "a critical pod is not held to GKE's 15 s",
                cfg(20, 20, 50, 5),
                vec![pod(30, true)],
                vec![],
            ),
        ];
        for (what, c, pods, want) in cases {
            assert_eq!(&codes(c, pods), want, "{what}");
        }
    }

    #[test]
    fn exactly_at_the_limit_fits() {
        assert_eq!(codes(&cfg(25, 25, 55, 5), &[pod(30, true)]), vec![]);
        assert_eq!(codes(&cfg(10, 10, 50, 5), &[pod(15, false)]), vec![]);
    }

    #[test]
    fn without_a_sigterm_round_its_budget_is_not_held_to_the_grace() {
        let mut c = cfg(5, 25, 50, 5);
        c.on_sigterm = OnSigterm::Never;
        assert_eq!(codes(&c, &[pod(20, false)]), vec![]);
    }

    #[test]
    fn every_pod_is_checked_and_named() {
        let pods = [
            WorkerPod { pod: "ml/a".into(), grace: s(10), critical: false },
            WorkerPod { pod: "ml/b".into(), grace: s(60), critical: false },
        ];
        let f = budget_shortfalls(&CheckpointConfig::default(), &pods, None);
        let named: Vec<_> = f
            .iter()
            .map(|x| (x.code, x.detail.contains(" pod ml/a "), x.detail.contains(" pod ml/b ")))
            .collect();
        assert_eq!(
            named,
            vec![
                ("pod-grace", true, false),
                ("pod-grace", true, false),
                ("gke-node-shutdown", false, true)
            ]
        );
        assert!(f[0].detail.contains("ml/a is killed 10s after its SIGTERM"), "{}", f[0].detail);
        assert!(
            f[2].detail.contains("= 30s but") && f[2].detail.contains("at most 15s"),
            "{}",
            f[2].detail
        );
    }

    #[test]
    fn an_on_demand_node_is_not_held_to_the_preemption_limits() {
        let c = cfg(40, 40, 50, 5); // preemption 45 s: over the notice, GKE's 15 s, a 30 s grace
        let spot = budget_shortfalls(&c, &[pod(30, false)], Some(true));
        let unknown = budget_shortfalls(&c, &[pod(30, false)], None);
        assert_eq!(spot, unknown, "unknown is checked as preemptible");
        let codes_of = |f: &[Shortfall]| f.iter().map(|f| (f.code, f.key)).collect::<Vec<_>>();
        assert_eq!(
            codes_of(&spot),
            vec![
                ("preemption-notice", "checkpoint.preemption_budget"),
                ("pod-grace", "checkpoint.preemption_budget"),
                ("pod-grace", "checkpoint.sigterm_budget"),
            ]
        );
        // On-demand: no preemption comes; the SIGTERM budget still meets the pod's grace.
        let on_demand = budget_shortfalls(&c, &[pod(30, false)], Some(false));
        assert_eq!(codes_of(&on_demand), vec![("pod-grace", "checkpoint.sigterm_budget")]);
    }
}
