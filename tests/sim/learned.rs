//! Worlds that restart on learned rhythms (issue 46, `[policy.learned] restarts = true`): their
//! configuration, the rhythm each worker brings from its earlier life (the coordinator's copy,
//! learned long before the run), and the ground truth of a learned restart.
//!
//! The truth is the documented rule, computed by the harness from what the coordinator holds
//! *at the read* (never from what an agent remembers): a restart stands on a learned rhythm only
//! when the coordinator's copy (`P:{N}:worker:W:rhythm`, `<since>|<longest>|<bucket>:<count>,…`)
//! exists, spans `history`, and the record is silent past the least silence the copy can teach
//! (`floor`, and 1.5 × the longest silence it holds) plus the least persistence (`floor`).
//! Anything short of that must be the fixed rule's (`stale_after`).

use std::time::Duration;

use futures_util::FutureExt;
use vigil::clock::{ms, Millis};
use vigil::config::Config;

use super::truth::Ctl;

/// The learned rule's numbers in these worlds: a rhythm of half-second beats looked at every
/// second teaches ~2.2 s (2 × its 1.07 s bucket), raised to the 3 s floor, so a learned
/// restart is due ~7 s into a hang (its pipeline then takes a few seconds of the world's), the
/// fixed rule's after 24 s (`stale_after` 20 s).
pub fn configure(cfg: &mut Config) {
    let p = &mut cfg.policy;
    p.stale_after = Duration::from_secs(20);
    p.restart_delay = Duration::from_secs(3);
    let l = &mut p.learned;
    l.enabled = true;
    l.restarts = true;
    l.history = Duration::from_secs(60);
    l.floor = Duration::from_secs(3);
    l.multiplier = 2.0;
    l.min_samples = 5;
}

/// The rhythm a worker brings from its earlier life: learned since two hours before `now`,
/// 200 silences of at most a second (bucket 8: up to 1,075 ms).
pub fn earlier_life(now: Millis) -> String {
    format!("{}|1000|8:200", now - 7_200_000)
}

impl Ctl {
    /// Whether worker `w`'s record, as it last wrote it, makes it a restart candidate at `now`:
    /// by the fixed rule, or — where the world restarts on learned rhythms — by the learned one
    /// the coordinator's copy allows now.
    pub fn condemnable(&self, w: usize, now: Millis) -> bool {
        self.workers[w].condemnable(now, &self.cfg) || self.learned_condemnable(w, now)
    }

    fn learned_condemnable(&self, w: usize, now: Millis) -> bool {
        let l = &self.cfg.policy.learned;
        let t = &self.workers[w];
        let (true, Some(hb), "processing") = (l.enabled && l.restarts, t.last_beat, t.state) else {
            return false;
        };
        let key = self.nodes[t.node].keys.rhythm(&t.worker);
        let copy = self
            .store
            .get_many(&[key])
            .now_or_never()
            .and_then(Result::ok)
            .and_then(|v| v.into_iter().next().flatten());
        let Some((since, longest)) = copy.as_deref().and_then(since_and_longest) else {
            return false;
        };
        // The least silence a copy can teach, and the least wait (the usual silence, at least
        // `floor`, at most `restart_delay`).
        let floor = ms(l.floor);
        let wait = floor.min(ms(self.cfg.policy.restart_delay));
        let least = floor.max(longest + longest / 2) + wait;
        now - since >= ms(l.history) && now - hb > least
    }
}

/// `<since>|<longest>|…` → (since, longest); `None` for anything else (no history).
fn since_and_longest(raw: &str) -> Option<(Millis, Millis)> {
    let mut parts = raw.splitn(3, '|');
    let since = parts.next()?.parse().ok()?;
    let longest = parts.next()?.parse().ok()?;
    parts.next()?;
    Some((since, longest))
}
