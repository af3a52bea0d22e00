//! HTTP: the read-only server Prometheus and the kubelet's probes reach (`server`), serving a
//! router on a TCP or unix listener (`listen`) whose connections junk cannot hold
//! (`admission`) and whose unix peers are read in `/proc` (`procfs`), the loop's liveness behind
//! `/healthz` (`health`), and one way to word a failed outbound call.

pub(crate) mod admission;
pub mod health;
pub(crate) mod listen;
pub(crate) mod procfs;
pub(crate) mod server;

/// A failed HTTP call in words an operator can act on (refused, TLS, timeout: the whole chain of
/// causes), without its URL: `reqwest::Error`'s `Display` names the URL, and a webhook's or a
/// checkpoint endpoint's carries a token.
pub(crate) fn http_error(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    for cause in std::iter::successors(std::error::Error::source(&e), |c| c.source()) {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
    }
    text
}
