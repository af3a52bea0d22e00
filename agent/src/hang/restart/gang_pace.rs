//! A gang's pace at work (issue 45, fail-slow; `gang.pace`): each member's agent measures its
//! own member's pace every cycle (`crate::hang::policy_pace`: in a synchronous collective every
//! rank runs at the gang's pace); the first to find it slow opens the gang's slow episode (one
//! SET NX), reads the gang's view once to name the member its evidence points to, and pages
//! `slow` once; the first member back at its pace ends the episode (compare-and-delete) and says
//! so once (`slow-over`). Never a restart, and no other mark of the gang's is touched.

use crate::alerts::{AlertKind, Resolve};
use crate::clock::{human, ms, Millis};
use crate::coord::CoordError;
use crate::hang::marks::MARK_TTL;
use crate::hang::model::{Gang, WorkerState};
use crate::hang::model_gang::Member;
use crate::hang::policy::Verdict;
use crate::hang::policy_fruitless::position;
use crate::hang::policy_gang::{present, Timing};
use crate::hang::policy_pace::{suspect, Look, PaceVerdict};
use crate::hang::policy_pipeline::Unit;

use super::{Case, RestartPath};

/// An open slow episode as the gang's key holds it: `<since>:<rate>:<baseline>|<node>/<worker>`
/// (rates in thousandths of a step per second; the member paged, or `-`).
struct Episode {
    since: Millis,
    placed: Option<(String, String)>,
}

impl Episode {
    fn encode(since: Millis, rate: f64, baseline: f64, placed: Option<&Member>) -> String {
        let at = placed.map_or("-".to_string(), |m| format!("{}/{}", m.node, m.worker));
        let milli = |r: f64| (r * 1000.0).round() as i64;
        format!("{since}:{}:{}|{at}", milli(rate), milli(baseline))
    }

    fn decode(v: &str) -> Option<Episode> {
        let (head, at) = v.split_once('|')?;
        let since = head.split(':').next()?.parse().ok()?;
        let placed = at
            .split_once('/')
            .map(|(n, w)| (n.to_string(), w.to_string()));
        Some(Episode { since, placed })
    }
}

/// The rate in words: `0.82 steps/s`.
fn per_second(r: f64) -> String {
    format!("{r:.2} steps/s")
}

impl RestartPath<'_> {
    /// This gang member's pace, measured and exported; the gang's slow episode opened or ended.
    pub(super) async fn pace(
        &mut self,
        case: &Case<'_>,
        own: &Member,
        now: Millis,
    ) -> Result<(), CoordError> {
        let cfg = self.ctx.cfg.gang.pace.clone();
        let (Some(s), true) = (case.status, cfg.enabled) else {
            return Ok(());
        };
        let Some(g) = s.gang.clone() else {
            return Ok(());
        };
        // NB: a window teaches nothing while the worker announced a long operation, left
        // `processing`, is not healthy by its own verdict, its node stands down, or its
        // container is warming up (compile, a restart's warm-up).
        let warming = case
            .c
            .started_ms()
            .is_some_and(|st| now - st < ms(cfg.warmup));
        let held = s.grace.is_some()
            || s.state != WorkerState::Processing
            || case.v != Verdict::Healthy
            || own.stand_down.is_some()
            || warming;
        let look = match (s.heartbeat, position(Some(s))) {
            (Some(hb), Some(step)) => Some(Look { hb, step, held }),
            _ => None,
        };
        self.pace.observe(look, &cfg);
        self.ctx
            .metrics
            .pace
            .observe(&case.c.worker, &g.id, self.pace.rate, self.pace.baseline);
        match self.pace.verdict(now, &cfg) {
            PaceVerdict::Slow {
                since,
                rate,
                baseline,
            } => self.slow_began(&g, since, rate, baseline, now).await,
            PaceVerdict::Recovered { rate, baseline } => {
                self.slow_ended(&g, rate, baseline, now).await
            }
            _ => Ok(()),
        }
    }

    /// Open the gang's slow episode (once for the gang: SET NX), name its member from the
    /// gang's view, page `slow` once.
    async fn slow_began(
        &mut self,
        g: &Gang,
        since: Millis,
        rate: f64,
        baseline: f64,
        now: Millis,
    ) -> Result<(), CoordError> {
        let key = self.ctx.keys.gang_slow(&g.id);
        if self.ctx.coord.get(&key).await?.is_some() {
            return Ok(());
        }
        let coord = self.ctx.coord.clone();
        let view = crate::fleet::gangs::read_view(coord.as_ref(), &self.ctx.keys, &g.id, g.size);
        let members = present(&view.await?, now, &Timing::of(&self.ctx.cfg));
        let named = suspect(&members);
        let value = Episode::encode(since, rate, baseline, named.as_ref().map(|(m, _)| *m));
        if !coord.set_nx(&key, &value, MARK_TTL).await? {
            return Ok(());
        }
        self.ctx.metrics.pace.episode();
        let who = match &named {
            Some((m, why)) => format!(
                "the member it waits for is {} on node {}: {}",
                m.worker,
                m.node,
                why.join("; ")
            ),
            None => "no member's evidence stands out (workers that publish compute_ms, and GPUs NVML reads, name the rank)".to_string(),
        };
        let detail = format!(
            "gang {} runs slow: {} against its usual {} ({:.0} %) for {}; {who}. Vigil does not restart for slowness",
            g.id,
            per_second(rate),
            per_second(baseline),
            100.0 * rate / baseline,
            human(now - since)
        );
        let first = named.as_ref().map(|(m, _)| *m);
        let a = self.gang_alert(AlertKind::Slow, g, &members, first, detail);
        let claim = self.ctx.keys.gang_alert(&g.id, &since.to_string(), "slow");
        self.page_once(&claim, MARK_TTL, a, Unit::Gang, now)
            .await
            .map(drop)
    }

    /// End the gang's slow episode (the first member back at its pace: compare-and-delete) and
    /// say so once.
    async fn slow_ended(
        &mut self,
        g: &Gang,
        rate: f64,
        baseline: f64,
        now: Millis,
    ) -> Result<(), CoordError> {
        let key = self.ctx.keys.gang_slow(&g.id);
        let Some(value) = self.ctx.coord.get(&key).await? else {
            return Ok(());
        };
        if !self.ctx.coord.del_if_owner(&key, &value).await? {
            return Ok(());
        }
        let Some(e) = Episode::decode(&value) else {
            return Ok(());
        };
        if let Some((node, worker)) = &e.placed {
            let end = Resolve::Episode(AlertKind::Slow);
            self.ctx.notifier.resolve(node, worker, end).await;
        }
        let detail = format!(
            "gang {} is back at its pace: {} against its usual {} — the slow episode lasted {}",
            g.id,
            per_second(rate),
            per_second(baseline),
            human(now - e.since)
        );
        let placed = e.placed.as_ref().map(|(n, _)| n.as_str());
        let mut a = self.gang_alert(AlertKind::SlowOver, g, &[], None, detail);
        if let (Some(node), Some((_, w))) = (placed, &e.placed) {
            a.node = node.to_string();
            a.worker = Some(w.clone());
        }
        let claim = self
            .ctx
            .keys
            .gang_alert(&g.id, &e.since.to_string(), "slow-over");
        self.page_once(&claim, MARK_TTL, a, Unit::Gang, now)
            .await
            .map(drop)
    }
}
