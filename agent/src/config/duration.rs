//! The config's durations: humantime text (`"90s"`, `"1h30m"`), at most [`MAX`]. NB: humantime
//! reads up to about 1.8e19 seconds, and the agent adds durations to clocks and to each other:
//! `poll_interval = "10000000000000000000s"` overflowed there (a panic at start-up, or at the
//! first Redis command) instead of being refused with its key.

use std::time::Duration;

use serde::de::Error as _;
use serde::Deserializer;

/// The longest duration any key takes: a year (humantime's, 365.25 days).
pub(crate) const MAX: Duration = Duration::from_secs(31_557_600);

/// Written as humantime writes it (`"1m 30s"`).
pub(crate) use humantime_serde::serialize;

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let v: Duration = humantime_serde::deserialize(d)?;
    if v > MAX {
        let max = humantime::format_duration(MAX);
        let why = format!("longer than {max}, the longest duration a key takes");
        return Err(D::Error::custom(why));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_names_keys;

    #[test]
    fn a_duration_past_a_year_is_refused_with_its_key() {
        assert_names_keys(&[
            ("poll_interval = \"10000000000000000000s\"", "poll_interval"),
            ("[redis]\ntimeout = \"400d\"", "redis.timeout"),
            ("[alerts]\ntimeout = \"18446744073709551615s\"", "alerts.timeout"),
        ]);
    }
}
