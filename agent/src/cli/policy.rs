//! `vigil policy`: the verdict → action table, generated from the policy code and the configured
//! thresholds.

use crate::config::Config;

/// The verdict → action table as printed by `vigil policy`.
pub(crate) fn render(cfg: &Config) -> String {
    let rows = crate::policy::table(&cfg.policy);
    let w0 = rows
        .iter()
        .map(|r| r.verdict.len())
        .max()
        .unwrap_or(7)
        .max(7);
    let w1 = rows.iter().map(|r| r.predicate.len()).max().unwrap_or(9);
    let mut out = format!("{:<w0$}  {:<w1$}  action\n", "verdict", "predicate");
    out.push_str(&format!(
        "{}  {}  {}\n",
        "-".repeat(w0),
        "-".repeat(w1),
        "-".repeat(6)
    ));
    for r in rows {
        out.push_str(&format!(
            "{:<w0$}  {:<w1$}  {}\n",
            r.verdict, r.predicate, r.action
        ));
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
    out
}
