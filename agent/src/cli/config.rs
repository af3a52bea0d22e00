//! `vigil config check` and `vigil config defaults`.

use super::CliError;
use crate::config::Config;

/// The config is already loaded and validated: say so and print it resolved.
pub(super) fn check(cfg: &Config) -> Result<(), CliError> {
    println!("config ok");
    print!("{}", toml::to_string_pretty(cfg).unwrap_or_default());
    Ok(())
}

pub(super) fn defaults() -> Result<(), CliError> {
    print!("{}", Config::defaults_toml());
    Ok(())
}
