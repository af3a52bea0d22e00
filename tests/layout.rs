//! The layout's promise, checked: data flows one way. `model` imports no other layer; `policy`
//! only `model` (and the shared `clock`/`config`); adapters (`sources`, `coord`, `runtime`,
//! `actions`) and `observe` never import an engine, the CLI or the wiring; `config` never imports
//! `coord`.

use std::path::Path;

/// The `use crate::…` / `crate::…::` references of the code (comments left out) in `dir`.
fn references(dir: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            for line in text.lines() {
                let code = line.split("//").next().unwrap_or("");
                let mut rest = code;
                while let Some(i) = rest.find("crate::") {
                    let tail = &rest[i + 7..];
                    let module: String = tail
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    out.push((p.display().to_string(), module));
                    rest = tail;
                }
            }
        }
    }
    out
}

fn assert_only(dir: &str, allowed: &[&str]) {
    let bad: Vec<_> = references(dir)
        .into_iter()
        .filter(|(_, m)| !m.is_empty() && !allowed.contains(&m.as_str()))
        .collect();
    assert!(bad.is_empty(), "{dir}/ reaches outside its layer: {bad:?}");
}

#[test]
fn model_is_data_only() {
    assert_only("model", &["model", "clock"]);
}

#[test]
fn policy_depends_on_data_only() {
    assert_only("policy", &["model", "policy", "clock", "config"]);
}

#[test]
fn adapters_and_observe_never_import_engines_cli_or_wiring() {
    for dir in ["sources", "coord", "runtime", "actions", "observe"] {
        let bad: Vec<_> = references(dir)
            .into_iter()
            .filter(|(_, m)| matches!(m.as_str(), "engine" | "cli" | "app"))
            .collect();
        assert!(
            bad.is_empty(),
            "{dir}/ imports an engine, the CLI or the wiring: {bad:?}"
        );
    }
}

#[test]
fn config_never_imports_coord() {
    // coord reads the config (`RedisCoordinator::from_config`, `RedisUrls`); the config is parsed
    // and validated without the coordinator.
    let bad: Vec<_> = references("config")
        .into_iter()
        .filter(|(_, m)| m == "coord")
        .collect();
    assert!(bad.is_empty(), "config/ imports coord/: {bad:?}");
}
