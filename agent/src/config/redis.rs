//! `[redis]`: where the coordinator is (empty: embedded), how it is reached, and `redis.url`
//! read once into the servers it names ([`RedisConfig::servers`]), which the coordinator connects
//! to.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, bad_if, has_scheme, ConfigError};
use crate::redact::{self, Secret, Urls};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[:password@]host:port[/db]`; env `REDIS_URL`. Empty: embedded single-node
    /// coordinator. With `mode = "cluster"`: the cluster's seed nodes, comma-separated; with
    /// `mode = "sentinel"`: the Sentinels, comma-separated (their credentials and database are
    /// the master's too). A secret: shown with every password and query value hidden
    /// (`redis://user:***@host:6379/0`).
    pub url: Secret<Urls>,
    /// `single` (the default: one server, or a managed endpoint that fails over behind one
    /// address), `cluster` (Redis Cluster), or `sentinel` (the master Sentinel names, followed
    /// across failovers).
    pub mode: RedisMode,
    /// With `mode = "sentinel"`: the name the Sentinels monitor the master under.
    pub sentinel_service: String,
    /// First component of every key Vigil writes.
    #[educe(Default(expression = "vigil".into()))]
    pub key_prefix: String,
    /// Per-command timeout; a slower Redis counts as unreachable (and restarts pause).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(2)))]
    pub(crate) timeout: Duration,
    /// Entries kept in each node's decision trail stream.
    #[educe(Default(expression = 1000))]
    pub(crate) trail_max_len: usize,
    /// For `rediss://`: a PEM file of the CA that signed the server's certificate (e.g. a
    /// managed Redis's server CA); empty = the system's trusted roots.
    pub(crate) ca_file: String,
}

/// How `redis.url` is reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    #[default]
    Single,
    Cluster,
    Sentinel,
}

impl RedisConfig {
    /// The servers `url` (`redis.url`'s text) names, in order: one with `mode = "single"`, the
    /// seed nodes or the Sentinels otherwise, none for the embedded coordinator. The one place
    /// the comma-separated text is split: validation and the coordinator read the same list.
    /// `redis://a:1, redis://b:2` → each URL, trimmed; empty entries are dropped. A piece
    /// without `://` is the one before it's (a raw comma in a password), as the redacted form
    /// reads it: split apart, the password's first half went into an error unredacted. NB: the
    /// URLs keep their passwords: never for an output (show `redis.url`, a [`Secret`], or
    /// `redact::url` of one).
    pub(crate) fn servers(url: &str) -> Vec<String> {
        let urls = redact::split_urls(url).into_iter().map(|u| u.trim().to_string());
        urls.filter(|u| !u.is_empty()).collect()
    }

    /// Keys that fit in a hash tag, URLs the mode can use, and the mode's own settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let unfit = self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}', ':']);
        bad_if(unfit, "redis.key_prefix", "must be non-empty without braces or colons")?;
        self.validate_urls()?;
        let why =
            "is empty: name the master the Sentinels monitor (as in `sentinel monitor NAME ...`)";
        let unnamed = self.mode == RedisMode::Sentinel && self.sentinel_service.trim().is_empty();
        bad_if(unnamed, "redis.sentinel_service", why)?;
        let without_tls = !self.ca_file.is_empty() && !self.url.expose().starts_with("rediss://");
        bad_if(without_tls, "redis.ca_file", "is only used with a rediss:// (TLS) redis.url")?;
        let why = "is not used with redis.mode = sentinel (the Sentinels and the master are verified against the system's roots): remove it, or use a certificate those roots sign";
        bad_if(!self.ca_file.is_empty() && self.mode == RedisMode::Sentinel, "redis.ca_file", why)?;
        bad_if(self.trail_max_len == 0, "redis.trail_max_len", "must be at least 1")
    }

    /// As many URLs as the mode takes, each one the `redis` crate can open.
    fn validate_urls(&self) -> Result<(), ConfigError> {
        let urls = Self::servers(self.url.expose());
        let why = "lists several servers: set redis.mode = \"cluster\" (Redis Cluster seed nodes) or \"sentinel\" (the Sentinels)";
        bad_if(urls.len() > 1 && self.mode == RedisMode::Single, "redis.url", why)?;
        for url in &urls {
            let shown = redact::url(url);
            let why = format!("`{shown}` is not a redis://, rediss:// or unix:// URL");
            bad_if(!has_scheme(url, &["redis://", "rediss://", "unix://"]), "redis.url", why)?;
            if let Err(e) = ::redis::Client::open(url.as_str()) {
                return bad("redis.url", format!("`{shown}` does not parse: {e}"));
            }
        }
        let why = "is empty: redis.mode = cluster or sentinel needs the servers' addresses";
        bad_if(self.mode != RedisMode::Single && urls.is_empty(), "redis.url", why)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_names_keys, key_of, parse};
    use super::*;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[redis]\nurl = \"http://x\"", "redis.url"),
            ("[redis]\nkey_prefix = \"a:b\"", "redis.key_prefix"),
            ("[redis]\ntrail_max_len = 0", "redis.trail_max_len"),
            ("[redis]\nurl = \"redis://host:notaport\"", "redis.url"),
            ("[redis]\ntimeout = \"0s\"", "redis.timeout"),
            (
                "[redis]\nmode = \"sentinel\"\nsentinel_service = \"m\"\nurl = \"rediss://s:26379\"\nca_file = \"/ca.pem\"",
                "redis.ca_file",
            ),
        ]);
    }

    #[test]
    fn the_url_is_read_once_into_its_servers() {
        assert!(RedisConfig::servers("").is_empty());
        assert!(RedisConfig::servers(" , ").is_empty());
        assert_eq!(
            RedisConfig::servers("redis://a:1, redis://b:2,,"),
            vec!["redis://a:1", "redis://b:2"]
        );
        let c = parse("[redis]\nurl = \"redis://a:1\"\n").unwrap();
        assert_eq!(RedisConfig::servers(c.redis.url.expose()), ["redis://a:1"]);
        // A raw comma in a password stays in its URL, as the redacted form reads it.
        assert_eq!(
            RedisConfig::servers("redis://:pa,ss@h1:6379,redis://h2"),
            vec!["redis://:pa,ss@h1:6379", "redis://h2"]
        );
    }

    #[test]
    fn errors_about_the_url_never_show_its_password() {
        for url in [
            "http://:s3cret@x:1",
            "redis://:s3cret@host:notaport",
            "redis://:s3cret@a:1,redis://:s3cret@b:2",
            "unix:///run/redis.sock?pass=s3cret,redis://b:2",
        ] {
            let err = parse(&format!("[redis]\nurl = \"{url}\"\n")).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("redis.url"), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
        // What holds the URLs, the config, shows them redacted (`Debug` included).
        let text = "[redis]\nmode = \"cluster\"\nurl = \"redis://:s3cret@a:1,redis://:s3cret@b:2\"";
        let shown = format!("{:?}", parse(text).unwrap().redis);
        assert!(shown.contains("redis://:***@a:1,redis://:***@b:2"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
        // A raw comma in a cluster's password: its first half was a URL of its own once.
        let text =
            "[redis]\nmode = \"cluster\"\nurl = \"redis://:s3c,ret@a:1,redis://b:notaport\"\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("redis.url") && !err.contains("s3c"), "{err}");
    }

    #[test]
    fn several_servers_need_a_mode_that_takes_them() {
        let two = "url = \"redis://a:1,redis://b:2\"";
        assert_eq!(key_of(parse(&format!("[redis]\n{two}\n"))), "redis.url");
        assert!(parse(&format!("[redis]\n{two}\nmode = \"cluster\"\n")).is_ok());
        assert_eq!(
            key_of(parse(&format!("[redis]\n{two}\nmode = \"sentinel\"\n"))),
            "redis.sentinel_service"
        );
        assert_eq!(
            key_of(parse("[redis]\nmode = \"cluster\"\n")),
            "redis.url",
            "cluster mode without servers"
        );
    }
}
