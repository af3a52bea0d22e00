//! The layout's promise, checked: a folder per feature — the hang and restart path, maintenance
//! and checkpoints, accelerators, the Node, the worker API, the fleet — each with its pure
//! decisions beside its loop and adapters, over shared infrastructure (coordination, runtimes,
//! Kubernetes, config, alerts, the trail, metrics and HTTP). One rule for decision code: a
//! feature's `model*` and `policy*` files do no I/O and read no clock (`now` is handed in), and
//! name nothing but other decision code and the shared data (`clock`, `config`,
//! `runtime::container`). No import circle between modules; `redact` a leaf; the wiring never
//! imports the CLI that calls it.
//!
//! And the test suite's promise: with `autotests = false`, a file in tests/ that agent/Cargo.toml
//! does not declare would silently never run, so every one must be declared.

use std::path::Path;

/// The features, each a folder of agent/src holding its decisions (`model*.rs`, `policy*.rs`).
const FEATURES: [&str; 7] =
    ["hang", "maintenance", "accel", "accel/gpu", "accel/tpu", "node", "worker_api"];

/// Everything agent/src holds at its top: the feature folders (`fleet` has no decisions of its
/// own: it publishes and reads records), the shared infrastructure, the CLI and the crate's few
/// root files. A new folder is a choice made here and in lib.rs's map, not by accident.
const TOP: [&str; 25] = [
    "accel",
    "alerts",
    "app",
    "backoff.rs",
    "cli",
    "clock.rs",
    "config",
    "coord",
    "cycle",
    "fleet",
    "fuzz.rs",
    "hang",
    "http",
    "kube",
    "lib.rs",
    "main.rs",
    "maintenance",
    "metrics",
    "node",
    "recording.rs",
    "redact.rs",
    "runtime",
    "trail",
    "vocab",
    "worker_api",
];

/// Shared data decision code may name besides other decision code: the clock, the config, the
/// container as the runtimes list it, the Node's vocabulary, and the secrets' redaction (a pure
/// leaf: a container's checkpoint label is a `Secret`).
const SHARED_DATA: [&str; 5] = ["clock", "config", "runtime::container", "vocab", "redact"];

/// Whether a file of agent/src (its path relative to it) is decision code: a feature's
/// `model*`/`policy*` file (tests aside), or the shared data decision code reads.
fn is_decision(path: &str) -> bool {
    let Some((dir, file)) = path.rsplit_once('/') else {
        return false;
    };
    let stem = file.trim_end_matches(".rs");
    (FEATURES.contains(&dir)
        && (stem.starts_with("model") || stem.starts_with("policy"))
        && !stem.ends_with("_tests"))
        || path == "runtime/container.rs"
        || path.starts_with("vocab/")
}

/// The module a decision file is (`accel/gpu/policy.rs` → `accel::gpu::policy`).
pub(crate) fn module_of(path: &str) -> String {
    path.trim_end_matches(".rs").trim_end_matches("/mod").replace('/', "::")
}

/// The `crate::…` paths the code of `text` names (comments and its `#[cfg(test)]` part left out).
pub(crate) fn crate_paths(text: &str) -> Vec<String> {
    paths_after(text, "crate::").into_iter().map(|(_, path)| path).collect()
}

/// Each path the code of `text` names after `prefix` (comments and its `#[cfg(test)]` part left
/// out): the text from the prefix on (to count `super::super::`), and the path after the
/// prefixes.
fn paths_after<'t>(text: &'t str, prefix: &str) -> Vec<(&'t str, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let mut rest = line.split("//").next().unwrap_or("");
        while let Some(i) = rest.find(prefix) {
            let from = &rest[i..];
            let mut tail = &from[prefix.len()..];
            while let Some(t) = tail.strip_prefix(prefix) {
                tail = t;
            }
            let path: String = tail
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push((from, path.trim_end_matches(':').to_string()));
            rest = tail;
        }
    }
    out
}

#[test]
fn the_crate_is_a_folder_per_feature_over_shared_infrastructure() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert_eq!(found, TOP, "agent/src's top is not the map of lib.rs");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    for entry in TOP {
        let module = entry.trim_end_matches(".rs");
        assert!(
            matches!(module, "lib" | "main") || lib.contains(&format!("`{module}`")),
            "lib.rs's map does not name `{module}`"
        );
    }
}

#[test]
fn every_feature_holds_its_decisions_beside_its_loop() {
    let files = sources();
    for feature in FEATURES {
        let decisions: Vec<&String> = files
            .iter()
            .map(|(p, _)| p)
            .filter(|p| p.starts_with(&format!("{feature}/")) && is_decision(p))
            .collect();
        assert!(!decisions.is_empty(), "{feature}/ has no decision file (model*.rs, policy*.rs)");
    }
}

/// What decision code must never write: I/O, a clock read, a process or the environment. A
/// decision takes `now` and its observations as arguments and returns what to do.
const EFFECTS: [&str; 14] = [
    "async fn",
    ".await",
    "tokio::",
    "std::fs",
    "std::net",
    "std::process",
    "std::env",
    "std::thread",
    "SystemClock",
    "Instant::now",
    "SystemTime::now",
    "println!",
    "eprintln!",
    "tracing::",
];

/// The effects (see [`EFFECTS`]) in the code of `text`, comments and its `#[cfg(test)]` part left
/// out, as `line: effect`.
fn effects_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        out.extend(EFFECTS.iter().filter(|e| code.contains(*e)).map(|e| format!("{}: {e}", n + 1)));
    }
    out
}

#[test]
fn the_checks_see_io_clock_reads_and_imports_and_skip_comments_and_tests() {
    let text = "use crate::coord::Keys;\nfn a(now: i64) {}\n// std::fs::read is fine in a comment, crate::app too\nfn b() { let t = Instant::now(); }\nasync fn c() {}\n#[cfg(test)]\nmod tests { fn d() { std::fs::read(\"x\"); crate::app::run(); } }\n";
    assert_eq!(effects_in(text), ["4: Instant::now", "5: async fn"]);
    assert_eq!(crate_paths(text), ["coord::Keys"]);
    assert!(is_decision("accel/gpu/policy_xid.rs") && is_decision("hang/model.rs"));
    assert!(!is_decision("hang/policy_tests.rs") && !is_decision("config/policy.rs"));
    assert!(!is_decision("cycle/agent.rs") && !is_decision("policy.rs"));
}

/// The one rule of decision code: it does no I/O and reads no clock — `now` is handed in — so
/// every decision is a unit test with a fixed time; and it names only other decision code and
/// the shared data, so no effect comes in through a call either.
#[test]
fn decision_functions_do_no_io_and_take_now() {
    let files = sources();
    let decisions: Vec<String> =
        files.iter().filter(|(p, _)| is_decision(p)).map(|(p, _)| module_of(p)).collect();
    let allowed = |path: &str| {
        SHARED_DATA
            .iter()
            .map(|s| s.to_string())
            .chain(decisions.iter().cloned())
            .any(|m| path == m || path.starts_with(&format!("{m}::")))
            // A feature's own folder module names its decision modules (`crate::accel::gpu`).
            || FEATURES.iter().any(|f| f.replace('/', "::") == path)
    };
    let mut bad = Vec::new();
    for (path, text) in files.iter().filter(|(p, _)| is_decision(p)) {
        bad.extend(effects_in(text).into_iter().map(|e| format!("{path}:{e}")));
        bad.extend(
            crate_paths(text)
                .into_iter()
                .filter(|p| !allowed(p))
                .map(|p| format!("{path}: crate::{p}")),
        );
    }
    assert!(bad.is_empty(), "decision code with effects or adapters: {bad:?}");
}

#[test]
fn redact_is_a_leaf() {
    // Every module redacts its outputs with it (config, coord, alerts, cli): it imports none.
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/redact.rs"))
        .unwrap();
    let paths = crate_paths(&text);
    assert!(paths.is_empty(), "redact.rs imports {paths:?}");
}

#[test]
fn the_wiring_never_imports_the_cli() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/app");
    let mut read = 0;
    let mut bad: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        read += 1;
        bad.extend(
            crate_paths(&text)
                .into_iter()
                .filter(|p| p == "cli" || p.starts_with("cli::"))
                .map(|p| format!("{}: {p}", path.display())),
        );
    }
    assert!(read >= 3, "app/ holds the wiring's files");
    assert!(bad.is_empty(), "app/ imports the CLI that calls it: {bad:?}");
}

/// The paths agent/Cargo.toml declares for `[[kind]]` targets, relative to the workspace root.
fn declared(kind: &str) -> Vec<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let table: toml::Table = std::fs::read_to_string(manifest).unwrap().parse().unwrap();
    table
        .get(kind)
        .and_then(|t| t.as_array())
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("path").and_then(|p| p.as_str()))
        .map(|p| p.trim_start_matches("../").to_string())
        .collect()
}

/// The `.rs` files directly in `dir` (relative to the workspace root), as `dir/name.rs`.
fn rust_files(dir: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out: Vec<String> = std::fs::read_dir(root.join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "rs"))
        .map(|p| format!("{dir}/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    out.sort();
    out
}

/// The `.rs` files of `dir` that run nowhere: neither declared (`declared`) nor a module
/// (`mod name;`) of a declared file.
fn run_nowhere(dir: &str, declared: &[String]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let texts: Vec<String> =
        declared.iter().filter_map(|f| std::fs::read_to_string(root.join(f)).ok()).collect();
    rust_files(dir)
        .into_iter()
        .filter(|f| !declared.contains(f))
        .filter(|f| {
            let stem = Path::new(f).file_stem().unwrap().to_string_lossy().to_string();
            let line = format!("mod {stem};");
            !texts.iter().any(|t| t.lines().any(|l| l.trim() == line))
        })
        .collect()
}

#[test]
fn every_test_file_is_declared_so_it_runs() {
    let binaries = declared("test");
    assert!(
        binaries.len() <= 4,
        "at most four integration-test binaries (each links the whole dependency tree): \
         make a new suite a module of one of them: {binaries:?}"
    );
    let missing = run_nowhere("tests", &binaries);
    assert!(
        missing.is_empty(),
        "agent/Cargo.toml has autotests = false, so these never run until a declared [[test]] \
         binary names them as a module (`mod name;`; helpers belong in tests/common/): {missing:?}"
    );
    // The benchmarks are examples; a file a benchmark includes (`mod server;`) is a helper.
    let missing = run_nowhere("tests/bench", &declared("example"));
    assert!(
        missing.is_empty(),
        "benchmarks that are neither declared as [[example]] nor included by one: {missing:?}"
    );
}

/// Every `redis-server` the tests, benchmarks and scripts start gets a directory of its own
/// (`--dir`, or the process's `current_dir`), so no `dump.rdb` lands in the checkout.
#[test]
fn every_redis_server_runs_in_a_directory_of_its_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    let mut stack = vec![root.join("tests"), root.join("scripts")];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs" || x == "sh") {
                files.push(p);
            }
        }
    }
    let mut bad = Vec::new();
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        let rust = p.extension().is_some_and(|x| x == "rs");
        let starts: Vec<usize> = if rust {
            text.match_indices("Command::new(\"redis-server\")").map(|(i, _)| i).collect()
        } else {
            text.match_indices("redis-server --")
                .map(|(i, _)| i)
                .filter(|&i| text[..i].ends_with('\n') || text[..i].ends_with(' '))
                .filter(|&i| !text[..i].trim_end_matches(' ').ends_with('#'))
                .collect()
        };
        for i in starts {
            // The command: up to `.spawn()` in Rust, up to the first line without a `\`
            // continuation in a script.
            let rest = &text[i..];
            let end = if rust {
                rest.find(".spawn()").unwrap_or(rest.len())
            } else {
                let mut end = 0;
                for line in rest.split_inclusive('\n') {
                    end += line.len();
                    if !line.trim_end().ends_with('\\') {
                        break;
                    }
                }
                end
            };
            let command = &rest[..end];
            if !command.contains("--dir") && !command.contains("current_dir") {
                let line = text[..i].lines().count() + 1;
                bad.push(format!("{}:{line}", p.display()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "redis-server started without a directory of its own (it would write dump.rdb into \
         the working directory): {bad:?}"
    );
}

/// Every source file of agent/src as its module path (`hang::restart::command`; a `mod.rs`
/// is its folder's module), with the module paths its code (tests aside) names after `crate::`.
pub(crate) fn module_references() -> Vec<(String, Vec<String>)> {
    sources()
        .into_iter()
        .map(|(path, text)| {
            let module = module_of(&path);
            let mut refs = crate_paths(&text);
            // A test file's `super` is the module that includes it, not its folder.
            if !path.trim_end_matches(".rs").ends_with("tests") {
                refs.extend(super_paths(&module, &text));
            }
            (module, refs)
        })
        .collect()
}

/// The `super::…` paths the code of `text` (a file of module `module`) names, made whole
/// (`super::nvml::field` in `accel::gpu::probe` would be `accel::gpu::nvml::field`): siblings
/// import each other that way, and a circle of two siblings is a circle.
pub(crate) fn super_paths(module: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (mut from, path) in paths_after(text, "super::") {
        // `super::super::x` climbs twice.
        let mut base: Vec<&str> = module.split("::").collect();
        while let Some(t) = from.strip_prefix("super::") {
            base.pop();
            from = t;
        }
        base.extend(path.split("::").filter(|p| !p.is_empty()));
        out.push(base.join("::"));
    }
    out
}

#[test]
fn super_paths_are_made_whole_from_the_module_that_names_them() {
    let text = "use super::nvml::field;\nuse super::{Container, Other};\nfn a() { super::super::clock::now(); }\n// super::gone in a comment\n#[cfg(test)]\nmod tests { use super::*; }\n";
    assert_eq!(
        super_paths("accel::gpu::probe", text),
        ["accel::gpu::nvml::field", "accel::gpu", "accel::clock::now"]
    );
}

/// Issue 17's promise: no two modules of agent/src import each other, directly or round a
/// longer circle (a module's own children and parents aside).
#[test]
fn no_import_circle_between_modules() {
    let files = module_references();
    let names: std::collections::BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let owner = |path: &str| -> Option<String> {
        let parts: Vec<&str> = path.split("::").collect();
        (1..=parts.len()).rev().map(|k| parts[..k].join("::")).find(|c| names.contains(c))
    };
    let related =
        |a: &str, b: &str| a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"));
    let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        names.iter().map(|n| (n.clone(), Default::default())).collect();
    for (m, refs) in &files {
        for r in refs {
            if let Some(t) = owner(r).filter(|t| t != m && !related(t, m)) {
                edges.get_mut(m).unwrap().insert(t);
            }
        }
    }
    // Depth-first search for a back edge; the circle is printed from the stack.
    fn visit(
        n: &str,
        edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        state: &mut std::collections::HashMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for t in &edges[n] {
            match state.get(t.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|s| s == t).unwrap();
                    let mut circle = stack[from..].to_vec();
                    circle.push(t.clone());
                    return Some(circle);
                }
                0 => {
                    if let Some(c) = visit(t, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = std::collections::HashMap::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            let circle = visit(n, &edges, &mut state, &mut Vec::new());
            assert!(circle.is_none(), "import circle: {}", circle.unwrap().join(" -> "));
        }
    }
}

/// Every `.rs` file under agent/src, with its path relative to it.
pub(crate) fn sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(&root).unwrap().display().to_string();
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    out
}

/// Small modules: no source file over 600 lines (tests included: a file that big wants a
/// `_tests.rs` beside it or a split by concern).
#[test]
fn no_source_file_is_over_600_lines() {
    let big: Vec<(String, usize)> = sources()
        .into_iter()
        .map(|(p, text)| (p, text.lines().count()))
        .filter(|&(_, n)| n > 600)
        .collect();
    assert!(big.is_empty(), "split these files: {big:?}");
}

/// Where each `fn` of `text` starts and how many lines it spans, up to the first
/// `#[cfg(test)]` (test code is exempt). A body ends at the first `}` line at the `fn`'s own
/// indentation; a declaration without a body (a trait's) ends at its `;`.
fn fn_lengths(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .iter()
        .position(|l| l.trim_start().starts_with("#[cfg(test)]"))
        .unwrap_or(lines.len());
    let mut out = Vec::new();
    let mut i = 0;
    while i < end {
        let line = lines[i];
        let code = line.trim_start();
        let indent = &line[..line.len() - code.len()];
        let sig = code
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ")
            .trim_start_matches("const ")
            .trim_start_matches("async ")
            .trim_start_matches("unsafe ");
        let Some(rest) = sig.strip_prefix("fn ") else {
            i += 1;
            continue;
        };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let mut j = i;
        let mut body = false;
        while j < end {
            let l = lines[j].trim_end();
            body |= l.contains('{');
            let closes = if j == i {
                l.ends_with('}') || (!body && l.ends_with(';'))
            } else {
                l == format!("{indent}}}") || (!body && l.ends_with(';'))
            };
            if closes {
                break;
            }
            j += 1;
        }
        out.push((name, j - i + 1));
        i = j + 1;
    }
    out
}

#[test]
fn fn_lengths_are_measured_from_signature_to_closing_brace() {
    let text = "fn a() {}\npub async fn b(\n    x: u8,\n) -> u8 {\n    x\n}\n    fn c(&self);\n#[cfg(test)]\nfn t() {\n}\n";
    assert_eq!(fn_lengths(text), vec![("a".into(), 1), ("b".into(), 5), ("c".into(), 1)]);
}

/// Functions outside tests fit on a screen: at most 60 lines (issue 43). `_tests.rs` files are
/// exempt; a folder's `tests.rs` keeps the earlier bound of 80 lines.
#[test]
fn no_function_outside_tests_is_over_60_lines() {
    let mut long = Vec::new();
    for (path, text) in sources() {
        if path.ends_with("_tests.rs") {
            continue;
        }
        let most = if path.ends_with("/tests.rs") { 80 } else { 60 };
        for (name, n) in fn_lengths(&text) {
            if n > most {
                long.push(format!("{path}: {name} ({n} lines)"));
            }
        }
    }
    assert!(long.is_empty(), "split these functions: {long:?}");
}
