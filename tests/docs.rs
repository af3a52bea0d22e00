//! The documentation is checked against the code, both ways where the code can list its names,
//! so it cannot drift. Each reference table is read from the page that holds it:
//!
//! | what | where |
//! |---|---|
//! | config keys | `docs/configuration.md`, section "Configuration" |
//! | metrics | `docs/metrics.md`, section "Metrics and HTTP endpoints" |
//! | alert kinds | `docs/alerts.md`, section "Alerts" |
//! | decision codes | `docs/trail.md`, section "Decision trail" |
//! | Redis keys | `docs/redis-keys.md`, section "Redis keys" |
//! | Node labels, annotations, taints, Events | `docs/maintenance.md` (maintenance), `docs/gpu.md` (GPU), `docs/tpu.md` (TPU) |
//! | CLI commands | `docs/cli.md`, section "CLI" |
//! | verdicts and who acts | `README.md`, section "Verdicts" |
//!
//! And every relative link of the README and of `docs/` leads to a file (and heading) that
//! exists, and every page of `docs/` is linked from the README.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use vigil::accel::gpu::model::{GpuHealth, GpuReport};
use vigil::accel::policy::desired;
use vigil::accel::tpu::model::{TpuHealth, TpuReport};
use vigil::alerts::AlertKind;
use vigil::config::{Config, KubernetesConfig};
use vigil::coord::Keys;
use vigil::hang::policy::Action;
use vigil::hang::policy::Verdict;
use vigil::maintenance::policy::{event_for, node_desired};
use vigil::metrics::{to_classic_text, Metrics};
use vigil::trail::Code;
use vigil::vocab::maintenance::{MaintenanceState, Phase};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A documentation file, by its path from the repository's root.
fn doc(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// The level of a Markdown heading line (`## x` is 2), or `None`.
fn heading_level(line: &str) -> Option<usize> {
    let level = line.len() - line.trim_start_matches('#').len();
    (level > 0 && line[level..].starts_with(' ')).then_some(level)
}

/// The text of the section whose heading line is exactly `heading` (e.g. `# Redis keys`): from
/// that line to the next heading of the same or a higher level, fenced code blocks skipped over.
fn section<'a>(text: &'a str, file: &str, heading: &str) -> &'a str {
    let level = heading_level(heading).expect("a heading");
    let mut start = None;
    let mut fenced = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end();
        if bare.starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            match start {
                None if bare == heading => start = Some(offset + line.len()),
                Some(s) if heading_level(bare).is_some_and(|l| l <= level) => {
                    return &text[s..offset]
                }
                _ => {}
            }
        }
        offset += line.len();
    }
    match start {
        Some(s) => &text[s..],
        None => panic!("{file} has no section {heading:?}"),
    }
}

/// The backticked first cells of the table rows of a section.
fn first_cells(section: &str) -> BTreeSet<String> {
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// The cells of a section's table rows, header and separator rows left out.
fn rows(section: &str) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = section
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .filter(|cells: &Vec<String>| !cells[0].starts_with("---"))
        .collect();
    if !rows.is_empty() {
        rows.remove(0); // the header
    }
    rows
}

fn config_keys() -> BTreeSet<String> {
    let value: toml::Value = toml::from_str(&Config::defaults_toml()).unwrap();
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
    let text = doc("docs/configuration.md");
    let documented = first_cells(section(&text, "docs/configuration.md", "# Configuration"));
    let code = config_keys();
    let missing: Vec<_> = code.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&code).collect();
    assert!(missing.is_empty(), "config keys missing from docs/configuration.md: {missing:?}");
    assert!(
        stale.is_empty(),
        "docs/configuration.md documents keys the code does not have: {stale:?}"
    );
}

#[test]
fn every_metric_is_documented_and_every_documented_metric_exists() {
    let m = Metrics::new();
    m.touch_all();
    let text = to_classic_text(&m.encode());
    let code: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, _)| n.to_string())
        .collect();
    let page = doc("docs/metrics.md");
    let section = section(&page, "docs/metrics.md", "# Metrics and HTTP endpoints");
    let first = first_cells(section);
    // A row may document two names: "`a`, `b`".
    let documented: BTreeSet<String> = section
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
    assert!(first.iter().all(|n| n.starts_with("vigil_")), "{first:?}");
    let missing: Vec<_> = code.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&code).collect();
    assert!(missing.is_empty(), "metrics missing from docs/metrics.md: {missing:?}");
    assert!(
        stale.is_empty(),
        "docs/metrics.md documents metrics the code does not have: {stale:?}"
    );
}

#[test]
fn every_alert_kind_is_documented() {
    let page = doc("docs/alerts.md");
    let documented = first_cells(section(&page, "docs/alerts.md", "# Alerts"));
    let code: BTreeSet<String> = AlertKind::ALL.iter().map(|k| k.as_str().to_string()).collect();
    let missing: Vec<_> = code.difference(&documented).collect();
    assert!(missing.is_empty(), "alert kinds missing from docs/alerts.md: {missing:?}");
    let stale: Vec<_> = documented.difference(&code).collect();
    assert!(
        stale.is_empty(),
        "docs/alerts.md documents alert kinds the code does not have: {stale:?}"
    );
}

#[test]
fn every_decision_code_is_documented() {
    let page = doc("docs/trail.md");
    let section = section(&page, "docs/trail.md", "# Decision trail");
    for &code in Code::ALL {
        let code = code.as_str();
        assert!(
            section.contains(&format!("`{code}`")),
            "decision code {code} missing from docs/trail.md"
        );
    }
}

#[test]
fn every_redis_key_is_documented() {
    let k = Keys::new("P", "N");
    let page = doc("docs/redis-keys.md");
    let documented = first_cells(section(&page, "docs/redis-keys.md", "# Redis keys"));
    let keys = [
        k.status("W"),
        k.suspect("W"),
        k.incident("W"),
        k.error_since("W"),
        k.progress("W"),
        k.cooldown("W"),
        k.restarted("W"),
        k.escalated("W"),
        k.fruitless("W"),
        k.gang_line("W"),
        k.lost("W"),
        k.rhythm("W"),
        k.incarnation("W"),
        k.retry("W"),
        k.episode("W", "<kind>"),
        k.alert_dedup("I", "<kind>"),
        k.lock(),
        k.breaker("<YYYY-MM-DD>"),
        k.breaker_alert("<YYYY-MM-DD>"),
        k.trail(),
        k.agent(),
        k.idle_since(),
        k.drills(),
        k.fleet_nodes(),
        k.fleet_slices(),
        k.fleet_drills(),
        k.maintenance_claim("<pool>"),
        k.fleet_budget(42).replace("42", "<window>"),
        k.fleet_budget_alert(42).replace("42", "<window>"),
        k.gang_members("G", 7).replace("#7", "#S"),
        k.gang_incident("G"),
        k.gang_decision("G"),
        k.gang_restarted("G"),
        k.gang_fruitless("G"),
        k.gang_lock("G"),
        k.gang_reader("G"),
        k.gang_breaker("G", "<YYYY-MM-DD>"),
        k.gang_alert("G", "<about>", "<kind>"),
        k.gang_checkpoint("G"),
        k.gang_slow("G"),
    ];
    for key in &keys {
        assert!(documented.contains(key), "Redis key {key} missing from docs/redis-keys.md");
    }
    assert_eq!(
        documented.len(),
        keys.len(),
        "docs/redis-keys.md documents keys the code does not have: {documented:?}"
    );
}

#[test]
fn every_node_label_annotation_taint_and_event_is_documented() {
    let maintenance = doc("docs/maintenance.md");
    let gpu = doc("docs/gpu.md");
    let k = KubernetesConfig::default();
    let st = MaintenanceState {
        phase: Phase::Terminating,
        reasons: vec!["preempted"],
        window_start: Some("a".into()),
        window_end: Some("b".into()),
        ..MaintenanceState::default()
    };
    let names = |d: &vigil::vocab::node::NodeDesired| -> BTreeSet<String> {
        d.labels
            .keys()
            .chain(d.annotations.keys())
            .chain(d.add_taints.iter().map(|t| &t.key))
            .cloned()
            .collect()
    };
    let mut d = node_desired(&k, &st, Some("x"), Some(true));
    let maintenance_names = names(&d);
    let report = GpuReport {
        state: vigil::accel::gpu::model::GpuMonitorState::On,
        node: GpuHealth::Failed,
        node_reasons: vec!["r".into()],
        ..Default::default()
    };
    desired(&k, &report, true, &mut d);
    let gpu_names: BTreeSet<String> = names(&d).difference(&maintenance_names).cloned().collect();
    assert!(!gpu_names.is_empty(), "the GPU adds no Node field");
    // A name is written whole, `name`, or as a taint, `name=value:Effect`.
    let mentions =
        |page: &str, n: &str| page.contains(&format!("`{n}`")) || page.contains(&format!("`{n}="));
    for n in &maintenance_names {
        assert!(mentions(&maintenance, n), "{n} missing from docs/maintenance.md");
    }
    for n in &gpu_names {
        assert!(mentions(&gpu, n), "{n} missing from docs/gpu.md");
    }
    let maintenance_events =
        [Phase::None, Phase::Pending, Phase::Ongoing, Phase::Terminating].map(|p| event_for(p).0);
    for reason in maintenance_events.iter().chain(&["VigilCheckpoint", "VigilPerformMaintenance"]) {
        assert!(
            maintenance.contains(&format!("`{reason}`")),
            "Event {reason} missing from docs/maintenance.md"
        );
    }
    for reason in vigil::accel::gpu::policy_node::GPU.events {
        assert!(gpu.contains(&format!("`{reason}`")), "Event {reason} missing from docs/gpu.md");
    }

    // TPU: every field it adds, its condition and every Event of a health change.
    let tpu = doc("docs/tpu.md");
    let before = names(&d);
    let report = TpuReport {
        monitoring: true,
        health: TpuHealth::Failed,
        reasons: vec!["r".into()],
        ..TpuReport::default()
    };
    desired(&k, &report, true, &mut d);
    let tpu_names: BTreeSet<String> = names(&d).difference(&before).cloned().collect();
    assert!(!tpu_names.is_empty(), "the TPU adds no Node field");
    for n in &tpu_names {
        assert!(mentions(&tpu, n), "{n} missing from docs/tpu.md");
    }
    for c in &d.conditions {
        assert!(
            doc("docs/kubernetes.md").contains(&format!("`{}`", c.kind)),
            "condition {} missing from docs/kubernetes.md",
            c.kind
        );
    }
    for reason in vigil::accel::tpu::policy::TPU.events {
        assert!(tpu.contains(&format!("`{reason}`")), "Event {reason} missing from docs/tpu.md");
    }
}

#[test]
fn every_cli_command_is_documented_and_every_documented_command_exists() {
    let page = doc("docs/cli.md");
    let documented: Vec<Vec<String>> = first_cells(section(&page, "docs/cli.md", "# CLI"))
        .iter()
        .map(|c| c.split_whitespace().map(str::to_string).collect())
        .collect();
    let cmd = vigil::cli::Cli::command();
    // Every command (and every command of a command group, as `vigil config check`).
    let mut code: Vec<Vec<String>> = Vec::new();
    for sub in cmd.get_subcommands() {
        let name = sub.get_name().to_string();
        let nested: Vec<_> = sub.get_subcommands().map(|s| s.get_name()).collect();
        if nested.is_empty() {
            code.push(vec![name]);
        } else {
            for n in nested {
                code.push(vec![name.clone(), n.to_string()]);
            }
        }
    }
    for words in &code {
        assert!(
            documented.iter().any(
                |d| d.first().map(String::as_str) == Some("vigil") && d[1..].starts_with(words)
            ),
            "command `vigil {}` missing from the CLI table of docs/cli.md",
            words.join(" ")
        );
    }
    for d in &documented {
        assert!(
            d.first().map(String::as_str) == Some("vigil")
                && code.iter().any(|words| d[1..].starts_with(words)),
            "docs/cli.md documents a command the CLI does not have: {}",
            d.join(" ")
        );
    }
}

#[test]
fn the_readme_verdict_table_is_the_policy_table() {
    let readme = doc("README.md");
    let rows = rows(section(&readme, "README.md", "## Verdicts"));
    let documented: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    let code: Vec<&str> = Verdict::ALL.iter().map(|v| v.as_str()).collect();
    assert_eq!(
        documented, code,
        "the README's verdict table lists other verdicts (or another order) than `vigil policy`"
    );
    for (row, v) in rows.iter().zip(Verdict::ALL.iter().copied()) {
        let who = row.last().unwrap();
        assert_eq!(
            who.contains("restart pipeline"),
            v.action() == Action::RestartPipeline,
            "README: who acts on {} is {who:?}, but the policy says {:?}",
            v.as_str(),
            v.action()
        );
    }
}

/// The relative links of a Markdown file (no URLs), outside code.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code cannot hold a link.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                links.push(target.to_string());
            }
            rest = &rest[end..];
        }
    }
    links
}

/// The anchors GitHub gives the headings of a Markdown file.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && heading_level(line).is_some() {
            let title = line.trim_start_matches('#').trim();
            let slug: String = title
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            out.insert(slug);
        }
    }
    out
}

/// Every relative link of `file` leads to an existing file, and to an existing heading when it
/// names one. Returns the files linked.
fn check_links(file: &str) -> Vec<PathBuf> {
    let text = doc(file);
    let dir = root().join(file).parent().unwrap().to_path_buf();
    let mut linked = Vec::new();
    for link in relative_links(&text) {
        let (path, anchor) = link.split_once('#').unwrap_or((link.as_str(), ""));
        let target = if path.is_empty() { root().join(file) } else { dir.join(path) };
        assert!(target.exists(), "{file} links to {link}, and {} does not exist", target.display());
        if !anchor.is_empty() {
            let headings = anchors(&std::fs::read_to_string(&target).unwrap());
            assert!(
                headings.contains(anchor),
                "{file} links to {link}, and it has no such heading (it has {headings:?})"
            );
        }
        linked.push(target.canonicalize().unwrap());
    }
    linked
}

fn docs_pages() -> Vec<String> {
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    pages
}

#[test]
fn every_docs_page_linked_from_the_readme_exists_and_every_page_is_linked() {
    let linked = check_links("README.md");
    let readme = doc("README.md");
    let docs_links: Vec<_> =
        relative_links(&readme).into_iter().filter(|l| l.starts_with("docs/")).collect();
    assert!(!docs_links.is_empty(), "the README links to no page of docs/");
    for page in docs_pages() {
        let path = root().join(&page).canonicalize().unwrap();
        assert!(linked.contains(&path), "README.md does not link to {page}");
    }
}

#[test]
fn every_relative_link_in_docs_resolves() {
    for page in docs_pages() {
        check_links(&page);
    }
}

/// docs/gpu.md carries the XID → action table between these markers, as the code prints it.
const XID_TABLE_BEGIN: &str =
    "<!-- xid-table: generated from agent/src/accel/gpu/policy_xid.rs; tests/docs.rs checks it -->";
const XID_TABLE_END: &str = "<!-- /xid-table -->";

#[test]
fn the_xid_table_of_docs_gpu_is_the_code_table() {
    let page = doc("docs/gpu.md");
    let start = page
        .find(XID_TABLE_BEGIN)
        .unwrap_or_else(|| panic!("docs/gpu.md lacks the marker {XID_TABLE_BEGIN}"))
        + XID_TABLE_BEGIN.len();
    let len = page[start..]
        .find(XID_TABLE_END)
        .unwrap_or_else(|| panic!("docs/gpu.md lacks the marker {XID_TABLE_END}"));
    let documented = page[start..start + len].trim();
    let code = vigil::accel::gpu::policy_xid::markdown();
    assert!(
        documented == code.trim(),
        "docs/gpu.md's XID table drifted from the code (agent/src/accel/gpu/policy_xid.rs); put this between the markers:\n{code}"
    );
}

/// Every test the threat model names (its last column: a file, then the tests in it) exists, so
/// a row cannot point at a test that was renamed or never written.
#[test]
fn every_test_the_threat_model_names_exists() {
    let page = doc("docs/security.md");
    let table = section(&page, "docs/security.md", "## Threat model");
    let mut named = 0;
    for row in rows(table) {
        let shown_by = row.last().expect("a row has cells");
        let mut file: Option<String> = None;
        for (i, token) in shown_by.split('`').enumerate() {
            if i % 2 == 0 {
                continue; // outside backticks
            }
            if token.ends_with(".rs") && token.contains('/') {
                file = Some(doc(token));
            } else if token
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                let text = file
                    .as_deref()
                    .unwrap_or_else(|| panic!("test {token} named before its file: {shown_by}"));
                assert!(
                    text.contains(&format!("fn {token}(")),
                    "the threat model names {token}, which its file does not have: {shown_by}"
                );
                named += 1;
            }
        }
    }
    assert!(named >= 20, "only {named} tests named");
}
