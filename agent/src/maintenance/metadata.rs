//! GCE metadata server watcher: host maintenance and preemption notices.
//!
//! Map: [`MetadataClient`] speaks HTTP to the metadata server (one GET, long-poll optional);
//! `parse_*` (metadata/parse.rs) turn the three watched keys into typed values; [`watch_with`]
//! (metadata/watcher.rs) runs one long-poll loop per key and publishes
//! `crate::vocab::maintenance::RawMetadata` on a `tokio::sync::watch` channel; the pure
//! `crate::maintenance::policy::derive` turns those raw values into a maintenance state.
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

use std::time::Duration;

use reqwest::header::{HeaderValue, ETAG};
use reqwest::{StatusCode, Url};

pub(crate) mod parse;
mod watcher;

pub(crate) use watcher::blind_hint;
pub use watcher::{watch_with, WatchConfig};

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

/// What a request to the metadata server gives: its answer, or the [`MetadataError`] that stopped
/// it.
type Result<T, E = MetadataError> = std::result::Result<T, E>;

/// Why a metadata request failed. Each message says what an operator should do about it.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum MetadataError {
    /// Connect or DNS failure: not on GCE, or the server is blocked.
    #[strum(serialize = "transport")]
    #[error("GCE metadata server at {host} is unreachable: not on GCE, or blocked by a firewall, proxy or custom route; maintenance and preemption notices are not watched until it answers")]
    Unreachable { host: String, source: reqwest::Error },
    /// 503: normal for under a second during host maintenance.
    #[error("GCE metadata server answered 503 for {key} (normal for under a second during host maintenance; retrying quickly); if it persists, check the VM in the Cloud console")]
    Unavailable {
        key: String,
        /// The start of the response body, kept to recognise the "no notifications" answer.
        body: String,
    },
    /// 429: some endpoints rate-limit.
    #[error("GCE metadata server rate-limited requests for {key} (429); backing off. Check that nothing else on this node polls the metadata server in a tight loop")]
    RateLimited { key: String },
    /// 404: the key does not exist on this VM.
    #[error("GCE metadata server has no {key} (404): this machine type or image may not offer it, or GCE_METADATA_HOST points at something else; notices from this key are not seen")]
    NotFound { key: String },
    /// 403: endpoint disabled, or a header (X-Forwarded-For) made the server refuse.
    #[error("GCE metadata server refused {key} (403): the endpoint may be disabled in the project or instance settings, or a proxy in the path adds X-Forwarded-For; check the network setup")]
    Forbidden { key: String },
    /// No answer within the request deadline.
    #[error("GCE metadata server did not answer {key} within {after:?}; retrying with backoff. If it persists, check the node's network and DNS for metadata.google.internal")]
    Timeout { key: String, after: Duration },
    /// The answer could not be understood; the previous value is kept.
    #[error("GCE metadata server sent an unusable answer for {key}: {detail}; keeping the previous value. Report it if it persists: the server's format may have changed")]
    Malformed { key: String, detail: String },
    /// Any other HTTP status.
    #[strum(serialize = "transport")]
    #[error("GCE metadata server answered HTTP {status} for {key}; retrying with backoff")]
    Http { key: String, status: u16 },
    /// The connection broke after it was made (reset, truncated body).
    #[strum(serialize = "transport")]
    #[error("request for {key} to the GCE metadata server broke off; retrying with backoff")]
    Transport { key: String, source: reqwest::Error },
    /// The configured host cannot form a URL.
    #[strum(serialize = "transport")]
    #[error("GCE_METADATA_HOST={host:?} is not a valid host[:port] ({detail}); fix it, or unset it to use metadata.google.internal")]
    BadHost { host: String, detail: String },
}

impl MetadataError {
    fn malformed(key: &str, detail: String) -> Self {
        MetadataError::Malformed { key: key.to_string(), detail }
    }

    /// Fixed metric label for this error: one of `unavailable`, `rate-limited`, `not-found`,
    /// `forbidden`, `timeout`, `malformed`, `transport` (connect/DNS failures, broken
    /// connections, other HTTP statuses, and a bad `GCE_METADATA_HOST`).
    pub fn kind(&self) -> &'static str {
        self.into()
    }

    /// True for the 503 that `upcoming-maintenance` gives when no notice was ever received:
    /// "nothing scheduled", not a failure.
    pub fn is_no_notifications_yet(&self) -> bool {
        matches!(self, MetadataError::Unavailable { body, .. } if body.contains(NO_NOTIFICATIONS))
    }
}

/// One successful read: the value and the ETag to long-poll from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// deadline of a plain read and the margin added to `timeout_sec` for a long-poll; a connect
    /// gets half of it.
    pub fn new(host: &str, request_timeout_extra: Duration) -> Result<Self> {
        let bad = |detail: String| MetadataError::BadHost { host: host.to_string(), detail };
        let h = host.trim();
        let h = h.strip_prefix("http://").unwrap_or(h).trim_end_matches('/');
        if h.is_empty() || h.contains(['/', '?', '#', '@', ' ']) {
            return Err(bad("expected host or host:port".into()));
        }
        let base = Url::parse(&format!("http://{h}/computeMetadata/v1/"))
            .map_err(|e| bad(e.to_string()))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            // NB: shorter than any request's deadline: a connect that hangs (a firewall that
            // drops) ends as `Unreachable`; at the same length, the request's deadline fired
            // first and a server never reached was reported as one that did not answer.
            .connect_timeout(request_timeout_extra / 2)
            // NB: the server never redirects the keys we read; following one could leave the
            // link-local server for somewhere that does not deserve the header.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| bad(format!("cannot build the HTTP client: {e}")))?;
        Ok(MetadataClient { host: h.to_string(), base, http, request_timeout_extra })
    }

    /// Client for `metadata.host` (`GCE_METADATA_HOST`); empty = `metadata.google.internal`.
    pub(crate) fn for_host(host: &str, request_timeout_extra: Duration) -> Result<Self> {
        let host = Some(host.trim()).filter(|h| !h.is_empty()).unwrap_or(DEFAULT_HOST);
        Self::new(host, request_timeout_extra)
    }

    /// The base URL requests go to, e.g. `http://metadata.google.internal/computeMetadata/v1/`.
    pub(crate) fn base_url(&self) -> &Url {
        &self.base
    }

    /// URL for `key` (relative to the base), with the long-poll parameters when `wait` is given.
    /// An empty `last_etag` is left out: the server then waits for the next change from now.
    fn url(&self, key: &str, wait: Option<(&str, u32)>) -> Result<Url> {
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
    pub async fn get(&self, key: &str, wait: Option<(&str, u32)>) -> Result<Fetched> {
        let url = self.url(key, wait)?;
        let deadline =
            self.request_timeout_extra + Duration::from_secs(u64::from(wait.map_or(0, |(_, t)| t)));
        let request = self.http.get(url).header("Metadata-Flavor", "Google").timeout(deadline);
        let resp = request.send().await.map_err(|e| self.transport_error(key, deadline, e))?;
        let resp = refused(key, resp).await?;
        if resp.headers().get("Metadata-Flavor") != Some(&HeaderValue::from_static("Google")) {
            let why = "the answer lacks `Metadata-Flavor: Google`, so it did not come from the metadata server (a proxy or captive portal in the path?)";
            return Err(MetadataError::malformed(key, why.into()));
        }
        let etag = resp.headers().get(ETAG).and_then(|v| v.to_str().ok()).map(str::trim);
        let etag = etag.filter(|s| !s.is_empty()).map(str::to_string);
        let value = resp.text().await.map_err(|e| self.transport_error(key, deadline, e))?;
        Ok(Fetched { value, etag })
    }

    fn transport_error(&self, key: &str, after: Duration, e: reqwest::Error) -> MetadataError {
        // NB: connect first: a connect timeout is "unreachable" (not on GCE), not a slow answer.
        if e.is_connect() || e.is_dns() {
            MetadataError::Unreachable { host: self.host.clone(), source: e }
        } else if e.is_timeout() {
            MetadataError::Timeout { key: key.to_string(), after }
        } else {
            MetadataError::Transport { key: key.to_string(), source: e }
        }
    }
}

/// The answer when its status is 200; otherwise the error its status means.
async fn refused(key: &str, resp: reqwest::Response) -> Result<reqwest::Response> {
    let key_s = || key.to_string();
    match resp.status() {
        StatusCode::OK => Ok(resp),
        StatusCode::SERVICE_UNAVAILABLE => {
            // The body distinguishes "no notifications yet" from a maintenance blip.
            let body = resp.text().await.unwrap_or_default();
            Err(MetadataError::Unavailable { key: key_s(), body: snippet(&body) })
        }
        StatusCode::TOO_MANY_REQUESTS => Err(MetadataError::RateLimited { key: key_s() }),
        StatusCode::NOT_FOUND => Err(MetadataError::NotFound { key: key_s() }),
        StatusCode::FORBIDDEN => Err(MetadataError::Forbidden { key: key_s() }),
        other => Err(MetadataError::Http { key: key_s(), status: other.as_u16() }),
    }
}

/// The first 200 characters of a server-supplied text, for messages and logs.
fn snippet(s: &str) -> String {
    s.chars().take(200).collect()
}

/// An error and its causes, `a: b: c`, for one log line.
fn chain(e: &dyn std::error::Error) -> String {
    let causes = std::iter::successors(Some(e), |&e| e.source());
    causes.map(|e| e.to_string()).collect::<Vec<_>>().join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_urls() {
        let c = MetadataClient::new("metadata.google.internal", Duration::from_secs(1)).unwrap();
        assert_eq!(c.base_url().as_str(), "http://metadata.google.internal/computeMetadata/v1/");
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
            (MetadataError::Unavailable { key: k(), body: String::new() }, "unavailable"),
            (MetadataError::RateLimited { key: k() }, "rate-limited"),
            (MetadataError::NotFound { key: k() }, "not-found"),
            (MetadataError::Forbidden { key: k() }, "forbidden"),
            (MetadataError::Timeout { key: k(), after: Duration::from_secs(1) }, "timeout"),
            (MetadataError::malformed("k", "d".into()), "malformed"),
            (MetadataError::Http { key: k(), status: 500 }, "transport"),
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
        assert!(
            !MetadataError::Unavailable { key: k(), body: "busy".into() }.is_no_notifications_yet()
        );
    }

    #[test]
    fn snippets_are_bounded_on_char_boundaries() {
        let long = "é".repeat(500);
        assert_eq!(snippet(&long).chars().count(), 200);
    }
}
