//! `vigil drill checkpoint`: a checkpoint drill of a gang, a worker or a node's workers
//! (`crate::maintenance::drill`), its verdict printed one line per budget. Exits 0 when every
//! member acknowledged, 1 when one did not (or the drill could not run), 2 on a config error.

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
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) wait: Option<std::time::Duration>,
}

/// The target the flags name.
fn target(cfg: &Config, d: &CheckpointDrill) -> Result<Target, CliError> {
    if let Some(g) = &d.gang {
        return Ok(Target::Gang(g.clone()));
    }
    if let Some(w) = &d.worker {
        let (node, worker) = w
            .split_once('/')
            .unwrap_or((cfg.node_name.as_str(), w.as_str()));
        super::worker_id(worker).map_err(|e| CliError::Failed(format!("--worker {w}: {e}")))?;
        if node.is_empty() {
            return Err(CliError::Failed(format!(
                "--worker {w}: the node name is empty"
            )));
        }
        return Ok(Target::Worker {
            node: node.to_string(),
            worker: worker.to_string(),
        });
    }
    Ok(Target::Node(
        d.node.clone().unwrap_or_else(|| cfg.node_name.clone()),
    ))
}

pub(super) async fn run(cfg: &Config, d: &CheckpointDrill) -> Result<(), CliError> {
    if cfg.embedded() {
        return Err(CliError::Failed(
            "a drill writes the members' records in Redis and waits for their acks there: set REDIS_URL (or redis.url) to the agents' Redis".into(),
        ));
    }
    let target = target(cfg, d)?;
    let coord = RedisCoordinator::from_config(&cfg.redis).map_err(failed)?;
    let result = drill::run(&coord, cfg, &target, d.wait)
        .await
        .map_err(|e| CliError::Failed(format!("drill of {}: {e}", target.label())))?;
    for line in verdict(&result) {
        println!("{line}");
    }
    if result.missing.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "drill of {}: {} of {} member(s) did not acknowledge",
            result.target,
            result.missing.len(),
            result.asked
        )))
    }
}
