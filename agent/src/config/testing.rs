//! Helpers of the config tests, shared by every section's.

use std::collections::HashMap;
use std::path::Path;

use super::{Config, ConfigError};

pub(super) fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A TOML file's text, parsed and validated, on node `n1`.
pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
    let mut c = Config::parse(text, Path::new("vigil.toml"))?;
    c.apply_env(&env(&[("NODE_NAME", "n1")]))?;
    c.validate()?;
    Ok(c)
}

/// The key an error names: a validation error's key, or the dotted path of a value that
/// did not parse into its type.
pub(super) fn key_of(r: Result<Config, ConfigError>) -> String {
    match r {
        Err(ConfigError::Invalid { key, .. }) => key.to_string(),
        Err(ConfigError::File { problem, .. }) => problem
            .strip_prefix("key `")
            .and_then(|p| p.split_once('`'))
            .map(|(k, _)| k.to_string())
            .unwrap_or(problem),
        other => panic!("expected an invalid key, got {other:?}"),
    }
}

/// Each `(text, key)`: the text, parsed alone, is rejected naming the key.
pub(super) fn assert_names_keys(cases: &[(&str, &str)]) {
    for (text, key) in cases {
        assert_eq!(key_of(parse(text)), *key, "for {text:?}");
    }
}
