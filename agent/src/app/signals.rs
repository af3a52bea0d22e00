//! The process's signals as `vigil run` takes them: SIGTERM and SIGINT stop the restart loop and
//! start the checkpoint round, everything stops after, and SIGHUP re-reads the configuration.

use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

use super::RunError;
use crate::config::{Config, ProcessEnv};
use crate::node::controller::TermAt;

/// The process's stop signals, as one token tree: `term` (SIGTERM/SIGINT) is a child of
/// `stop`, so stopping everything also stops the restart loop, while a SIGTERM first stops only
/// the restart loop and starts the checkpoint round.
pub(crate) struct Signals {
    /// Everything stops: watchers, server, heartbeat, GPU monitor.
    pub(crate) stop: CancellationToken,
    /// SIGTERM / SIGINT: no new restart; checkpoint the workers, then drain.
    pub(crate) term: CancellationToken,
    /// SIGHUP: new configurations (already validated).
    pub(crate) reload: tokio::sync::watch::Receiver<Config>,
    /// When SIGTERM/SIGINT came, stamped before `term` fires: the drain and the checkpoint
    /// round both run their deadline from it.
    pub(crate) term_at: TermAt,
}

/// Install the handlers. SIGHUP re-reads `path` (and the environment); an invalid new config
/// keeps the running one and says why.
pub(crate) fn install_signals(
    path: Option<PathBuf>,
    first: &Config,
    dry_run_flag: bool,
) -> Result<Signals, RunError> {
    use tokio::signal::unix::{signal, SignalKind};
    let fail =
        |what: &str, e: std::io::Error| RunError(format!("cannot install the {what} handler: {e}"));
    let stop = CancellationToken::new();
    let term = stop.child_token();
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| fail("SIGTERM", e))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| fail("SIGINT", e))?;
    let mut sighup = signal(SignalKind::hangup()).map_err(|e| fail("SIGHUP", e))?;
    let (t, s, term_at) = (term.clone(), stop.clone(), TermAt::default());
    let at = term_at.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM: checkpointing workers, then exiting"),
            _ = sigint.recv() => tracing::info!("SIGINT: checkpointing workers, then exiting"),
            _ = s.cancelled() => return,
        }
        let _ = at.set(tokio::time::Instant::now());
        t.cancel();
    });
    let (tx, reload) = tokio::sync::watch::channel(first.clone());
    let s = stop.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                got = sighup.recv() => if got.is_none() { return },
                _ = s.cancelled() => return,
            }
            let loaded = Config::load(path.as_deref(), &ProcessEnv).inspect_err(|e| {
                tracing::error!(error = %e, "SIGHUP: the new configuration is invalid; keeping the running one")
            });
            let Ok(mut cfg) = loaded else { continue };
            // `--dry-run` on the command line stays in force across reloads.
            cfg.dry_run |= dry_run_flag;
            tracing::info!("SIGHUP: configuration re-read");
            let _ = tx.send(cfg);
        }
    });
    Ok(Signals { stop, term, reload, term_at })
}

/// Wait for `term`, or for the restart loop (`cycle`) to end without it: a panic in a cycle
/// ended the loop's task alone, and the agent served its API and probes on, restarting nothing,
/// until someone read `/healthz`. Then the reason is the error, so the process exits non-zero at
/// once and its supervisor (the DaemonSet, systemd) starts it again. NB: `term` is not fired:
/// no checkpoint round (the workers are fine and the node stays; with `checkpoint.on_sigterm =
/// "always"` a loop that panics every cycle would ask one per crash). Everything stops with
/// `stop`, which the controller takes before `term`.
pub(crate) async fn until_term_or_end(
    cycle: tokio::task::JoinHandle<()>,
    term: &CancellationToken,
) -> Result<(), RunError> {
    let ended = tokio::select! {
        biased;
        () = term.cancelled() => return Ok(()),
        ended = cycle => ended,
    };
    let why = match ended {
        // NB: the loop's own way out: it ends at `term`, which may have fired meanwhile.
        Ok(()) if term.is_cancelled() => return Ok(()),
        Err(e) if e.is_panic() => {
            let panic = e.into_panic();
            let text = panic.downcast_ref::<&str>().map(|s| s.to_string());
            let text = text.or_else(|| panic.downcast_ref::<String>().cloned());
            let text = text.unwrap_or_else(|| "a panic without a message".into());
            format!("the restart loop panicked ({text}): exiting, so the agent is started again")
        }
        _ => "the restart loop ended without a SIGTERM: exiting, so the agent is started again"
            .into(),
    };
    tracing::error!("{why}");
    Err(RunError(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_restart_loop_that_dies_stops_the_agent_with_its_reason() {
        let term = CancellationToken::new();
        let cycle = tokio::spawn(async { panic!("index out of bounds") });
        let why = until_term_or_end(cycle, &term).await.expect_err("the loop died").0;
        assert!(why.contains("index out of bounds"), "{why}");
        assert!(!term.is_cancelled(), "no checkpoint round: the node is not going away");
    }

    #[tokio::test]
    async fn a_sigterm_is_no_failure() {
        let term = CancellationToken::new();
        let (t, stopped) = (term.clone(), term.clone());
        let cycle = tokio::spawn(async move { t.cancelled().await });
        stopped.cancel();
        tokio::task::yield_now().await; // the loop has ended too: both are ready
        assert!(until_term_or_end(cycle, &term).await.is_ok());
    }
}
