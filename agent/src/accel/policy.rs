//! One health path for every accelerator kind (pure): what a node's GPU or TPU report says about
//! the Node — its health label, the reasons annotation, the failure taint, its condition — and the
//! Event of a change. A kind is a report type implementing [`Accelerator`] and a row of
//! [`Names`]; the engine's tracker (`crate::accel::tracker`) publishes any of them the same way.

use crate::accel::model::Health;
use crate::config::KubernetesConfig;
use crate::vocab::node::{
    no_schedule_taint, problem_condition, truncate, EventType, NodeCondition, NodeDesired,
};

/// A kind's names on the Node and in its Events (label, annotation and taint after the label
/// prefix): the reasons annotation is the label's name with `-reasons`.
#[derive(Debug)]
pub struct Names {
    pub(crate) label: &'static str,
    pub(crate) taint: &'static str,
    pub(crate) condition: &'static str,
    /// The Event reason of a change to healthy, degraded and failed.
    pub events: [&'static str; 3],
}

/// A node's report of one accelerator kind.
pub trait Accelerator: Clone {
    const NAMES: &'static Names;
    /// The monitor runs and the node has this kind: the verdict means something.
    fn monitoring(&self) -> bool;
    fn health(&self) -> Health;
    /// Why it is not healthy, one line per cause, for operators.
    fn reasons(&self) -> &[String];
    fn reasons_mut(&mut self) -> &mut Vec<String>;
    /// False while the monitor is still starting: the Node's fields are left as they are, so an
    /// agent restart never takes a failure's label, taint and condition off for the seconds
    /// before its first report.
    fn settled(&self) -> bool {
        true
    }
    /// Whether a failure the report holds still stands (the taint stays) though there is no
    /// verdict now: by default only while monitoring.
    fn failures_known(&self) -> bool {
        self.monitoring()
    }
    /// The kind's Node condition; `None`: the condition is removed.
    fn condition(&self) -> Option<NodeCondition>;
    /// Whether `self` differs from `other` in more than its reasons (published at once; reasons
    /// alone at most once a minute).
    fn differs(&self, other: &Self) -> bool;
    /// The health the Node showed as an Event's "before": `None` without a verdict.
    fn shown(&self) -> Option<Health> {
        self.monitoring().then(|| self.health())
    }
    /// Whether a change to `self` from a report that showed `prev` goes in the trail.
    fn noted(&self, prev: Option<Health>) -> bool {
        self.monitoring() || prev.is_some()
    }
    /// One line for the trail, the Event and the alert: the change from `prev` to `self`.
    fn detail(&self, prev: &Self) -> String;
}

/// Add a kind's fields to the Node's desired state: the health label, the reasons, the condition,
/// and (with `taint`) a `NoSchedule` taint while it has failed. Without a verdict the label and
/// the annotation are removed.
pub fn desired<A: Accelerator>(k: &KubernetesConfig, report: &A, taint: bool, d: &mut NodeDesired) {
    if !report.settled() {
        return;
    }
    let (n, p) = (A::NAMES, &k.label_prefix);
    let on = report.monitoring();
    d.labels.insert(format!("{p}{}", n.label), on.then(|| report.health().as_str().to_string()));
    let reasons = truncate(&report.reasons().join("; "), 1000);
    let reasons = (on && !reasons.is_empty()).then_some(reasons);
    d.annotations.insert(format!("{p}{}-reasons", n.label), reasons);
    // NB: a failure outlives a monitor that stopped answering (a wedged NVML): the taint stays.
    let failed = taint && report.failures_known() && report.health() == Health::Failed;
    no_schedule_taint(d, format!("{p}{}", n.taint), failed);
    match report.condition() {
        Some(c) => d.conditions.push(c),
        None => d.remove_conditions.push(n.condition.to_string()),
    }
}

/// A kind's condition under a verdict of `health`: True when it failed, False when healthy or
/// degraded (still usable; the reason and `message`, cut to 1000 bytes, say why). The GPU's and
/// the TPU's condition while monitoring.
pub(crate) fn verdict_condition(names: &Names, health: Health, message: &str) -> NodeCondition {
    // In the order of the scale: healthy, degraded, failed.
    let reason = ["Healthy", "Degraded", "Failed"][health as usize];
    let failed = Some(health == Health::Failed);
    problem_condition(names.condition, failed, reason, truncate(message, 1000))
}

/// The Event reason and type for a kind's health changing to `health`.
pub(crate) fn event_for(names: &Names, health: Health) -> (&'static str, EventType) {
    let kind = if health == Health::Healthy { EventType::Normal } else { EventType::Warning };
    // `events` is in the order of the scale: healthy, degraded, failed.
    (names.events[health as usize], kind)
}
