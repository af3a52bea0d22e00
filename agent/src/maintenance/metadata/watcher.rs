//! The watcher: one long-poll loop per key (`maintenance-event`, `upcoming-maintenance`,
//! `preempted`) that publishes [`RawMetadata`] on a `tokio::sync::watch` channel. Apart from the
//! client and the parsers because this is where the timing lives: the start-up probe, the ETag
//! long-poll, the fast retries of a maintenance-time 503, the backoff, and the confirmation
//! before a notice is cleared.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use reqwest::Url;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::parse::{parse_maintenance_event, parse_preempted, parse_upcoming};
use super::{
    chain, snippet, Fetched, MetadataClient, MetadataError, MAINTENANCE_EVENT_PATH, PREEMPTED_PATH,
    UPCOMING_MAINTENANCE_PATH,
};
use crate::backoff::Backoff;
use crate::http::health::Warnings;
use crate::metrics::Metrics;
use crate::vocab::maintenance::{MaintenanceEvent, RawMetadata, UpcomingMaintenance};

/// Tuning of [`watch_with`]. The defaults suit production; tests shorten them.
#[derive(Debug, Clone, educe::Educe)]
#[educe(Default)]
pub struct WatchConfig {
    /// `timeout_sec` of each long-poll: how long the server may hold a request.
    #[educe(Default(expression = 60))]
    pub timeout_sec: u32,
    /// Bounds of the random pause after a 503 (the server gives sub-second 503s in maintenance).
    #[educe(Default(expression = (Duration::from_millis(200), Duration::from_millis(500))))]
    pub unavailable_retry: (Duration, Duration),
    /// First pause after 429, timeouts and transport errors; doubles (with jitter) per failure.
    #[educe(Default(expression = Duration::from_millis(500)))]
    pub backoff_initial: Duration,
    /// Cap of that backoff.
    #[educe(Default(expression = Duration::from_secs(30)))]
    pub backoff_max: Duration,
    /// NB: if a long-poll comes back faster than this with an unchanged value (the server does
    /// not hold this key, or answers "no notifications" at once), wait out the rest before the
    /// next request, so a server that ignores `wait_for_change` is polled, not hammered.
    #[educe(Default(expression = Duration::from_secs(5)))]
    pub min_interval: Duration,
    /// Start-up reads of maintenance-event that may fail to connect, retried quickly (a node's
    /// network can come up a moment after the agent), before the watcher says the server is
    /// unreachable, probes it with backoff, and (unless `gce_known`) decides it is not on GCE.
    #[educe(Default(expression = 3))]
    pub startup_attempts: u32,
    /// The operator says this is GCE (`metadata.enabled = "on"`): a server that cannot be
    /// reached is late, not absent, so failing the quick attempts does not end the start-up read
    /// (restarts keep waiting for it, up to `metadata.first_read_wait`), and it is probed at
    /// most `OPEN_READ_PROBE_MAX` (2 s) apart until it answers.
    pub gce_known: bool,
    /// Where a standing problem (no `maintenance-event` key) is reported for `/readyz`.
    pub warnings: Option<Warnings>,
}

/// Quick start-up attempts with `metadata.enabled = "on"`, against `auto`'s 3: the operator says
/// the server is there, so give a late network longer. With the defaults they take about 6 s
/// when each connect fails at once (refused, no route: 29 pauses of 200 ms); a connect that
/// hangs instead takes up to the client's connect timeout (2.5 s in the agent), so 30 such
/// attempts take up to about 1.4 min (30 × 2.5 s and the pauses).
const ON_STARTUP_ATTEMPTS: u32 = 30;

/// NB: the longest pause between probes past the quick attempts while `gce_known` (the start-up
/// read stays open until the server answers). The server may come up at any moment, and until
/// it is asked again a pending maintenance notice goes unseen, while restarts wait for the read
/// only up to `metadata.first_read_wait`: the backoff's up to ~60 s between probes would see the
/// notice up to that much late. A request every 2 s to the node's own link-local server is
/// cheap. Once the server has answered, the usual backoff applies.
const OPEN_READ_PROBE_MAX: Duration = Duration::from_secs(2);

impl WatchConfig {
    /// This tuning for `metadata.enabled = "on"`: more quick attempts at start-up, then the same
    /// message as `auto` and the backoff, capped at `OPEN_READ_PROBE_MAX` (2 s); the start-up read
    /// ends only when the server answers (see [`WatchConfig::gce_known`]).
    pub fn enabled_on(self) -> WatchConfig {
        WatchConfig { startup_attempts: ON_STARTUP_ATTEMPTS, gce_known: true, ..self }
    }
}

/// Watch `maintenance-event`, `upcoming-maintenance` and `preempted` until `shutdown` fires,
/// publishing each change on `tx` (only when a parsed value actually changes).
///
/// Reads maintenance-event once at start-up, so GCE keeps giving its 60-second warning. If that
/// read cannot connect at all (not on GCE, or not yet), it says so once and keeps probing with
/// backoff. Errors never change a published value; each is counted in
/// `vigil_metadata_errors_total`.
pub async fn watch_with(
    client: MetadataClient,
    tx: watch::Sender<RawMetadata>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    cfg: WatchConfig,
) {
    let ctx = Ctx { client, tx, unsettled: AtomicUsize::new(3), metrics, shutdown, cfg };
    let Some(first) = first_answer(&ctx).await else { return };
    tokio::join!(
        key_loop(&ctx, Key::MaintenanceEvent, Some(first)),
        key_loop(&ctx, Key::UpcomingMaintenance, None),
        key_loop(&ctx, Key::Preempted, None),
    );
    tracing::debug!("metadata watcher stopped");
}

/// The first answer of the metadata server (`maintenance-event`), probed until it comes;
/// `None` at shutdown. Once the quick attempts have all failed to connect, the start-up read is
/// over (`RawMetadata::settled`: not on GCE), unless the operator says this is GCE
/// ([`WatchConfig::gce_known`]: then it stays open, and the probes come at most
/// [`OPEN_READ_PROBE_MAX`] apart).
async fn first_answer(ctx: &Ctx) -> Option<Answer> {
    let (key, cfg) = (Key::MaintenanceEvent, &ctx.cfg);
    let attempts = cfg.startup_attempts.max(1);
    let mut attempt = 0;
    // NB: a server that cannot be reached at start-up may only be late (the node's network comes
    // up after the agent): after the quick attempts, keep probing with backoff (capped while the
    // start-up read is open: `OPEN_READ_PROBE_MAX`). The watcher is off only when configured off.
    let mut probe = Backoff::jittered(cfg.backoff_initial, cfg.backoff_max);
    loop {
        attempt += 1;
        let res = ctx.shutdown.run_until_cancelled(ctx.client.get(key.path(), None)).await?;
        let e = match res {
            Err(e @ MetadataError::Unreachable { .. }) => e,
            other => {
                if attempt > attempts {
                    tracing::info!("GCE metadata server reachable now: watching");
                }
                return Some(other);
            }
        };
        ctx.metrics.maintenance.metadata_error(key.as_str(), e.kind());
        let step = unreached(cfg, attempt);
        if step.settle {
            // NB: read as "no maintenance" from here on (not on GCE): the start-up read is
            // over, and restarts stop waiting for it.
            ctx.tx.send_if_modified(|raw| !std::mem::replace(&mut raw.settled, true));
        }
        if step.say {
            tracing::info!(
                "GCE metadata server unreachable ({}): not on GCE, or not up yet; probing again with backoff (off GCE, set metadata.enabled = \"off\")",
                chain(&e)
            );
        }
        let pause_for = step.pause.of(cfg, &mut probe);
        ctx.shutdown.run_until_cancelled(tokio::time::sleep(pause_for)).await?;
    }
}

/// What the start-up probe does after a failed connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unreached {
    /// Say that the server cannot be reached: once, after the last quick attempt.
    say: bool,
    /// End the start-up read (`RawMetadata::settled`): not on GCE.
    settle: bool,
    /// The pause before the next attempt.
    pause: Pause,
}

/// The pause of the start-up probe before its next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    /// `unavailable_retry.0`: a quick attempt.
    Quick,
    /// The next step of the backoff, at most [`OPEN_READ_PROBE_MAX`]: the start-up read is
    /// open (`gce_known`).
    Capped,
    /// The next step of the backoff.
    Backoff,
}

impl Pause {
    /// How long, `probe` being the backoff past the quick attempts.
    fn of(self, cfg: &WatchConfig, probe: &mut Backoff) -> Duration {
        match self {
            Pause::Quick => cfg.unavailable_retry.0,
            Pause::Capped => probe.next_delay().min(OPEN_READ_PROBE_MAX),
            Pause::Backoff => probe.next_delay(),
        }
    }
}

/// What the start-up probe does after its `attempt`-th (from 1) failed connect under `cfg`.
fn unreached(cfg: &WatchConfig, attempt: u32) -> Unreached {
    let attempts = cfg.startup_attempts.max(1);
    let last = attempt == attempts;
    let pause = if attempt < attempts {
        Pause::Quick
    } else if cfg.gce_known {
        Pause::Capped
    } else {
        Pause::Backoff
    };
    Unreached { say: last, settle: last && !cfg.gce_known, pause }
}

/// The watched keys; `as_str` is the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
enum Key {
    MaintenanceEvent,
    UpcomingMaintenance,
    Preempted,
}

impl Key {
    fn path(self) -> &'static str {
        match self {
            Key::MaintenanceEvent => MAINTENANCE_EVENT_PATH,
            Key::UpcomingMaintenance => UPCOMING_MAINTENANCE_PATH,
            Key::Preempted => PREEMPTED_PATH,
        }
    }

    /// Parse a body read from this key.
    fn parse(self, body: &str) -> Result<Parsed, MetadataError> {
        Ok(match self {
            Key::MaintenanceEvent => Parsed::Event(parse_maintenance_event(body)?),
            Key::UpcomingMaintenance => Parsed::Upcoming(parse_upcoming(body)?),
            Key::Preempted => Parsed::Preempted(parse_preempted(body)?),
        })
    }
}

as_str!(Key);

enum Parsed {
    Event(MaintenanceEvent),
    Upcoming(Option<UpcomingMaintenance>),
    Preempted(bool),
}

impl Parsed {
    /// Store into `raw`; true when the value changed.
    fn apply(self, raw: &mut RawMetadata) -> bool {
        // The old value against the new one.
        fn set<T: PartialEq>(slot: &mut T, v: T) -> bool {
            std::mem::replace(slot, v) != *slot
        }
        match self {
            Parsed::Event(v) => set(&mut raw.maintenance_event, Some(v)),
            Parsed::Upcoming(v) => set(&mut raw.upcoming, v),
            Parsed::Preempted(v) => set(&mut raw.preempted, Some(v)),
        }
    }
}

/// One request's outcome.
type Answer = Result<Fetched, MetadataError>;

/// What the three keys' loops share.
struct Ctx {
    client: MetadataClient,
    tx: watch::Sender<RawMetadata>,
    /// The keys whose start-up read is not over yet (see [`KeyState::settle`]).
    unsettled: AtomicUsize,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    cfg: WatchConfig,
}

/// What one key's loop carries from one answer to the next.
struct KeyState {
    key: Key,
    /// A read succeeded: from now on, long-poll from `etag`.
    read_once: bool,
    etag: Option<String>,
    backoff: Backoff,
    /// Consecutive 503s retried fast (see [`UNAVAILABLE_FAST`]).
    unavailable_streak: u32,
    /// A "nothing scheduled" answer seen once while a notice is published, not yet confirmed.
    clear_seen: bool,
    /// Its start-up read is over (see [`KeyState::settle`]).
    settled: bool,
}

/// One key: a plain read until one succeeds, then long-polls from the last ETag; `None` at
/// shutdown.
async fn key_loop(ctx: &Ctx, key: Key, mut pending: Option<Answer>) -> Option<()> {
    let mut state = KeyState {
        key,
        read_once: false,
        etag: None,
        backoff: Backoff::jittered(ctx.cfg.backoff_initial, ctx.cfg.backoff_max),
        unavailable_streak: 0,
        clear_seen: false,
        settled: false,
    };
    loop {
        let started = Instant::now();
        let wait =
            state.read_once.then(|| (state.etag.as_deref().unwrap_or(""), ctx.cfg.timeout_sec));
        let res = match pending.take() {
            Some(r) => r,
            None => ctx.shutdown.run_until_cancelled(ctx.client.get(key.path(), wait)).await?,
        };
        // NB: `blind` sees the raw answer, `upcoming-maintenance`'s "nothing scheduled" 404
        // included: fine only because it ignores every key but `maintenance-event`.
        blind(ctx, key, &res);
        let delay = match res {
            Ok(fetched) => state.on_read(ctx, fetched, started),
            Err(e) if nothing_scheduled(key, &e) => state.on_read(ctx, Fetched::default(), started),
            Err(e) => state.on_error(ctx, &e),
        };
        if !delay.is_zero() {
            ctx.shutdown.run_until_cancelled(tokio::time::sleep(delay)).await?;
        }
    }
}

/// Whether `e` is how `upcoming-maintenance` says "nothing scheduled" (a 404, or a 503 "no
/// notifications"): it reads as an empty value.
fn nothing_scheduled(key: Key, e: &MetadataError) -> bool {
    key == Key::UpcomingMaintenance
        && (e.is_no_notifications_yet() || matches!(e, MetadataError::NotFound { .. }))
}

impl KeyState {
    /// This key's start-up read is over (its value published, or the key absent): once the
    /// last of the three is, the published value says so (`RawMetadata::settled`), after the
    /// values it carries.
    fn settle(&mut self, ctx: &Ctx) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        if ctx.unsettled.fetch_sub(1, Ordering::SeqCst) == 1 {
            ctx.tx.send_if_modified(|raw| !std::mem::replace(&mut raw.settled, true));
        }
    }

    /// An answer with a body: publish it when it parses and changed; the pause before the next
    /// request.
    fn on_read(&mut self, ctx: &Ctx, fetched: Fetched, started: Instant) -> Duration {
        let key = self.key;
        match key.parse(&fetched.value) {
            Ok(parsed) if unconfirmed_clear(ctx, &parsed, &mut self.clear_seen) => {
                // NB: the old ETag is kept: the next long-poll returns at once if the key
                // still says nothing, and waits if the notice is back (a blip).
                self.read_once = true;
                ctx.cfg.unavailable_retry.0
            }
            Ok(parsed) => {
                self.backoff.reset();
                self.unavailable_streak = 0;
                let waited = std::mem::replace(&mut self.read_once, true);
                self.etag = fetched.etag;
                let changed = ctx.tx.send_if_modified(|raw| parsed.apply(raw));
                self.settle(ctx);
                if changed {
                    // The node controller logs the phase this makes.
                    tracing::info!(
                        key = key.as_str(),
                        value = %snippet(fetched.value.trim()),
                        "metadata changed"
                    );
                    Duration::ZERO
                } else if waited {
                    ctx.cfg.min_interval.saturating_sub(started.elapsed())
                } else {
                    Duration::ZERO
                }
            }
            Err(e) => {
                // An answer this build cannot read will not read better on the next try.
                self.settle(ctx);
                ctx.metrics.maintenance.metadata_error(key.as_str(), e.kind());
                tracing::warn!(key = key.as_str(), "{e}");
                // NB: adopt the new ETag, or the next long-poll would return the same bad
                // value at once, forever. The previous good value stays published.
                if let Some(t) = fetched.etag {
                    self.etag = Some(t);
                }
                self.backoff.next_delay()
            }
        }
    }

    /// A failed request: counted; the pause before the next one.
    fn on_error(&mut self, ctx: &Ctx, e: &MetadataError) -> Duration {
        use MetadataError as E;
        let key = self.key;
        ctx.metrics.maintenance.metadata_error(key.as_str(), e.kind());
        // NB: a key the server does not have or refuses is as read as it will be; a 503 (sub-
        // second during host maintenance), a 429 or a timeout is not: its value may be the
        // notice itself.
        if matches!(e, E::NotFound { .. } | E::Forbidden { .. } | E::BadHost { .. }) {
            self.settle(ctx);
        }
        match e {
            // NB: maintenance gives sub-second 503s, so retry fast at first; a 503 that
            // lasts is something else, and gets the backoff and a warning.
            MetadataError::Unavailable { .. } if self.unavailable_streak < UNAVAILABLE_FAST => {
                self.unavailable_streak += 1;
                tracing::debug!(key = key.as_str(), "{e}");
                jitter(ctx.cfg.unavailable_retry.0, ctx.cfg.unavailable_retry.1)
            }
            _ => {
                tracing::warn!(key = key.as_str(), "{}", chain(e));
                self.backoff.next_delay()
            }
        }
    }
}

/// NB: one empty answer (a 200 with `{}`, a 404) between two PENDING answers must not clear a
/// notice: the Node would flip pending → none → pending with two Events. A "nothing scheduled"
/// while a notice is published is acted on only when the next read says it again. True when
/// this answer is the first such read (hold it); any other answer resets the count.
fn unconfirmed_clear(ctx: &Ctx, parsed: &Parsed, clear_seen: &mut bool) -> bool {
    let clears = matches!(parsed, Parsed::Upcoming(None)) && ctx.tx.borrow().upcoming.is_some();
    *clear_seen = clears && !*clear_seen;
    if *clear_seen {
        tracing::debug!(
            "upcoming-maintenance says nothing is scheduled: confirming before clearing"
        );
    }
    *clear_seen
}

/// What an operator must know when the server answers but has no `maintenance-event`: the
/// likely cause and the fix.
pub(crate) fn blind_hint(base: &Url) -> String {
    format!("the metadata server at {base} has no instance/maintenance-event (404): maintenance and termination notices cannot be seen (this is not \"no maintenance\"). On GKE this is the GKE metadata server of a Workload Identity node pool, which serves pods only a subset of the Compute Engine paths: run the agent with hostNetwork: true (deploy/overlays/gke) so it reaches the Compute Engine metadata server")
}

/// A 404 on `maintenance-event` blinds the watcher: say so once (and for `/readyz`) while it
/// lasts, and say when it ends.
fn blind(ctx: &Ctx, key: Key, res: &Answer) {
    if key != Key::MaintenanceEvent {
        return;
    }
    let warning = match res {
        Err(MetadataError::NotFound { .. }) => Some(blind_hint(ctx.client.base_url())),
        Err(_) => return,
        Ok(_) => None,
    };
    // Without `/readyz`'s warnings, every 404 is said; with them, each change once.
    let warnings = ctx.cfg.warnings.as_ref();
    if warnings.map_or(warning.is_some(), |w| w.set("metadata", warning.clone())) {
        match warning {
            Some(text) => tracing::error!("{text}"),
            None => tracing::info!("instance/maintenance-event answers now"),
        }
    }
}

/// Consecutive 503s retried after [`WatchConfig::unavailable_retry`] before the backoff applies
/// (about 2-5 s of them with the defaults: well past a maintenance blip).
const UNAVAILABLE_FAST: u32 = 10;

/// A random duration in `[lo, hi]` (the quick retries of a maintenance-time 503).
fn jitter(lo: Duration, hi: Duration) -> Duration {
    let (lo, hi) = (lo.as_millis() as u64, hi.as_millis() as u64);
    Duration::from_millis(rand::rng().random_range(lo..=hi.max(lo)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start-up probe's steps over the first `n` failed connects.
    fn schedule(cfg: &WatchConfig, n: u32) -> Vec<Unreached> {
        (1..=n).map(|attempt| unreached(cfg, attempt)).collect()
    }

    /// The pauses of the start-up probe after the first `n` failed connects, with its backoff.
    fn pauses(cfg: &WatchConfig, n: u32) -> Vec<Duration> {
        let mut probe = Backoff::jittered(cfg.backoff_initial, cfg.backoff_max);
        schedule(cfg, n).into_iter().map(|s| s.pause.of(cfg, &mut probe)).collect()
    }

    /// `metadata.enabled = "on"` once retried an unreachable server every 200 ms for ever,
    /// silently (its quick attempts had no end): now a few seconds of quick retries, then the
    /// (capped) backoff for good, the server's absence said once, and the start-up read never
    /// ended by it (the operator says this is GCE).
    #[test]
    fn on_retries_quickly_at_start_then_says_it_once_and_backs_off_never_settling() {
        let steps = schedule(&WatchConfig::default().enabled_on(), 10_000);
        let quick = steps.iter().take_while(|s| s.pause == Pause::Quick).count();
        assert!((10..100).contains(&quick), "a few seconds of quick retries, not {quick}");
        let capped = steps[quick..].iter().all(|s| s.pause == Pause::Capped);
        assert!(capped, "then the backoff, capped while the start-up read is open, for good");
        assert_eq!(steps.iter().filter(|s| s.say).count(), 1, "said once");
        assert!(steps[quick].say, "when the quick retries end");
        assert!(steps.iter().all(|s| !s.settle), "an unreachable server is late, not absent");
    }

    /// `auto`: three quick attempts, then said once, the start-up read over (not on GCE), and
    /// probed with backoff.
    #[test]
    fn auto_settles_after_its_quick_attempts() {
        let steps = schedule(&WatchConfig::default(), 50);
        let quick = steps.iter().take_while(|s| s.pause == Pause::Quick).count();
        assert_eq!(quick, 2);
        let once = Unreached { say: true, settle: true, pause: Pause::Backoff };
        assert_eq!(steps[quick], once);
        let later = Unreached { say: false, settle: false, pause: Pause::Backoff };
        assert!(steps[quick + 1..].iter().all(|s| *s == later));
    }

    /// `on` past its quick attempts once backed off up to ~60 s between probes: a server that
    /// came up was first asked up to that much later, its pending notice unseen meanwhile. Now,
    /// while the start-up read is open, the probes come at most `OPEN_READ_PROBE_MAX` apart;
    /// `auto` (its start-up read over) backs off as before.
    #[test]
    fn with_on_probes_stay_a_few_seconds_apart_while_the_start_up_read_is_open() {
        let on = WatchConfig::default().enabled_on();
        let p = pauses(&on, 100);
        assert!(p.iter().all(|d| *d <= OPEN_READ_PROBE_MAX), "capped: {p:?}");
        assert_eq!(p.last(), Some(&OPEN_READ_PROBE_MAX), "probed on at the cap, not faster");
        let auto = WatchConfig::default();
        let p = pauses(&auto, 100);
        assert!(p.iter().any(|d| *d >= auto.backoff_max), "auto backs off to its cap: {p:?}");
    }
}
