//! What a worker says about itself and what Vigil remembers about it, in the coordinator:
//! the status record a worker publishes, and the shared marks (timers, cooldown, episodes).
//! Data only: the decisions on it are in `crate::hang::policy`.

use std::collections::HashMap;

use serde::{Deserialize, Deserializer};

use crate::clock::{Millis, Stamp};
use crate::runtime::container::ALERT_ONLY;

/// What a worker says about itself: its status record (Redis hash or local status API).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WorkerStatus {
    pub(crate) state: WorkerState,
    /// Last beat, on the coordinator's clock. `None` when the field is missing or unreadable.
    pub(crate) heartbeat: Option<Millis>,
    pub(crate) job: Option<String>,
    pub(crate) progress: Option<String>,
    /// How long (ms) the worker said it may stay silent after this heartbeat (a long operation:
    /// a compile, a checkpoint save); `None` = `policy.stale_after`. The policy caps it.
    pub(crate) grace: Option<Millis>,
    /// The worker says its restarts belong to someone else (`restarts = alert-only`).
    pub(crate) alert_only: bool,
    /// For a container of several ranks (one process per GPU: torchrun), the rank this status
    /// is — the worst one, which the container's verdict is — and how many there are.
    pub(crate) rank: Option<(u32, u32)>,
    /// The collective the worker is a member of (its record's `gang` and `gang_size`): the
    /// ranks of one distributed job across nodes.
    pub(crate) gang: Option<Gang>,
    /// The step of the worker's last durable checkpoint (its record's `checkpoint_step`).
    pub(crate) checkpoint_step: Option<u64>,
    /// How long (ms) the worker's last step computed before its collective (its record's
    /// `compute_ms`): in a slow gang the rank that computes longest is the one the others wait
    /// for (fail-slow, `crate::hang::policy_pace`).
    pub(crate) compute: Option<Millis>,
}

/// A distributed job's collective as a member's record names it: an id unique in the fleet and,
/// when the worker says so, how many members it expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gang {
    pub(crate) id: String,
    pub(crate) size: Option<u32>,
}

/// The most members a gang may say it has.
pub(crate) const MAX_GANG: u32 = 65_536;

/// The documented rule for a gang id: 1–253 characters of `[A-Za-z0-9._/-]` (a Kubernetes
/// namespace and a job name joined by `/` fit). No `:` and no braces: it will name Redis keys.
pub(crate) fn valid_gang_id(id: &str) -> bool {
    is_word(id, 253, &['/'])
}

/// A record's `gang_size`: a whole number from 1 to [`MAX_GANG`].
pub(crate) fn parse_gang_size(text: &str) -> Option<u32> {
    text.trim().parse().ok().filter(|n: &u32| (1..=MAX_GANG).contains(n))
}

/// A record's gang (the container's fields `gang` and `gang_size`); `None` without a valid id.
/// NB: a record written straight to Redis is not checked where it enters: an invalid id is no
/// gang, never a key name; the worker API, `vigil beat` and the Python client refuse one.
pub(crate) fn gang_of(fields: &HashMap<String, String>) -> Option<Gang> {
    let id = fields.get("gang").map(|g| g.trim()).filter(|g| valid_gang_id(g))?;
    let size = fields.get("gang_size").and_then(|n| parse_gang_size(n));
    Some(Gang { id: id.to_string(), size })
}

/// The most ranks one container's record may hold (one process per accelerator: 8 or 16 GPUs,
/// with room); past it the record is read as one process's.
pub(crate) const MAX_RANKS: u32 = 32;

/// How many ranks a record says its container runs (`ranks`, 1 to [`MAX_RANKS`]); `None` for
/// an ordinary one-process record (or a value out of bounds).
pub(crate) fn ranks(fields: &HashMap<String, String>) -> Option<u32> {
    fields.get("ranks")?.trim().parse().ok().filter(|n: &u32| (1..=MAX_RANKS).contains(n))
}

/// The record field of `rank` for `field`: `state@3` (the field itself without a rank). `@` is
/// in no worker id or field name, so the rank is read back unambiguously.
pub(crate) fn rank_field(field: &str, rank: Option<u32>) -> String {
    rank.map_or_else(|| field.to_string(), |r| format!("{field}@{r}"))
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum WorkerState {
    Idle,
    #[default]
    Processing,
    Error,
    /// Any other state a worker reports (e.g. `loading`, `compile`): watched like
    /// `processing` (stale after `policy.stale_after` or its announced grace), never errored.
    Other(String),
}

impl WorkerState {
    pub(crate) fn parse(s: &str) -> WorkerState {
        match s.trim().to_ascii_lowercase().as_str() {
            "idle" => WorkerState::Idle,
            "processing" => WorkerState::Processing,
            "error" => WorkerState::Error,
            other => WorkerState::Other(bounded(other, MAX_FIELD)),
        }
    }
    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &str {
        match self {
            WorkerState::Idle => "idle",
            WorkerState::Processing => "processing",
            WorkerState::Error => "error",
            WorkerState::Other(s) => s,
        }
    }
}

impl WorkerStatus {
    /// Read the record's fields. `heartbeat` is seconds since the epoch (decimals allowed) on the
    /// coordinator's clock; an unreadable heartbeat is kept as `None` so the verdict can say so.
    pub(crate) fn from_fields(fields: &HashMap<String, String>) -> Option<WorkerStatus> {
        Self::read(fields, None)
    }

    /// A `processing` record with `heartbeat` and nothing else (the default state).
    #[cfg(test)]
    pub(crate) fn processing(heartbeat: Option<Millis>) -> WorkerStatus {
        WorkerStatus { heartbeat, ..WorkerStatus::default() }
    }

    /// The ranks of a container whose processes each publish their own fields (`ranks = N`,
    /// then `state@r`, `heartbeat@r`, `progress@r`, `grace@r` for r in 0..N; `job` and
    /// `restarts` are the container's). `None` for an ordinary one-process record. A rank that
    /// wrote nothing yet is there, with no heartbeat: it is not guessed to be fine.
    pub(crate) fn ranks_from_fields(fields: &HashMap<String, String>) -> Option<Vec<WorkerStatus>> {
        let n = ranks(fields)?;
        let of_rank = |r| {
            let s = Self::read(fields, Some(r)).unwrap_or_else(|| Self::container_wide(fields));
            let job = s.job.or_else(|| Self::text(fields, "job"));
            WorkerStatus { job, rank: Some((r, n)), ..s }
        };
        Some((0..n).map(of_rank).collect())
    }

    fn text(fields: &HashMap<String, String>, k: &str) -> Option<String> {
        // NB: worker-supplied text goes into log lines, alerts and webhooks: bounded, so a
        // 5 MB `job` field costs nothing downstream.
        fields.get(k).filter(|v| !v.is_empty()).map(|v| bounded(v, MAX_FIELD))
    }

    /// What the container's own fields say of each of its processes (its restarts, its gang, the
    /// step of its last durable checkpoint: `checkpoint_step`), on a `processing` record that
    /// says nothing else: a rank that wrote nothing yet is that, with no heartbeat.
    fn container_wide(fields: &HashMap<String, String>) -> WorkerStatus {
        let alert_only = fields.get("restarts").is_some_and(|v| v.trim() == ALERT_ONLY);
        let checkpoint_step = fields.get("checkpoint_step").and_then(|s| s.trim().parse().ok());
        Self { alert_only, gang: gang_of(fields), checkpoint_step, ..Self::default() }
    }

    /// One process's status: the container's one, or rank `rank`'s (its fields `state@r`...).
    fn read(fields: &HashMap<String, String>, rank: Option<u32>) -> Option<WorkerStatus> {
        let f = |k: &str| rank_field(k, rank);
        // NB: a record holding only the agent's checkpoint fields (a worker that never
        // published) is still "no record": the worker has said nothing about itself.
        let said = fields.contains_key(&f("state")) || fields.contains_key(&f("heartbeat"));
        said.then(|| WorkerStatus {
            state: WorkerState::parse(fields.get(&f("state")).map(String::as_str).unwrap_or("")),
            heartbeat: fields.get(&f("heartbeat")).and_then(|h| seconds_ms(h, f64::INFINITY)),
            job: Self::text(fields, &f("job")),
            progress: Self::text(fields, &f("progress")),
            grace: fields.get(&f("grace")).and_then(|g| parse_grace(g)),
            compute: fields.get(&f("compute_ms")).and_then(|c| parse_compute(c)),
            ..Self::container_wide(fields)
        })
    }
}

/// A record's `compute_ms`: whole milliseconds, at most a day.
pub(crate) fn parse_compute(text: &str) -> Option<Millis> {
    text.trim().parse().ok().filter(|n: &Millis| (0..=86_400_000).contains(n))
}

/// A record's `grace`: seconds (decimals allowed) above zero; anything else is no grace.
pub(crate) fn parse_grace(text: &str) -> Option<Millis> {
    // NB: capped long before f64 -> i64 could overflow; the policy caps it again.
    seconds_ms(text, 1e9)
}

/// `text` as seconds (decimals allowed) above zero, at most `cap`, in ms; anything else is none.
fn seconds_ms(text: &str, cap: f64) -> Option<Millis> {
    let secs = text.trim().parse::<f64>().ok()?;
    (secs.is_finite() && secs > 0.0).then(|| (secs.min(cap) * 1000.0).round() as Millis)
}

/// The documented rule for a worker id (the opt-in label's value): 1–128 characters of
/// `[A-Za-z0-9._-]`. Anything else would be read into Redis key names (a `:` could make another
/// worker's key look like a record), so it is refused where it enters.
pub(crate) fn valid_worker_id(id: &str) -> bool {
    is_word(id, 128, &[])
}

/// A worker state as a worker may write it: 1–64 characters of `[A-Za-z0-9._-]`.
pub(crate) fn valid_state(state: &str) -> bool {
    is_word(state, 64, &[])
}

/// `s` is 1 to `max` characters of `[A-Za-z0-9._-]` and `extra`: the one rule behind worker
/// ids, states and gang ids, which all end up in key names or log lines.
fn is_word(s: &str, max: usize, extra: &[char]) -> bool {
    (1..=max).contains(&s.len())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c) || extra.contains(&c))
}

/// Longest worker-supplied text kept from a record (`job`, `progress`, an unknown state).
pub(crate) const MAX_FIELD: usize = 256;

/// `s` cut to at most `max` bytes on a character boundary, with `…` when cut.
pub(crate) fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let cut = (0..=max).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
    format!("{}…", &s[..cut])
}

/// The shared marks Vigil keeps per worker in the coordinator (never in process memory).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Marks {
    /// First observation of a stale heartbeat: (the heartbeat seen, when it was seen).
    pub(crate) suspect: Option<(Millis, Millis)>,
    /// The incident timer: start time and id, set once with SET NX (first observer wins).
    pub(crate) incident: Option<Incident>,
    /// When the record was first seen in state `error`.
    pub(crate) error_since: Option<Millis>,
    /// Last progress marker seen and when it last changed.
    pub(crate) progress: Option<(String, Millis)>,
    /// A cooldown marker exists: we restarted this worker recently.
    pub(crate) cooldown: bool,
    /// When we last restarted it (kept past the cooldown, for escalation).
    pub(crate) restarted_at: Option<Millis>,
    /// The "restart did not help" page has been sent for the last restart.
    pub(crate) escalated: bool,
    /// Alert-only episodes currently open (their alert has been sent).
    pub(crate) episodes: Vec<Episode>,
    /// Failed restarts so far and when the next may run, for the incident they belong to.
    pub(crate) retry: Option<Retry>,
    /// Our restarts in a row that brought no progress past where the worker stopped.
    pub(crate) fruitless: Option<Fruitless>,
    /// The silences it came back from, as the coordinator keeps them (`policy.learned`).
    pub(crate) rhythm: Option<crate::hang::model_rhythm::History>,
    /// Its last gang restart's line: its beats up to then never end the gang's run of
    /// fruitless restarts (`crate::coord::Keys::gang_line`).
    pub(crate) gang_line: Option<Millis>,
}

/// Restarts in a row that did not help (`crate::hang::policy_fruitless`), stored as
/// `<count>:<since_ms>:<last_ms>:<past>[:<job>]` (`past` `-` when the worker's progress is no
/// number; `job` when its record named one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fruitless {
    pub(crate) count: u32,
    /// The first restart of the run.
    pub(crate) since: Millis,
    /// The last one.
    pub(crate) last: Millis,
    /// The furthest the worker had got when it stopped (its numeric progress or checkpoint
    /// step), when it publishes a number.
    pub(crate) past: Option<u64>,
    /// The `job` its record named at the run's restarts: a record naming another is a new job
    /// under the same worker id, which this run says nothing of.
    pub(crate) job: Option<String>,
}

impl Fruitless {
    pub(crate) fn encode(&self) -> String {
        let past = self.past.map_or("-".to_string(), |p| p.to_string());
        let job = self.job.as_ref().map_or(String::new(), |j| format!(":{j}"));
        format!("{}:{}:{}:{past}{job}", self.count, self.since, self.last)
    }

    pub(crate) fn decode(text: &str) -> Option<Fruitless> {
        // NB: five parts at most: a job name may hold `:` (an older agent reads four).
        let mut it = text.splitn(5, ':');
        let count = it.next()?.parse().ok()?;
        let (since, last) = (it.next()?.parse().ok()?, it.next()?.parse().ok()?);
        // `-`: no number; anything else that is not one: no run.
        let past =
            Some(it.next()?).filter(|p| *p != "-").map(str::parse::<u64>).transpose().ok()?;
        let job = it.next().map(str::to_string);
        Some(Fruitless { count, since, last, past, job })
    }
}

/// The restarts of one incident that failed, and the earliest time of the next try.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Retry {
    pub(crate) incident: String,
    pub(crate) failures: u32,
    pub(crate) not_before: Millis,
}

/// An incident timer (`"<start_ms>:<incident_id>"`, a [`Stamp`]): a worker's, or a gang's
/// (`crate::hang::model_gang::GangState::incident`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Incident {
    pub(crate) started: Millis,
    pub(crate) id: String,
}

impl Incident {
    pub(crate) fn decode(s: &str) -> Option<Incident> {
        Stamp::parse(s).map(|s| Incident { started: s.at, id: s.rest })
    }
    pub(crate) fn encode(&self) -> String {
        Stamp::new(self.started, &self.id).to_string()
    }
}

/// Alert-only conditions: each alerts once when it begins and closes when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum Episode {
    Unreachable,
    Stalled,
    GpuFailed,
    TpuFailed,
    Paused,
    Exited,
}

as_str!(pub Episode);

/// The verdict on one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
#[derive(Default, serde::Serialize, strum::EnumString)]
#[serde(into = "&'static str")]
pub enum Verdict {
    /// Fresh heartbeat, or not processing: nothing to do.
    #[default]
    Healthy,
    /// Stale heartbeat seen once: wait for the confirming observation.
    Suspect,
    /// Stale heartbeat while processing, confirmed by a second observation.
    Hung,
    /// In state `error`, not yet for `error_for`.
    ErrorPending,
    /// In state `error` for at least `error_for`.
    Errored,
    /// No usable status record: alert only (the machine may be rebooting or off on purpose).
    Unreachable,
    /// Fresh heartbeat but the progress marker has not moved for `stalled_after`: alert only.
    Stalled,
    /// A cooldown marker exists: this is our own restart booting, not a new incident.
    Booting,
    /// The node has a maintenance or preemption notice: checkpoint path, never a restart.
    InMaintenance,
    /// Would be hung or errored, but the GPU under it has failed: a restart cannot fix hardware.
    GpuFailed,
    /// Would be hung or errored, but the node's TPU has failed: a restart cannot fix hardware.
    TpuFailed,
    /// The container is paused by someone (`docker pause`): their decision, alert only.
    Paused,
    /// The container has exited: alert once, never started by Vigil (someone stopped it, or the
    /// runtime's restart policy decides).
    Exited,
}

impl Verdict {
    pub const ALL: &'static [Verdict] = <Verdict as strum::VariantArray>::VARIANTS;

    /// A verdict another agent wrote (a gang member's entry): a name this build does not know
    /// (a newer agent's) reads as `Unreachable` — neither stopped nor booting, so it blocks a
    /// gang restart rather than joining one it cannot judge.
    pub(crate) fn read_lenient<'de, D: Deserializer<'de>>(d: D) -> Result<Verdict, D::Error> {
        let name = <std::borrow::Cow<'de, str> as Deserialize>::deserialize(d)?;
        Ok(name.parse().unwrap_or(Verdict::Unreachable))
    }
}
as_str!(pub Verdict);

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_record_names_its_gang_and_its_size() {
        let beat = [("state", "processing"), ("heartbeat", "1700000000")];
        let gang = |extra: &[(&str, &str)]| {
            let fields = record(&[&beat[..], extra].concat());
            WorkerStatus::from_fields(&fields).unwrap().gang
        };
        assert_eq!(gang(&[]), None);
        assert_eq!(
            gang(&[("gang", "ml/llama-70b/0"), ("gang_size", "64")]),
            Some(Gang { id: "ml/llama-70b/0".into(), size: Some(64) })
        );
        // A size out of bounds is no size; an id that could name another key is no gang.
        for size in ["0", "65537", "-1", "x", ""] {
            assert_eq!(gang(&[("gang", "g"), ("gang_size", size)]).unwrap().size, None);
        }
        for id in ["", "a:b", "{tag}", "a b", &"x".repeat(254)] {
            assert_eq!(gang(&[("gang", id)]), None, "{id:?}");
        }
        assert!(valid_gang_id(&"x".repeat(253)));
    }

    #[test]
    fn every_rank_of_a_container_is_a_member_of_its_gang() {
        let fields = record(&[
            ("ranks", "2"),
            ("gang", "job-1"),
            ("gang_size", "16"),
            ("state@0", "processing"),
            ("heartbeat@0", "1700000000"),
        ]);
        let ranks = WorkerStatus::ranks_from_fields(&fields).unwrap();
        assert_eq!(ranks.len(), 2);
        for r in ranks {
            assert_eq!(r.gang.as_ref().map(|g| (g.id.as_str(), g.size)), Some(("job-1", Some(16))));
        }
    }
}
