//! The agent heartbeat and the fleet view: each agent writes its node record (with a TTL) and
//! touches a sorted-set index, so listing the fleet never needs `KEYS` or a full `SCAN`.
//! `vigil status` (and a training controller polling `--json`) reads them back, and a slice is
//! available only when every node of it is healthy and none is in maintenance (seed 003).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::clock::{human, ms, Millis};
use crate::coord::{Coordinator, Keys, Op, Result};
use crate::fleet::{gangs, lost};
use crate::hang::policy_gang::Timing;

/// Index entries older than this are pruned (a node gone for a day is forgotten).
pub(crate) const INDEX_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// What one agent publishes about its node.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NodeRecord {
    pub node: String,
    /// The node's pool: `fleet.pool`, else the Node's `cloud.google.com/gke-nodepool` label.
    pub pool: String,
    /// The node's slice: `fleet.slice`, else the pool of a multi-host TPU slice; empty: none.
    pub slice: String,
    /// Provisioning model from the Node's labels: `standard`, `spot`, `preemptible`,
    /// `flex-start` or GKE's own value; empty when unknown.
    pub provisioning: String,
    /// Accelerator type from the Node's labels (`cloud.google.com/gke-accelerator`, else
    /// `cloud.google.com/gke-tpu-accelerator`); empty when none.
    pub accelerator: String,
    /// `cloud.google.com/gke-tpu-topology`, e.g. `2x2x4`; empty when none.
    pub tpu_topology: String,
    /// Maintenance phase: none, pending, ongoing, terminating.
    pub maintenance: String,
    /// Which sources report the maintenance: `metadata`, `node-labels`,
    /// `metadata+node-labels`; empty when none does.
    pub maintenance_source: String,
    /// When the scheduled maintenance's window starts (ms since the epoch), when one is known.
    pub maintenance_window: Option<Millis>,
    /// GPU health: healthy, degraded, failed, or unknown (no NVML).
    pub gpu: String,
    /// Since when the container runtime cannot list the workers (the coordinator's clock: the
    /// agent's first outage cycle that reached it, or its predecessor's); `None` while it can. While it is down, `workers`, `places` and
    /// `gangs` are as last shown: nothing is known of them now.
    pub runtime_down: Option<Millis>,
    /// Worker id → verdict.
    pub workers: BTreeMap<String, String>,
    /// Worker id → where it runs: `namespace/pod/container` on Kubernetes nodes, the container
    /// name on Docker.
    pub places: BTreeMap<String, String>,
    /// Worker id → its gang (`<id>` or `<id>|<gang_size>`), for the workers that name one.
    pub gangs: BTreeMap<String, String>,
    pub version: String,
    pub dry_run: bool,
    /// Coordinator clock, ms.
    pub updated_at: Millis,
    /// Seconds lost per cause in the last 24 hours (`vigil_lost_seconds_total`'s causes).
    pub lost: BTreeMap<String, f64>,
    /// The hourly ledger behind `lost` (hour since the epoch → cause → seconds), so an agent
    /// restart takes it up again.
    #[serde(skip)]
    pub lost_hours: crate::metrics::LostLedger,
}

impl NodeRecord {
    /// The record as its Redis hash holds it: each field its JSON, but a string bare and a
    /// `None` empty (`runtime_down` while the runtime is up).
    pub(crate) fn fields(&self) -> Vec<(String, String)> {
        let Ok(Value::Object(map)) = serde_json::to_value(self) else { return Vec::new() };
        let hours = serde_json::to_string(&self.lost_hours).unwrap_or_else(|_| "{}".into());
        map.into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => (k, s),
                Value::Null => (k, String::new()),
                v => (k, v.to_string()),
            })
            .chain([("lost_hours".into(), hours)])
            .collect()
    }

    pub(crate) fn from_fields(f: &std::collections::HashMap<String, String>) -> Option<NodeRecord> {
        let get = |k: &str| f.get(k).cloned().unwrap_or_default();
        Some(NodeRecord {
            node: f.get("node")?.clone(),
            pool: get("pool"),
            slice: get("slice"),
            provisioning: get("provisioning"),
            accelerator: get("accelerator"),
            tpu_topology: get("tpu_topology"),
            maintenance_source: get("maintenance_source"),
            maintenance_window: get("maintenance_window").parse().ok(),
            maintenance: f.get("maintenance").cloned().unwrap_or_else(|| "none".into()),
            gpu: f.get("gpu").cloned().unwrap_or_else(|| "unknown".into()),
            runtime_down: get("runtime_down").parse().ok(),
            workers: serde_json::from_str(&get("workers")).unwrap_or_default(),
            places: serde_json::from_str(&get("places")).unwrap_or_default(),
            gangs: serde_json::from_str(&get("gangs")).unwrap_or_default(),
            version: get("version"),
            dry_run: get("dry_run") == "true",
            updated_at: get("updated_at").parse().unwrap_or(0),
            lost: serde_json::from_str(&get("lost")).unwrap_or_default(),
            lost_hours: serde_json::from_str(&get("lost_hours")).unwrap_or_default(),
        })
    }
}

/// Write this node's record and refresh its index entry.
pub async fn publish(
    coord: &dyn Coordinator,
    keys: &Keys,
    rec: &NodeRecord,
    ttl: Duration,
) -> Result<()> {
    coord.batch(&publish_ops(keys, rec, ttl, Upkeep::ALL)).await.map(drop)
}

/// What a publication writes besides the record and its index entry, when it is due: the
/// node's place in the slice map and the pruning of the fleet index. Neither changes from one
/// cycle to the next, so a cycle writes them now and then (`crate::fleet::heartbeat`), not 2
/// of a healthy cycle's commands every time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upkeep {
    /// Write the node's `[pool, slice]` in the slice map.
    pub place: bool,
    /// Drop the index's members silent past the retention.
    pub prune: bool,
}

impl Upkeep {
    pub const ALL: Upkeep = Upkeep { place: true, prune: true };
    #[cfg(any(test, feature = "bench"))]
    pub const NONE: Upkeep = Upkeep { place: false, prune: false };
}

/// The node's `[pool, slice]` as the slice map holds it.
pub(crate) fn place_value(rec: &NodeRecord) -> String {
    serde_json::json!([rec.pool, rec.slice]).to_string()
}

/// The writes that publish a node record: the record itself (with its TTL), its entry in the
/// fleet index, and what `upkeep` says is due — the node's slice, the index's pruning of nodes
/// silent past the retention.
pub fn publish_ops(keys: &Keys, rec: &NodeRecord, ttl: Duration, upkeep: Upkeep) -> Vec<Op> {
    let mut ops = vec![Op::Hset { key: keys.agent(), fields: rec.fields(), ttl: Some(ttl) }];
    if upkeep.place {
        // The slice outlives the record, so a node that went silent still counts against it.
        let fields = vec![(rec.node.clone(), place_value(rec))];
        ops.push(Op::Hset { key: keys.fleet_slices(), fields, ttl: None });
    }
    ops.push(Op::IndexTouch {
        key: keys.fleet_nodes(),
        member: rec.node.clone(),
        score: rec.updated_at,
        prune_before: upkeep.prune.then(|| rec.updated_at - ms(INDEX_RETENTION)),
    });
    ops
}

/// A node as the fleet view shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct NodeView {
    pub(crate) node: String,
    /// healthy, unhealthy, maintenance, unknown (its runtime cannot list its workers), or down
    /// (no live heartbeat record).
    pub(crate) health: &'static str,
    pub(crate) last_seen: Millis,
    pub(crate) record: Option<NodeRecord>,
}

/// Verdicts that make a node unhealthy for the slice view.
const BAD_VERDICTS: &[&str] = &["hung", "errored", "gpu-failed", "tpu-failed", "unreachable"];

pub(crate) fn health(rec: Option<&NodeRecord>) -> &'static str {
    match rec {
        None => "down",
        Some(r) if r.maintenance != "none" => "maintenance",
        Some(r) if r.gpu == "failed" => "unhealthy",
        // NB: a worker last seen hung stays a reason (its restart may be what wedged the
        // runtime).
        Some(r) if r.workers.values().any(|v| BAD_VERDICTS.contains(&v.as_str())) => "unhealthy",
        // NB: its workers are as last seen, not as they are: never counted healthy (an idle
        // node's opportunistic maintenance counts its pool's healthy nodes), nor unhealthy (its
        // slice stays available: Vigil lost sight of the training, the training did not stop).
        Some(r) if r.runtime_down.is_some() => "unknown",
        Some(_) => "healthy",
    }
}

/// A node's last known (pool, slice).
pub(crate) type Places = BTreeMap<String, (String, String)>;

/// Read every indexed node (prefix-wide), and each node's last known pool and slice.
pub(crate) async fn read(coord: &dyn Coordinator, prefix: &str) -> Result<(Vec<NodeView>, Places)> {
    let fleet = Keys::new(prefix, "-");
    let placed = coord.hgetall(&fleet.fleet_slices()).await?;
    let place = |(node, v): (String, String)| Some((node, serde_json::from_str(&v).ok()?));
    let last_slice: Places = placed.into_iter().filter_map(place).collect();
    let members = coord.index_members(&fleet.fleet_nodes()).await?;
    let record_keys: Vec<String> =
        members.iter().map(|(node, _)| Keys::new(prefix, node).agent()).collect();
    let records = coord.hgetall_many(&record_keys).await?;
    let mut out = Vec::with_capacity(members.len());
    for ((node, last_seen), fields) in members.into_iter().zip(records) {
        let rec = NodeRecord::from_fields(&fields);
        out.push(NodeView { health: health(rec.as_ref()), node, last_seen, record: rec });
    }
    out.sort_by(|a, b| a.node.cmp(&b.node));
    Ok((out, last_slice))
}

/// `/v1/status`'s answer on the agent's read-only port: [`report`] with the gang rules' durations.
pub(crate) struct StatusPage {
    pub(crate) timing: Timing,
}

#[async_trait::async_trait]
impl crate::http::server::StatusReport for StatusPage {
    async fn report(&self, coord: &dyn Coordinator, prefix: &str, json: bool) -> Result<String> {
        report(coord, prefix, json, &self.timing).await
    }
}

/// `vigil status`, as text or as JSON (`{"at", "nodes", "slices", "gangs", "lost"}`): read from `coord`, which is
/// Redis for the CLI and whatever the agent runs on (the embedded coordinator included) when the
/// agent's server answers `GET /v1/status`.
pub(crate) async fn report(
    coord: &dyn Coordinator,
    prefix: &str,
    json: bool,
    timing: &Timing,
) -> Result<String> {
    let now = coord.time().await?;
    let (views, last_slice) = read(coord, prefix).await?;
    let slices = slices(&views, &last_slice);
    let records = || views.iter().filter_map(|v| v.record.as_ref());
    let tags = records().flat_map(|r| r.gangs.values().cloned());
    let gangs = gangs::views(coord, prefix, timing, tags, now).await?;
    let lost_by_pool = lost::by_pool(records().map(|r| (r.pool.as_str(), &r.lost)));
    Ok(if json {
        let body = serde_json::json!({
            "at": now, "nodes": views, "slices": slices, "gangs": gangs, "lost": lost_by_pool
        });
        format!("{}\n", serde_json::to_string_pretty(&body).unwrap_or_default())
    } else {
        render(&views, &slices, now) + &lost::render(&lost_by_pool) + &gangs::render(&gangs, now)
    })
}

/// One slice's availability.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct SliceView {
    pub(crate) slice: String,
    pub(crate) pool: String,
    pub(crate) nodes: usize,
    pub(crate) healthy: usize,
    pub(crate) unhealthy: usize,
    pub(crate) maintenance: usize,
    pub(crate) down: usize,
    /// Nodes whose runtime cannot list their workers.
    pub(crate) unknown: usize,
    /// Every node healthy (or unknown) and none in maintenance.
    pub(crate) available: bool,
}

/// Group nodes by slice. A down node keeps its last known slice from the index-only view: it
/// is counted under the slice its last record named, or `-` when that is gone too.
pub(crate) fn slices(views: &[NodeView], places: &Places) -> Vec<SliceView> {
    // NB: keyed by (pool, slice): the same slice name in two pools is two slices. A down node
    // is placed by the pool and slice its last record named.
    let mut by: BTreeMap<(String, String), SliceView> = BTreeMap::new();
    for v in views {
        let (pool, slice) = match &v.record {
            Some(r) => (r.pool.clone(), r.slice.clone()),
            None => places.get(&v.node).cloned().unwrap_or_else(|| (String::new(), "-".into())),
        };
        if slice.is_empty() {
            continue;
        }
        let key = (pool.clone(), slice.clone());
        let e = by.entry(key).or_insert_with(|| SliceView { slice, pool, ..Default::default() });
        e.nodes += 1;
        match v.health {
            "healthy" => e.healthy += 1,
            "maintenance" => e.maintenance += 1,
            "down" => e.down += 1,
            "unknown" => e.unknown += 1,
            _ => e.unhealthy += 1,
        }
        e.available = e.healthy + e.unknown == e.nodes;
    }
    by.into_values().collect()
}

/// The human table printed by `vigil status`.
pub(crate) fn render(views: &[NodeView], slices: &[SliceView], now: Millis) -> String {
    if views.is_empty() {
        return "no agents have reported (is REDIS_URL the fleet's Redis, and the prefix right?)\n"
            .into();
    }
    let head = ["NODE", "POOL", "SLICE", "PROVISIONING", "ACCELERATOR", "TOPOLOGY", "HEALTH"];
    let mut out = node_row(head, ["MAINTENANCE", "SOURCE", "GPU", "SEEN", "workers"]);
    for v in views {
        let cells = match &v.record {
            Some(r) => [
                r.pool.as_str(),
                r.slice.as_str(),
                r.provisioning.as_str(),
                r.accelerator.as_str(),
                r.tpu_topology.as_str(),
                r.maintenance.as_str(),
                r.maintenance_source.as_str(),
                r.gpu.as_str(),
            ],
            None => ["?"; 8],
        };
        let [pool, slice, prov, accel, topo, maint, source, gpu] = cells.map(or_dash);
        let workers = v.record.as_ref().map(|r| workers_cell(r, now)).unwrap_or_default();
        let seen = format!("{} ago", human(now - v.last_seen));
        let head = [v.node.as_str(), pool, slice, prov, accel, topo, v.health];
        out.push_str(&node_row(head, [maint, source, gpu, &seen, &workers]));
    }
    out.push_str(&slices_table(slices));
    out
}

/// One line of the nodes' table.
fn node_row([a, b, c, d, e, f, g]: [&str; 7], [h, i, j, k, l]: [&str; 5]) -> String {
    format!("{a:<24} {b:<12} {c:<12} {d:<12} {e:<18} {f:<9} {g:<12} {h:<12} {i:<21} {j:<9} {k:<10} {l}\n")
}

/// The slices' table under the nodes' (nothing without a slice).
fn slices_table(slices: &[SliceView]) -> String {
    if slices.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\n{:<16} {:<12} {:>5} {:>7} {:>9} {:>11} {:>4} {:>7}  available\n",
        "SLICE", "POOL", "NODES", "HEALTHY", "UNHEALTHY", "MAINTENANCE", "DOWN", "UNKNOWN"
    );
    for s in slices {
        let SliceView { nodes, healthy, unhealthy, maintenance, down, unknown, .. } = s;
        let (slice, pool) = (&s.slice, or_dash(&s.pool));
        let available = if s.available { "yes" } else { "NO" };
        out.push_str(&format!(
            "{slice:<16} {pool:<12} {nodes:>5} {healthy:>7} {unhealthy:>9} {maintenance:>11} {down:>4} {unknown:>7}  {available}\n"
        ));
    }
    out
}

/// `worker=verdict@place …` of a record; while its runtime is down, said first, the verdicts
/// being as last seen.
fn workers_cell(r: &NodeRecord, now: Millis) -> String {
    let down = r.runtime_down.map(|t| human(now.saturating_sub(t)));
    let down = down.map(|d| format!("(runtime down for {d}; as last seen:) ")).unwrap_or_default();
    let place = |w: &String| r.places.get(w).map(|p| format!("@{p}")).unwrap_or_default();
    let cells: Vec<_> = r.workers.iter().map(|(w, v)| format!("{w}={v}{}", place(w))).collect();
    format!("{down}{}", cells.join(" "))
}

fn or_dash(s: &str) -> &str {
    Some(s).filter(|s| !s.is_empty()).unwrap_or("-")
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
