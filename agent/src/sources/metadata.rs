//! GCE metadata server watcher: host maintenance and preemption notices.
//!
//! Map: [`MetadataClient`] speaks HTTP to the metadata server (one GET, long-poll optional);
//! `parse_*` turn the three watched keys into typed values; [`watch`] runs one long-poll loop per
//! key and publishes [`RawMetadata`] on a `tokio::sync::watch` channel; the pure
//! `crate::policy::maintenance::derive` turns those raw values into a maintenance state.
//!
//! Facts about the server this module relies on (checked against public sources):
//! - `instance/maintenance-event` is `NONE`, `MIGRATE_ON_HOST_MAINTENANCE` or
//!   `TERMINATE_ON_HOST_MAINTENANCE`; its value changes 60 s before an event, and that warning is
//!   only given if the key was read since the last event, hence the plain read at start-up
//!   (<https://cloud.google.com/compute/docs/metadata/getting-live-migration-notice>).
//! - `instance/upcoming-maintenance` is snake_case JSON: `type`, `maintenance_status`
//!   (`PENDING`/`ONGOING`), `can_reschedule` as the *string* `"true"`, `window_start_time`,
//!   `window_end_time`, `latest_window_start_time`, `maintenance_reasons`; `{ }` when nothing is
//!   scheduled (<https://docs.cloud.google.com/ai-hypercomputer/docs/manage/host-events>; enum
//!   values from <https://cloud.google.com/compute/docs/reference/rest/v1/UpcomingMaintenance>).
//!   When no notice was ever received the server answers 503 with the body
//!   `{ "error": "no notifications have been received yet, try again later" }`, which Google's
//!   own SAP agent treats as "nothing scheduled" (GoogleCloudPlatform/sapagent,
//!   `shared/gce/metadataserver/metadataserver.go`).
//! - Requests need `Metadata-Flavor: Google`; 403, 429 and 503 are documented answers
//!   (<https://cloud.google.com/compute/docs/troubleshooting/troubleshoot-metadata-server>).
//! - `?wait_for_change=true&last_etag=E&timeout_sec=N` holds the request until the value's ETag
//!   differs from `E`; a stale `E` returns at once, and `timeout_sec` expiry returns the current value.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use reqwest::header::{HeaderValue, ETAG};
use reqwest::{StatusCode, Url};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use serde::Deserialize;

use crate::backoff::Backoff;
use crate::model::maintenance::{
    MaintenanceEvent, RawMetadata, UpcomingMaintenance, UpcomingStatus,
};
use crate::observe::health::Warnings;
use crate::observe::metrics::Metrics;

/// Path of the maintenance-event key, relative to `computeMetadata/v1/`.
pub const MAINTENANCE_EVENT_PATH: &str = "instance/maintenance-event";
/// Path of the upcoming-maintenance key, relative to `computeMetadata/v1/`.
pub const UPCOMING_MAINTENANCE_PATH: &str = "instance/upcoming-maintenance";
/// Path of the preempted key, relative to `computeMetadata/v1/`.
pub(crate) const PREEMPTED_PATH: &str = "instance/preempted";

/// Host used when `GCE_METADATA_HOST` is unset: the name Google's client libraries use.
pub(crate) const DEFAULT_HOST: &str = "metadata.google.internal";

/// Body marker of the 503 that means "no upcoming-maintenance notice was ever received".
const NO_NOTIFICATIONS: &str = "no notifications have been received yet";

/// Parse `instance/maintenance-event`. Only the documented values are accepted: an unknown one
/// must not be mistaken for `NONE` (a false "all clear") nor for an event.
pub(crate) fn parse_maintenance_event(body: &str) -> Result<MaintenanceEvent, MetadataError> {
    MaintenanceEvent::parse(body).ok_or_else(|| {
        MetadataError::malformed(
            MAINTENANCE_EVENT_PATH,
            format!(
                "expected NONE, MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_HOST_MAINTENANCE, got {:?}",
                snippet(body.trim())
            ),
        )
    })
}

/// Parse `instance/preempted` (`TRUE`/`FALSE`; case is ignored).
pub(crate) fn parse_preempted(body: &str) -> Result<bool, MetadataError> {
    let v = body.trim();
    if v.eq_ignore_ascii_case("TRUE") {
        Ok(true)
    } else if v.eq_ignore_ascii_case("FALSE") {
        Ok(false)
    } else {
        Err(MetadataError::malformed(
            PREEMPTED_PATH,
            format!("expected TRUE or FALSE, got {:?}", snippet(v)),
        ))
    }
}

/// `instance/upcoming-maintenance` as the server writes it (snake_case), with the REST API's
/// camelCase spellings accepted too, since some tools relay that form.
#[derive(Debug, Deserialize)]
struct UpcomingWire {
    /// The "no notifications have been received yet" answer is an error object.
    error: Option<String>,
    #[serde(alias = "maintenanceStatus")]
    maintenance_status: Option<UpcomingStatus>,
    #[serde(default, alias = "canReschedule", deserialize_with = "string_bool")]
    can_reschedule: bool,
    #[serde(rename = "type", alias = "maintenance_type", alias = "maintenanceType")]
    maintenance_type: Option<String>,
    #[serde(alias = "windowStartTime")]
    window_start_time: Option<String>,
    #[serde(alias = "windowEndTime")]
    window_end_time: Option<String>,
    #[serde(alias = "latestWindowStartTime")]
    latest_window_start_time: Option<String>,
    #[serde(alias = "maintenanceReasons")]
    maintenance_reasons: Option<Vec<String>>,
    /// Fields this version does not know: tolerated, but an object of nothing else is no notice.
    #[serde(flatten)]
    other: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
}

/// `can_reschedule` arrives as the *string* `"true"`/`"false"` (any case); a JSON bool or null is
/// accepted too.
fn string_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum BoolOrString {
        Bool(bool),
        String(String),
    }
    match Option::<BoolOrString>::deserialize(d)? {
        None => Ok(false),
        Some(BoolOrString::Bool(b)) => Ok(b),
        Some(BoolOrString::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(BoolOrString::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(BoolOrString::String(s)) => Err(serde::de::Error::custom(format!(
            "can_reschedule should be \"true\" or \"false\", got {s:?}"
        ))),
    }
}

/// Parse `instance/upcoming-maintenance`. `Ok(None)` means nothing is scheduled: an empty body,
/// `{ }`, the literal `NONE`, or the "no notifications have been received yet" error object.
/// A status other than PENDING/ONGOING is rejected (malformed) rather than guessed at, so the
/// previous value is kept.
pub(crate) fn parse_upcoming(body: &str) -> Result<Option<UpcomingMaintenance>, MetadataError> {
    let text = body.trim();
    if text.is_empty() || text == "NONE" {
        return Ok(None);
    }
    let bad = |detail: String| MetadataError::malformed(UPCOMING_MAINTENANCE_PATH, detail);
    let wire: UpcomingWire =
        serde_json::from_str(text).map_err(|e| bad(format!("{e}: {:?}", snippet(text))))?;
    if let Some(err) = &wire.error {
        if err.contains(NO_NOTIFICATIONS) {
            return Ok(None);
        }
        return Err(bad(format!("server reported an error: {:?}", snippet(err))));
    }
    let Some(status) = wire.maintenance_status else {
        let nothing = wire.other.is_empty()
            && wire.maintenance_type.is_none()
            && wire.window_start_time.is_none()
            && wire.window_end_time.is_none();
        if nothing {
            return Ok(None);
        }
        return Err(bad(format!("no maintenance_status in {:?}", snippet(text))));
    };
    Ok(Some(UpcomingMaintenance {
        maintenance_type: wire.maintenance_type,
        status,
        can_reschedule: wire.can_reschedule,
        window_start: wire.window_start_time,
        window_end: wire.window_end_time,
        latest_window_start: wire.latest_window_start_time,
        reasons: wire.maintenance_reasons.unwrap_or_default(),
    }))
}

/// Why a metadata request failed. Each message says what an operator should do about it.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// Connect or DNS failure: not on GCE, or the server is blocked.
    #[error(
        "GCE metadata server at {host} is unreachable: not on GCE, or blocked by a firewall, \
         proxy or custom route; maintenance and preemption notices are not watched until it answers"
    )]
    Unreachable {
        host: String,
        #[source]
        source: reqwest::Error,
    },
    /// 503: normal for under a second during host maintenance.
    #[error(
        "GCE metadata server answered 503 for {key} (normal for under a second during host \
         maintenance; retrying quickly); if it persists, check the VM in the Cloud console"
    )]
    Unavailable {
        key: String,
        /// The start of the response body, kept to recognise the "no notifications" answer.
        body: String,
    },
    /// 429: some endpoints rate-limit.
    #[error(
        "GCE metadata server rate-limited requests for {key} (429); backing off. Check that \
         nothing else on this node polls the metadata server in a tight loop"
    )]
    RateLimited { key: String },
    /// 404: the key does not exist on this VM.
    #[error(
        "GCE metadata server has no {key} (404): this machine type or image may not offer it, \
         or GCE_METADATA_HOST points at something else; notices from this key are not seen"
    )]
    NotFound { key: String },
    /// 403: endpoint disabled, or a header (X-Forwarded-For) made the server refuse.
    #[error(
        "GCE metadata server refused {key} (403): the endpoint may be disabled in the project or \
         instance settings, or a proxy in the path adds X-Forwarded-For; check the network setup"
    )]
    Forbidden { key: String },
    /// No answer within the request deadline.
    #[error(
        "GCE metadata server did not answer {key} within {after:?}; retrying with backoff. If it \
         persists, check the node's network and DNS for metadata.google.internal"
    )]
    Timeout { key: String, after: Duration },
    /// The answer could not be understood; the previous value is kept.
    #[error(
        "GCE metadata server sent an unusable answer for {key}: {detail}; keeping the previous \
         value. Report it if it persists: the server's format may have changed"
    )]
    Malformed { key: String, detail: String },
    /// Any other HTTP status.
    #[error("GCE metadata server answered HTTP {status} for {key}; retrying with backoff")]
    Http { key: String, status: u16 },
    /// The connection broke after it was made (reset, truncated body).
    #[error("request for {key} to the GCE metadata server broke off; retrying with backoff")]
    Transport {
        key: String,
        #[source]
        source: reqwest::Error,
    },
    /// The configured host cannot form a URL.
    #[error(
        "GCE_METADATA_HOST={host:?} is not a valid host[:port] ({detail}); fix it, or unset it to \
         use metadata.google.internal"
    )]
    BadHost { host: String, detail: String },
}

impl MetadataError {
    fn malformed(key: &str, detail: String) -> Self {
        MetadataError::Malformed {
            key: key.to_string(),
            detail,
        }
    }

    /// Fixed metric label for this error: one of `unavailable`, `rate-limited`, `not-found`,
    /// `forbidden`, `timeout`, `malformed`, `transport` (connect/DNS failures, broken
    /// connections, other HTTP statuses, and a bad `GCE_METADATA_HOST`).
    pub fn kind(&self) -> &'static str {
        match self {
            MetadataError::Unavailable { .. } => "unavailable",
            MetadataError::RateLimited { .. } => "rate-limited",
            MetadataError::NotFound { .. } => "not-found",
            MetadataError::Forbidden { .. } => "forbidden",
            MetadataError::Timeout { .. } => "timeout",
            MetadataError::Malformed { .. } => "malformed",
            MetadataError::Unreachable { .. }
            | MetadataError::Http { .. }
            | MetadataError::Transport { .. }
            | MetadataError::BadHost { .. } => "transport",
        }
    }

    /// True for the 503 that `upcoming-maintenance` gives when no notice was ever received:
    /// "nothing scheduled", not a failure.
    pub fn is_no_notifications_yet(&self) -> bool {
        matches!(self, MetadataError::Unavailable { body, .. } if body.contains(NO_NOTIFICATIONS))
    }
}

/// One successful read: the value and the ETag to long-poll from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The body, as sent.
    pub value: String,
    /// The `ETag` header, when the server sent one: the `last_etag` of the next long-poll.
    pub etag: Option<String>,
}

/// HTTP client for the metadata server. Sends `Metadata-Flavor: Google`, never goes through a
/// proxy (a proxy would add `X-Forwarded-For`, which the server refuses, and the metadata server
/// is link-local anyway), and insists the answer carries `Metadata-Flavor: Google` too.
#[derive(Debug, Clone)]
pub struct MetadataClient {
    host: String,
    base: Url,
    http: reqwest::Client,
    request_timeout_extra: Duration,
}

impl MetadataClient {
    /// Client for `http://{host}/computeMetadata/v1/`. `host` is `name[:port]`, as in
    /// `GCE_METADATA_HOST` (a leading `http://` is tolerated). `request_timeout_extra` is the
    /// deadline of a plain read and the margin added to `timeout_sec` for a long-poll.
    pub fn new(host: &str, request_timeout_extra: Duration) -> Result<Self, MetadataError> {
        let bad = |detail: String| MetadataError::BadHost {
            host: host.to_string(),
            detail,
        };
        let h = host.trim();
        let h = h.strip_prefix("http://").unwrap_or(h).trim_end_matches('/');
        if h.is_empty() || h.contains(['/', '?', '#', '@', ' ']) {
            return Err(bad("expected host or host:port".into()));
        }
        let base = Url::parse(&format!("http://{h}/computeMetadata/v1/"))
            .map_err(|e| bad(e.to_string()))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(request_timeout_extra)
            // NB: the server never redirects the keys we read; following one could leave the
            // link-local server for somewhere that does not deserve the header.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| bad(format!("cannot build the HTTP client: {e}")))?;
        Ok(MetadataClient {
            host: h.to_string(),
            base,
            http,
            request_timeout_extra,
        })
    }

    /// Client for `metadata.host` (`GCE_METADATA_HOST`); empty = `metadata.google.internal`.
    pub(crate) fn for_host(
        host: &str,
        request_timeout_extra: Duration,
    ) -> Result<Self, MetadataError> {
        let host = Some(host.trim())
            .filter(|h| !h.is_empty())
            .unwrap_or(DEFAULT_HOST);
        Self::new(host, request_timeout_extra)
    }

    /// The base URL requests go to, e.g. `http://metadata.google.internal/computeMetadata/v1/`.
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// URL for `key` (relative to the base), with the long-poll parameters when `wait` is given.
    /// An empty `last_etag` is left out: the server then waits for the next change from now.
    fn url(&self, key: &str, wait: Option<(&str, u32)>) -> Result<Url, MetadataError> {
        let mut url = self.base.join(key).map_err(|e| {
            MetadataError::malformed(key, format!("cannot form a URL for the key: {e}"))
        })?;
        if let Some((last_etag, timeout_sec)) = wait {
            let mut q = url.query_pairs_mut();
            q.append_pair("wait_for_change", "true");
            if !last_etag.is_empty() {
                q.append_pair("last_etag", last_etag);
            }
            q.append_pair("timeout_sec", &timeout_sec.to_string());
        }
        Ok(url)
    }

    /// GET one key, e.g. `instance/maintenance-event`. With `wait = Some((last_etag,
    /// timeout_sec))` this is a long-poll; the HTTP deadline is then `timeout_sec` plus the
    /// client's slack, so the server's own timeout always answers first.
    pub async fn get(
        &self,
        key: &str,
        wait: Option<(&str, u32)>,
    ) -> Result<Fetched, MetadataError> {
        let url = self.url(key, wait)?;
        let deadline =
            self.request_timeout_extra + Duration::from_secs(u64::from(wait.map_or(0, |(_, t)| t)));
        let resp = self
            .http
            .get(url)
            .header("Metadata-Flavor", "Google")
            .timeout(deadline)
            .send()
            .await
            .map_err(|e| self.transport_error(key, deadline, e))?;

        let status = resp.status();
        let key_s = || key.to_string();
        match status {
            StatusCode::OK => {}
            StatusCode::SERVICE_UNAVAILABLE => {
                // The body distinguishes "no notifications yet" from a maintenance blip.
                let body = resp.text().await.unwrap_or_default();
                return Err(MetadataError::Unavailable {
                    key: key_s(),
                    body: snippet(&body),
                });
            }
            StatusCode::TOO_MANY_REQUESTS => {
                return Err(MetadataError::RateLimited { key: key_s() })
            }
            StatusCode::NOT_FOUND => return Err(MetadataError::NotFound { key: key_s() }),
            StatusCode::FORBIDDEN => return Err(MetadataError::Forbidden { key: key_s() }),
            other => {
                return Err(MetadataError::Http {
                    key: key_s(),
                    status: other.as_u16(),
                })
            }
        }
        if resp.headers().get("Metadata-Flavor") != Some(&HeaderValue::from_static("Google")) {
            return Err(MetadataError::malformed(
                key,
                "the answer lacks `Metadata-Flavor: Google`, so it did not come from the \
                 metadata server (a proxy or captive portal in the path?)"
                    .into(),
            ));
        }
        let etag = resp
            .headers()
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        let value = resp
            .text()
            .await
            .map_err(|e| self.transport_error(key, deadline, e))?;
        Ok(Fetched { value, etag })
    }

    fn transport_error(&self, key: &str, after: Duration, e: reqwest::Error) -> MetadataError {
        // NB: connect first: a connect timeout is "unreachable" (not on GCE), not a slow answer.
        if e.is_connect() || e.is_dns() {
            MetadataError::Unreachable {
                host: self.host.clone(),
                source: e,
            }
        } else if e.is_timeout() {
            MetadataError::Timeout {
                key: key.to_string(),
                after,
            }
        } else {
            MetadataError::Transport {
                key: key.to_string(),
                source: e,
            }
        }
    }
}

/// Tuning of [`watch_with`]. The defaults suit production; tests shorten them.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// `timeout_sec` of each long-poll: how long the server may hold a request.
    pub timeout_sec: u32,
    /// Bounds of the random pause after a 503 (the server gives sub-second 503s in maintenance).
    pub unavailable_retry: (Duration, Duration),
    /// First pause after 429, timeouts and transport errors; doubles (with jitter) per failure.
    pub backoff_initial: Duration,
    /// Cap of that backoff.
    pub backoff_max: Duration,
    /// NB: if a long-poll comes back faster than this with an unchanged value (the server does
    /// not hold this key, or answers "no notifications" at once), wait out the rest before the
    /// next request, so a server that ignores `wait_for_change` is polled, not hammered.
    pub min_interval: Duration,
    /// Start-up reads of maintenance-event that may fail to connect before the watcher decides
    /// it is not on GCE (a node's network can come up a moment after the agent).
    pub startup_attempts: u32,
    /// Where a standing problem (no `maintenance-event` key) is reported for `/readyz`.
    pub warnings: Option<Warnings>,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            timeout_sec: 60,
            unavailable_retry: (Duration::from_millis(200), Duration::from_millis(500)),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            min_interval: Duration::from_secs(5),
            startup_attempts: 3,
            warnings: None,
        }
    }
}

/// Watch the three keys with [`WatchConfig::default`]; see [`watch_with`].
pub async fn watch(
    client: MetadataClient,
    tx: watch::Sender<RawMetadata>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    watch_with(client, tx, metrics, shutdown, WatchConfig::default()).await
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
    let key = Key::MaintenanceEvent;
    let attempts = cfg.startup_attempts.max(1);
    let mut first = None;
    let mut attempt = 0;
    // NB: a server that cannot be reached at start-up may only be late (the node's network comes
    // up after the agent): after the quick attempts, keep probing with backoff. The watcher is
    // off only when configured off.
    let mut probe = Backoff::jittered(cfg.backoff_initial, cfg.backoff_max);
    while first.is_none() {
        attempt += 1;
        let res = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = client.get(key.path(), None) => r,
        };
        let pause_for = match res {
            Err(e @ MetadataError::Unreachable { .. }) => {
                metrics.metadata_error(key.label(), e.kind());
                if attempt < attempts {
                    cfg.unavailable_retry.0
                } else {
                    if attempt == attempts {
                        tracing::info!(
                            "GCE metadata server unreachable ({}): not on GCE, or not up yet; probing again with backoff (set metadata.enabled = off off GCE)",
                            chain(&e)
                        );
                    }
                    probe.next_delay()
                }
            }
            other => {
                if attempt > attempts {
                    tracing::info!("GCE metadata server reachable now: watching");
                }
                first = Some(other);
                continue;
            }
        };
        if !pause(&shutdown, pause_for).await {
            return;
        }
    }

    let ctx = Ctx {
        client: &client,
        tx: &tx,
        metrics: &metrics,
        shutdown: &shutdown,
        cfg: &cfg,
    };
    tokio::join!(
        key_loop(ctx, Key::MaintenanceEvent, first),
        key_loop(ctx, Key::UpcomingMaintenance, None),
        key_loop(ctx, Key::Preempted, None),
    );
    tracing::debug!("metadata watcher stopped");
}

/// The watched keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

    /// Metric label.
    fn label(self) -> &'static str {
        match self {
            Key::MaintenanceEvent => "maintenance-event",
            Key::UpcomingMaintenance => "upcoming-maintenance",
            Key::Preempted => "preempted",
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

enum Parsed {
    Event(MaintenanceEvent),
    Upcoming(Option<UpcomingMaintenance>),
    Preempted(bool),
}

impl Parsed {
    /// Store into `raw`; true when the value changed.
    fn apply(self, raw: &mut RawMetadata) -> bool {
        fn set<T: PartialEq>(slot: &mut T, v: T) -> bool {
            if *slot == v {
                false
            } else {
                *slot = v;
                true
            }
        }
        match self {
            Parsed::Event(v) => set(&mut raw.maintenance_event, Some(v)),
            Parsed::Upcoming(v) => set(&mut raw.upcoming, v),
            Parsed::Preempted(v) => set(&mut raw.preempted, Some(v)),
        }
    }
}

#[derive(Clone, Copy)]
struct Ctx<'a> {
    client: &'a MetadataClient,
    tx: &'a watch::Sender<RawMetadata>,
    metrics: &'a Metrics,
    shutdown: &'a CancellationToken,
    cfg: &'a WatchConfig,
}

/// One key: a plain read until one succeeds, then long-polls from the last ETag.
async fn key_loop(ctx: Ctx<'_>, key: Key, mut pending: Option<Result<Fetched, MetadataError>>) {
    let mut read_once = false;
    let mut etag: Option<String> = None;
    let mut backoff = Backoff::jittered(ctx.cfg.backoff_initial, ctx.cfg.backoff_max);
    let mut unavailable_streak = 0u32;
    // A "nothing scheduled" answer seen once while a notice is published, not yet confirmed.
    let mut clear_seen = false;
    loop {
        let started = Instant::now();
        let waited = read_once;
        let res = match pending.take() {
            Some(r) => r,
            None => {
                let wait = read_once.then(|| (etag.as_deref().unwrap_or(""), ctx.cfg.timeout_sec));
                tokio::select! {
                    _ = ctx.shutdown.cancelled() => return,
                    r = ctx.client.get(key.path(), wait) => r,
                }
            }
        };
        // `upcoming-maintenance` says "nothing scheduled" with a 404 or a 503 "no notifications".
        let res = match res {
            Err(e)
                if key == Key::UpcomingMaintenance
                    && (e.is_no_notifications_yet()
                        || matches!(e, MetadataError::NotFound { .. })) =>
            {
                Ok(Fetched {
                    value: String::new(),
                    etag: None,
                })
            }
            other => other,
        };

        blind(ctx, key, &res);
        let delay = match res {
            Ok(fetched) => match key.parse(&fetched.value) {
                Ok(parsed) if unconfirmed_clear(ctx, &parsed, &mut clear_seen) => {
                    // NB: the old ETag is kept: the next long-poll returns at once if the key
                    // still says nothing, and waits if the notice is back (a blip).
                    read_once = true;
                    ctx.cfg.unavailable_retry.0
                }
                Ok(parsed) => {
                    backoff.reset();
                    unavailable_streak = 0;
                    read_once = true;
                    etag = fetched.etag;
                    let changed = ctx.tx.send_if_modified(|raw| parsed.apply(raw));
                    if changed {
                        // The node controller logs the phase this makes.
                        tracing::info!(
                            key = key.label(),
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
                    ctx.metrics.metadata_error(key.label(), e.kind());
                    tracing::warn!(key = key.label(), "{e}");
                    // NB: adopt the new ETag, or the next long-poll would return the same bad
                    // value at once, forever. The previous good value stays published.
                    if fetched.etag.is_some() {
                        etag = fetched.etag;
                    }
                    backoff.next_delay()
                }
            },
            Err(e) => {
                ctx.metrics.metadata_error(key.label(), e.kind());
                match &e {
                    // NB: maintenance gives sub-second 503s, so retry fast at first; a 503 that
                    // lasts is something else, and gets the backoff and a warning.
                    MetadataError::Unavailable { .. } if unavailable_streak < UNAVAILABLE_FAST => {
                        unavailable_streak += 1;
                        tracing::debug!(key = key.label(), "{e}");
                        jitter(ctx.cfg.unavailable_retry.0, ctx.cfg.unavailable_retry.1)
                    }
                    _ => {
                        tracing::warn!(key = key.label(), "{}", chain(&e));
                        backoff.next_delay()
                    }
                }
            }
        };
        if !delay.is_zero() && !pause(ctx.shutdown, delay).await {
            return;
        }
    }
}

/// NB: one empty answer (a 200 with `{}`, a 404) between two PENDING answers must not clear a
/// notice: the Node would flip pending → none → pending with two Events. A "nothing scheduled"
/// while a notice is published is acted on only when the next read says it again. True when
/// this answer is the first such read (hold it); any other answer resets the count.
fn unconfirmed_clear(ctx: Ctx<'_>, parsed: &Parsed, clear_seen: &mut bool) -> bool {
    let clears = matches!(parsed, Parsed::Upcoming(None)) && ctx.tx.borrow().upcoming.is_some();
    if !clears {
        *clear_seen = false;
        return false;
    }
    if *clear_seen {
        *clear_seen = false;
        return false;
    }
    *clear_seen = true;
    tracing::debug!("upcoming-maintenance says nothing is scheduled: confirming before clearing");
    true
}

/// What an operator must know when the server answers but has no `maintenance-event`: the
/// likely cause and the fix.
pub(crate) fn blind_hint(base: &Url) -> String {
    format!(
        "the metadata server at {base} has no instance/maintenance-event (404): maintenance and \
         termination notices cannot be seen (this is not \"no maintenance\"). On GKE this is the GKE \
         metadata server of a Workload Identity node pool, which serves pods only a subset of the \
         Compute Engine paths: run the agent with hostNetwork: true (deploy/overlays/gke) so it \
         reaches the Compute Engine metadata server"
    )
}

/// A 404 on `maintenance-event` blinds the watcher: say so once (and for `/readyz`) while it
/// lasts, and say when it ends.
fn blind(ctx: Ctx<'_>, key: Key, res: &Result<Fetched, MetadataError>) {
    if key != Key::MaintenanceEvent {
        return;
    }
    let warning = match res {
        Err(MetadataError::NotFound { .. }) => Some(blind_hint(ctx.client.base_url())),
        Err(_) => return,
        Ok(_) => None,
    };
    let Some(w) = &ctx.cfg.warnings else {
        if let Some(text) = warning {
            tracing::error!("{text}");
        }
        return;
    };
    if w.set("metadata", warning.clone()) {
        match warning {
            Some(text) => tracing::error!("{text}"),
            None => tracing::info!("instance/maintenance-event answers now"),
        }
    }
}

/// Consecutive 503s retried after [`WatchConfig::unavailable_retry`] before the backoff applies
/// (about 2-5 s of them with the defaults: well past a maintenance blip).
const UNAVAILABLE_FAST: u32 = 10;

/// Sleep unless shutdown fires first; false when it did.
async fn pause(shutdown: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// A random duration in `[lo, hi]` (the quick retries of a maintenance-time 503).
fn jitter(lo: Duration, hi: Duration) -> Duration {
    let (lo, hi) = (lo.as_millis() as u64, hi.as_millis() as u64);
    if hi <= lo {
        return Duration::from_millis(lo);
    }
    Duration::from_millis(rand::rng().random_range(lo..=hi))
}

/// The first 200 characters of a server-supplied text, for messages and logs.
fn snippet(s: &str) -> String {
    s.chars().take(200).collect()
}

/// An error and its causes, `a: b: c`, for one log line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use UpcomingStatus::{Ongoing as ONGOING, Pending as PENDING};

    #[test]
    fn maintenance_event_values() {
        use MaintenanceEvent as E;
        for (body, want) in [
            ("NONE", E::None),
            ("MIGRATE_ON_HOST_MAINTENANCE", E::MigrateOnHostMaintenance),
            (
                "TERMINATE_ON_HOST_MAINTENANCE",
                E::TerminateOnHostMaintenance,
            ),
            ("  NONE\n", E::None),
        ] {
            assert_eq!(parse_maintenance_event(body).ok(), Some(want));
        }
        for bad in ["BANANA", "", "none", "TERMINATE"] {
            let e = parse_maintenance_event(bad).unwrap_err();
            assert_eq!(e.kind(), "malformed", "{bad:?}");
        }
    }

    #[test]
    fn preempted_values() {
        assert_eq!(parse_preempted("TRUE").ok(), Some(true));
        assert_eq!(parse_preempted("FALSE\n").ok(), Some(false));
        assert_eq!(parse_preempted("true").ok(), Some(true));
        for bad in ["MAYBE", "", "1", "yes"] {
            assert_eq!(
                parse_preempted(bad).unwrap_err().kind(),
                "malformed",
                "{bad:?}"
            );
        }
    }

    /// The example answer in Google's host-events guide.
    const GCE_EXAMPLE: &str = r#"{
        "can_reschedule": "true",
        "latest_window_start_time": "2024-12-01T19:00:01Z",
        "maintenance_reasons": ["PLANNED_UPDATE", "PLANNED_NETWORK_UPDATE"],
        "maintenance_status": "PENDING",
        "type": "SCHEDULED",
        "window_end_time": "2024-12-01T21:00:01Z",
        "window_start_time": "2024-12-01T19:00:01Z"
    }"#;

    #[test]
    fn upcoming_gce_example() {
        let u = parse_upcoming(GCE_EXAMPLE).unwrap().unwrap();
        assert_eq!(
            u,
            UpcomingMaintenance {
                maintenance_type: Some("SCHEDULED".into()),
                status: PENDING,
                can_reschedule: true,
                window_start: Some("2024-12-01T19:00:01Z".into()),
                window_end: Some("2024-12-01T21:00:01Z".into()),
                latest_window_start: Some("2024-12-01T19:00:01Z".into()),
                reasons: vec!["PLANNED_UPDATE".into(), "PLANNED_NETWORK_UPDATE".into()],
            }
        );
    }

    #[test]
    fn upcoming_table() {
        // (body, Ok(Some((status, can_reschedule))) | Ok(None) | Err)
        type Want = Result<Option<(UpcomingStatus, bool)>, ()>;
        let table: &[(&str, Want)] = &[
            ("", Ok(None)),
            ("  \n", Ok(None)),
            ("{ }", Ok(None)),
            ("{}", Ok(None)),
            ("NONE", Ok(None)),
            (
                r#"{ "error": "no notifications have been received yet, try again later" }"#,
                Ok(None),
            ),
            (
                r#"{"maintenance_status":"ONGOING","can_reschedule":"false"}"#,
                Ok(Some((ONGOING, false))),
            ),
            (
                r#"{"maintenance_status":"PENDING","can_reschedule":true}"#,
                Ok(Some((PENDING, true))),
            ),
            (
                r#"{"maintenance_status":"PENDING","can_reschedule":"TRUE"}"#,
                Ok(Some((PENDING, true))),
            ),
            (
                r#"{"maintenance_status":"PENDING"}"#,
                Ok(Some((PENDING, false))),
            ),
            (
                r#"{"maintenanceStatus":"ONGOING","canReschedule":true}"#,
                Ok(Some((ONGOING, true))),
            ),
            ("{not json", Err(())),
            ("BANANA", Err(())),
            ("[]", Err(())),
            ("\"PENDING\"", Err(())),
            (r#"{"foo": 1}"#, Err(())),
            (r#"{"maintenance_status":"BANANA"}"#, Err(())),
            (r#"{"maintenance_status":7}"#, Err(())),
            (
                r#"{"maintenance_status":"PENDING","can_reschedule":"maybe"}"#,
                Err(()),
            ),
            (
                r#"{"maintenance_status":"PENDING","maintenance_reasons":"x"}"#,
                Err(()),
            ),
            (r#"{"error": "internal"}"#, Err(())),
        ];
        for (body, want) in table {
            let got = parse_upcoming(body);
            match (want, got) {
                (Ok(None), Ok(None)) => {}
                (Ok(Some((status, resched))), Ok(Some(u))) => {
                    assert_eq!(u.status, *status, "{body}");
                    assert_eq!(u.can_reschedule, *resched, "{body}");
                }
                (Err(()), Err(e)) => assert_eq!(e.kind(), "malformed", "{body}"),
                (want, got) => panic!("{body}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn client_urls() {
        let c = MetadataClient::new("metadata.google.internal", Duration::from_secs(1)).unwrap();
        assert_eq!(
            c.base_url().as_str(),
            "http://metadata.google.internal/computeMetadata/v1/"
        );
        let c = MetadataClient::new("127.0.0.1:8080", Duration::from_secs(1)).unwrap();
        assert_eq!(
            c.url(MAINTENANCE_EVENT_PATH, None).unwrap().as_str(),
            "http://127.0.0.1:8080/computeMetadata/v1/instance/maintenance-event"
        );
        assert_eq!(
            c.url(PREEMPTED_PATH, Some(("a b&c", 30))).unwrap().as_str(),
            "http://127.0.0.1:8080/computeMetadata/v1/instance/preempted\
             ?wait_for_change=true&last_etag=a+b%26c&timeout_sec=30"
        );
        assert_eq!(
            c.url(PREEMPTED_PATH, Some(("", 5))).unwrap().query(),
            Some("wait_for_change=true&timeout_sec=5")
        );
        let c = MetadataClient::new("http://10.0.0.1:80/", Duration::from_secs(1)).unwrap();
        assert_eq!(c.base_url().as_str(), "http://10.0.0.1/computeMetadata/v1/");
    }

    #[test]
    fn bad_hosts_name_the_variable() {
        for bad in ["", "a b", "host/path", "user@host", "host:notaport"] {
            let e = MetadataClient::new(bad, Duration::from_secs(1)).unwrap_err();
            assert!(e.to_string().contains("GCE_METADATA_HOST"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn env_value_defaults_to_metadata_google_internal() {
        let slack = Duration::from_secs(5);
        for v in ["", "  "] {
            let c = MetadataClient::for_host(v, slack).unwrap();
            assert_eq!(c.base_url().host_str(), Some(DEFAULT_HOST));
        }
        let c = MetadataClient::for_host("127.0.0.1:9", slack).unwrap();
        assert_eq!(c.base_url().port(), Some(9));
    }

    #[test]
    fn error_kinds_are_fixed_labels() {
        let k = || "instance/preempted".to_string();
        let cases = [
            (
                MetadataError::Unavailable {
                    key: k(),
                    body: String::new(),
                },
                "unavailable",
            ),
            (MetadataError::RateLimited { key: k() }, "rate-limited"),
            (MetadataError::NotFound { key: k() }, "not-found"),
            (MetadataError::Forbidden { key: k() }, "forbidden"),
            (
                MetadataError::Timeout {
                    key: k(),
                    after: Duration::from_secs(1),
                },
                "timeout",
            ),
            (MetadataError::malformed("k", "d".into()), "malformed"),
            (
                MetadataError::Http {
                    key: k(),
                    status: 500,
                },
                "transport",
            ),
        ];
        for (e, kind) in cases {
            assert_eq!(e.kind(), kind, "{e}");
        }
        let none = MetadataError::Unavailable {
            key: k(),
            body: r#"{ "error": "no notifications have been received yet, try again later" }"#
                .into(),
        };
        assert!(none.is_no_notifications_yet());
        assert!(!MetadataError::Unavailable {
            key: k(),
            body: "busy".into()
        }
        .is_no_notifications_yet());
    }

    #[test]
    fn snippets_are_bounded_on_char_boundaries() {
        let long = "é".repeat(500);
        assert_eq!(snippet(&long).chars().count(), 200);
    }
}
