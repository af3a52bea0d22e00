//! The layout's promise, checked: data flows one way. `model` imports no other layer; `policy`
//! only `model` (and the shared `clock`/`config`); adapters (`sources`, `coord`, `runtime`,
//! `actions`) and `observe` never import an engine, the CLI or the wiring; `engine` never imports
//! the CLI or the wiring; the wiring (`app`) never imports the CLI that calls it; `observe` never
//! imports `runtime` (the runtime reports to `/readyz` through `observe::server::Probe`); `config`
//! never imports `coord`; `redact` imports nothing of the crate. And the rule of decision code:
//! `model/` and `policy/` do no I/O and read no clock (`now` is handed in).
//!
//! And the test suite's promise: with `autotests = false`, a file in tests/ that agent/Cargo.toml
//! does not declare would silently never run, so every one must be declared.

use std::path::Path;

/// The `use crate::…` / `crate::…::` references of the code (comments left out) in `dir` (a
/// folder of agent/src, or one file such as `app.rs`).
fn references(dir: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut out = Vec::new();
    let mut files = Vec::new();
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        if d.is_file() {
            files.push(d);
            continue;
        }
        for entry in std::fs::read_dir(&d).unwrap() {
            stack.push(entry.unwrap().path());
        }
    }
    assert!(!files.is_empty(), "no source under src/{dir}");
    for p in files {
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
        out.extend(
            EFFECTS
                .iter()
                .filter(|e| code.contains(*e))
                .map(|e| format!("{}: {e}", n + 1)),
        );
    }
    out
}

#[test]
fn the_effects_check_sees_io_and_clock_reads_and_skips_comments_and_tests() {
    let text = "fn a(now: i64) {}\n// std::fs::read is fine in a comment\nfn b() { let t = Instant::now(); }\nasync fn c() {}\n#[cfg(test)]\nmod tests { fn d() { std::fs::read(\"x\"); } }\n";
    assert_eq!(effects_in(text), ["3: Instant::now", "4: async fn"]);
}

/// The one rule of decision code: the data (`model/`) and the decisions (`policy/`) do no I/O
/// and read no clock — `now` is handed in — so every decision is a unit test with a fixed time.
#[test]
fn decision_functions_do_no_io_and_take_now() {
    let bad: Vec<String> = sources()
        .into_iter()
        .filter(|(path, _)| {
            (path.starts_with("policy/") || path.starts_with("model/"))
                && !path.ends_with("_tests.rs")
        })
        .flat_map(|(path, text)| {
            effects_in(&text)
                .into_iter()
                .map(move |e| format!("{path}:{e}"))
        })
        .collect();
    assert!(bad.is_empty(), "decision code with effects: {bad:?}");
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
fn redact_is_a_leaf() {
    // Every layer redacts its outputs with it (config, coord, actions, cli): it imports none.
    assert_only("redact.rs", &[]);
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

#[test]
fn the_engine_never_imports_the_cli_or_the_wiring() {
    let bad: Vec<_> = references("engine")
        .into_iter()
        .filter(|(_, m)| matches!(m.as_str(), "cli" | "app"))
        .collect();
    assert!(
        bad.is_empty(),
        "engine/ imports the CLI or the wiring: {bad:?}"
    );
}

#[test]
fn the_wiring_never_imports_the_cli() {
    let bad: Vec<_> = references("app.rs")
        .into_iter()
        .filter(|(_, m)| m == "cli")
        .collect();
    assert!(
        bad.is_empty(),
        "app.rs imports the CLI that calls it: {bad:?}"
    );
}

#[test]
fn observe_never_imports_the_runtime() {
    let bad: Vec<_> = references("observe")
        .into_iter()
        .filter(|(_, m)| m == "runtime")
        .collect();
    assert!(
        bad.is_empty(),
        "observe/ imports runtime/ (report through observe::server::Probe): {bad:?}"
    );
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
    let texts: Vec<String> = declared
        .iter()
        .filter_map(|f| std::fs::read_to_string(root.join(f)).ok())
        .collect();
    rust_files(dir)
        .into_iter()
        .filter(|f| !declared.contains(f))
        .filter(|f| {
            let stem = Path::new(f)
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .to_string();
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
            text.match_indices("Command::new(\"redis-server\")")
                .map(|(i, _)| i)
                .collect()
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

/// Every source file of agent/src as its module path (`engine::restart::command`; a `mod.rs`
/// is its folder's module), with the module paths its code names after `crate::`.
fn module_references() -> Vec<(String, Vec<String>)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(&src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|l| l == "mod") {
                parts.pop();
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let mut refs = Vec::new();
            for line in text.lines() {
                let mut rest = line.split("//").next().unwrap_or("");
                while let Some(i) = rest.find("crate::") {
                    let tail = &rest[i + 7..];
                    let path: String = tail
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    refs.push(path.trim_end_matches(':').to_string());
                    rest = tail;
                }
            }
            out.push((parts.join("::"), refs));
        }
    }
    out
}

/// Issue 17's promise: no two modules of agent/src import each other, directly or round a
/// longer circle (a module's own children and parents aside).
#[test]
fn no_import_circle_between_modules() {
    let files = module_references();
    let names: std::collections::BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let owner = |path: &str| -> Option<String> {
        let parts: Vec<&str> = path.split("::").collect();
        (1..=parts.len())
            .rev()
            .map(|k| parts[..k].join("::"))
            .find(|c| names.contains(c))
    };
    let related =
        |a: &str, b: &str| a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"));
    let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = names
        .iter()
        .map(|n| (n.clone(), Default::default()))
        .collect();
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
            assert!(
                circle.is_none(),
                "import circle: {}",
                circle.unwrap().join(" -> ")
            );
        }
    }
}

/// Every `.rs` file under agent/src, with its path relative to it.
fn sources() -> Vec<(String, String)> {
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

/// Small modules: no source file over 700 lines (tests included: a file that big wants a
/// `_tests.rs` beside it or a split by concern).
#[test]
fn no_source_file_is_over_700_lines() {
    let big: Vec<(String, usize)> = sources()
        .into_iter()
        .map(|(p, text)| (p, text.lines().count()))
        .filter(|&(_, n)| n > 700)
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
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
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
    assert_eq!(
        fn_lengths(text),
        vec![("a".into(), 1), ("b".into(), 5), ("c".into(), 1)]
    );
}

/// Functions outside tests fit on a screen: at most 80 lines (the demo's scripted scenes and
/// `_tests.rs` files are exempt).
#[test]
fn no_function_outside_tests_is_over_80_lines() {
    let mut long = Vec::new();
    for (path, text) in sources() {
        if path.ends_with("_tests.rs") || path.ends_with("demo.rs") {
            continue;
        }
        for (name, n) in fn_lengths(&text) {
            if n > 80 {
                long.push(format!("{path}: {name} ({n} lines)"));
            }
        }
    }
    assert!(long.is_empty(), "split these functions: {long:?}");
}
