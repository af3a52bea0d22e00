//! The checkpoint-budget check as `vigil doctor` and `vigil explain` run it: the worker pods of a
//! node (the opt-in label, from the Kubernetes API) and the pure
//! `crate::maintenance::policy_budget::budget_shortfalls` of the configured budgets against them.

use std::time::Duration;

use crate::config::Config;
use crate::kube::node_source::{KubeNodeReader, NodeReader};
use crate::kube::pods::{KubePods, NodePod, PodError};
use crate::maintenance::policy_budget::{budget_shortfalls, Shortfall, WorkerPod};
use crate::vocab::node_info::Provisioning;

/// What the check found for one node.
pub(super) struct BudgetReport {
    /// The worker pods read; `None` off Kubernetes; `Err` when they could not be read.
    pub(crate) pods: Option<Result<Vec<WorkerPod>, PodError>>,
    pub(crate) shortfalls: Vec<Shortfall>,
    pub(crate) worker_stop: Duration,
    /// The node's provisioning model from GKE's labels; `None` when unknown (off Kubernetes, the
    /// Node unreadable, no GKE label): every limit is then checked.
    pub(crate) provisioning: Option<Provisioning>,
}

/// Read `node`'s worker pods (on Kubernetes) and check the budgets against them.
pub(super) async fn check(cfg: &Config, node: &str) -> BudgetReport {
    let pods = if cfg.kubernetes_on() { Some(worker_pods(cfg, node).await) } else { None };
    let provisioning = if cfg.kubernetes_on() { provisioning(cfg, node).await } else { None };
    let read: &[WorkerPod] = pods.as_ref().and_then(|p| p.as_ref().ok()).map_or(&[], Vec::as_slice);
    let shortfalls = budget_shortfalls(&cfg.checkpoint, read, preemptible(provisioning.as_ref()));
    BudgetReport { pods, shortfalls, worker_stop: cfg.checkpoint.worker_stop, provisioning }
}

/// Whether preemptions can come: Spot and preemptible VMs yes, on-demand (`standard`) no;
/// anything else (flex-start, a model Vigil does not know, no label) is unknown.
fn preemptible(p: Option<&Provisioning>) -> Option<bool> {
    match p? {
        Provisioning::Spot | Provisioning::Preemptible => Some(true),
        Provisioning::Standard => Some(false),
        Provisioning::FlexStart | Provisioning::Other(_) => None,
    }
}

/// The node's provisioning model from its Node's GKE labels; `None` when it cannot be read (the
/// check then assumes preemptions can come).
async fn provisioning(cfg: &Config, node: &str) -> Option<Provisioning> {
    let reader = KubeNodeReader::connect(&cfg.kubernetes.api_url).await.ok()?;
    let raw = reader.read(node).await.ok()?;
    crate::node::policy_info::parse(&raw).provisioning
}

async fn worker_pods(cfg: &Config, node: &str) -> Result<Vec<WorkerPod>, PodError> {
    let pods = KubePods::list_node(&cfg.kubernetes.api_url, node).await?;
    let worker = |p: &NodePod| WorkerPod { pod: p.display(), grace: p.grace, critical: p.critical };
    Ok(pods.iter().filter(|p| p.is_worker(&cfg.runtime.worker_label)).map(worker).collect())
}

impl BudgetReport {
    /// What was read, in one line.
    pub fn summary(&self) -> String {
        let stop = humantime::format_duration(self.worker_stop);
        let stop = match &self.provisioning {
            Some(p) => {
                let note = " (no preemption: its limits are not checked)";
                let note = if preemptible(Some(p)) == Some(false) { note } else { "" };
                format!("{stop}; provisioning {}{note}", p.as_str())
            }
            None => stop.to_string(),
        };
        match &self.pods {
            None => format!("checked against Compute Engine's notices only (not on Kubernetes: no worker pod read); checkpoint.worker_stop = {stop}"),
            Some(Err(e)) => format!(
                "worker pods' grace periods unknown ({e}); checked against Compute Engine's notices only; checkpoint.worker_stop = {stop}"
            ),
            Some(Ok(p)) => {
                let g = p.iter().map(|w| w.grace).min().map(humantime::format_duration);
                let g = g.map(|g| format!(", shortest terminationGracePeriodSeconds {g}"));
                let (n, g) = (p.len(), g.unwrap_or_default());
                format!("{n} worker pod(s) read{g}; checkpoint.worker_stop = {stop}")
            }
        }
    }

    /// The report as `vigil explain` prints it after the trail.
    pub(crate) fn render(&self) -> String {
        let verdict = if self.shortfalls.is_empty() { "fits" } else { "CANNOT be met" };
        let mut s = format!("\ncheckpoint budget: {verdict} ({})\n", self.summary());
        for f in &self.shortfalls {
            s.push_str(&format!("  [{}] {}\n", f.code, f.detail));
        }
        s
    }
}
