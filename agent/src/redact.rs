//! Secrets kept out of every output: the redacted forms of the config values that carry one
//! (`redis.url`, `alerts.webhook_url`, an HTTP `checkpoint.method`), and [`Secret`], the type
//! those config fields have, whose `Display`, `Debug` and serialization show only the redacted
//! form. The value itself is read with [`Secret::expose`], so every use of it is one grep away.
//!
//! The functions are lenient on purpose: a URL that does not parse is redacted too (it is
//! exactly the one a config error prints), and when in doubt more is hidden, never less.
//!
//! A leaf: it imports nothing of the crate, and every layer may use it (tests/layout.rs).

use std::fmt;
use std::marker::PhantomData;

/// What a hidden part is replaced with.
pub(crate) const MASK: &str = "***";

/// A URL with its password, query values and fragment hidden; scheme, user, host, port, path
/// and a `#insecure` fragment kept: `redis://user:***@host:6379/0`, `unix:///run/redis.sock?db=0&pass=***`,
/// `http://w:8080/ckpt?token=***`. A user name without a password is hidden too (it may be a
/// token: `https://TOKEN@host`).
pub(crate) fn url(text: &str) -> String {
    let (scheme, rest) = split_scheme(text);
    let (userinfo, after) = split_userinfo(rest);
    let (after, fragment) = after.split_once('#').map_or((after, None), |(a, f)| (a, Some(f)));
    let (before_query, query) = after.split_once('?').map_or((after, None), |(b, q)| (b, Some(q)));
    let userinfo = userinfo.map(|u| format!("{}@", mask_userinfo(u))).unwrap_or_default();
    let query = query.map(|q| format!("?{}", mask_query(q))).unwrap_or_default();
    // `#insecure` (a rediss:// URL's) is kept; any other fragment may be a credential.
    let fragment = fragment.map(|f| format!("#{}", if f == "insecure" { f } else { MASK }));
    format!("{scheme}{userinfo}{before_query}{query}{}", fragment.unwrap_or_default())
}

/// The URLs of a comma-separated list (`redis.url` in cluster or sentinel mode). A piece
/// without `://` belongs to the one before it (a raw comma in a password), a blank one to
/// nobody (a trailing comma): the agent connects to the URLs this splits, and [`urls`] hides
/// them the same way.
pub(crate) fn split_urls(text: &str) -> Vec<String> {
    let mut pieces: Vec<String> = Vec::new();
    for piece in text.split(',') {
        match pieces.last_mut() {
            Some(last) if !piece.contains("://") && !piece.trim().is_empty() => {
                last.push(',');
                last.push_str(piece);
            }
            _ => pieces.push(piece.to_string()),
        }
    }
    pieces
}

/// Each URL of a comma-separated list ([`split_urls`]), as [`url`].
pub(crate) fn urls(text: &str) -> String {
    let shown = split_urls(text).into_iter().map(|p| {
        let lead = &p[..p.len() - p.trim_start().len()];
        format!("{lead}{}", url(p.trim_start()))
    });
    shown.collect::<Vec<_>>().join(",")
}

/// `scheme://` and the rest; no scheme: `""` and all of it.
fn split_scheme(text: &str) -> (&str, &str) {
    text.find("://").map_or(("", text), |i| text.split_at(i + 3))
}

/// The userinfo (before the last `@`) and what follows it. The last `@`, wherever it is: a
/// password with a raw `/`, `?` or `@` is hidden whole; an `@` in a path or query hides more
/// than needed, never less.
fn split_userinfo(rest: &str) -> (Option<&str>, &str) {
    rest.rfind('@').map_or((None, rest), |at| (Some(&rest[..at]), &rest[at + 1..]))
}

/// `user:password` → `user:***`; anything else (a bare user or token, or a userinfo that is not
/// one: it held `/`, `?` or `#`) → `***`.
fn mask_userinfo(userinfo: &str) -> String {
    match userinfo.split_once(':') {
        Some((user, _)) if !user.contains(['/', '?', '#']) => format!("{user}:{MASK}"),
        _ => MASK.to_string(),
    }
}

/// `a=1&b=2&flag` → `a=***&b=***&***`: the names kept, every value hidden.
fn mask_query(query: &str) -> String {
    let masked = query.split('&').map(|pair| match pair.split_once('=') {
        Some((name, _)) => format!("{name}={MASK}"),
        None if pair.is_empty() => String::new(),
        None => MASK.to_string(),
    });
    masked.collect::<Vec<_>>().join("&")
}

/// How a [`Secret`] is shown.
pub trait Redaction {
    fn redact(text: &str) -> String;
}

/// Shown as [`urls`]: a URL, or a comma-separated list of them (`redis.url`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Urls;

impl Redaction for Urls {
    fn redact(text: &str) -> String {
        urls(text)
    }
}

/// A webhook URL (`alerts.webhook_url`): scheme, host and port only, everything after them
/// hidden (`https://hooks.slack.com/***`). Slack-style URLs carry their token in the path,
/// others in the query or the userinfo.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Webhook;

impl Redaction for Webhook {
    fn redact(text: &str) -> String {
        let (scheme, rest) = split_scheme(text);
        let (userinfo, after) = split_userinfo(rest);
        let (host, path) = after.split_at(after.find(['/', '?', '#']).unwrap_or(after.len()));
        let user = userinfo.map(|_| format!("{MASK}@")).unwrap_or_default();
        let path = if path.is_empty() { String::new() } else { format!("/{MASK}") };
        format!("{scheme}{user}{host}{path}")
    }
}

/// Hidden whole, a password or token with nothing worth showing: `***`, or nothing when there
/// is nothing to hide.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hidden;

impl Redaction for Hidden {
    fn redact(text: &str) -> String {
        let shown = if text.is_empty() { "" } else { MASK };
        shown.to_string()
    }
}

/// A config value that is, or carries, a secret. It parses, compares and clones as the text it
/// wraps, but `Display`, `Debug` and `Serialize` give only its redacted form (`R`), so printing
/// or serializing a config (`vigil config check`) cannot leak it. Read the value with
/// [`Secret::expose`], only to hand it to the client that needs it.
///
/// NB: serialization is for showing: a serialized config does not round-trip its secrets.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret<R: Redaction> {
    text: String,
    shown: PhantomData<fn() -> R>,
}

impl<R: Redaction> Secret<R> {
    pub fn new(text: impl Into<String>) -> Self {
        Secret { text: text.into(), shown: PhantomData }
    }

    /// The value itself, for the client that connects with it; never for an output.
    pub fn expose(&self) -> &str {
        &self.text
    }

    /// The redacted form, for an output.
    pub(crate) fn redacted(&self) -> String {
        R::redact(&self.text)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

impl<R: Redaction> From<String> for Secret<R> {
    fn from(text: String) -> Self {
        Secret::new(text)
    }
}

impl<R: Redaction> From<&str> for Secret<R> {
    fn from(text: &str) -> Self {
        Secret::new(text)
    }
}

impl<R: Redaction> fmt::Display for Secret<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl<R: Redaction> fmt::Debug for Secret<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl<R: Redaction> serde::Serialize for Secret<R> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

impl<'de, R: Redaction> serde::Deserialize<'de> for Secret<R> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // NB: serde's own error quotes a value of the wrong type (`routing_key = 12345`).
        String::deserialize(d)
            .map(Secret::new)
            .map_err(|_| serde::de::Error::custom("must be a string (the value is not shown)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_hidden_and_the_address_kept() {
        for (given, shown) in [
            ("redis://:s3cret@redis.vigil:6379/0", "redis://:***@redis.vigil:6379/0"),
            ("redis://vigil:s3cret@10.0.0.3:6379/2", "redis://vigil:***@10.0.0.3:6379/2"),
            ("rediss://u:p@r:6380/#insecure", "rediss://u:***@r:6380/#insecure"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://[::1]:6379", "redis://[::1]:6379"),
            ("redis://s3cret@host:6379", "redis://***@host:6379"),
            ("https://TOKEN@api.example.com/x", "https://***@api.example.com/x"),
            ("", ""),
        ] {
            assert_eq!(url(given), shown, "{given}");
        }
    }

    #[test]
    fn a_secret_of_the_wrong_type_is_not_quoted() {
        #[derive(serde::Deserialize)]
        struct S {
            #[allow(dead_code)]
            key: Secret<Hidden>,
        }
        let e = toml::from_str::<S>("key = 123456789").err().expect("an integer is refused");
        assert!(!e.message().contains("123456789"), "{}", e.message());
    }

    #[test]
    fn query_values_are_hidden_and_their_names_kept() {
        assert_eq!(
            url("unix:///run/redis.sock?db=1&pass=s3cret"),
            "unix:///run/redis.sock?db=***&pass=***"
        );
        assert_eq!(
            url("http://w:8080/ckpt?token=s3cret&flag#frag"),
            "http://w:8080/ckpt?token=***&***#***"
        );
        // A fragment may be a credential too; only a rediss:// URL's `#insecure` is kept.
        assert_eq!(url("unix:///s.sock?pass=ab#cd"), "unix:///s.sock?pass=***#***");
        assert_eq!(url("http://w/hook#t0ken"), "http://w/hook#***");
        assert_eq!(url("rediss://r:6380?db=0#insecure"), "rediss://r:6380?db=***#insecure");
        assert_eq!(url("http://w:8080/ckpt?"), "http://w:8080/ckpt?");
    }

    #[test]
    fn malformed_urls_hide_more_never_less() {
        for (given, secret) in [
            ("redis://:pa/ss@host:6379", "pa/ss"),
            ("redis://:pa?ss@host:6379", "pa?ss"),
            ("redis://:p@ss@host:6379", "p@ss"),
            ("redis://u:pa#ss@host", "pa#ss"),
            ("htps://u:s3cret@host", "s3cret"),
            ("u:s3cret@host:6379", "s3cret"),
        ] {
            let shown = url(given);
            assert!(!shown.contains(secret), "{given} -> {shown}");
            assert!(shown.contains(MASK), "{given} -> {shown}");
        }
        assert_eq!(url("redis://:pa/ss@host:6379"), "redis://:***@host:6379");
        // An `@` in a path or query: everything before it goes, the host with it.
        assert_eq!(url("http://w/ckpt?mail=a@b"), "http://***@b");
        assert_eq!(url("https://h/p:x@y"), "https://***@y");
    }

    #[test]
    fn every_url_of_a_list_is_redacted() {
        assert_eq!(
            urls("redis://:a@h1:1, redis://:b@h2:2,redis://h3:3"),
            "redis://:***@h1:1, redis://:***@h2:2,redis://h3:3"
        );
        // A raw comma in a password: the piece after it is part of the same URL.
        let shown = urls("redis://:pa,ss@h1:1,redis://h2:2");
        assert_eq!(shown, "redis://:***@h1:1,redis://h2:2");
    }

    #[test]
    fn webhooks_keep_scheme_host_and_port_only() {
        for (given, shown) in [
            ("https://hooks.slack.com/services/T000/B000/s3cret", "https://hooks.slack.com/***"),
            (
                "https://alerts.example.com:8443/hook?token=s3cret",
                "https://alerts.example.com:8443/***",
            ),
            ("https://u:s3cret@alerts.example.com/", "https://***@alerts.example.com/***"),
            ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
            ("https://h?token=s3cret", "https://h/***"),
            ("", ""),
        ] {
            assert_eq!(Webhook::redact(given), shown, "{given}");
        }
    }

    #[test]
    fn a_secret_shows_only_its_redacted_form() {
        let s: Secret<Webhook> = "https://hooks.slack.com/services/T/B/s3cret".into();
        assert_eq!(s.expose(), "https://hooks.slack.com/services/T/B/s3cret");
        assert_eq!(s.to_string(), "https://hooks.slack.com/***");
        assert_eq!(format!("{s:?}"), "\"https://hooks.slack.com/***\"");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"https://hooks.slack.com/***\"");
        let back: Secret<Webhook> = serde_json::from_str("\"https://h/s3cret\"").unwrap();
        assert_eq!(back.expose(), "https://h/s3cret");
        assert_eq!(back, Secret::new("https://h/s3cret"));
        let p: Secret<Hidden> = "s3cret".into();
        assert_eq!(p.to_string(), MASK);
        assert_eq!(Secret::<Hidden>::default().to_string(), "");
        assert!(Secret::<Urls>::default().is_empty());
    }
}
