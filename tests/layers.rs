//! The layers, checked (issue 43): the shared infrastructure names no feature, and the map of
//! agent/src in docs/development.md names every file.

use std::path::Path;

use crate::layout::{crate_paths, module_references, sources};

/// The shared infrastructure under the features: it serves them and names none of them. A
/// feature's words that infrastructure needs sit below both (`vocab`: the Node's; `clock`,
/// `config`, `runtime::container`), and a feature's own Redis schema, trail writer or metrics
/// filler lives with the feature.
const INFRASTRUCTURE: [&str; 13] = [
    "alerts",
    "backoff",
    "clock",
    "config",
    "coord",
    "http",
    "kube",
    "metrics",
    "recording",
    "redact",
    "runtime",
    "trail",
    "vocab",
];

/// The feature folders (what `INFRASTRUCTURE` must not name).
const FEATURE_FOLDERS: [&str; 6] = [
    "accel",
    "fleet",
    "hang",
    "maintenance",
    "node",
    "worker_api",
];

#[test]
fn infrastructure_never_imports_a_feature() {
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_string();
    let modules = module_references();
    let names: std::collections::BTreeSet<&str> = modules.iter().map(|(m, _)| m.as_str()).collect();
    // The module a path names: its longest prefix that is a module.
    let owner = |path: &str| -> String {
        let parts: Vec<&str> = path.split("::").collect();
        (1..=parts.len())
            .rev()
            .map(|k| parts[..k].join("::"))
            .find(|c| names.contains(c.as_str()))
            .unwrap_or_else(|| path.to_string())
    };
    let mut found: std::collections::BTreeSet<(String, String)> = Default::default();
    for (module, refs) in modules.iter() {
        if !INFRASTRUCTURE.contains(&top(module).as_str()) {
            continue;
        }
        for r in refs {
            if FEATURE_FOLDERS.contains(&top(r).as_str()) {
                found.insert((module.clone(), owner(r)));
            }
        }
    }
    assert!(
        found.is_empty(),
        "infrastructure imports a feature (move the shared words below both, or the code into \
         the feature): {found:?}"
    );
    // The checker reads what it claims to: a planted import is found.
    let planted = crate_paths("use crate::hang::policy::Verdict;\n");
    assert_eq!(planted, vec!["hang::policy::Verdict".to_string()]);
}

/// docs/development.md's map of agent/src names every source file (test files aside): a file
/// of a folder in that folder's entry, a root file anywhere in the map.
#[test]
fn the_development_map_names_every_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/development.md")).unwrap();
    let start = doc.find("```\nagent/src/").expect("the map of agent/src") + 4;
    let map = &doc[start..start + doc[start..].find("```").unwrap()];
    // Each top entry's text: from its line (two spaces, then `name/` or `name.rs`) to the next.
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in map.lines().skip(1) {
        let head = line.strip_prefix("  ").filter(|l| !l.starts_with(' '));
        if let Some(name) = head.and_then(|l| l.split_whitespace().next()) {
            entries.push((name.to_string(), String::new()));
        }
        if let Some((_, text)) = entries.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    let names = |text: &str, file: &str| {
        text.match_indices(file).any(|(i, _)| {
            let before = text[..i].chars().last();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    };
    let mut missing = Vec::new();
    for (path, _) in sources() {
        let file = path.rsplit('/').next().unwrap();
        if file == "mod.rs" || file == "tests.rs" || file.ends_with("_tests.rs") {
            continue;
        }
        let listed = match path.split_once('/') {
            None => names(map, file),
            Some((top, _)) => entries
                .iter()
                .find(|(name, _)| name == &format!("{top}/"))
                .is_some_and(|(_, text)| names(text, file)),
        };
        if !listed {
            missing.push(path);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/development.md's map does not name: {missing:?}"
    );
}
