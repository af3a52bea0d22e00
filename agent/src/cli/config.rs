//! `vigil config check` and `vigil config defaults`.

use super::CliError;
use crate::config::{Config, ProcessEnv};

/// The config is already loaded and validated: say so and print it resolved; a `RUST_LOG` the
/// agent would set aside is said too (on stderr: scripts read the configuration on stdout).
pub(super) fn check(cfg: &Config) -> Result<(), CliError> {
    if let Some(why) = cfg.log.filter(&ProcessEnv).1 {
        eprintln!("warning: {why}");
    }
    println!("config ok");
    print!("{}", toml::to_string_pretty(cfg).unwrap_or_default());
    Ok(())
}

pub(super) fn defaults() -> Result<(), CliError> {
    print!("{}", Config::defaults_toml());
    Ok(())
}
