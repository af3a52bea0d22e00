//! `vigil cleanup`: the uninstall of what Vigil wrote on a Node. Every label and annotation under
//! `kubernetes.label_prefix`, Vigil's taints (by key, whatever their effect: the prefix's
//! `termination-imminent`, `gpu-failed`, `tpu-failed` and `slow`, [`taint_keys`]) and its
//! conditions ([`CONDITIONS`]: `VigilMaintenance`, `VigilGPUUnhealthy`, `VigilTPUUnhealthy`,
//! `VigilSlow`) come off; nothing else is touched: not the retired `VigilGPUHealthy`
//! (docs/upgrading.md), and not GKE's `cloud.google.com/perform-maintenance` label, which is only
//! named. Needs only the agent's own RBAC: `get` and `patch` on `nodes`, `patch` on
//! `nodes/status`.

use super::{failed, CliError};
use crate::config::Config;
use crate::kube::node::{Cleanup, KubeNodeApi, NodeError};
use crate::maintenance::policy::PERFORM_MAINTENANCE_LABEL;
use crate::vocab::node::{taint_keys, CONDITIONS};

pub(super) async fn run(cfg: &Config, node: Option<String>, dry_run: bool) -> Result<(), CliError> {
    let node = node.unwrap_or_else(|| cfg.node_name.clone());
    if node.is_empty() {
        return Err(failed("cleanup: no node name: give --node NAME, or set NODE_NAME"));
    }
    let api = KubeNodeApi::connect(&cfg.kubernetes.api_url).await.map_err(failed)?;
    let (prefix, keys) = (&cfg.kubernetes.label_prefix, taint_keys(&cfg.kubernetes));
    let labels = [PERFORM_MAINTENANCE_LABEL];
    let cleanup = api.cleanup(&node, prefix, &keys, &CONDITIONS, &labels, dry_run);
    let removed = cleanup.await.map_err(|e| match e {
        // The agent's wording says the next cycle retries; here, the operator does.
        NodeError::Conflict { attempts, .. } => CliError::Failed(format!(
            "cleanup of node {node:?}: {attempts} attempts in a row conflicted with other writers of the Node (409 Conflict); nothing of the taints was lost: run it again"
        )),
        e => CliError::Failed(format!("cleanup of node {node:?}: {e}")),
    })?;
    print!("{}", render(&node, prefix, &removed, dry_run));
    Ok(())
}

/// The report: one line per field removed (or that would be), or one line saying there is none;
/// then a note per label left alone.
fn render(node: &str, prefix: &str, removed: &Cleanup, dry_run: bool) -> String {
    let mut out = if removed.is_empty() {
        format!("node {node}: nothing of Vigil's to remove (no label or annotation under {prefix}, no Vigil taint or condition)\n")
    } else {
        let verb = if dry_run { "would remove" } else { "removed" };
        let mut out = format!("node {node}: {verb}\n");
        for (kind, items) in [
            ("label", &removed.labels),
            ("annotation", &removed.annotations),
            ("taint", &removed.taints),
            ("condition", &removed.conditions),
        ] {
            for item in items {
                out.push_str(&format!("  {kind} {item}\n"));
            }
        }
        if dry_run {
            out.push_str("(dry run: nothing was written)\n");
        }
        out
    };
    for label in &removed.kept {
        let key = label.split('=').next().unwrap_or(label);
        out.push_str(&format!(
            "note: label {label} left alone: it is GKE's, which Vigil sets while it holds the opportunistic-maintenance claim; if Vigil set it: kubectl label node {node} {key}-\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_every_field_or_says_there_is_none() {
        let none = render("n1", "vigil.dev/", &Cleanup::default(), false);
        assert!(none.contains("nothing of Vigil's to remove"), "{none}");
        let some = Cleanup {
            labels: vec!["vigil.dev/maintenance".into()],
            annotations: vec!["vigil.dev/last-checkpoint".into()],
            taints: vec!["vigil.dev/gpu-failed=true:NoSchedule".into()],
            conditions: vec!["VigilSlow".into()],
            kept: vec![],
        };
        let out = render("n1", "vigil.dev/", &some, true);
        for line in [
            "node n1: would remove",
            "  label vigil.dev/maintenance",
            "  annotation vigil.dev/last-checkpoint",
            "  taint vigil.dev/gpu-failed=true:NoSchedule",
            "  condition VigilSlow",
            "dry run",
        ] {
            assert!(out.contains(line), "{line}: {out}");
        }
        assert!(render("n1", "vigil.dev/", &some, false).starts_with("node n1: removed\n"));
        let kept = Cleanup {
            kept: vec!["cloud.google.com/perform-maintenance=true".into()],
            ..Cleanup::default()
        };
        let out = render("n1", "vigil.dev/", &kept, false);
        assert!(out.contains("nothing of Vigil's to remove"), "{out}");
        assert!(
            out.contains("kubectl label node n1 cloud.google.com/perform-maintenance-"),
            "{out}"
        );
    }

    #[test]
    fn the_help_names_exactly_what_cleanup_removes() {
        let cli = <crate::cli::Cli as clap::CommandFactory>::command();
        let cleanup = cli.find_subcommand("cleanup");
        let about = cleanup.and_then(|c| c.get_long_about().or(c.get_about()));
        let help = about.map(ToString::to_string).unwrap_or_default();
        for condition in CONDITIONS {
            assert!(help.contains(condition), "{condition} missing from `vigil cleanup --help`");
        }
        let k = crate::config::KubernetesConfig::default();
        for key in taint_keys(&k) {
            let taint = key.strip_prefix(k.label_prefix.as_str()).unwrap_or(key.as_str());
            assert!(help.contains(taint), "taint {taint} missing from `vigil cleanup --help`");
        }
        // The retired condition is named only as one that stays (cleanup no longer lists it).
        let retired = help.matches("VigilGPUHealthy").count();
        assert_eq!(retired, help.matches("VigilGPUHealthy is not removed").count(), "{help}");
    }
}
