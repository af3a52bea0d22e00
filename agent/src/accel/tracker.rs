//! Publishing an accelerator's health, one path for every kind: [`HealthTracker`] keeps what the
//! Node shows and says when a new report is worth showing (a change of health or of a headline
//! fact — which GPUs failed, how many chips are present — at once, a change of reasons only —
//! counts of XIDs, ECC or device errors — at most once a minute, so an error storm does not patch
//! the Node on every event); the node controller's `apply` folds any kind's report into the Node,
//! the trail, an Event and, on failure, an alert (`crate::node::controller::health`). A kind is
//! its report's [`Accelerator`] impl (pure, with its row of names) and its [`Tracked`] impl here
//! (its alert, trail code and metrics).

// NB: real time on purpose: the reason-only updates of the Node are throttled on real time.
#![allow(clippy::disallowed_types)]
use std::time::{Duration, Instant};

use crate::accel::model::Health;
use crate::accel::policy::Accelerator;
use crate::alerts::AlertKind;
use crate::metrics::Metrics;
use crate::trail::Code;

/// What the engine needs of a kind beyond its pure rules.
pub(crate) trait Tracked: Accelerator + Default + Send + 'static {
    /// The kind's metrics' memory between reports.
    type Seen: Default + Send;
    /// The alert of a failure.
    const ALERT: AlertKind;
    /// The trail entry of a change.
    const TRAIL: Code;
    /// What the failure alert asks of the on-call.
    const ADVICE: &'static str;
    /// Export the report's series.
    fn record(&self, metrics: &Metrics, seen: &mut Self::Seen);
}

/// A kind's health as last shown on the Node, and when.
#[derive(Default)]
pub(crate) struct HealthTracker<A: Tracked> {
    /// Whether the Node has been given a report yet: the first always goes to it.
    seeded: bool,
    report: A,
    seen: A::Seen,
    published_at: Option<Instant>,
}

/// A change worth showing.
#[derive(Debug)]
pub(crate) struct Change {
    /// The health shown before (`None`: no verdict).
    pub(crate) prev: Option<Health>,
    /// For the trail, the Event and the alert.
    pub(crate) detail: String,
}

impl Change {
    /// Whether the change is an Event (and, to failed, an alert) for `r`, the report now shown:
    /// a change of the health shown, while monitoring. The GPU's rule adds its monitor's start
    /// (`crate::accel::gpu::policy_node::announced`).
    pub(crate) fn announced<A: Accelerator>(&self, r: &A) -> bool {
        r.monitoring() && self.prev != Some(r.health())
    }
}

impl<A: Tracked> HealthTracker<A> {
    const REASONS_EVERY: Duration = Duration::from_secs(60);

    /// The first report, taken as what the Node shows (no change to announce at start-up).
    pub(crate) fn seed(&mut self, report: A, metrics: &Metrics) {
        report.record(metrics, &mut self.seen);
        (self.report, self.seeded) = (report, true);
    }

    /// The report the Node shows.
    pub(crate) fn report(&self) -> &A {
        &self.report
    }

    /// Fold in a new report (metrics always); `Some` when the Node should show it.
    pub(crate) fn fold(&mut self, mut report: A, metrics: &Metrics) -> Option<Change> {
        report.record(metrics, &mut self.seen);
        let first = !std::mem::replace(&mut self.seeded, true);
        let headline = first || report.differs(&self.report);
        let reasons_due = report.reasons() != self.report.reasons()
            && self.published_at.is_none_or(|t| t.elapsed() >= Self::REASONS_EVERY);
        if !headline && !reasons_due {
            // Keep the previous reasons: they are what the Node shows.
            std::mem::swap(report.reasons_mut(), self.report.reasons_mut());
            self.report = report;
            return None;
        }
        self.published_at = Some(Instant::now());
        let prev = std::mem::replace(&mut self.report, report);
        Some(Change { prev: prev.shown(), detail: self.report.detail(&prev) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accel::gpu::model::{Failure, GpuMonitorState, GpuReport, GpuStatus};
    use crate::accel::gpu::policy_node::announced;
    use crate::accel::tpu::model::{TpuHealth, TpuReport};

    fn gpu(state: GpuMonitorState, node: Health, reasons: &[&str]) -> GpuReport {
        GpuReport {
            state,
            node,
            node_reasons: reasons.iter().map(|r| r.to_string()).collect(),
            ..GpuReport::default()
        }
    }

    #[test]
    fn a_change_of_health_shows_at_once_and_reasons_alone_wait_a_minute() {
        let m = Metrics::new();
        let mut t = HealthTracker::<GpuReport>::default();
        t.seed(gpu(GpuMonitorState::On, Health::Healthy, &[]), &m);
        let c = t
            .fold(gpu(GpuMonitorState::On, Health::Failed, &["GPU 0: XID 79"]), &m)
            .expect("a failure shows at once");
        assert_eq!(c.prev, Some(Health::Healthy));
        assert_eq!(c.detail, "GPU health healthy → failed: GPU 0: XID 79");
        // New reasons within the minute: not shown; the Node keeps the old ones.
        let more = gpu(GpuMonitorState::On, Health::Failed, &["GPU 0: XID 79 ×2"]);
        assert!(t.fold(more, &m).is_none());
        assert_eq!(t.report().node_reasons, ["GPU 0: XID 79"]);
    }

    /// A failed node's report of four GPUs, UUIDs `GPU-<index>`, those of `failed` failed.
    fn failed_gpus(failed: &[u32], reasons: &[&str]) -> GpuReport {
        let gpus = (0..4).map(|i| GpuStatus {
            index: i,
            uuid: format!("GPU-{i}"),
            health: if failed.contains(&i) { Health::Failed } else { Health::Healthy },
            ..GpuStatus::default()
        });
        GpuReport { gpus: gpus.collect(), ..gpu(GpuMonitorState::On, Health::Failed, reasons) }
    }

    #[test]
    fn another_gpu_failing_shows_at_once_though_the_health_is_the_same() {
        let m = Metrics::new();
        let mut t = HealthTracker::<GpuReport>::default();
        t.seed(failed_gpus(&[0], &["GPU 0: XID 79"]), &m);
        let both = ["GPU 0: XID 79", "GPU 3: XID 79"];
        let c = t.fold(failed_gpus(&[0, 3], &both), &m).expect("GPU 3's failure shows at once");
        assert_eq!(c.prev, Some(Health::Failed));
        assert_eq!(t.report().node_reasons, both);
        // The same GPUs failed, other reasons: a recount, held for the minute as before.
        let more = failed_gpus(&[0, 3], &["GPU 0: XID 79 ×2", "GPU 3: XID 79"]);
        assert!(t.fold(more, &m).is_none());
        assert_eq!(t.report().node_reasons, both);
        // A GPU is its UUID: renumbered by a driver reload, it is the same failed GPU.
        let mut renumbered = failed_gpus(&[0, 3], &both);
        renumbered.gpus[3].index = 7;
        assert!(!renumbered.differs(t.report()));
        // Without a UUID, a GPU is its index.
        let (mut a, mut b) = (failed_gpus(&[0], &[]), failed_gpus(&[1], &[]));
        for g in a.gpus.iter_mut().chain(b.gpus.iter_mut()) {
            g.uuid.clear();
        }
        assert!(a.differs(&b));
        // One recovering while another stays failed shows at once too (its device untainted).
        assert!(failed_gpus(&[3], &[]).differs(t.report()));
    }

    /// [`failed_gpus`] with a failure on each failed GPU: those of `kept` kept from before the
    /// agent restarted (`gpu.state_file`), those of `new` this process's own.
    fn failures(kept: &[u32], new: &[u32]) -> GpuReport {
        let all: Vec<u32> = kept.iter().chain(new).copied().collect();
        let mut r = failed_gpus(&all, &[]);
        for g in &mut r.gpus {
            let from_file = kept.contains(&g.index);
            if from_file || new.contains(&g.index) {
                g.failure = Some(Failure { kept: from_file, ..Failure::default() });
            }
        }
        r
    }

    #[test]
    fn an_agent_restart_does_not_announce_a_kept_failure_again() {
        let m = Metrics::new();
        // The controller's first look is often the channel's default: the monitor starting.
        let restarted = || {
            let mut t = HealthTracker::<GpuReport>::default();
            t.seed(GpuReport::default(), &m);
            t
        };
        let mut t = restarted();
        let c = t.fold(failures(&[0], &[]), &m).expect("the first verdict shows");
        assert_eq!(c.prev, None, "no health is shown while the monitor starts");
        assert_eq!(c.detail, "GPU health unknown → failed");
        assert!(t.report().noted(c.prev), "the trail notes it");
        assert!(!announced(t.report(), c.prev), "no Event, no alert: they went out before");
        // The same through the kept failure published before NVML is read.
        let mut t = restarted();
        let before_nvml = GpuReport { state: GpuMonitorState::Starting, ..failures(&[0], &[]) };
        let c = t.fold(before_nvml, &m).expect("the kept failure shows");
        assert!(!announced(t.report(), c.prev));
        let c = t.fold(failures(&[0], &[]), &m).expect("monitoring now");
        assert!(!announced(t.report(), c.prev));
        // A failure of this process is announced, a kept one beside it or not.
        let mut t = restarted();
        let c = t.fold(failures(&[], &[1]), &m).expect("a failure shows");
        assert!(announced(t.report(), c.prev));
        let mut t = restarted();
        let c = t.fold(failures(&[0], &[1]), &m).expect("a failure shows");
        assert!(announced(t.report(), c.prev));
        // Up healthy: no Event (healthy until told otherwise); a failure after that: one.
        let mut t = restarted();
        let up = gpu(GpuMonitorState::On, Health::Healthy, &[]);
        let c = t.fold(up, &m).expect("monitoring now");
        assert!(!announced(t.report(), c.prev));
        let c = t.fold(failures(&[], &[2]), &m).expect("a failure shows");
        assert!(announced(t.report(), c.prev));
    }

    #[test]
    fn the_gpu_monitors_state_shows_without_a_verdict() {
        // Starting → no GPU: no health on either side, but the condition's reason changes.
        let m = Metrics::new();
        let mut t = HealthTracker::<GpuReport>::default();
        t.seed(GpuReport::in_state(GpuMonitorState::Starting), &m);
        let c = t.fold(GpuReport::in_state(GpuMonitorState::NoGpu), &m);
        assert!(c.is_some(), "the Node's condition must say NoGpu");
        assert!(!t.report().noted(c.unwrap().prev), "no trail entry without a verdict");
    }

    #[test]
    fn a_tpu_report_first_shows_and_its_chip_counts_are_headline() {
        let m = Metrics::new();
        let mut t = HealthTracker::<TpuReport>::default();
        let r =
            TpuReport { monitoring: true, present: 4, expected: Some(4), ..TpuReport::default() };
        let c = t.fold(r.clone(), &m).expect("the first report always shows");
        assert_eq!(c.prev, None);
        assert!(c.detail.ends_with("(was unknown)"), "{}", c.detail);
        assert!(c.announced(t.report()), "a TPU's first verdict is an Event");
        let fewer = TpuReport { present: 3, health: TpuHealth::Failed, ..r };
        let c = t.fold(fewer, &m).expect("a chip gone shows at once");
        assert_eq!(c.prev, Some(TpuHealth::Healthy));
        assert!(c.announced(t.report()));
    }
}
