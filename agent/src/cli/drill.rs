//! `vigil drill checkpoint`: a checkpoint drill of a gang, a worker or a node's workers
//! (`crate::maintenance::drill`), its verdict printed one line per budget. Exits 0 when every
//! member acknowledged (within the `--require`d budget), 1 when one did not, 2 on a config
//! error or a malformed flag (a typo in `--node` is no drill verdict), 3 when the drill could not
//! run (refused beside a real request, interrupted by a real notice, Redis unreachable).

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
    #[arg(long, value_name = "[NODE/]WORKER", value_parser = worker_arg)]
    pub(crate) worker: Option<String>,
    /// Drill every worker of this node (the default: this node).
    #[arg(long, value_name = "NODE", value_parser = node_arg)]
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

/// `--node` and the node of `--worker`: a node name as the agents take it. Checked as the
/// command line is parsed, so a malformed one exits 2 naming the flag, as every bad flag value
/// does, and never 1, the drill's "a member did not acknowledge".
fn node_arg(n: &str) -> Result<String, String> {
    let why = "is no node name (at most 253 characters of a-z A-Z 0-9 . - _)";
    let valid = crate::config::valid_node_name(n);
    valid.then(|| n.to_string()).ok_or_else(|| format!("{n:?} {why}"))
}

/// `--worker`: `NODE/WORKER` or `WORKER`, each part as the agents take it (checked as
/// [`node_arg`] is).
fn worker_arg(w: &str) -> Result<String, String> {
    let (node, worker) = w.split_once('/').map_or((None, w), |(n, w)| (Some(n), w));
    if let Some(node) = node {
        node_arg(node)?;
    }
    super::worker_id(worker)?;
    Ok(w.to_string())
}

/// The target the flags name: their values were checked as they were parsed, and the config's
/// node name (the default) when it was loaded.
fn target(cfg: &Config, d: &CheckpointDrill) -> Target {
    if let Some(g) = &d.gang {
        return Target::Gang(g.clone());
    }
    if let Some(w) = &d.worker {
        let (node, worker) = w.split_once('/').unwrap_or((cfg.node_name.as_str(), w.as_str()));
        return Target::Worker { node: node.to_string(), worker: worker.to_string() };
    }
    Target::Node(d.node.clone().unwrap_or_else(|| cfg.node_name.clone()))
}

pub(super) async fn run(cfg: &Config, d: &CheckpointDrill) -> Result<(), CliError> {
    if cfg.embedded() {
        return Err(CliError::Unable("a drill writes the members' records in Redis and waits for their acks there: set REDIS_URL (or redis.url) to the agents' Redis".into()));
    }
    let target = target(cfg, d);
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;

    #[test]
    fn a_malformed_node_or_worker_is_refused_naming_why() {
        assert_eq!(node_arg("gke-a3-pool-1").as_deref(), Ok("gke-a3-pool-1"));
        assert!(node_arg("bad node").is_err_and(|e| e.contains("is no node name")));
        assert!(node_arg("").is_err());
        assert_eq!(worker_arg("w0").as_deref(), Ok("w0"));
        assert_eq!(worker_arg("n1/w0").as_deref(), Ok("n1/w0"));
        for bad in ["bad node/w0", "/w0", "n1/", "n1/w 0", "n1/a/b", "w 0"] {
            assert!(worker_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_malformed_target_is_a_usage_error_not_a_drill_verdict() {
        let parse = |flag: &str, value: &str| {
            Cli::try_parse_from(["vigil", "drill", "checkpoint", flag, value])
        };
        for (flag, value, why) in [
            ("--node", "bad node", "is no node name"),
            ("--worker", "bad node/w0", "is no node name"),
            ("--worker", "n1/w 0", "a worker id is"),
        ] {
            let err = parse(flag, value).err().map(|e| (e.exit_code(), e.to_string()));
            let Some((code, text)) = err else { panic!("{flag} {value:?} was taken") };
            assert_eq!(code, 2, "{flag} {value:?}: {text}");
            assert!(text.contains(flag) && text.contains(why), "{text}");
        }
        assert!(parse("--worker", "n1/w0").is_ok());
        assert!(parse("--node", "n1").is_ok());
    }
}
