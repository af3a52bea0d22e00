//! `vigil drill checkpoint`: a checkpoint drill of a gang, a worker or a node's workers
//! (`crate::maintenance::drill`), its verdict printed one line per budget. Exits 0 when every
//! member acknowledged (within the `--require`d budget), 1 when one did not, 2 on a config
//! error, 3 when the drill could not run (refused beside a real request, interrupted by a real
//! notice, Redis unreachable).

use clap::{ArgGroup, Args};

use super::{failed, CliError, ConfigArg};
use crate::config::Config;
use crate::coord::redis::RedisCoordinator;
use crate::maintenance::drill::{self, Target};
use crate::maintenance::policy_round::verdict;

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").args(["gang", "worker", "node"])))]
pub(crate) struct CheckpointDrill {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Drill every member of this gang, on every node (the gang id of its records or pod
    /// labels, e.g. `ml/llama-70b`).
    #[arg(long, value_name = "GANG", value_parser = super::gang_id)]
    pub(crate) gang: Option<String>,
    /// Drill one worker: `NODE/WORKER`, or `WORKER` of this node.
    #[arg(long, value_name = "[NODE/]WORKER")]
    pub(crate) worker: Option<String>,
    /// Drill every worker of this node (the default: this node).
    #[arg(long, value_name = "NODE")]
    pub(crate) node: Option<String>,
    /// How long to wait for the acknowledgements (default: the maintenance budget, the
    /// tightest among the members' nodes).
    #[arg(long, value_name = "DURATION", value_parser = wait)]
    pub(crate) wait: Option<std::time::Duration>,
    /// Exit 1 unless every member acknowledged within this budget too: `preemption` or
    /// `maintenance` (for a CI job that gates on the drill).
    #[arg(long, value_enum, value_name = "BUDGET")]
    pub(crate) require: Option<Budget>,
}

/// A budget a drill can be required to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Budget {
    Preemption,
    Maintenance,
}

/// `--wait`: a duration up to a day.
fn wait(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("a duration like 90s or 5m: {e}"))?;
    if d.is_zero() || d > drill::MAX_WAIT {
        return Err("a duration above 0 and at most 1 day".into());
    }
    Ok(d)
}

/// `--node` and the node of `--worker`: a node name as the agents take it.
fn node_name(flag: &str, n: &str) -> Result<String, CliError> {
    let why = "is no node name (at most 253 characters of a-z A-Z 0-9 . - _)";
    let valid = crate::config::valid_node_name(n);
    valid.then(|| n.to_string()).ok_or_else(|| failed(format!("{flag}: {n:?} {why}")))
}

/// The target the flags name.
fn target(cfg: &Config, d: &CheckpointDrill) -> Result<Target, CliError> {
    if let Some(g) = &d.gang {
        return Ok(Target::Gang(g.clone()));
    }
    if let Some(w) = &d.worker {
        let (node, worker) = w.split_once('/').unwrap_or((cfg.node_name.as_str(), w.as_str()));
        let worker = super::worker_id(worker).map_err(|e| failed(format!("--worker {w}: {e}")))?;
        return Ok(Target::Worker { node: node_name("--worker", node)?, worker });
    }
    let node = d.node.as_deref().unwrap_or(&cfg.node_name);
    Ok(Target::Node(node_name("--node", node)?))
}

pub(super) async fn run(cfg: &Config, d: &CheckpointDrill) -> Result<(), CliError> {
    if cfg.embedded() {
        return Err(CliError::Unable("a drill writes the members' records in Redis and waits for their acks there: set REDIS_URL (or redis.url) to the agents' Redis".into()));
    }
    let target = target(cfg, d)?;
    let coord =
        RedisCoordinator::from_config(&cfg.redis).map_err(|e| CliError::Unable(e.to_string()))?;
    let ran = drill::run(&coord, cfg, &target, d.wait).await;
    let result = ran.map_err(|e| CliError::Unable(format!("drill of {}: {e}", target.label())))?;
    println!("{}", verdict(&result).join("\n"));
    let (name, missing, asked) = (&result.target, result.missing.len(), result.asked);
    if missing > 0 {
        let why = format!("drill of {name}: {missing} of {asked} member(s) did not acknowledge");
        return Err(failed(why));
    }
    let (budget, fits) = match d.require {
        Some(Budget::Preemption) => ("preemption", result.fits_preemption),
        Some(Budget::Maintenance) => ("maintenance", result.fits_maintenance),
        None => return Ok(()),
    };
    let why = format!("drill of {name}: it does not fit the {budget} budget (--require {budget})");
    fits.then_some(()).ok_or_else(|| failed(why))
}
