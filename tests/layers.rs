//! The layers, checked (issue 43): the shared infrastructure names no feature, no folders import
//! one another round a circle, and the map of agent/src
//! in docs/development.md names every file. Imports are read as `crate::` paths (a `super::` path
//! stays within its folder or climbs to its parent: the module circles of tests/layout.rs read
//! those too; method calls across an `impl` split over files are not seen).

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
const FEATURE_FOLDERS: [&str; 7] =
    ["accel", "cycle", "fleet", "hang", "maintenance", "node", "worker_api"];

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
    assert!(missing.is_empty(), "docs/development.md's map does not name: {missing:?}");
}

/// The folder of a source file (`hang/restart/command.rs` → `hang/restart`); a file at the top
/// of agent/src is a folder of its own (`clock.rs` → `clock`).
fn folder_of(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((dir, _)) => dir.to_string(),
        None => path.trim_end_matches(".rs").to_string(),
    }
}

/// The strongly connected sets of more than one node of `edges` (Tarjan's algorithm), each
/// sorted.
fn circles(
    edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        index: std::collections::HashMap<&'a str, usize>,
        low: std::collections::HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
        let i = w.index.len();
        w.index.insert(v, i);
        w.low.insert(v, i);
        w.stack.push(v);
        for t in w.edges.get(v).into_iter().flatten() {
            if !w.index.contains_key(t.as_str()) {
                visit(w, t);
                let l = w.low[v].min(w.low[t.as_str()]);
                w.low.insert(v, l);
            } else if w.stack.contains(&t.as_str()) {
                let l = w.low[v].min(w.index[t.as_str()]);
                w.low.insert(v, l);
            }
        }
        if w.low[v] == w.index[v] {
            let mut set = Vec::new();
            while let Some(top) = w.stack.pop() {
                set.push(top.to_string());
                if top == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                w.out.push(set);
            }
        }
    }
    let mut w = Walk {
        edges,
        index: Default::default(),
        low: Default::default(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !w.index.contains_key(v.as_str()) {
            visit(&mut w, v);
        }
    }
    w.out
}

#[test]
fn no_folder_circle() {
    let files = sources();
    let folder_of_module: std::collections::BTreeMap<String, String> =
        files.iter().map(|(p, _)| (crate::layout::module_of(p), folder_of(p))).collect();
    let folder = |path: &str| -> Option<String> {
        let parts: Vec<&str> = path.split("::").collect();
        (1..=parts.len()).rev().find_map(|k| folder_of_module.get(&parts[..k].join("::")).cloned())
    };
    let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    // Test files (`*_tests.rs`, `tests.rs`) aside, as `#[cfg(test)]` parts are.
    let is_test = |p: &str| p.ends_with("_tests.rs") || p.ends_with("/tests.rs");
    for (path, text) in files.iter().filter(|(p, _)| !is_test(p)) {
        let from = folder_of(path);
        for r in crate_paths(text) {
            if let Some(to) = folder(&r).filter(|to| *to != from) {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    // The top folders as whole rooms too (a feature and its sub-folders one room): the gang's
    // view read from `fleet` by `hang/restart`, while `fleet` reads `hang`'s model, was a circle
    // no pair of folders showed.
    let top = |f: &str| f.split('/').next().unwrap_or(f).to_string();
    let mut rooms: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for (from, tos) in &edges {
        for to in tos.iter().filter(|to| top(to) != top(from)) {
            rooms.entry(top(from)).or_default().insert(top(to));
        }
    }
    let found = circles(&rooms);
    assert!(found.is_empty(), "top folders import one another round a circle: {found:?}");
    // NB: the engine's circle (hang, hang/restart, fleet, maintenance) closed in issue 43: the
    // node's cycle went above the features (`cycle`) and what forbids restarts below them
    // (`vocab::stand_down`, `vocab::maintenance`).
    let found = circles(&edges);
    assert!(
        found.is_empty(),
        "folders import one another round a circle (parent and child folders count): {found:?}"
    );
    // The search finds what it claims to: a planted back edge closes a circle.
    let mut planted = edges.clone();
    planted.entry("kube".to_string()).or_default().insert("accel/tpu".to_string());
    planted.entry("accel/tpu".to_string()).or_default().insert("kube".to_string());
    assert!(circles(&planted)
        .iter()
        .any(|c| c.contains(&"kube".to_string()) && c.contains(&"accel/tpu".to_string())));
    // And the circle that was closed: the hang folder driving its restart folder again (the
    // cycle back in `hang`) is one, the restart folder naming `hang` being real.
    assert!(
        edges.get("hang/restart").is_some_and(|t| t.contains("hang")),
        "the restart folder reads the hang folder's model: {edges:?}"
    );
    let mut back = edges.clone();
    back.entry("hang".to_string()).or_default().insert("hang/restart".to_string());
    assert!(circles(&back)
        .iter()
        .any(|c| c.contains(&"hang".to_string()) && c.contains(&"hang/restart".to_string())));
}
