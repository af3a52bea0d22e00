//! Checkpoint drills (`vigil drill checkpoint`): a real checkpoint request, marked as a drill,
//! to a gang, a worker or a node's workers; the time to every acknowledgement measured against
//! the budgets of a preemption and of a maintenance notice. The result goes to the trail of
//! every node asked and to the drills hash of the target's first node, whose agent exports it as
//! metrics (`export_loop`) for the alert rules.
//!
//! A drill only writes the request into the members' records (a worker of the `record` method,
//! the default, finds it there: the worker API's answers carry it, `vigil beat` and the Python
//! client see it; a `signal` or `http` worker is not signalled by a drill): it never signals a
//! container, never stands restarts down and never touches the Node. It refuses to run beside a
//! real round (a gang's open round, a member's unanswered request), and a real notice during it
//! interrupts it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{brief, duration, ms, ticked, Millis};
use crate::config::Config;
use crate::coord::{CoordError, Coordinator, Keys, Op};
use crate::fleet::view::NodeRecord;
use crate::hang::gang_marks::read_view;
use crate::hang::model_gang::{member_id, Member};
use crate::hang::policy_gang::{self as gp, Timing};
use crate::maintenance::gang_round::{asked, fresh, Asked, RoundIo, ROUND_MARGIN};
use crate::maintenance::model_round::{Round, DRILL_REASON};
use crate::maintenance::policy_round::{drill_result, round_budget, verdict};
use crate::maintenance::request::acknowledges;
use crate::metrics::Metrics;
use crate::trail::{Code, Decision};
use crate::vocab::maintenance::DrillResult;

/// How long a drill's result is kept (and exported) after the drill.
const KEPT: Duration = Duration::from_secs(30 * 86_400);
/// The longest a drill waits (`--wait`): a day is already no notice's budget.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(86_400);

/// What a drill asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// Every member of a gang, on every node.
    Gang(String),
    /// One worker of one node.
    Worker { node: String, worker: String },
    /// Every worker a node's agent publishes.
    Node(String),
}

impl Target {
    /// The metric label and the drills hash field: `gang:<id>`, `worker:<node>/<id>`, `node:<n>`.
    pub(crate) fn label(&self) -> String {
        match self {
            Target::Gang(g) => format!("gang:{g}"),
            Target::Worker { node, worker } => format!("worker:{}", member_id(node, worker)),
            Target::Node(n) => format!("node:{n}"),
        }
    }
}

/// Why a drill asked nothing, or cannot report what it measured.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DrillError {
    /// The coordinator could not be read or written.
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// Why not, said to the operator: the target has nobody to ask (no record, no workers, no
    /// members in the view); a round or a request is open on it (a drill never competes with a
    /// real one); or a real notice came during the drill (the workers saved for it, nothing is
    /// recorded).
    #[error("{0}")]
    Unable(String),
}

/// Run a drill: ask, wait up to `wait` (default: the tightest maintenance budget among the
/// members' nodes), measure, record. `Err` says why nothing was asked.
pub(crate) async fn run(
    coord: &dyn Coordinator,
    cfg: &Config,
    target: &Target,
    wait: Option<Duration>,
) -> Result<DrillResult, DrillError> {
    let now = coord.time().await?;
    let (members, view) = members_of(coord, cfg, target, now).await?;
    let io = RoundIo { coord, prefix: &cfg.redis.key_prefix };
    refuse_pending(&io, &members, now, cfg).await?;
    let preemption = round_budget(cfg.checkpoint.preemption_budget, "preemption", &view);
    let maintenance = round_budget(cfg.checkpoint.maintenance_budget, "host-maintenance", &view);
    let wait = wait.unwrap_or(maintenance).min(MAX_WAIT);
    let round = fresh(DRILL_REASON, now, wait, format!("{} (vigil drill)", cfg.node_name), true);
    let gang_key = claim_gang(coord, cfg, &round, target).await?;
    let started = Instant::now();
    io.write_requests(&round, &members).await;
    let acks = io.wait_acks(&round, &members, now, started, started + wait).await;
    if let Some(key) = &gang_key {
        let _ = coord.del_if_owner(key, &round.encode()).await;
    }
    let waited = ms(started.elapsed());
    superseded(&io, &members, &round).await?;
    let result = drill_result(target.label(), now, &acks, waited, preemption, maintenance);
    record(coord, cfg, &members, &result).await;
    Ok(result)
}

/// A gang's drill takes the gang's round key for the round's time (returned, to give back): while
/// it runs, a real notice on a member's node replaces it (its workers save for the notice), and a
/// second drill is refused. Other targets take none.
async fn claim_gang(
    coord: &dyn Coordinator,
    cfg: &Config,
    round: &Round,
    target: &Target,
) -> Result<Option<String>, DrillError> {
    let Target::Gang(g) = target else { return Ok(None) };
    let key = Keys::new(&cfg.redis.key_prefix, &cfg.node_name).gang_checkpoint(g);
    let ttl = duration(round.until - round.at) + ROUND_MARGIN;
    if coord.set_nx(&key, &round.encode(), ttl).await? {
        return Ok(Some(key));
    }
    let label = target.label();
    let open = coord.get(&key).await?.and_then(|t| Round::decode(&t));
    Err(DrillError::Unable(match open {
        Some(Round { reason, by, .. }) => format!("{label} has a checkpoint round open ({reason}, opened by {by}): a drill never competes with a real round; try again when it ends"),
        None => format!("{label} has a checkpoint round open"),
    }))
}

/// A real notice that came during the drill wrote its own request over the drill's: the
/// workers saved for the notice, and the drill measured nothing it can report.
async fn superseded(io: &RoundIo<'_>, members: &[Asked], round: &Round) -> Result<(), DrillError> {
    for (m, rec) in members.iter().zip(&io.records(members.iter()).await?) {
        if rec.get("checkpoint_request").is_some_and(|r| !r.is_empty() && *r != round.id) {
            let reason = rec.get("checkpoint_reason").map_or("", String::as_str);
            let why = format!(
                "interrupted: {} was asked for a real checkpoint ({reason}) during the drill; the workers save for it, and the drill is not recorded",
                member_id(&m.node, &m.worker)
            );
            return Err(DrillError::Unable(why));
        }
    }
    Ok(())
}

/// The members to ask, and the gang's view (for the members' budgets; empty for other targets).
async fn members_of(
    coord: &dyn Coordinator,
    cfg: &Config,
    target: &Target,
    now: Millis,
) -> Result<(Vec<Asked>, Vec<Member>), DrillError> {
    let prefix = cfg.redis.key_prefix.as_str();
    match target {
        Target::Gang(g) => {
            // The gang's members as the fleet view has them now: every shard a gang of any size
            // may use (the size is the members' to say).
            let any_size = Some(gp::MAX_SHARDS * gp::MEMBERS_PER_SHARD);
            let all =
                read_view(coord, &Keys::new(prefix, &cfg.node_name), g, any_size, None).await?;
            let view = gp::present(&all, now, &Timing::of(cfg));
            if view.is_empty() {
                let why = format!("gang {g} has no members in the fleet view: no agent has seen a worker of it lately (a record's `gang`, or its pod's JobSet/Job/LeaderWorkerSet labels)");
                return Err(DrillError::Unable(why));
            }
            let (_, members) = asked(&cfg.node_name, &[], &view);
            Ok((members, view))
        }
        Target::Worker { node, worker } => {
            let rec = coord.hgetall(&Keys::new(prefix, node).status(worker)).await?;
            if rec.is_empty() {
                let why = format!(
                    "worker {} has no status record: it never beat, or the node or worker id is wrong",
                    member_id(node, worker)
                );
                return Err(DrillError::Unable(why));
            }
            Ok((vec![Asked { node: node.clone(), worker: worker.clone() }], Vec::new()))
        }
        Target::Node(node) => {
            let fields = coord.hgetall(&Keys::new(prefix, node).agent()).await?;
            let workers = NodeRecord::from_fields(&fields).map(|r| r.workers).unwrap_or_default();
            if workers.is_empty() {
                let why = format!("node {node} publishes no workers: its agent is not running, or no worker there opted in");
                return Err(DrillError::Unable(why));
            }
            let members = workers.into_keys().map(|worker| Asked { node: node.clone(), worker });
            Ok((members.collect(), Vec::new()))
        }
    }
}

/// A member with a request of its own still unanswered (a real notice's, or another drill's)
/// is not drilled over: the drill would replace the id the worker is saving for.
async fn refuse_pending(
    io: &RoundIo<'_>,
    members: &[Asked],
    now: Millis,
    cfg: &Config,
) -> Result<(), DrillError> {
    let recent = ms(cfg.checkpoint.maintenance_budget + cfg.checkpoint.grace);
    for (m, rec) in members.iter().zip(&io.records(members.iter()).await?) {
        let Some(id) = rec.get("checkpoint_request").filter(|r| !r.is_empty()) else { continue };
        let at: Millis = rec.get("checkpoint_requested_at").map_or(0, |t| t.parse().unwrap_or(0));
        if !acknowledges(rec, id) && now - at < recent {
            let reason = rec.get("checkpoint_reason").map_or("", String::as_str);
            let (who, ago) = (member_id(&m.node, &m.worker), brief(duration(now - at)));
            let why = format!("{who} has a checkpoint request pending ({reason}, {ago} ago, not acknowledged): a drill never competes with a real request; try again when it is answered");
            return Err(DrillError::Unable(why));
        }
    }
    Ok(())
}

/// The result into the trail of every node asked (one line each) and into the drills hash of
/// the target's first node, whose agent exports it. Failures are logged: the verdict was
/// printed already.
async fn record(coord: &dyn Coordinator, cfg: &Config, members: &[Asked], r: &DrillResult) {
    let prefix = cfg.redis.key_prefix.as_str();
    let nodes: std::collections::BTreeSet<&str> = members.iter().map(|m| m.node.as_str()).collect();
    let by = format!("vigil drill on {}", cfg.node_name);
    // One line, the same on every node but for its worker.
    let mut d = Decision {
        at: r.at,
        worker: "*",
        verdict: "drill",
        decision: Code::CheckpointDrill,
        detail: verdict(r).join("; "),
        incident: None,
        agent: &by,
        dry_run: false,
    };
    for node in &nodes {
        // The one member asked on this node, else `*`.
        let here: Vec<&str> =
            members.iter().filter(|m| m.node == *node).map(|m| m.worker.as_str()).collect();
        d.worker = if let [one] = here[..] { one } else { "*" };
        let key = Keys::new(prefix, node).trail();
        if let Err(e) = coord.append(&key, &d.fields(), cfg.redis.trail_max_len).await {
            tracing::warn!(node, error = %e, "cannot write the drill to this node's trail");
        }
    }
    if let Some(owner) = nodes.first() {
        store(coord, prefix, owner, r).await;
    }
}

/// The result into `owner`'s drills, the fleet's index pointed at it, and the target's former
/// result removed from its former node (the gang's first node changed): one exporter per
/// target.
async fn store(coord: &dyn Coordinator, prefix: &str, owner: &str, r: &DrillResult) {
    let keys = Keys::new(prefix, owner);
    let index = keys.fleet_drills();
    let former = coord.hgetall(&index).await.ok().and_then(|mut i| i.remove(&r.target));
    let result = vec![(r.target.clone(), serde_json::to_string(r).unwrap_or_default())];
    let mut ops = vec![
        Op::Hset { key: keys.drills(), fields: result, ttl: Some(KEPT) },
        Op::Hset { key: index, fields: vec![(r.target.clone(), owner.to_string())], ttl: None },
    ];
    if let Some(former) = former.filter(|n| n != owner) {
        let key = Keys::new(prefix, &former).drills();
        ops.push(Op::Hdel { key, fields: vec![r.target.clone()] });
    }
    // NB: a cluster splits the batch per slot; the writes are independent.
    if let Err(e) = coord.batch(&ops).await {
        tracing::warn!(error = %e, "cannot store the drill's result for its metrics");
    }
}

/// Export this node's drills (`Keys::drills`) as metrics, re-read every `every`: a drill run
/// from any machine shows up on the scrape of the target's first node.
pub(crate) async fn export_loop(
    coord: Arc<dyn Coordinator>,
    keys: Keys,
    metrics: Arc<Metrics>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    while ticked(&mut tick, &stop).await {
        match coord.hgetall(&keys.drills()).await {
            Ok(fields) => {
                // NB: without the clock nothing is judged old (nothing removed).
                let now = coord.time().await.ok();
                let (drills, old) = current_drills(&fields, now);
                metrics.drills.set(&drills);
                if !old.is_empty() {
                    let _ = coord.batch(&[Op::Hdel { key: keys.drills(), fields: old }]).await;
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read this node's checkpoint drills"),
        }
    }
}

/// The drills still kept (run within `KEPT` of `now`), and the fields of those older or
/// unreadable, to remove.
fn current_drills(
    fields: &std::collections::HashMap<String, String>,
    now: Option<Millis>,
) -> (Vec<DrillResult>, Vec<String>) {
    let (mut kept, mut old) = (Vec::new(), Vec::new());
    for (target, v) in fields {
        match serde_json::from_str::<DrillResult>(v) {
            Ok(d) if now.is_none_or(|now| now.saturating_sub(d.at) <= ms(KEPT)) => kept.push(d),
            _ => old.push(target.clone()),
        }
    }
    kept.sort_by(|a, b| a.target.cmp(&b.target));
    (kept, old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, SystemClock};
    use crate::coord::memory::MemoryCoordinator;

    /// The agent exports the drills stored at its node, and only those: a drill that did not
    /// fit the preemption budget reads `fits{budget="preemption"} 0`, as the alert rule wants.
    #[tokio::test]
    async fn the_node_s_drills_become_metrics() {
        let coord: Arc<dyn Coordinator> = Arc::new(MemoryCoordinator::new(Arc::new(SystemClock)));
        let keys = Keys::new("vigil", "gpu-0");
        let at = SystemClock.now() - 60_000;
        let d = drill_result(
            "gang:ml/llm".into(),
            at,
            &[crate::maintenance::model_round::MemberAck {
                member: "gpu-0/rank-0".into(),
                acked: Some(41_000),
                state: None,
            }],
            41_000,
            Duration::from_secs(25),
            Duration::from_secs(50),
        );
        let mut stale = d.clone();
        stale.target = "node:gone".into();
        stale.at = at - ms(KEPT) - 1;
        let fields = vec![
            (d.target.clone(), serde_json::to_string(&d).unwrap()),
            (stale.target.clone(), serde_json::to_string(&stale).unwrap()),
            ("worker:x/y".into(), "not json".into()),
        ];
        coord.hset(&keys.drills(), &fields, None).await.unwrap();
        let metrics = Arc::new(Metrics::new());
        let stop = CancellationToken::new();
        let task = tokio::spawn(export_loop(
            coord.clone(),
            keys.clone(),
            metrics.clone(),
            Duration::from_secs(3600),
            stop.clone(),
        ));
        let text = loop {
            let text = metrics.encode();
            if text.contains("vigil_checkpoint_drill_fits{") {
                break text;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        stop.cancel();
        task.await.unwrap();
        let stamp = format!(
            r#"vigil_checkpoint_drill_timestamp_seconds{{target="gang:ml/llm"}} {}"#,
            at / 1000
        );
        for want in [
            r#"vigil_checkpoint_drill_fits{target="gang:ml/llm",budget="preemption"} 0"#,
            r#"vigil_checkpoint_drill_fits{target="gang:ml/llm",budget="maintenance"} 1"#,
            r#"vigil_checkpoint_drill_seconds{target="gang:ml/llm",quantile="0.5"} 41.0"#,
            stamp.as_str(),
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert!(!text.contains("node:gone") && !text.contains("worker:x/y"), "{text}");
        // The old and the unreadable are removed from the node's drills.
        let left = coord.hgetall(&keys.drills()).await.unwrap();
        assert_eq!(left.keys().collect::<Vec<_>>(), vec!["gang:ml/llm"]);
    }
}
