//! Unit tests of the configuration: defaults, layering, validation and the environment.

use super::testing::{assert_names_keys, env, key_of, parse};
use super::*;

#[test]
fn defaults_are_valid_and_match_the_brief() {
    let c = parse("").unwrap();
    assert_eq!(c.policy.stale_after, Duration::from_secs(120));
    assert_eq!(c.policy.restart_delay, Duration::from_secs(180));
    assert_eq!(c.policy.error_for, Duration::from_secs(1800));
    assert_eq!(c.policy.cooldown, Duration::from_secs(600));
    assert_eq!(c.policy.escalate_after, Duration::from_secs(600));
    assert_eq!(c.safety.breaker_per_day, 3);
    assert!(c.embedded());
}

#[test]
fn yaml_is_accepted() {
    let mut c = Config::parse(
        "policy:\n  stale_after: 3m\nsafety:\n  breaker_per_day: 5\n",
        Path::new("v.yaml"),
    )
    .unwrap();
    c.apply_env(&env(&[("NODE_NAME", "n1")])).unwrap();
    c.validate().unwrap();
    assert_eq!(c.policy.stale_after, Duration::from_secs(180));
    assert_eq!(c.safety.breaker_per_day, 5);
}

#[test]
fn unknown_key_is_named() {
    let err = parse("[policy]\nstale_afterr = \"2m\"\n").unwrap_err();
    assert!(err.to_string().contains("stale_afterr"), "{err}");
}

#[test]
fn bad_duration_is_named() {
    let err = parse("[policy]\nstale_after = \"two minutes\"\n").unwrap_err();
    assert!(err.to_string().contains("key `policy.stale_after`"), "{err}");
}

#[test]
fn short_lock_ttl_is_rejected() {
    let r = parse("[safety]\nlock_ttl = \"30s\"\n");
    assert_eq!(key_of(r), "safety.lock_ttl");
}

#[test]
fn env_overrides_file() {
    let mut c = Config::parse(
        "node_name = \"file\"\n[redis]\nurl = \"redis://file:1\"\n",
        Path::new("v.toml"),
    )
    .unwrap();
    c.apply_env(&env(&[
        ("NODE_NAME", "env-node"),
        ("REDIS_URL", "redis://env:2"),
        ("DOCKER_HOST", "tcp://127.0.0.1:2375"),
    ]))
    .unwrap();
    assert_eq!(c.node_name, "env-node");
    assert_eq!(c.redis.url.expose(), "redis://env:2");
    assert_eq!(c.docker.host, "tcp://127.0.0.1:2375");
}

/// An empty `REDIS_URL` is an error naming it where the agent runs (it was taken as unset: every
/// node its own embedded coordinator); loading the config (a worker's `vigil beat`) reads it as
/// unset, like the other empty variables.
#[test]
fn an_empty_redis_url_is_refused_and_other_empty_variables_are_unset() {
    for blank in ["", " "] {
        let empty = env(&[("NODE_NAME", "n1"), ("REDIS_URL", blank)]);
        let e = super::refuse_empty_redis_url(&empty).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid { key: "REDIS_URL", .. }), "{e}");
        assert!(e.to_string().contains("is set but empty"), "{e}");
    }
    let empty = env(&[("NODE_NAME", "n1"), ("REDIS_URL", "")]);
    assert!(Config::load(None, &empty).expect("a worker's beat loads it").embedded());
    let set = env(&[("REDIS_URL", "redis://r:6379")]);
    assert!(super::refuse_empty_redis_url(&set).is_ok());
    assert!(super::refuse_empty_redis_url(&env(&[])).is_ok());
    let mut c = Config::parse("[docker]\nhost = \"tcp://d:2375\"\n", Path::new("v.toml")).unwrap();
    c.apply_env(&env(&[
        ("NODE_NAME", "n1"),
        ("DOCKER_HOST", ""),
        ("VIGIL_POOL", ""),
        ("KUBERNETES_SERVICE_HOST", ""),
    ]))
    .unwrap();
    assert_eq!(c.docker.host, "tcp://d:2375");
    assert!(c.fleet.pool.is_empty() && !c.kubernetes_in_cluster);
    assert!(c.embedded());
}

#[test]
fn alert_secrets_come_from_the_env() {
    let mut c = Config::parse("[alerts.headers]\nX-Team = \"ml\"\n", Path::new("v.toml")).unwrap();
    c.apply_env(&env(&[
        ("VIGIL_ALERTMANAGER_URL", "http://am:pw@am:9093"),
        ("VIGIL_PAGERDUTY_ROUTING_KEY", "rk"),
        (
            "VIGIL_WEBHOOK_HEADERS",
            "# from the Secret: rotate monthly\nAuthorization: Bearer a:b\nX-Scope: org-1\n",
        ),
    ]))
    .unwrap();
    assert_eq!(c.alerts.alertmanager_url.expose(), "http://am:pw@am:9093");
    assert_eq!(c.alerts.routing_key.expose(), "rk");
    let h: Vec<(&str, &str)> =
        c.alerts.headers.iter().map(|(n, v)| (n.as_str(), v.expose())).collect();
    assert_eq!(h, [("Authorization", "Bearer a:b"), ("X-Scope", "org-1"), ("X-Team", "ml")]);
    c.validate().unwrap();
    // A `#` comment (colon or none) and a blank line are nothing.
    let commented = "# rotate monthly\n\nX-Scope: org-1\n";
    let fine = env(&[("NODE_NAME", "n1"), ("VIGIL_WEBHOOK_HEADERS", commented)]);
    let loaded = Config::load(None, &fine).expect("a comment without a colon is a comment");
    assert_eq!(loaded.alerts.headers.len(), 1);
    // A line that is not `Name: value` is refused by its number, never shown.
    let pasted =
        env(&[("NODE_NAME", "n1"), ("VIGIL_WEBHOOK_HEADERS", "X-Scope: org-1\nBearer s3cret\n")]);
    let e = Config::load(None, &pasted).unwrap_err().to_string();
    assert!(e.contains("VIGIL_WEBHOOK_HEADERS") && e.contains("line 2"), "{e}");
    assert!(!e.contains("s3cret"), "{e}");
}

/// A TOML syntax error says where, never the line: it is often the one with the password.
#[test]
fn a_toml_syntax_error_never_shows_its_line() {
    let text = "node_name = \"n1\"\n[redis]\nurl = redis://:s3cret@h:6379\n";
    let e = Config::parse(text, Path::new("v.toml")).unwrap_err().to_string();
    assert!(e.contains("line 3"), "{e}");
    assert!(!e.contains("s3cret"), "{e}");
}

/// The keys of one section are in that section's tests; these are the top level's and the
/// rules across sections.
#[test]
fn every_invalid_value_names_its_key() {
    assert_names_keys(&[
        ("poll_interval = \"0s\"", "poll_interval"),
        ("poll_interval = \"40s\"\n[fleet]\nheartbeat_ttl = \"1m\"", "fleet.heartbeat_ttl"),
        (
            "[opportunistic]\nenabled = true\n[redis]\nurl = \"redis://r:6379\"",
            "opportunistic.enabled",
        ),
        ("[opportunistic]\nenabled = true\n[fleet]\npool = \"p\"", "opportunistic.enabled"),
        // A claim that expires before its holder's next poll: two nodes of a pool offered.
        ("[opportunistic]\nclaim_ttl = \"0s\"", "opportunistic.claim_ttl"),
    ]);
}

/// The pool's claim outlives two polls of the node holding it (the default, 2h, does).
#[test]
fn the_pool_claim_outlives_two_polls() {
    let polls = "poll_interval = \"40s\"\n[fleet]\nheartbeat_ttl = \"2m\"\n";
    let short = format!("{polls}[opportunistic]\nclaim_ttl = \"79s\"\n");
    assert_eq!(key_of(parse(&short)), "opportunistic.claim_ttl");
    assert!(parse(&format!("{polls}[opportunistic]\nclaim_ttl = \"80s\"\n")).is_ok());
    let e = parse("[opportunistic]\nclaim_ttl = \"20s\"\n").unwrap_err().to_string();
    assert!(e.contains("at least twice poll_interval (30s)"), "{e}");
}

#[test]
fn opportunistic_takes_its_pool_from_the_config_or_the_node() {
    let redis = "[redis]\nurl = \"redis://r:6379\"\n";
    let on = format!("{redis}[opportunistic]\nenabled = true\n");
    assert_eq!(key_of(parse(&on)), "opportunistic.enabled", "no pool anywhere");
    assert!(parse(&format!("{on}[fleet]\npool = \"p\"\n")).is_ok());
    // The Kubernetes API on: the pool is read from the Node's label at run time.
    assert!(parse(&format!("{on}[kubernetes]\nenabled = \"on\"\n")).is_ok());
    let text = format!("{on}[kubernetes]\nenabled = \"off\"\n");
    assert_eq!(key_of(parse(&text)), "opportunistic.enabled");
}

#[test]
fn zero_durations_are_named_before_any_other_problem() {
    // Sections in order (redis before safety), but every zero duration before both.
    let text = "[redis]\nkey_prefix = \"a:b\"\n[safety]\nbreaker_per_day = 0\n";
    assert_eq!(key_of(parse(text)), "redis.key_prefix");
    let text = format!("{text}[alerts]\ntimeout = \"0s\"\n");
    assert_eq!(key_of(parse(&text)), "alerts.timeout");
}

#[test]
fn typed_values_parse_at_the_boundary() {
    let c = parse(
        "[server]\nlisten = \"\"\n[log]\nformat = \"json\"\n[checkpoint]\nmethod = \"signal:usr2\"\nsignal = \"SIGHUP\"\n[gpu]\nenabled = \"off\"\n",
    )
    .unwrap();
    assert_eq!(c.server.listen, None, "empty disables the server");
    assert_eq!(c.log.format, LogFormat::Json);
    assert_eq!(c.checkpoint.method, CheckpointMethod::Signal(Some(Signal::Usr2)));
    assert_eq!(c.checkpoint.signal, Signal::Hup);
    assert_eq!(c.gpu.enabled, Switch::Off);
    let c = parse("[checkpoint]\nmethod = \"https://w:8080/ckpt\"\n").unwrap();
    assert_eq!(c.checkpoint.method, CheckpointMethod::Http("https://w:8080/ckpt".into()));
}

#[test]
fn validation_does_no_io_and_load_checks_files() {
    let mut c = Config { node_name: "n1".into(), ..Config::default() };
    c.redis.url = "rediss://r:6380".into();
    c.redis.ca_file = "/nonexistent/vigil-ca.pem".into();
    assert!(c.validate().is_ok(), "validate reads no file");
    let err = c.check_files().unwrap_err();
    assert!(matches!(err, ConfigError::Invalid { key: "redis.ca_file", .. }), "{err}");
}

#[test]
fn node_names_are_kubernetes_node_names() {
    let long = "n".repeat(254);
    for bad in ["a:b", "a/b", "a\nb", "a b", "{n}", long.as_str()] {
        let c = Config { node_name: bad.into(), ..Config::default() };
        assert_eq!(key_of(c.validate().map(|()| c.clone())), "node_name", "{bad:?}");
    }
    let ok = Config { node_name: "gke-pool-1-abcd.europe-west4-a_x".into(), ..Config::default() };
    assert!(ok.validate().is_ok());
}

#[test]
fn defaults_round_trip_through_toml() {
    let text = Config::defaults_toml();
    let c = Config::parse(&text, Path::new("d.toml")).unwrap();
    assert_eq!(c.policy, PolicyConfig::default());
    assert_eq!(c.safety, SafetyConfig::default());
    assert_eq!(c.server, ServerConfig::default());
    assert_eq!(c.checkpoint, CheckpointConfig::default());
    assert_eq!(c.log, LogConfig::default());
}
