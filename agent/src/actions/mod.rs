//! Write adapters: alerts and pages, checkpoint requests, the Kubernetes Node. (Restarts go
//! through `crate::runtime`.)

pub mod alert;
pub mod alertmanager;
pub mod checkpoint;
pub mod node;
#[cfg(feature = "demo")]
pub mod recording;

/// A failed HTTP call in words an operator can act on (refused, TLS, timeout: the whole chain of
/// causes), without its URL: `reqwest::Error`'s `Display` names the URL, and a webhook's or a
/// checkpoint endpoint's carries a token.
pub(crate) fn http_error(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}
