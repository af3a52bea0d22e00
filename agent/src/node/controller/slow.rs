//! The node controller's part of fail-slow (`gang.pace`): the slow gangs the cycle found naming
//! a member of this node become the Node's `VigilSlow` condition (and, opt-in, its taint) and a
//! Warning Event per gang that newly names it.

use crate::vocab::node::EventType;

use super::Controller;

impl Controller {
    /// A change of the slow gangs naming this node (read at each tick: the condition is
    /// minutes in the making, a poll interval more is nothing): into the view, and a Warning
    /// Event for each gang that newly names it. Whether the Node must be written.
    pub(super) async fn take_slow(&mut self) -> bool {
        let Some(rx) = self.slow_rx.as_mut() else {
            return false;
        };
        if !rx.has_changed().unwrap_or(false) {
            return false;
        }
        let named = rx.borrow_and_update().clone();
        let new: Vec<String> = named
            .iter()
            .filter(|(g, _)| !self.node.view.slow.contains_key(*g))
            .map(|(_, line)| format!("vigil: {line}"))
            .collect();
        self.node.view.slow = named;
        for message in new {
            self.node
                .event("VigilSlow", &message, EventType::Warning)
                .await;
        }
        true
    }
}
