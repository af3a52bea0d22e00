//! Alerts and pages: every alert is a log line; with a webhook configured it is also posted as a
//! Slack-compatible JSON body (`text` for humans, `vigil` for machines), a PagerDuty Events v2
//! event or generic JSON (`alerts.format`), with retry and timeout; with Alertmanager
//! configured, there too (`super::alertmanager`). Sinks that keep alerts open (Alertmanager,
//! PagerDuty) resolve them when the engine says the condition ended ([`Resolve`]).
//!
//! De-duplication is *not* done here: the pipeline decides, with shared keys, whether an alert is
//! the first for its incident. A sink only delivers.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use crate::metrics::Metrics;
use crate::redact::{Secret, Webhook};

pub mod alertmanager;
mod format;
pub(crate) mod gate;
mod webhook;

pub use webhook::WebhookSink;

/// What an alert is about. The names are stable: they appear in metrics and in the webhook body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[derive(strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub enum AlertKind {
    /// A confirmed hang; the persistence timer started.
    #[default]
    Hung,
    /// Errored for `error_for`.
    Errored,
    /// The restart is about to run (logs attached).
    Restarting,
    /// Observe mode: the restart would run now (logs attached).
    WouldRestart,
    /// Page: the restart command failed.
    RestartFailed,
    /// Page: still broken `escalate_after` after our restart.
    Escalation,
    /// The per-node breaker is open: automation stopped for today, alert only.
    BreakerOpen,
    /// The fleet-wide budget is exhausted: no restart anywhere until the window ends.
    BudgetExhausted,
    /// Status record missing: alert only.
    Unreachable,
    /// Heartbeat fresh, progress frozen: alert only.
    Stalled,
    /// Hung or errored on a failed GPU: a person must look.
    GpuFailed,
    /// The node's TPU chips failed (a chip gone, or a fatal device error): a person must look.
    TpuFailed,
    /// Logs could not be collected; the restart was not attempted this cycle.
    LogsFailed,
    /// Two containers claim the same worker id: nothing is restarted.
    Ambiguous,
    /// A container's opt-in label is not a valid worker id: it is never a worker.
    InvalidWorkerId,
    /// The coordinator (Redis) is unreachable: restarts are paused.
    CoordinatorDown,
    /// The container runtime is unreachable.
    RuntimeDown,
    /// The worker's container is paused by someone: alert only, never a restart.
    Paused,
    /// The worker's container has exited: alert only, never started by Vigil.
    Exited,
    /// Page: the worker is hung but Vigil must not restart it (e.g. a CRI pod whose
    /// restartPolicy is Never): a person decides.
    NotRestartable,
    /// Page: a hung gang cannot be restarted as a whole (a member's node in maintenance, its
    /// breaker open, its agent silent, members missing, the gang breaker or fleet budget spent):
    /// nobody is restarted.
    GangBlocked,
    /// A gang member stopped while its peers still progress.
    Straggler,
    /// Page: `policy.max_fruitless_restarts` restarts in a row brought no progress past where
    /// the worker stopped: Vigil stops restarting it.
    Fruitless,
    /// A gang runs below its usual pace (fail-slow, `gang.pace`): the member it waits for, when
    /// its evidence says so. Never a restart.
    Slow,
    /// A gang's slow episode is over: back at its pace.
    SlowOver,
}

#[cfg(any(test, feature = "bench"))]
impl AlertKind {
    /// Every kind, for the docs drift check (docs/alerts.md).
    pub const ALL: &'static [AlertKind] = <AlertKind as strum::VariantArray>::VARIANTS;
}

impl AlertKind {
    /// Alert-only episodes (alerts of a condition, not of an incident): they end with the
    /// episode.
    pub(crate) fn is_episode(self) -> bool {
        use AlertKind::*;
        matches!(self, Unreachable | Stalled | GpuFailed | TpuFailed | Paused | Exited | Slow)
    }

    /// The `severity` label in Alertmanager: `page` for pages, `info` for what needs no
    /// action, `warning` for the rest.
    pub(crate) fn severity(self) -> &'static str {
        use AlertKind::*;
        match self {
            _ if self.is_page() => "page",
            Restarting | WouldRestart | Paused | SlowOver => "info",
            _ => "warning",
        }
    }

    /// Pages carry the configured mention: a person is needed now.
    pub(crate) fn is_page(self) -> bool {
        use AlertKind::*;
        matches!(self, RestartFailed | Escalation | NotRestartable | GangBlocked | Fruitless)
    }
}
as_str!(pub AlertKind);

/// One alert, with everything a person needs to act without opening another tool.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Alert {
    pub kind: AlertKind,
    pub node: String,
    pub worker: Option<String>,
    /// Where the worker runs: `namespace/pod/container` on Kubernetes nodes, the container name
    /// on Docker.
    pub container: Option<String>,
    pub(crate) verdict: Option<&'static str>,
    pub job: Option<String>,
    /// The distributed job the worker is a member of, how many members the gang has when that
    /// is known (its labels or its members' records say), and how many members report.
    pub gang: Option<String>,
    pub gang_size: Option<u32>,
    pub gang_members: Option<u32>,
    /// How long the condition has lasted, human-readable.
    #[serde(rename = "for")]
    pub(crate) duration: Option<String>,
    pub incident: Option<String>,
    pub detail: String,
    pub logs: Option<String>,
    pub page: bool,
    /// An update of an alert already sent for this incident (e.g. a further failed restart
    /// after the `restart-failed` page): it does not page again.
    pub update: bool,
    /// Which attempt of the incident this is about (failed restarts), when it counts.
    pub attempt: Option<u32>,
    pub(crate) dry_run: bool,
}

/// The prefix of the name an incident's alert placed at no worker (a gang's, with no member to
/// place it at) is kept open under by the sinks that keep alerts open, and resolved under by the
/// engine ([`AlertSink::resolve`]): `@<incident>` ([`no_worker`]). NB: `@` is in no worker id
/// (`[A-Za-z0-9._-]`), so it is never among a sink's `open_workers` (the roster does not end it,
/// its incident does); one per incident, so one gang's end never resolves another's alert
/// (two gangs — two tenants — blocked on one node).
pub const NO_WORKER: &str = "@";

/// The name incident `incident`'s alert placed at no worker is kept under.
pub fn no_worker(incident: &str) -> String {
    format!("{NO_WORKER}{incident}")
}

impl Alert {
    pub fn new(kind: AlertKind, node: &str, detail: impl Into<String>) -> Alert {
        let (node, detail, page) = (node.to_string(), detail.into(), kind.is_page());
        Alert { kind, node, detail, page, ..Default::default() }
    }

    /// The worker a sink that keeps alerts open keeps this one under, for the end that resolves
    /// it: its own, or [`no_worker`] of its incident for an incident's alert placed at no
    /// worker. None for a node-wide alert (neither a worker nor an incident: `coordinator-down`,
    /// `breaker-open`…), which no end resolves.
    pub(crate) fn kept_under(&self) -> Option<String> {
        match (&self.worker, &self.incident) {
            (Some(w), _) => Some(w.clone()),
            (None, Some(inc)) => Some(no_worker(inc)),
            (None, None) => None,
        }
    }

    /// The one-line human summary (also the log line).
    pub fn summary(&self) -> String {
        let update = if self.update { " (update)" } else { "" };
        let mut s = format!("[vigil] {}{update} on node {}", self.kind.as_str(), self.node);
        s += &self.worker.as_ref().map(|w| format!(", worker {w}")).unwrap_or_default();
        s += &self.container.as_ref().map(|c| format!(" in {c}")).unwrap_or_default();
        if let Some(v) = self.verdict {
            let d = self.duration.as_ref().map(|d| format!(" for {d}")).unwrap_or_default();
            s.push_str(&format!(" ({v}{d})"));
        }
        s += &self.job.as_ref().map(|j| format!(", job {j}")).unwrap_or_default();
        if let Some(g) = &self.gang {
            s.push_str(&format!(", gang {g}"));
            // NB: an unknown size says so; the members that report are a count, not a size.
            match (self.gang_size, self.gang_members.filter(|n| *n > 0)) {
                (Some(n), _) => s.push_str(&format!(" ({n} members)")),
                (None, Some(n)) => s.push_str(&format!(" (size unknown; {n} reporting)")),
                (None, None) => s.push_str(" (size unknown)"),
            }
        }
        let dry_run = if self.dry_run { " [dry run]" } else { "" };
        format!("{s}: {}{dry_run}", self.detail)
    }

    /// The Slack-compatible body. NB: a worker writes its `job` and its log lines, so its text
    /// is escaped the way Slack's message formatting asks (`&`, `<`, `>`): a `<!channel>` or a
    /// `<https://…|link>` in them reaches the channel as text, and a code fence in the logs
    /// cannot close the block. Only the configured mention is sent as markup. The logs, in
    /// `text` and in `vigil`, are their last [`LOGS_TAIL`] bytes.
    pub(crate) fn webhook_body(&self, mention: &str) -> serde_json::Value {
        let paged = self.page && !mention.is_empty();
        let mut text = if paged { format!("{mention} ") } else { String::new() };
        text.push_str(&slack_escape(&self.summary()));
        if let Some(logs) = self.logs.as_ref().filter(|l| !l.trim().is_empty()) {
            text.push_str("\n```\n");
            // A zero-width space after each backtick: no run of three is left to end the block.
            text.push_str(&slack_escape(tail_chars(logs, LOGS_TAIL)).replace('`', "`\u{200B}"));
            text.push_str("\n```");
        }
        serde_json::json!({ "text": text, "vigil": self.fields() })
    }

    /// The alert's fields as JSON, its logs cut to their last [`LOGS_TAIL`] bytes: Slack's
    /// `vigil`, the generic JSON body, PagerDuty's `custom_details`.
    pub(crate) fn fields(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(logs) = self.logs.as_deref() {
            v["logs"] = Value::from(tail_chars(logs, LOGS_TAIL));
        }
        v
    }
}

/// How much of the logs an alert's webhook body carries, in bytes (the end is kept). NB: every
/// copy of them in a body, not only the one a person reads: a CRI log runs to 1 MiB, and the
/// receiver's 413 for a body that large is final (no retry): the alert would be lost.
pub(crate) const LOGS_TAIL: usize = 3000;

/// Slack's three control characters, escaped as its formatting reference asks.
fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The end of `s`, at most `max` bytes, cut on a character boundary.
pub(crate) fn tail_chars(s: &str, max: usize) -> &str {
    let from = s.len().saturating_sub(max);
    let start = (from..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
    &s[start..]
}

#[derive(Debug, thiserror::Error)]
#[error("{sink} {url} failed after {attempts} attempt(s): {last}")]
pub struct AlertError {
    /// Which sink: `webhook` or `alertmanager`.
    pub(crate) sink: &'static str,
    /// The webhook, redacted (`https://hooks.slack.com/***`): this error is logged.
    pub(crate) url: String,
    pub attempts: u32,
    pub(crate) last: String,
}

/// Where a sink posts: its URL (a secret: only ever shown redacted, as its errors name it), the
/// address posted to (the URL, or an API's path under it), the HTTP client with the extra
/// headers it sends, and the attempts a post gets. Cloned into the background for resolves.
#[derive(Clone)]
struct Endpoint {
    /// Which sink: `webhook` or `alertmanager`.
    sink: &'static str,
    /// Shown, redacted, in errors.
    url: Secret<Webhook>,
    /// Posted to (`new`'s `target`): the URL, or an API's path under it (Alertmanager's).
    target: Secret<Webhook>,
    http: reqwest::Client,
    headers: reqwest::header::HeaderMap,
    attempts: u32,
}

impl Endpoint {
    /// Posts to `target` (`url` itself, or an API's path under it), every request bounded by
    /// `timeout` (with the default client when the builder fails).
    fn new(sink: &'static str, url: &str, target: &str, timeout: Duration, attempts: u32) -> Self {
        let http = reqwest::Client::builder().timeout(timeout).build();
        let http = http.unwrap_or_else(|_| reqwest::Client::new());
        let (url, target) = (Secret::new(url), Secret::new(target));
        Endpoint { sink, url, target, http, headers: Default::default(), attempts }
    }

    /// The sink's failure after `attempts`, naming its URL redacted.
    fn error(&self, attempts: u32, last: String) -> AlertError {
        AlertError { sink: self.sink, url: self.url.redacted(), attempts, last }
    }

    /// POST `body` as JSON until a 2xx, `attempts` times at most (the alert backoff before
    /// each): a 4xx other than 429 (a body the receiver rejects) will not get better by
    /// retrying.
    async fn post<B: Serialize + ?Sized>(&self, body: &B) -> Result<(), AlertError> {
        let mut last = String::new();
        for attempt in 0..self.attempts {
            tokio::time::sleep(crate::config::alert_backoff(attempt)).await;
            let request = self.http.post(self.target.expose()).headers(self.headers.clone());
            match request.json(body).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
                    return Err(self.error(attempt + 1, format!("HTTP {}", r.status())))
                }
                Ok(r) => last = format!("HTTP {}", r.status()),
                Err(e) => last = crate::http::http_error(e),
            }
        }
        Err(self.error(self.attempts, last))
    }

    /// POST each of `bodies` in the background where there is a runtime, else here; a failure
    /// is logged by `failed`, with `worker` (written in the sink's module: its log target). For
    /// resolves: the engine resolves under the node lock, whose TTL is sized for one alert's
    /// delivery.
    async fn post_later(&self, bodies: Vec<Value>, worker: &str, failed: fn(&AlertError, &str)) {
        let (to, worker) = (self.clone(), worker.to_string());
        let post = async move {
            for body in bodies {
                if let Err(e) = to.post(&body).await {
                    failed(&e, &worker);
                }
            }
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return post.await };
        drop(rt.spawn(post));
    }
}

/// Which of a worker's alerts a condition's end resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// The incident ended with the worker healthy (recovered, or healthy after our restart):
    /// every incident alert of the worker, escalations included.
    Recovered,
    /// The incident timer was cleared without the worker being healthy yet (our restart is
    /// booting, maintenance, paused): its incident alerts, but not an escalation.
    IncidentCleared,
    /// An alert-only episode ended: the alerts of that kind (`stalled`, `unreachable`, ...).
    Episode(AlertKind),
    /// The worker is no longer on the node (its container is gone): all of its alerts.
    Gone,
}

impl Resolve {
    /// Does this end resolve an alert of `kind`?
    pub(crate) fn covers(self, kind: AlertKind) -> bool {
        match self {
            Resolve::Episode(k) => k == kind,
            Resolve::Gone => true,
            Resolve::Recovered => !kind.is_episode(),
            Resolve::IncidentCleared => !kind.is_episode() && kind != AlertKind::Escalation,
        }
    }
}

/// Somewhere alerts are delivered.
#[async_trait]
pub trait AlertSink: Send + Sync {
    async fn send(&self, alert: &Alert) -> Result<(), AlertError>;

    /// The condition behind `worker`'s alerts on `node` ended ([`no_worker`] of an incident:
    /// that incident's alerts placed at no worker there). Sinks that keep alerts open
    /// (Alertmanager, PagerDuty) resolve them; the others have nothing to do.
    async fn resolve(&self, _node: &str, _worker: &str, _end: Resolve) {}

    /// The workers of `node` with alerts kept open here (none for sinks that keep none), never
    /// [`NO_WORKER`].
    fn open_workers(&self, _node: &str) -> Vec<String> {
        Vec::new()
    }
}

/// Several sinks (webhook and Alertmanager): every alert goes to each, at the same time (so a
/// delivery takes no longer than the slowest sink's, as the node lock's TTL assumes); the first
/// error is returned after all were tried, the others logged.
pub(crate) struct Fanout(pub Vec<Arc<dyn AlertSink>>);

#[async_trait]
impl AlertSink for Fanout {
    async fn send(&self, alert: &Alert) -> Result<(), AlertError> {
        let sent = futures_util::future::join_all(self.0.iter().map(|s| s.send(alert))).await;
        let mut errors = sent.into_iter().filter_map(Result::err);
        let first = errors.next();
        errors.for_each(|e| tracing::error!(error = %e, "alert delivery failed"));
        first.map_or(Ok(()), Err)
    }

    async fn resolve(&self, node: &str, worker: &str, end: Resolve) {
        for sink in &self.0 {
            sink.resolve(node, worker, end).await;
        }
    }

    fn open_workers(&self, node: &str) -> Vec<String> {
        let all = self.0.iter().flat_map(|s| s.open_workers(node));
        all.collect::<std::collections::BTreeSet<_>>().into_iter().collect()
    }
}

/// Delivers an alert everywhere it should go: always the log, the webhook when configured, and a
/// metric per outcome. A failed delivery is logged and counted, never fatal.
pub struct Notifier {
    sink: Option<Arc<dyn AlertSink>>,
    metrics: Arc<Metrics>,
}

impl Notifier {
    pub fn new(sink: Option<Arc<dyn AlertSink>>, metrics: Arc<Metrics>) -> Self {
        Notifier { sink, metrics }
    }

    /// `worker`'s condition ended: sinks that keep alerts open resolve the ones it covers.
    pub(crate) async fn resolve(&self, node: &str, worker: &str, end: Resolve) {
        let Some(sink) = &self.sink else { return };
        sink.resolve(node, worker, end).await;
    }

    /// The workers on `node` now (this cycle's roster): the open alerts of any other worker
    /// (its container gone) are resolved.
    pub(crate) async fn retain(&self, node: &str, present: &std::collections::HashSet<String>) {
        let Some(sink) = &self.sink else { return };
        for gone in sink.open_workers(node).into_iter().filter(|w| !present.contains(w)) {
            sink.resolve(node, &gone, Resolve::Gone).await;
        }
    }

    pub(crate) async fn send(&self, alert: &Alert) {
        let kind = alert.kind.as_str();
        if alert.page {
            tracing::error!(alert = kind, node = %alert.node, worker = alert.worker.as_deref(), incident = alert.incident.as_deref(), "{}", alert.summary());
        } else {
            tracing::warn!(alert = kind, node = %alert.node, worker = alert.worker.as_deref(), incident = alert.incident.as_deref(), "{}", alert.summary());
        }
        let Some(sink) = &self.sink else {
            self.metrics.decisions.alert(kind, "logged");
            return;
        };
        match sink.send(alert).await {
            Ok(()) => self.metrics.decisions.alert(kind, "sent"),
            Err(e) => {
                tracing::error!(alert = kind, error = %e, "alert delivery failed; it is in this log only");
                self.metrics.decisions.alert(kind, "failed");
            }
        }
    }
}

#[cfg(test)]
mod tests;
