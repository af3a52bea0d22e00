//! The process's signals as `vigil run` takes them: SIGTERM and SIGINT stop the restart loop and
//! start the checkpoint round, everything stops after, and SIGHUP re-reads the configuration.

use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

use super::RunError;
use crate::config::{Config, ProcessEnv};

/// The process's stop signals, as one token tree: `term` (SIGTERM/SIGINT) is a child of
/// `stop`, so stopping everything also stops the restart loop, while a SIGTERM first stops only
/// the restart loop and starts the checkpoint round.
pub(crate) struct Signals {
    /// Everything stops: watchers, server, heartbeat, GPU monitor.
    pub(crate) stop: CancellationToken,
    /// SIGTERM / SIGINT: no new restart; checkpoint the workers, then drain.
    pub(crate) term: CancellationToken,
    /// SIGHUP: new configurations (already validated).
    pub(crate) reload: Option<tokio::sync::watch::Receiver<Config>>,
}

impl Signals {
    /// Tokens without handlers (tests and embedders fire `term` themselves).
    pub fn new() -> Signals {
        let stop = CancellationToken::new();
        Signals {
            term: stop.child_token(),
            stop,
            reload: None,
        }
    }
}

impl Default for Signals {
    fn default() -> Self {
        Signals::new()
    }
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
    let mut signals = Signals::new();
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| fail("SIGTERM", e))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| fail("SIGINT", e))?;
    let mut sighup = signal(SignalKind::hangup()).map_err(|e| fail("SIGHUP", e))?;
    let (term, stop) = (signals.term.clone(), signals.stop.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM: checkpointing workers, then exiting"),
            _ = sigint.recv() => tracing::info!("SIGINT: checkpointing workers, then exiting"),
            _ = stop.cancelled() => return,
        }
        term.cancel();
    });
    let (tx, rx) = tokio::sync::watch::channel(first.clone());
    let stop = signals.stop.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                got = sighup.recv() => if got.is_none() { return },
                _ = stop.cancelled() => return,
            }
            match Config::load(path.as_deref(), &ProcessEnv) {
                Ok(mut cfg) => {
                    // `--dry-run` on the command line stays in force across reloads.
                    cfg.dry_run |= dry_run_flag;
                    tracing::info!("SIGHUP: configuration re-read");
                    let _ = tx.send(cfg);
                }
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: the new configuration is invalid; keeping the running one")
                }
            }
        }
    });
    signals.reload = Some(rx);
    Ok(signals)
}
