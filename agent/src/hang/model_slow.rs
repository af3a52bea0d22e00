//! A gang's slow episode as its key (`P:gang:{G}:slow`) holds it (fail-slow, `gang.pace`;
//! `crate::hang::restart::gang_pace` opens, follows and ends it). Data only: how the value is
//! written and read.
//!
//! `<since>:<rate>:<baseline>:<node>/<worker>@<opened>|?` while the opener names the member;
//! once named, `…|<node>/<worker>|<points>|<why>` (the member paged, its evidence's score and the
//! evidence; `-` for none). `since` is when the opener's run of slow windows began, the rates
//! are in thousandths of a step per second, `<node>/<worker>@<opened>` is the member whose agent
//! opened it and when (a value of an older agent has no opener: it is nobody's to take back).

use std::time::Duration;

use crate::clock::Millis;
use crate::config::PaceConfig;

/// The key's value after an episode ended (for `slow_for`): nobody opens another meanwhile.
pub(crate) const QUIET: &str = "over";

/// An episode's value: its run's start, rate and baseline, who opened it (`<node>/<worker>`)
/// and when, and where it is placed (`?` while naming).
pub(crate) fn episode(
    since: Millis,
    (rate, baseline): (f64, f64),
    (opener, opened): (&str, Millis),
    placed: &str,
) -> String {
    let milli = |r: f64| (r * 1000.0).round() as i64;
    format!("{since}:{}:{}:{opener}@{opened}|{placed}", milli(rate), milli(baseline))
}

/// The value's opener field: `<node>/<worker>@<opened>`.
fn opener_field(value: &str) -> Option<&str> {
    value.split_once('|')?.0.splitn(4, ':').nth(3)
}

/// The member whose agent opened the episode `value` (`<node>/<worker>`).
pub(crate) fn opener_of(value: &str) -> Option<&str> {
    opener_field(value).map(|f| f.split_once('@').map_or(f, |(who, _)| who))
}

/// When it was opened (`None`: an older agent's value).
pub(crate) fn opened_of(value: &str) -> Option<Millis> {
    opener_field(value)?.split_once('@')?.1.parse().ok()
}

/// When its run of slow windows began.
pub(crate) fn since_of(value: &str) -> Option<Millis> {
    value.split(':').next()?.parse().ok()
}

/// The rate and the baseline it says, in steps per second.
pub(crate) fn rates_of(value: &str) -> Option<(f64, f64)> {
    let head = value.split_once('|')?.0;
    let mut n = head.split(':').skip(1).map(|x| x.parse::<f64>().ok());
    Some((n.next()?? / 1000.0, n.next()?? / 1000.0))
}

/// The episode `value`'s name in its pages' claims: who opened it and when (an episode opened
/// again after it lapsed is a new one, paged again: the earlier page was resolved), or, for an
/// older agent's value, when its run began.
pub(crate) fn claim_id(value: &str) -> String {
    opener_field(value).unwrap_or_else(|| value.split(':').next().unwrap_or_default()).to_string()
}

/// Where the episode `value` placed its `slow` alert: the member named, else the opener's.
pub(crate) fn placed_at(value: &str) -> Option<(String, String)> {
    let member = match value.split_once('|')?.1.split('|').next()? {
        "-" | "?" => opener_of(value)?,
        named => named,
    };
    let (node, worker) = member.split_once('/')?;
    Some((node.to_string(), worker.to_string()))
}

/// The evidence the episode `value` named its member by (`None`: nobody named, or not yet).
pub(crate) fn why_of(value: &str) -> Option<&str> {
    let mut placed = value.split_once('|')?.1.splitn(3, '|');
    match placed.next()? {
        "-" | "?" => None,
        _ => placed.nth(1).filter(|why| !why.is_empty()),
    }
}

/// Whether an episode's value names its member yet (`?` while the opener reads the view).
pub(crate) fn settled(value: &str) -> bool {
    value.split_once('|').is_some_and(|(_, placed)| placed != "?")
}

/// How long an episode's key lives unless its opener renews it (at least 10 minutes, or five
/// times `slow_for`): an episode whose opener is gone — its agent stopped for good, its member
/// moved — lapses, and a gang still slow opens another, instead of none for a day.
pub(crate) fn lease(cfg: &PaceConfig) -> Duration {
    (cfg.slow_for * 5).max(Duration::from_secs(600))
}

/// The longest an episode is renewed, from its opening: a gang slow for days is paged again once
/// a day (its episode lapses, and is opened again), not once for ever.
pub(crate) const MOST: Millis = 24 * 3_600_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_says_who_opened_it_when_and_where_its_page_was_placed() {
        let named =
            episode(1_000, (1.4, 2.0), ("gpu-0/rank-0", 5_000), "gpu-3/rank-3|2|it computes");
        assert_eq!(named, "1000:1400:2000:gpu-0/rank-0@5000|gpu-3/rank-3|2|it computes");
        assert_eq!(opener_of(&named), Some("gpu-0/rank-0"));
        assert_eq!(since_of(&named), Some(1_000));
        assert_eq!(opened_of(&named), Some(5_000));
        assert_eq!(rates_of(&named), Some((1.4, 2.0)));
        assert_eq!(claim_id(&named), "gpu-0/rank-0@5000");
        let at = |n: &str, w: &str| Some((n.to_string(), w.to_string()));
        assert_eq!(placed_at(&named), at("gpu-3", "rank-3"));
        assert_eq!(why_of(&named), Some("it computes"));
        assert!(settled(&named));
        // Nobody named, or not named yet: placed at the opener's own member.
        for placed in ["-", "?"] {
            let v = episode(1_000, (1.4, 2.0), ("gpu-0/rank-0", 5_000), placed);
            assert_eq!(placed_at(&v), at("gpu-0", "rank-0"));
            assert_eq!(settled(&v), placed == "-");
            assert_eq!(why_of(&v), None);
        }
        // Opened again after it lapsed: another claim, paged again.
        let again = episode(1_000, (1.4, 2.0), ("gpu-0/rank-0", 900_000), "-");
        assert_ne!(claim_id(&again), claim_id(&named));
        assert_eq!(opener_of(QUIET), None);
        assert_eq!(placed_at(QUIET), None);
        assert!(!settled(QUIET));
        // An older agent's value (`<since>:<rate>:<base>|…`): nobody's; its claim by its start.
        let old = "1000:1400:2000|gpu-3/rank-3|2|it computes";
        assert_eq!(opener_of(old), None);
        assert_eq!(opened_of(old), None);
        assert_eq!(claim_id(old), "1000");
        assert_eq!(rates_of(old), Some((1.4, 2.0)));
        assert_eq!(lease(&PaceConfig::default()), Duration::from_secs(600));
    }
}
