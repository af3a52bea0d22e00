//! The README's reference tables are checked against the code, both ways where the code can
//! list its names: every config key, metric, alert kind, decision code, Redis key, Node label,
//! annotation, taint, Event reason and CLI command, so the documentation cannot drift.

use std::collections::BTreeSet;

use clap::CommandFactory;
use vigil::actions::alert::AlertKind;
use vigil::coord::Keys;
use vigil::maintenance::{event_for, gpu_desired, node_desired};
use vigil::metrics::Metrics;
use vigil::sources::metadata::{MaintenanceState, Phase};

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap()
}

/// The backticked first cells of table rows in the section titled `heading`.
fn first_cells(readme: &str, heading: &str) -> BTreeSet<String> {
    let start = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README has no section {heading}"));
    let rest = &readme[start + heading.len()..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    rest[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_string())
        .collect()
}

fn config_keys() -> BTreeSet<String> {
    let value: toml::Value = toml::from_str(&vigil::config::Config::defaults_toml()).unwrap();
    let mut keys = BTreeSet::new();
    for (k, v) in value.as_table().unwrap() {
        match v.as_table() {
            Some(t) => {
                for sub in t.keys() {
                    keys.insert(format!("{k}.{sub}"));
                }
            }
            None => {
                keys.insert(k.clone());
            }
        }
    }
    keys
}

#[test]
fn every_config_key_is_documented_and_every_documented_key_exists() {
    let documented = first_cells(&readme(), "## Configuration");
    let code = config_keys();
    let missing: Vec<_> = code.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&code).collect();
    assert!(
        missing.is_empty(),
        "config keys missing from the README: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "README documents keys the code does not have: {stale:?}"
    );
}

#[test]
fn every_metric_is_documented_and_every_documented_metric_exists() {
    let m = Metrics::new();
    m.touch_all();
    let text = vigil::metrics::to_classic_text(&m.encode());
    let code: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, _)| n.to_string())
        .collect();
    let readme = readme();
    let section = first_cells(&readme, "## Metrics and HTTP endpoints");
    // A row may document two names: "`a`, `b`".
    let start = readme.find("## Metrics and HTTP endpoints").unwrap();
    let rest = &readme[start..];
    let documented: BTreeSet<String> = rest[..rest[3..].find("\n## ").unwrap_or(rest.len())]
        .lines()
        .filter(|l| l.starts_with("| `vigil_"))
        .flat_map(|l| {
            l.split('|')
                .nth(1)
                .unwrap_or("")
                .split(',')
                .map(|n| n.trim().trim_matches('`').to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        section.iter().all(|n| n.starts_with("vigil_")),
        "{section:?}"
    );
    let missing: Vec<_> = code.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&code).collect();
    assert!(
        missing.is_empty(),
        "metrics missing from the README: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "README documents metrics the code does not have: {stale:?}"
    );
}

#[test]
fn every_alert_kind_is_documented() {
    let documented = first_cells(&readme(), "## Alerts");
    let code: BTreeSet<String> = AlertKind::ALL
        .iter()
        .map(|k| k.as_str().to_string())
        .collect();
    assert_eq!(code, documented.intersection(&code).cloned().collect());
    let stale: Vec<_> = documented.difference(&code).collect();
    assert!(
        stale.is_empty(),
        "README documents alert kinds the code does not have: {stale:?}"
    );
}

#[test]
fn every_decision_code_is_documented() {
    let readme = readme();
    let start = readme.find("## Decision trail").unwrap();
    let section = &readme[start..];
    for code in vigil::trail::code::ALL {
        assert!(
            section.contains(&format!("`{code}`")),
            "decision code {code} missing from the README's Decision trail section"
        );
    }
}

#[test]
fn every_redis_key_is_documented() {
    let k = Keys::new("P", "N");
    let documented = first_cells(&readme(), "## Redis keys");
    let keys = [
        k.status("W"),
        k.suspect("W"),
        k.incident("W"),
        k.error_since("W"),
        k.progress("W"),
        k.cooldown("W"),
        k.restarted("W"),
        k.escalated("W"),
        k.incarnation("W"),
        k.episode("W", "<kind>"),
        k.alert_dedup("I", "<kind>"),
        k.lock(),
        k.breaker("<YYYY-MM-DD>"),
        k.breaker_alert("<YYYY-MM-DD>"),
        k.trail(),
        k.agent(),
        k.idle_since(),
        k.fleet_nodes(),
        k.fleet_slices(),
        k.maintenance_claim("<pool>"),
        k.fleet_budget(42).replace("42", "<window>"),
        k.fleet_budget_alert(42).replace("42", "<window>"),
    ];
    for key in &keys {
        assert!(
            documented.contains(key),
            "Redis key {key} missing from the README"
        );
    }
    assert_eq!(
        documented.len(),
        keys.len(),
        "README documents keys the code does not have: {documented:?}"
    );
}

#[test]
fn every_node_label_annotation_taint_and_event_is_documented() {
    let readme = readme();
    let k = vigil::config::KubernetesConfig::default();
    let st = MaintenanceState {
        phase: Phase::Terminating,
        reasons: vec!["preempted"],
        window_start: Some("a".into()),
        window_end: Some("b".into()),
        ..MaintenanceState::default()
    };
    let mut d = node_desired(&k, &st, Some("x"), Some(true));
    let report = vigil::policy::gpu::GpuReport {
        monitoring: true,
        node: vigil::policy::gpu::GpuHealth::Failed,
        node_reasons: vec!["r".into()],
        ..Default::default()
    };
    gpu_desired(&k, &report, true, &mut d);
    let names = d
        .labels
        .keys()
        .chain(d.annotations.keys())
        .chain(d.add_taints.iter().map(|t| &t.key))
        .cloned()
        .collect::<Vec<_>>();
    for n in names {
        assert!(
            readme.contains(&format!("`{n}")),
            "{n} missing from the README"
        );
    }
    for p in [
        Phase::None,
        Phase::Pending,
        Phase::Ongoing,
        Phase::Terminating,
    ] {
        let (reason, _) = event_for(p);
        assert!(
            readme.contains(&format!("`{reason}`")),
            "Event {reason} missing from the README"
        );
    }
    for reason in [
        "VigilCheckpoint",
        "VigilPerformMaintenance",
        "VigilGpuFailed",
        "VigilGpuDegraded",
        "VigilGpuHealthy",
    ] {
        assert!(
            readme.contains(&format!("`{reason}`")),
            "Event {reason} missing from the README"
        );
    }
}

#[test]
fn every_cli_command_is_documented() {
    let readme = readme();
    let cmd = vigil::cli::Cli::command();
    for sub in cmd.get_subcommands() {
        let name = sub.get_name();
        assert!(
            readme.contains(&format!("`vigil {name}")),
            "command `vigil {name}` missing from the README's CLI table"
        );
    }
}
