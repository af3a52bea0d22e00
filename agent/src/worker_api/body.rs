//! A status body as a worker sends it (`PUT /v1/workers/{id}/status`), parsed into the record's
//! fields (pure, fuzzed in `crate::fuzz`): every field a string, a rank's own fields carrying its
//! number, and each bad value refused with a 400 that names the rule.

use axum::http::StatusCode;
use serde::Deserialize;

use crate::hang::model::{
    bounded, parse_compute, parse_gang_size, parse_grace, rank_field, valid_gang_id, MAX_GANG,
    MAX_RANKS,
};

/// Body of `PUT /v1/workers/{id}/status`; `heartbeat` is stamped by the agent. Every field is
/// optional, but at least one must be given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatusBody {
    pub(crate) state: Option<String>,
    pub(crate) job: Option<String>,
    /// The distributed job's collective this worker is a member of, and its expected size.
    pub(crate) gang: Option<String>,
    pub(crate) gang_size: Option<String>,
    pub(crate) progress: Option<String>,
    /// Acknowledges a checkpoint request (ideally with its id).
    pub(crate) checkpoint_ack: Option<String>,
    /// The step of the worker's last durable checkpoint: a restart that brings no progress
    /// past it (nor past its progress) counts as fruitless.
    pub(crate) checkpoint_step: Option<String>,
    /// How long the last step computed before its collective (whole ms): the rank that
    /// computes longest is the one a slow gang waits for.
    pub(crate) compute_ms: Option<String>,
    /// Seconds the worker may stay silent after this beat (a long operation); "0" ends it.
    pub(crate) grace: Option<String>,
    /// One process of a container of several (torchrun: one per GPU): its rank, 0-based. Its
    /// fields are its own (`state@3`…), and the container is as healthy as its worst rank.
    /// Refused without `ranks`, as `ranks` is without it.
    pub(crate) rank: Option<String>,
    /// How many ranks the container runs (with `rank`).
    pub(crate) ranks: Option<String>,
}

/// A write, as stored: the record's fields, and the rank it is of (its heartbeat then goes in
/// `heartbeat@<rank>`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatusWrite {
    pub(crate) fields: Vec<(String, String)>,
    pub(crate) rank: Option<u32>,
}

/// The record fields of a status body (pure: fuzzed in `crate::fuzz`), or the answer that says
/// what is wrong with it.
pub(crate) fn status_fields(body: &[u8]) -> Result<StatusWrite, (StatusCode, String)> {
    let parsed: StatusBody = serde_json::from_slice(body).map_err(|e| {
        bad(format!("body must be JSON {{\"state\":..,\"job\":..,\"gang\":..,\"gang_size\":..,\"progress\":..,\"checkpoint_ack\":..,\"checkpoint_step\":..,\"compute_ms\":..,\"grace\":..,\"rank\":..,\"ranks\":..}} (strings): {e}"))
    })?;
    let (rank, ranks) = checked_numbers(&parsed)?;
    // A rank's own fields carry its number; `job`, `gang` and `ranks` are the container's.
    let own = |k: &str| rank_field(k, rank);
    let mut fields: Vec<(String, String)> = [
        (own("state"), parsed.state),
        ("job".to_string(), parsed.job),
        ("gang".to_string(), parsed.gang),
        ("gang_size".to_string(), parsed.gang_size),
        ("checkpoint_step".to_string(), parsed.checkpoint_step),
        (own("progress"), parsed.progress),
        (own("checkpoint_ack"), parsed.checkpoint_ack),
        (own("grace"), parsed.grace.clone()),
        (own("compute_ms"), parsed.compute_ms.clone()),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .collect();
    let why = "give at least one of state, job, gang, gang_size, progress, checkpoint_ack, checkpoint_step, compute_ms, grace";
    if fields.is_empty() {
        return Err(bad(why));
    }
    if let Some(n) = ranks {
        fields.push(("ranks".into(), n.to_string()));
    }
    if let Some(g) = parsed.grace.as_deref() {
        let zero = g.trim().parse::<f64>().is_ok_and(|v| v == 0.0);
        if !zero && parse_grace(g).is_none() {
            return Err(bad(format!(
                "grace must be seconds (e.g. \"1200\"), or \"0\" to end it; got {g:?}"
            )));
        }
    }
    Ok(StatusWrite { fields, rank })
}

/// A field that must be a number or a gang id, the rule it breaks, and its test.
type Rule<'a> = (&'a Option<String>, String, fn(&str) -> bool);

/// The body's rank and ranks, once every field that must be a number or a gang id is one.
fn checked_numbers(body: &StatusBody) -> Result<(Option<u32>, Option<u32>), (StatusCode, String)> {
    let rank = number(body.rank.as_deref(), "rank", 0)?;
    let ranks = number(body.ranks.as_deref(), "ranks", 1)?;
    match (rank, ranks) {
        (Some(r), Some(n)) if r >= n => {
            return Err(bad(format!("rank {r} is not below ranks {n}")));
        }
        (None, Some(_)) => return Err(bad("ranks needs rank (this process's)")),
        // The agent reads a rank's fields (`state@<r>`, `heartbeat@<r>`) only in a record that
        // says how many ranks there are: without `ranks`, a 200 would store beats nothing reads.
        (Some(_), None) => return Err(bad("rank needs ranks (how many the container runs)")),
        _ => {}
    }
    // Each field that must be a number or a gang id, the rule it breaks, and its test.
    let rules: [Rule; 4] = [
        (&body.gang, "gang must be 1-253 characters of [A-Za-z0-9._/-]".into(), valid_gang_id),
        (&body.gang_size, format!("gang_size must be a whole number from 1 to {MAX_GANG}"), |n| {
            parse_gang_size(n).is_some()
        }),
        (&body.checkpoint_step, "checkpoint_step must be a whole number (a step)".into(), |n| {
            n.trim().parse::<u64>().is_ok()
        }),
        (&body.compute_ms, "compute_ms must be whole milliseconds, at most a day".into(), |n| {
            parse_compute(n).is_some()
        }),
    ];
    for (value, rule, valid) in rules {
        if let Some(v) = value.as_deref().filter(|v| !valid(v)) {
            return Err(bad(format!("{rule}; got {:?}", bounded(v, 64))));
        }
    }
    Ok((rank, ranks))
}

fn bad(why: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::BAD_REQUEST, format!("{why}\n"))
}

/// A `rank` or `ranks` field: a whole number from `min` up to `MAX_RANKS`.
fn number(v: Option<&str>, key: &str, min: u32) -> Result<Option<u32>, (StatusCode, String)> {
    let Some(v) = v else { return Ok(None) };
    match v.trim().parse::<u32>() {
        Ok(n) if n >= min && n <= MAX_RANKS => Ok(Some(n)),
        _ => Err(bad(format!("{key} must be a whole number from {min} to {MAX_RANKS}; got {v:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gang_is_the_container_s_field_and_a_bad_one_is_refused_naming_the_rule() {
        let w = status_fields(
            br#"{"state":"processing","gang":"ml/run-1/0","gang_size":"64","rank":"1","ranks":"2"}"#,
        )
        .expect("a valid gang");
        for (k, v) in [("gang", "ml/run-1/0"), ("gang_size", "64"), ("state@1", "processing")] {
            assert!(w.fields.contains(&(k.to_string(), v.to_string())), "{k}: {:?}", w.fields);
        }
        for body in [
            &br#"{"gang":"a:b"}"#[..],
            br#"{"gang":"{tag}"}"#,
            br#"{"gang":"g","gang_size":"0"}"#,
            br#"{"gang":"g","gang_size":"65537"}"#,
        ] {
            let (code, why) = status_fields(body).expect_err("refused");
            assert_eq!(code, axum::http::StatusCode::BAD_REQUEST);
            assert!(why.starts_with("gang"), "{why}");
        }
    }

    /// Issue 31: the step of the last durable checkpoint is the container's field; a value that is
    /// no whole number is refused naming the rule.
    #[test]
    fn a_checkpoint_step_is_a_whole_number_of_the_container() {
        let w =
            status_fields(br#"{"checkpoint_step":"41200","rank":"0","ranks":"2"}"#).expect("valid");
        assert!(w.fields.contains(&("checkpoint_step".to_string(), "41200".to_string())));
        for body in [&br#"{"checkpoint_step":"-1"}"#[..], br#"{"checkpoint_step":"step-7"}"#] {
            let (code, why) = status_fields(body).expect_err("refused");
            assert_eq!(code, axum::http::StatusCode::BAD_REQUEST);
            assert!(why.starts_with("checkpoint_step must be a whole number"), "{why}");
        }
    }

    /// A rank without `ranks` is refused: the agent reads a record without `ranks` as one
    /// process's, so its `state@0`/`heartbeat@0` would be stored but never read.
    #[test]
    fn a_rank_needs_ranks_as_ranks_needs_a_rank() {
        for body in [&br#"{"state":"x","rank":"0"}"#[..], br#"{"state":"x","ranks":"2"}"#] {
            let (code, why) = status_fields(body).expect_err("refused");
            assert_eq!(code, axum::http::StatusCode::BAD_REQUEST);
            assert!(why.contains("ranks"), "{why}");
        }
        let (_, why) = status_fields(br#"{"state":"x","rank":"0"}"#).expect_err("refused");
        assert!(why.starts_with("rank needs ranks"), "{why}");
        let w = status_fields(br#"{"state":"x","rank":"0","ranks":"1"}"#).expect("both given");
        assert_eq!(w.rank, Some(0));
        assert!(w.fields.contains(&("ranks".to_string(), "1".to_string())), "{:?}", w.fields);
    }
}
