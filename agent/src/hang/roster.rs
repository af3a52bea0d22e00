//! Who the workers are this cycle: the opted-in containers, grouped by worker id, one container
//! speaking for each worker. A container whose label is not a valid worker id, and a worker id
//! that several containers claim, are alerted once and never acted on: the agent never guesses
//! which record belongs to which container.

use std::collections::{BTreeMap, HashSet};

use crate::alerts::gate::AlertGate;
use crate::alerts::{Alert, AlertKind, Resolve};
use crate::clock::Millis;
use crate::coord::Result;
use crate::hang::context::Context;
use crate::hang::journal::{About, Journal};
use crate::hang::marks::MARK_TTL;
use crate::hang::model::valid_worker_id;
use crate::hang::policy::Verdict;
use crate::runtime::Container;
use crate::trail::Code;

/// The containers of a worker id: one, or several claiming it.
pub(crate) type ByWorker = BTreeMap<String, Vec<Container>>;

/// The problems this agent already alerted, so each is alerted once.
#[derive(Default)]
pub(crate) struct Roster {
    /// Worker ids claimed by several containers.
    ambiguous: HashSet<String>,
    /// Containers already alerted for a label that is not a valid worker id.
    invalid: HashSet<String>,
}

impl Roster {
    /// The containers by worker id, each id with the containers that speak for it (see
    /// [`current_of`]); a container with an invalid id is left out, alerted once.
    pub(crate) async fn group(&mut self, ctx: &Context, containers: Vec<Container>) -> ByWorker {
        // NB: containers whose opt-in label breaks the worker-id rule are never workers: their
        // id would be read into Redis key names. One alert per container.
        let (valid, invalid): (Vec<_>, Vec<_>) =
            containers.into_iter().partition(|c| valid_worker_id(&c.worker));
        self.invalid.retain(|id| invalid.iter().any(|c| &c.id == id));
        for c in invalid {
            if !self.invalid.insert(c.id.clone()) {
                continue;
            }
            let shown: String = c.worker.chars().take(64).collect();
            let detail = format!(
                "{} carries the opt-in label with {shown:?}, which is not a worker id (1-128 characters of A-Z a-z 0-9 . _ -): it is not watched and never restarted until the label is fixed",
                c.display()
            );
            let a = Alert::new(AlertKind::InvalidWorkerId, ctx.keys.node(), detail);
            ctx.notifier.send(&a).await;
        }
        let mut by_worker = ByWorker::new();
        for c in valid {
            by_worker.entry(c.worker.clone()).or_default().push(c);
        }
        by_worker.into_iter().map(|(w, list)| (w, current_of(list))).collect()
    }

    /// Several containers claim one worker id: alert once, never guess which one the record
    /// belongs to.
    pub(crate) async fn ambiguous(
        &mut self,
        ctx: &Context,
        journal: &mut Journal,
        alerts: &mut AlertGate,
        worker: &str,
        list: &[Container],
        now: Millis,
    ) -> Result<()> {
        if !self.ambiguous.insert(worker.to_string()) {
            return Ok(());
        }
        // NB: de-duplicated per node, not per agent: two agents on one node (a rolling update)
        // send one alert and write one trail entry.
        let key = dedup_key(ctx, worker);
        let claimed = match alerts
            .claim(ctx.coord.as_ref(), &key, now, MARK_TTL, ctx.cfg.safety.lock_ttl)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                // Asked again next cycle: an episode whose claim never answered is not over.
                self.ambiguous.remove(worker);
                return Err(e);
            }
        };
        if !claimed {
            return Ok(());
        }
        let names: Vec<_> = list.iter().map(|c| c.display()).collect();
        let (n, names) = (list.len(), names.join(", "));
        let detail = format!("{n} containers claim worker id `{worker}` ({names}); none will be restarted until one label is fixed");
        let mut a = Alert::new(AlertKind::Ambiguous, ctx.keys.node(), detail);
        a.worker = Some(worker.to_string());
        ctx.notifier.send(&a).await;
        let about = About::worker(worker, Verdict::Healthy).once();
        let detail = "several containers share this worker id".to_string();
        journal.note(now, about, Code::SkippedAmbiguous, detail).await
    }

    /// A worker that is no longer ambiguous: its page resolved (a sink that keeps alerts open
    /// re-posted it until now), and the next time it is, it is a new episode.
    pub(crate) async fn unambiguous(&mut self, ctx: &Context, worker: &str) -> Result<()> {
        if self.ambiguous.remove(worker) {
            let ended = Resolve::Episode(AlertKind::Ambiguous);
            ctx.notifier.resolve(ctx.keys.node(), worker, ended).await;
            ctx.coord.del(&[dedup_key(ctx, worker)]).await?;
        }
        Ok(())
    }

    /// Ambiguous ids no container carries any more (both went at once): gone, their page
    /// resolved with them (`crate::alerts::Notifier::retain`); a later ambiguity of the id is a
    /// new episode. Forgotten once its key is gone (a failed delete is tried next cycle).
    pub(crate) async fn forget_gone(
        &mut self,
        ctx: &Context,
        present: &HashSet<String>,
    ) -> Result<()> {
        let gone: Vec<String> =
            self.ambiguous.iter().filter(|w| !present.contains(*w)).cloned().collect();
        for worker in gone {
            ctx.coord.del(&[dedup_key(ctx, &worker)]).await?;
            self.ambiguous.remove(&worker);
        }
        Ok(())
    }
}

/// The de-duplication key of a worker id's ambiguity alert.
fn dedup_key(ctx: &Context, worker: &str) -> String {
    ctx.keys.alert_dedup(&format!("ambiguous-{worker}"), "ambiguous")
}

/// The containers that speak for a worker: the running (or paused) ones; when none is, the one
/// that exited last (reported, never started). An old exited container next to its running
/// replacement is history, not a second claim on the worker id.
fn current_of(list: Vec<Container>) -> Vec<Container> {
    let (live, exited): (Vec<_>, Vec<_>) = list.into_iter().partition(|c| c.running || c.paused);
    if !live.is_empty() {
        return live;
    }
    // NB: by time, not text: CRI's `attempt-10@…` sorts before `attempt-9@…` as a string.
    exited.into_iter().max_by_key(Container::started_ms).into_iter().collect()
}
