//! Gangs' pace (fail-slow, `gang.pace`): each watched gang member's step rate, the baseline
//! this agent learned of it and whether it is slow (one series per member of this node, removed
//! with the worker), and the slow episodes this agent opened.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{F64Gauge, Labels};

/// One member of a gang on this node: its `gang` and `worker`.
type PaceLabels = Labels<2, String>;

fn member(gang: &str, worker: &str) -> PaceLabels {
    [("gang", gang.to_string()), ("worker", worker.to_string())]
}

#[derive(Default)]
pub(crate) struct PaceMetrics {
    rate: Family<PaceLabels, F64Gauge>,
    baseline: Family<PaceLabels, F64Gauge>,
    slow: Family<PaceLabels, Gauge>,
    /// Slow episodes opened here.
    pub(crate) episodes: Counter,
    /// Worker → the gang its series are labelled with.
    exported: Mutex<BTreeMap<String, String>>,
}

impl PaceMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = PaceMetrics::default();
        register!(reg;
            "gang_step_rate" => m.rate,
                "Steps per second of each watched gang member in its last measured window (gang.pace); one series per member of this node";
            "gang_step_rate_baseline" => m.baseline,
                "The step rate this agent learned of each watched gang member (gang.pace): a slow episode is a rate below gang.pace.slow_fraction of it for gang.pace.slow_for";
            "gang_slow" => m.slow,
                "1 while a watched gang member runs below gang.pace.slow_fraction of its learned rate for gang.pace.slow_for (its gang is slow), else 0; one series per measured member of this node";
            "gang_slow_episodes" => m.episodes,
                "Slow episodes of a gang this agent opened (the first member's agent to find its gang slow)";
        );
        m
    }

    /// Export `worker`'s pace in `gang` (its rate and baseline once measured), and whether it is
    /// `slow` (every look).
    pub(crate) fn observe(
        &self,
        worker: &str,
        gang: &str,
        rate: Option<f64>,
        baseline: Option<f64>,
        slow: bool,
    ) {
        let id = member(gang, worker);
        let mut all = self.exported.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = all.get(worker).filter(|g| *g != gang) {
            self.drop_series(old, worker);
        }
        if let Some(r) = rate {
            self.rate.get_or_create(&id).set(r);
        }
        // NB: the verdict of every look, held ones included (a hold is no measured window), so
        // that a gang held, idle or hung never shows slow.
        self.slow.get_or_create(&id).set(i64::from(slow));
        all.insert(worker.to_string(), gang.to_string());
        if let Some(b) = baseline {
            self.baseline.get_or_create(&id).set(b);
        }
    }

    /// `worker` is no gang member with its pace measured now (pace off, no gang): its series go.
    pub(crate) fn forget(&self, worker: &str) {
        self.retain(|w| w != worker);
    }

    /// `worker`'s series labelled with `gang`, gone.
    fn drop_series(&self, gang: &str, worker: &str) {
        let id = member(gang, worker);
        self.rate.remove(&id);
        self.baseline.remove(&id);
        self.slow.remove(&id);
    }

    /// Keep only the series of the workers `watched` says this node watches now.
    pub(crate) fn retain(&self, watched: impl Fn(&str) -> bool) {
        let mut all = self.exported.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|worker, gang| {
            if watched(worker) {
                return true;
            }
            self.drop_series(gang, worker);
            false
        });
    }
}
