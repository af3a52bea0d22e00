//! Bounded fuzzing of every parser that reads input from outside the agent: the config file,
//! worker status records, the metadata server's values and its upcoming-maintenance JSON, CRI
//! log lines, and the status API's request bodies.
//!
//! A stable fuzz toolchain (`cargo fuzz` needs nightly) cannot run in CI here, so this is
//! proptest: each target starts from a committed corpus (`agent/fuzz-corpus/<target>/`) and
//! mutates it — bytes inserted, deleted, replaced, corpus entries spliced — next to fully random
//! input. The property is always "no panic" plus what the parser promises (bounded fields, an
//! error that says something). `VIGIL_FUZZ_CASES` sets the cases per target (2,000 by default,
//! a few seconds in CI); `bash scripts/fuzz.sh` runs longer. A failing input is shrunk and kept
//! under `agent/proptest-regressions/`, which is committed and replayed first on every run.

use std::collections::HashMap;
use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config as Runner, FileFailurePersistence};

use crate::config::Config;
use crate::hang::model::{WorkerStatus, MAX_FIELD};
use crate::maintenance::metadata::parse::{
    parse_maintenance_event, parse_preempted, parse_upcoming,
};
use crate::runtime::cri_log;
use crate::worker_api::status_fields;

fn runner() -> Runner {
    let cases =
        std::env::var("VIGIL_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    Runner {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Runner::default()
    }
}

/// The committed corpus of `target`, one input per file.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz-corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> =
        files.iter().map(|f| std::fs::read(f).expect("corpus file")).collect();
    assert!(!inputs.is_empty(), "empty corpus {}", dir.display());
    inputs
}

/// One edit of a mutation: (kind, position, byte).
type Edit = (u8, usize, u8);

fn mutate(seeds: &[Vec<u8>], pick: usize, other: usize, edits: &[Edit]) -> Vec<u8> {
    let mut b = seeds[pick % seeds.len()].clone();
    for &(kind, pos, byte) in edits {
        let at = if b.is_empty() { 0 } else { pos % (b.len() + 1) };
        match kind % 5 {
            0 => b.insert(at, byte),
            1 if at < b.len() => {
                b.remove(at);
            }
            2 if at < b.len() => b[at] = byte,
            3 => {
                // Splice in a piece of another corpus entry.
                let o = &seeds[other % seeds.len()];
                let from = pos % (o.len() + 1);
                let piece = &o[from..(from + 1 + byte as usize).min(o.len())];
                b.splice(at..at, piece.iter().copied());
            }
            _ => b.truncate(at),
        }
    }
    b
}

/// Corpus-based mutations, and plain random bytes.
fn input(target: &str) -> BoxedStrategy<Vec<u8>> {
    let seeds = corpus(target);
    let mutated = (any::<usize>(), any::<usize>(), prop::collection::vec(any::<Edit>(), 0..12))
        .prop_map(move |(pick, other, edits)| mutate(&seeds, pick, other, &edits));
    prop_oneof![
        4 => mutated,
        1 => prop::collection::vec(any::<u8>(), 0..600),
    ]
    .boxed()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn fuzz_config_loader() {
    let mut r = proptest::test_runner::TestRunner::new(runner());
    r.run(&input("config"), |b| {
        match Config::parse(&text(&b), Path::new("fuzz.toml")) {
            Ok(cfg) => {
                if let Err(e) = cfg.validate() {
                    prop_assert!(!e.to_string().is_empty());
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty(), "an error says what is wrong"),
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn fuzz_worker_record() {
    let keys = prop_oneof![
        Just("state".to_string()),
        Just("heartbeat".to_string()),
        Just("job".to_string()),
        Just("progress".to_string()),
        Just("checkpoint_ack".to_string()),
        "[a-z_]{0,12}",
    ];
    let record = prop::collection::vec((keys, input("record")), 0..8);
    let mut r = proptest::test_runner::TestRunner::new(runner());
    r.run(&record, |pairs| {
        let fields: HashMap<String, String> =
            pairs.into_iter().map(|(k, v)| (k, text(&v))).collect();
        if let Some(s) = WorkerStatus::from_fields(&fields) {
            // Worker-supplied text is bounded before it reaches logs, alerts and webhooks.
            let bound = MAX_FIELD + 4;
            prop_assert!(s.job.as_ref().is_none_or(|j| j.len() <= bound));
            prop_assert!(s.progress.as_ref().is_none_or(|p| p.len() <= bound));
            prop_assert!(s.state.as_str().len() <= bound);
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn fuzz_metadata_values() {
    let mut r = proptest::test_runner::TestRunner::new(runner());
    r.run(&input("metadata"), |b| {
        let body = text(&b);
        if let Ok(e) = parse_maintenance_event(&body) {
            prop_assert_eq!(e.as_str(), body.trim(), "only exact values are accepted");
        }
        let _ = parse_preempted(&body);
        Ok(())
    })
    .unwrap();
}

#[test]
fn fuzz_upcoming_maintenance_json() {
    let mut r = proptest::test_runner::TestRunner::new(runner());
    r.run(&input("upcoming"), |b| {
        if let Err(e) = parse_upcoming(&text(&b)) {
            // The error quotes a bounded snippet of what was received, never all of it.
            prop_assert!(e.to_string().len() < 2_000, "{}", e.to_string().len());
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn fuzz_cri_log_lines() {
    let mut r = proptest::test_runner::TestRunner::new(runner());
    r.run(&(input("cri-log"), 0usize..20), |(b, lines)| {
        let t = text(&b);
        for line in t.lines() {
            if let Some(rec) = cri_log::parse_line(line) {
                prop_assert!(line.starts_with(rec.time));
                prop_assert!(line.ends_with(rec.message));
                prop_assert!(matches!(rec.stream, "stdout" | "stderr"));
            }
        }
        let out = cri_log::tail(&t, lines);
        prop_assert!(out.lines().count() <= lines.max(1));
        Ok(())
    })
    .unwrap();
}

#[test]
fn fuzz_status_api_bodies() {
    let mut r = proptest::test_runner::TestRunner::new(runner());
    r.run(&input("status-body"), |b| {
        match status_fields(&b) {
            Ok(write) => {
                prop_assert!(!write.fields.is_empty());
                let known = ["state", "job", "progress", "checkpoint_ack", "grace", "ranks"];
                // A rank's own fields carry its number (`state@3`).
                let name = |k: &str| k.split('@').next().unwrap_or_default().to_string();
                prop_assert!(write.fields.iter().all(|(k, _)| known.contains(&name(k).as_str())));
            }
            Err((code, why)) => {
                prop_assert_eq!(code.as_u16(), 400);
                prop_assert!(!why.is_empty());
            }
        }
        Ok(())
    })
    .unwrap();
}
