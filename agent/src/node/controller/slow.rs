//! The node controller's part of fail-slow (`gang.pace`): the slow gangs the cycle found naming
//! a member of this node become the Node's `VigilSlow` condition and a Warning Event per gang
//! that newly names it; with `gang.pace.taint`, the slow taint while one names it and
//! `gang.pace.taint_for` after (on the coordinator's clock; an agent restarted forgets the hold).

use crate::clock::ms;
use crate::vocab::node::EventType;

use super::Controller;

impl Controller {
    /// A change of the slow gangs naming this node (read at each tick: the condition is
    /// minutes in the making, a poll interval more is nothing): into the view, and a Warning
    /// Event for each gang that newly names it; the taint's hold followed. Whether the Node must
    /// be written.
    pub(super) async fn take_slow(&mut self) -> bool {
        let Some(rx) = self.slow_rx.as_mut() else { return false };
        let changed = rx.has_changed().unwrap_or(false);
        if changed {
            let named = rx.borrow_and_update().clone();
            let before = std::mem::replace(&mut self.node.view.slow, named);
            for (g, n) in &self.node.view.slow {
                if !before.contains_key(g) {
                    self.node.event("VigilSlow", &n.line, EventType::Warning).await;
                }
            }
        }
        let pace = &self.cfg.gang.pace;
        let v = &self.node.view;
        if pace.taint.effect().is_none() || (v.slow.is_empty() && v.slow_until.is_none()) {
            return changed;
        }
        let now = self.now().await;
        let v = &mut self.node.view;
        if !v.slow.is_empty() {
            v.slow_until = Some(now + ms(pace.taint_for));
        }
        v.slow_until = v.slow_until.filter(|until| now < *until);
        let tainted = v.slow_until.is_some();
        // NB: strong evidence is remembered through the hold; a hold that ends forgets it.
        let evict = match (tainted, v.slow.is_empty()) {
            (false, _) => false,
            (true, false) => v.slow.values().any(|n| n.strong),
            (true, true) => v.slow_evict,
        };
        let moved = (tainted, evict) != (v.slow_tainted, v.slow_evict);
        (v.slow_tainted, v.slow_evict) = (tainted, evict);
        changed || moved
    }
}
