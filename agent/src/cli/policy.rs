//! `vigil policy`: the verdict → action table, generated from the policy code and the configured
//! thresholds; `vigil policy gpu`: the XID → action table (`crate::accel::gpu::policy_xid`).

use crate::config::Config;
use crate::hang::policy_pipeline::Unit;

/// The table `vigil policy` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Table {
    /// Worker verdicts and who acts on them.
    Restart,
    /// What each XID calls for.
    Gpu,
}

/// The XID → action table as printed by `vigil policy gpu`, with the configured overrides.
pub(crate) fn render_gpu(cfg: &Config) -> String {
    let rows = crate::accel::gpu::policy_xid::table(&cfg.gpu);
    let w1 = rows.iter().map(|r| r.meaning.len()).max().unwrap_or(7).max(7);
    let w2 = rows.iter().map(|r| r.nvidia.len()).max().unwrap_or(6).max(6);
    let w3 = "informational".len();
    let mut out =
        format!("{:>4}  {:<w1$}  {:<w2$}  {:<w3$}  source\n", "xid", "meaning", "NVIDIA", "vigil");
    for r in &rows {
        let (xid, meaning, nvidia, action, source) =
            (r.xid, r.meaning, r.nvidia, r.action.as_str(), r.source);
        let row = format!("{xid:>4}  {meaning:<w1$}  {nvidia:<w2$}  {action:<w3$}  {source}\n");
        out.push_str(&row);
    }
    out.push_str(
        "\nreset-gpu, drain and reboot-node mark the GPU failed (taint with gpu.taint_on_failure; its \
         workers are not restarted) until a reset, a driver reload or a reboot shows; restart-app and \
         informational are recorded only; an XID in no row degrades the GPU while recent. The driver's \
         own recovery action (NVML), where it reports one, fails the GPU the same way.\n",
    );
    out
}

/// `vigil policy`: print the table asked for.
pub(super) fn run(cfg: &Config, which: Table) -> Result<(), super::CliError> {
    match which {
        Table::Restart => print!("{}", render(cfg)),
        Table::Gpu => print!("{}", render_gpu(cfg)),
    }
    Ok(())
}

/// The verdict → action table as printed by `vigil policy`.
pub(crate) fn render(cfg: &Config) -> String {
    let rows = crate::hang::policy_table::table(&cfg.policy);
    let w0 = rows.iter().map(|r| r.verdict.len()).max().unwrap_or(7).max(7);
    let w1 = rows.iter().map(|r| r.predicate.len()).max().unwrap_or(9);
    let mut out = format!("{:<w0$}  {:<w1$}  action\n", "verdict", "predicate");
    out.push_str(&format!("{}  {}  {}\n", "-".repeat(w0), "-".repeat(w1), "-".repeat(6)));
    for r in rows {
        out.push_str(&format!("{:<w0$}  {:<w1$}  {}\n", r.verdict, r.predicate, r.action));
    }
    out.push_str(&format!(
        "\nrestart pipeline: hang persists {} → node lock → logs → alert → revalidate → lock TTL check → \
         compare container → breaker ({}/day{}) + fleet budget ({} per {}) → cooldown {} → restart; \
         escalation page after {}{}\n",
        humantime::format_duration(cfg.policy.restart_delay),
        cfg.safety.breaker_per_day,
        if cfg.safety.breaker_disabled { ", DISABLED" } else { "" },
        cfg.safety.fleet_budget,
        humantime::format_duration(cfg.safety.fleet_window),
        humantime::format_duration(cfg.policy.cooldown),
        humantime::format_duration(cfg.policy.escalate_after),
        if cfg.dry_run { "\nobserve mode (dry_run): restarts are never run" } else { "" },
    ));
    out.push_str(
        "\nan incident's stages (vigil_worker_incident_stage), each with what may follow it:\n",
    );
    life_table(&mut out, Unit::Worker);
    out.push_str("  (and every stage back to quiet: the worker is fine, or its marks expired or were lost)\n");
    out.push_str("\na gang's incident (one for the whole job; its members boot as their own agents see them):\n");
    life_table(&mut out, Unit::Gang);
    out.push_str("  (and every stage back to quiet: the collective moves, or its marks expired or were lost)\n");
    out
}

/// One unit's table of the life (`crate::hang::policy_life::table`).
fn life_table(out: &mut String, unit: Unit) {
    for (from, to) in crate::hang::policy_life::table(unit) {
        let to: Vec<&str> = to.iter().map(|s| s.as_str()).collect();
        out.push_str(&format!("  {:<12} -> {}\n", from.as_str(), to.join(", ")));
    }
}
