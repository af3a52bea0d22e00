//! The checkpoint-budget check as `vigil doctor` and `vigil explain` run it: the worker pods of a
//! node (the opt-in label, from the Kubernetes API) and the pure
//! `crate::policy::budget::budget_shortfalls` of the configured budgets against them.

use std::time::Duration;

use crate::config::Config;
use crate::policy::budget::{budget_shortfalls, Shortfall, WorkerPod};
use crate::sources::pods::{KubePods, PodApi};

/// What the check found for one node.
pub(super) struct BudgetReport {
    /// The worker pods read; `None` off Kubernetes; `Err` when they could not be read.
    pub pods: Option<Result<Vec<WorkerPod>, String>>,
    pub shortfalls: Vec<Shortfall>,
    pub worker_stop: Duration,
}

/// Read `node`'s worker pods (on Kubernetes) and check the budgets against them.
pub(super) async fn check(cfg: &Config, node: &str) -> BudgetReport {
    let pods = if cfg.kubernetes_on() {
        Some(worker_pods(cfg, node).await)
    } else {
        None
    };
    let read = pods.as_ref().and_then(|p| p.as_ref().ok());
    let shortfalls = budget_shortfalls(&cfg.checkpoint, read.map_or(&[], Vec::as_slice));
    BudgetReport {
        pods,
        shortfalls,
        worker_stop: cfg.checkpoint.worker_stop,
    }
}

async fn worker_pods(cfg: &Config, node: &str) -> Result<Vec<WorkerPod>, String> {
    let api = KubePods::connect(&cfg.kubernetes.api_url).await?;
    let pods = api.node_pods(node).await?;
    Ok(pods
        .iter()
        .filter(|p| p.is_worker(&cfg.runtime.worker_label))
        .map(|p| WorkerPod {
            pod: p.display(),
            grace: p.grace,
            critical: p.critical,
        })
        .collect())
}

impl BudgetReport {
    /// What was read, in one line.
    pub fn summary(&self) -> String {
        let stop = humantime::format_duration(self.worker_stop);
        match &self.pods {
            None => format!(
                "checked against Compute Engine's notices only (not on Kubernetes: no worker pod read); checkpoint.worker_stop = {stop}"
            ),
            Some(Err(e)) => format!(
                "worker pods' grace periods unknown ({e}); checked against Compute Engine's notices only; checkpoint.worker_stop = {stop}"
            ),
            Some(Ok(p)) => {
                let shortest = p.iter().map(|w| w.grace).min();
                format!(
                    "{} worker pod(s) read{}; checkpoint.worker_stop = {stop}",
                    p.len(),
                    shortest.map_or(String::new(), |g| format!(
                        ", shortest terminationGracePeriodSeconds {}",
                        humantime::format_duration(g)
                    ))
                )
            }
        }
    }

    /// The report as `vigil explain` prints it after the trail.
    pub fn render(&self) -> String {
        let mut s = String::from("\ncheckpoint budget: ");
        if self.shortfalls.is_empty() {
            s.push_str(&format!("fits ({})\n", self.summary()));
            return s;
        }
        s.push_str(&format!("CANNOT be met ({})\n", self.summary()));
        for f in &self.shortfalls {
            s.push_str(&format!("  [{}] {}\n", f.code, f.detail));
        }
        s
    }
}
