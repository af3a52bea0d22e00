//! The gang simulation's coordinator (`super::gang`): the shared store behind an outage switch,
//! and the planted mutants' lies — each breaks one gang invariant, to show the harness catches it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use vigil::coord::{read_workers_by_parts, CoordError, Coordinator, Keys, Reply, Request};

use super::hgetall_many_by_parts;

/// A bug planted in what the agents are told, to show the harness catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GangMutant {
    /// Members' entries lose their heartbeats: nobody looks like progressing.
    ProgressHidden,
    /// Members' entries lose what would block a decision (`sd`, `br`).
    BlockersHidden,
    /// Every gang alert claim succeeds: nothing is de-duplicated.
    AlertsNotDeduplicated,
    /// The cooldown claim is invisible: a restarted member looks hung again at once.
    CooldownUnseen,
    /// The gang's run of fruitless restarts reads as absent: restarts that do not help go on.
    FruitlessForgotten,
    /// The gang's run reads as if its last restart were far in the future: no beat ever shows
    /// progress, so restarts that help are refused too.
    FruitlessNeverEnds,
    /// A decision of one member for all reads, to every agent, as naming that agent's own
    /// member: each carries it out (`executable` ignoring the decision's member).
    EveryMemberNamed,
    /// The slow line drawn above the job's pace (`gang.pace.slow_fraction` 1.1): jitter reads
    /// as a slowdown.
    SlowLineAbovePace,
    /// Members' entries lose their compute time (`cmp`): the evidence that names the slow member
    /// never reaches the page.
    ComputeHidden,
    /// While a gang's slow episode is open its members' heartbeats read as stopped when it
    /// began: a slow job taken for a hung one.
    SlowTakenForHung,
    /// Issue 46: the members' agents read as agreeing on learned evidence when they do not —
    /// an entry without a learned rule (`lr`) reads with another member's: a gang restarted on
    /// the learned rhythm though one member's agent holds none.
    AgreementForged,
    /// Issue 45: an agent starting over does not find the slow episode it opened — each
    /// agent's first read of a gang's slow key answers nothing: its opener, restarted, never
    /// takes the episode back, and the episode lapses and is paged again. (Each gang's key's
    /// first read: an agent resumes each of its members.)
    EpisodeNotFound,
    /// A member's own restart's line (`gang-line`) reads as absent: its old incarnation's beat
    /// in a slow restart (`super::gang_restart`) reads as the gang's progress, ends its run of
    /// fruitless restarts, and one restart too many goes through.
    LineUnseen,
}

impl GangMutant {
    #[allow(dead_code)]
    pub const ALL: [GangMutant; 13] = [
        GangMutant::ProgressHidden,
        GangMutant::BlockersHidden,
        GangMutant::AlertsNotDeduplicated,
        GangMutant::CooldownUnseen,
        GangMutant::FruitlessForgotten,
        GangMutant::FruitlessNeverEnds,
        GangMutant::EveryMemberNamed,
        GangMutant::SlowLineAbovePace,
        GangMutant::ComputeHidden,
        GangMutant::SlowTakenForHung,
        GangMutant::AgreementForged,
        GangMutant::EpisodeNotFound,
        GangMutant::LineUnseen,
    ];
}

/// The agents' coordinator: the shared store, gone while `down`, and the mutant's lies.
pub struct Faulty {
    pub inner: Arc<dyn Coordinator>,
    pub down: Arc<AtomicBool>,
    pub mutant: Option<GangMutant>,
    /// The agent's node (`EveryMemberNamed` names its member).
    pub node: String,
    /// `EpisodeNotFound`: the slow keys this agent has read once.
    pub read_slow: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// A one-member decision (`<ms>:<incident>|<node>/<worker>`) naming `node`'s member of the gang
/// whose decision key `key` is: the gang's worker on that node (`rank-g<i>` for gang `ml/<x>`).
fn named_here(key: &str, value: &str, node: &str) -> String {
    let Some((decision, _)) = value.split_once('|') else {
        return value.to_string();
    };
    let g = if key.contains("{ml/a}") { 0 } else { 1 };
    format!("{decision}|{node}/rank-g{g}")
}

fn hides(mutant: Option<GangMutant>, key: &str) -> bool {
    match mutant {
        Some(GangMutant::CooldownUnseen) => key.ends_with(":cooldown"),
        Some(GangMutant::FruitlessForgotten) => is_gang_run(key),
        Some(GangMutant::LineUnseen) => key.ends_with(":gang-line"),
        _ => false,
    }
}

fn is_gang_run(key: &str) -> bool {
    key.contains(":gang:{") && key.ends_with(":fruitless")
}

/// `<count>:<since>:<last>:<past>` with `last` far in the future.
fn never_ends(run: &str) -> String {
    let mut parts: Vec<String> = run.split(':').map(str::to_string).collect();
    if let Some(last) = parts.get_mut(2) {
        *last = (i64::MAX / 4).to_string();
    }
    parts.join(":")
}

/// `AgreementForged`: the view's entries without a learned rule given another entry's.
fn forge_agreement(h: HashMap<String, String>) -> HashMap<String, String> {
    let parse = |v: &String| serde_json::from_str::<serde_json::Value>(v).unwrap_or_default();
    let Some(lr) = h.values().map(parse).find_map(|e| e.get("lr").cloned()) else {
        return h;
    };
    h.into_iter()
        .map(|(f, v)| {
            let mut e = parse(&v);
            if let Some(o) = e.as_object_mut() {
                o.entry("lr").or_insert(lr.clone());
            }
            (f, e.to_string())
        })
        .collect()
}

impl Faulty {
    /// `SlowTakenForHung`: the slow gang member's record, its heartbeat frozen at the start of
    /// the gang's open slow episode (`<since>:<rate>:<baseline>|…`).
    async fn slow_taken_for_hung(&self, key: String) -> Result<Reply, CoordError> {
        let slow = Keys::new("vigil", &self.node).gang_slow(super::gang_slow::SLOW_GANG);
        let episode = self.inner.get(&slow).await?;
        let since = episode
            .as_deref()
            .and_then(|v| v.split(':').next())
            .and_then(|s| s.parse::<i64>().ok());
        let reply = self.inner.execute(Request::Hgetall(key)).await?;
        match (reply, since) {
            (Reply::Hash(mut h), Some(since)) => {
                h.insert("heartbeat".into(), vigil::coord::heartbeat_value(since));
                Ok(Reply::Hash(h))
            }
            (other, _) => Ok(other),
        }
    }
}

#[async_trait]
impl Coordinator for Faulty {
    fn describe(&self) -> String {
        "gang simulation".into()
    }
    async fn execute(&self, request: Request) -> Result<Reply, CoordError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(CoordError::Timeout {
                addr: "sim".into(),
                timeout: Duration::from_secs(1),
            });
        }
        let m = self.mutant;
        match request {
            // By parts, so the lies below reach every read.
            Request::ReadWorkers(workers) => {
                read_workers_by_parts(self, &workers).await.map(Reply::Workers)
            }
            Request::HgetallMany(keys) => {
                hgetall_many_by_parts(self, &keys).await.map(Reply::Hashes)
            }
            Request::GetMany(keys) => {
                let reply = self.inner.execute(Request::GetMany(keys.clone())).await?;
                match reply {
                    Reply::Values(mut v) => {
                        for (k, val) in keys.iter().zip(v.iter_mut()) {
                            if hides(m, k) {
                                *val = None;
                            }
                            if m == Some(GangMutant::FruitlessNeverEnds) && is_gang_run(k) {
                                *val = val.as_deref().map(never_ends);
                            }
                            if m == Some(GangMutant::EpisodeNotFound)
                                && k.ends_with(":slow")
                                && self
                                    .read_slow
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .insert(k.clone())
                            {
                                *val = None;
                            }
                            if m == Some(GangMutant::EveryMemberNamed)
                                && k.contains(":gang:{")
                                && k.ends_with(":decision")
                            {
                                *val = val.as_deref().map(|v| named_here(k, v, &self.node));
                            }
                        }
                        Ok(Reply::Values(v))
                    }
                    other => Ok(other),
                }
            }
            Request::Hgetall(key)
                if m == Some(GangMutant::SlowTakenForHung) && key.ends_with(":status:rank-g2") =>
            {
                self.slow_taken_for_hung(key).await
            }
            Request::Hgetall(key)
                if matches!(
                    m,
                    Some(
                        GangMutant::BlockersHidden
                            | GangMutant::ProgressHidden
                            | GangMutant::ComputeHidden
                    )
                ) && key.ends_with(":members") =>
            {
                let reply = self.inner.execute(Request::Hgetall(key)).await?;
                match reply {
                    Reply::Hash(h) => Ok(Reply::Hash(
                        h.into_iter()
                            .map(|(f, v)| {
                                let mut e: serde_json::Value =
                                    serde_json::from_str(&v).unwrap_or_default();
                                if let Some(o) = e.as_object_mut() {
                                    let hide: &[&str] = match m {
                                        Some(GangMutant::ProgressHidden) => &["hb"],
                                        Some(GangMutant::ComputeHidden) => &["cmp"],
                                        _ => &["sd", "br"],
                                    };
                                    for f in hide {
                                        o.remove(*f);
                                    }
                                }
                                (f, e.to_string())
                            })
                            .collect(),
                    )),
                    other => Ok(other),
                }
            }
            Request::Hgetall(key)
                if m == Some(GangMutant::AgreementForged) && key.ends_with(":members") =>
            {
                match self.inner.execute(Request::Hgetall(key)).await? {
                    Reply::Hash(h) => Ok(Reply::Hash(forge_agreement(h))),
                    other => Ok(other),
                }
            }
            Request::SetNx { key, value, ttl }
                if (m == Some(GangMutant::AlertsNotDeduplicated)
                    && key.contains(":gang:{")
                    && key.contains(":alert:"))
                    || (m == Some(GangMutant::CooldownUnseen) && key.ends_with(":cooldown")) =>
            {
                self.inner.execute(Request::SetNx { key, value, ttl }).await?;
                Ok(Reply::Done(true))
            }
            other => self.inner.execute(other).await,
        }
    }
}
