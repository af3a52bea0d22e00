//! Per-worker series, for alert rules and dashboards: each watched worker's verdict, heartbeat
//! age and last restart. Labelled by the worker id, and only for the workers this node watches
//! now: a worker's series are removed when its container is no longer listed, so the cardinality
//! is the node's workers (one series per worker in each family), never a history.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::clock::Millis;

use super::{F64Gauge, Labels};

/// One worker (its id: 1-128 characters of `[A-Za-z0-9._-]`).
type WorkerLabels = Labels<1, String>;
/// One worker and one of its values (its verdict, or its incident stage).
type ValueLabels = Labels<2, String>;

/// What is exported for one worker.
#[derive(Debug, Default)]
struct Exported {
    /// The verdict whose `vigil_worker_state` series exists.
    state: Option<&'static str>,
    /// The stage whose `vigil_worker_incident_stage` series exists.
    stage: Option<&'static str>,
    /// The latest restart known (coordinator clock, ms).
    restarted: Option<Millis>,
}

#[derive(Default)]
pub(crate) struct WorkerMetrics {
    /// A worker's current verdict.
    pub(crate) state: Family<ValueLabels, Gauge>,
    /// A worker's incident stage.
    pub(crate) stage: Family<ValueLabels, Gauge>,
    pub(crate) heartbeat_age: Family<WorkerLabels, F64Gauge>,
    pub(crate) last_restart: Family<WorkerLabels, F64Gauge>,
    pub(crate) allowed_silence: Family<WorkerLabels, F64Gauge>,
    exported: Mutex<BTreeMap<String, Exported>>,
}

/// One evaluation of a worker, as [`WorkerMetrics::observe`] exports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerSample<'a> {
    pub(crate) worker: &'a str,
    /// The verdict's name (`Verdict::as_str`).
    pub(crate) state: &'static str,
    /// Where its incident stands (`crate::hang::policy_life::Stage::as_str`).
    pub(crate) stage: &'static str,
    /// The coordinator's clock at the evaluation.
    pub(crate) now: Millis,
    /// The record's last heartbeat, when it has one.
    pub(crate) heartbeat: Option<Millis>,
    /// The restart the shared marks remember, when they do.
    pub(crate) restarted: Option<Millis>,
    /// The silence it was allowed at this evaluation (ms): `stale_after`, its grace, or its
    /// learned silence; `None` without a record.
    pub(crate) silence: Option<Millis>,
}

fn seconds(ms: Millis) -> f64 {
    ms as f64 / 1000.0
}

/// `worker`'s one series in `family` (`label` = `value`) set to 1, the series of the value it
/// had before (`exported`, kept up to date) removed.
fn set_current(
    family: &Family<ValueLabels, Gauge>,
    label: &'static str,
    worker: &str,
    value: &'static str,
    exported: &mut Option<&'static str>,
) {
    let series = |v: &str| [("worker", worker.to_string()), (label, v.to_string())];
    if let Some(old) = exported.filter(|old| *old != value) {
        family.remove(&series(old));
    }
    *exported = Some(value);
    family.get_or_create(&series(value)).set(1);
}

/// `id`'s series in `family` set to `value`, removed for `None` (if it is there).
fn set_or_remove(family: &Family<WorkerLabels, F64Gauge>, id: &WorkerLabels, value: Option<f64>) {
    if let Some(v) = value {
        family.get_or_create(id).set(v);
    } else {
        family.remove(id);
    }
}

impl WorkerMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = WorkerMetrics::default();
        register!(reg;
            "worker_state" => m.state,
                "1 for each watched worker's current verdict (state); one series per worker of this node";
            "worker_incident_stage" => m.stage,
                "1 for each watched worker's incident stage (quiet, suspect, confirmed, due, backing-off, deciding, restarting, booting, recovered, escalated); one series per worker of this node";
            "worker_heartbeat_age" in Unit::Seconds => m.heartbeat_age,
                "Age of each watched worker's last heartbeat at its last evaluation (coordinator clock)";
            "worker_allowed_silence" in Unit::Seconds => m.allowed_silence,
                "The silence each watched worker was allowed at its last evaluation: policy.stale_after, the grace it announced, or the silence learned from its rhythm (policy.learned)";
            "worker_last_restart_timestamp" in Unit::Seconds => m.last_restart,
                "Unix time of each watched worker's last restart by Vigil, when one is known";
        );
        m
    }

    fn exported(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Exported>> {
        self.exported.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Export one evaluation: the verdict's series (the previous verdict's removed), the
    /// heartbeat's age (removed when the record has no heartbeat) and the latest restart known.
    pub(crate) fn observe(&self, s: WorkerSample<'_>) {
        let mut all = self.exported();
        let e = all.entry(s.worker.to_string()).or_default();
        let id = [("worker", s.worker.to_string())];
        set_current(&self.state, "state", s.worker, s.state, &mut e.state);
        set_current(&self.stage, "stage", s.worker, s.stage, &mut e.stage);
        let age = s.heartbeat.map(|hb| seconds((s.now - hb).max(0)));
        set_or_remove(&self.heartbeat_age, &id, age);
        set_or_remove(&self.allowed_silence, &id, s.silence.map(seconds));
        if let Some(at) = s.restarted {
            self.note_restart(e, s.worker, at);
        }
    }

    /// `worker` was restarted at `at` (coordinator clock), by this agent or as the shared marks
    /// remember. NB: the shared restart mark is deleted once the worker is healthy again: the
    /// series keeps the latest restart known for as long as the worker is watched.
    pub(crate) fn restarted(&self, worker: &str, at: Millis) {
        let mut all = self.exported();
        let e = all.entry(worker.to_string()).or_default();
        self.note_restart(e, worker, at);
    }

    /// `worker`'s entry `e` (its lock held) and series told of a restart at `at`: the latest
    /// restart known, never going back.
    fn note_restart(&self, e: &mut Exported, worker: &str, at: Millis) {
        if e.restarted.is_none_or(|known| at > known) {
            e.restarted = Some(at);
            self.last_restart.get_or_create(&[("worker", worker.to_string())]).set(seconds(at));
        }
    }

    /// Keep only the series of the workers `watched` says this node watches now.
    pub(crate) fn retain(&self, watched: impl Fn(&str) -> bool) {
        let mut all = self.exported();
        all.retain(|worker, e| {
            if watched(worker) {
                return true;
            }
            let id = [("worker", worker.clone())];
            if let Some(state) = e.state {
                self.state.remove(&[id[0].clone(), ("state", state.to_string())]);
            }
            if let Some(stage) = e.stage {
                self.stage.remove(&[id[0].clone(), ("stage", stage.to_string())]);
            }
            self.heartbeat_age.remove(&id);
            self.allowed_silence.remove(&id);
            self.last_restart.remove(&id);
            false
        });
    }

    /// The workers with series, for tests.
    #[cfg(test)]
    pub(crate) fn workers(&self) -> Vec<String> {
        self.exported().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(m: &WorkerMetrics) -> String {
        let mut reg = Registry::with_prefix("vigil");
        register!(reg;
            "worker_state" => m.state, "";
            "worker_heartbeat_age" in Unit::Seconds => m.heartbeat_age, "";
            "worker_allowed_silence" in Unit::Seconds => m.allowed_silence,
                "The silence each watched worker was allowed at its last evaluation: policy.stale_after, the grace it announced, or the silence learned from its rhythm (policy.learned)";
            "worker_last_restart_timestamp" in Unit::Seconds => m.last_restart, "";
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        out
    }

    fn sample<'a>(worker: &'a str, state: &'static str) -> WorkerSample<'a> {
        WorkerSample {
            worker,
            state,
            stage: "quiet",
            now: 200_000,
            heartbeat: Some(50_000),
            restarted: None,
            silence: Some(120_000),
        }
    }

    #[test]
    fn one_state_series_per_worker_and_its_values() {
        let m = WorkerMetrics::default();
        m.observe(sample("w1", "healthy"));
        m.observe(WorkerSample { restarted: Some(100_500), ..sample("w1", "hung") });
        let text = scrape(&m);
        assert!(text.contains("vigil_worker_state{worker=\"w1\",state=\"hung\"} 1"), "{text}");
        assert!(!text.contains("state=\"healthy\""), "the old verdict's series is removed: {text}");
        assert!(text.contains("vigil_worker_heartbeat_age_seconds{worker=\"w1\"} 150.0"), "{text}");
        assert!(
            text.contains("vigil_worker_last_restart_timestamp_seconds{worker=\"w1\"} 100.5"),
            "{text}"
        );
    }

    #[test]
    fn a_restart_is_kept_after_its_mark_is_forgotten_and_never_goes_back() {
        let m = WorkerMetrics::default();
        m.restarted("w1", 300_000);
        m.observe(WorkerSample { restarted: Some(100_000), ..sample("w1", "booting") });
        m.observe(sample("w1", "healthy"));
        let text = scrape(&m);
        assert!(
            text.contains("vigil_worker_last_restart_timestamp_seconds{worker=\"w1\"} 300.0"),
            "{text}"
        );
    }

    #[test]
    fn a_record_without_heartbeat_has_no_age() {
        let m = WorkerMetrics::default();
        m.observe(sample("w1", "healthy"));
        m.observe(WorkerSample { heartbeat: None, ..sample("w1", "unreachable") });
        let text = scrape(&m);
        assert!(!text.contains("vigil_worker_heartbeat_age_seconds{"), "{text}");
        assert!(text.contains("state=\"unreachable\"} 1"), "{text}");
    }

    #[test]
    fn a_worker_that_disappears_takes_its_series_with_it() {
        let m = WorkerMetrics::default();
        m.observe(WorkerSample { restarted: Some(1_000), ..sample("gone", "hung") });
        m.observe(sample("kept", "healthy"));
        m.retain(|w| w == "kept");
        let text = scrape(&m);
        assert!(!text.contains("gone"), "{text}");
        assert!(text.contains("worker=\"kept\""), "{text}");
        assert_eq!(m.workers(), vec!["kept".to_string()]);
    }
}
