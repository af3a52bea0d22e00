//! Alert de-duplication: a shared key per incident and kind decides who sends an alert (the
//! first observer, with SET NX). Separate from the node lock on purpose (design rule 2): the
//! gate stops duplicate notifications, the lock duplicate commands.

use std::collections::HashMap;
use std::time::Duration;

use crate::clock::Millis;
use crate::coord::{CoordError, Coordinator};

/// The claims of one agent instance, with the ones whose answer was lost.
pub(crate) struct AlertGate {
    /// Written into each claim: who took it.
    instance: String,
    /// Claims whose SET NX got no answer: key → the value we tried.
    unanswered: HashMap<String, String>,
}

impl AlertGate {
    pub fn new(instance: &str) -> AlertGate {
        AlertGate {
            instance: instance.to_string(),
            unanswered: HashMap::new(),
        }
    }

    /// Take the right to send the alert behind the de-duplication `key` (SET NX: the first
    /// observer alerts). NB: a SET whose reply was lost may have been applied, and then nobody
    /// would ever send the alert; the value tried is remembered, and the next attempt that
    /// finds exactly that value there knows it won. At least once (a crash in between aside),
    /// never "never".
    pub async fn claim(
        &mut self,
        coord: &dyn Coordinator,
        key: &str,
        now: Millis,
        ttl: Duration,
    ) -> Result<bool, CoordError> {
        let tried = self.unanswered.remove(key);
        let value = tried
            .clone()
            .unwrap_or_else(|| format!("{now}:{}", self.instance));
        let taken = match coord.set_nx(key, &value, ttl).await {
            Ok(taken) => taken,
            Err(e) => {
                if self.unanswered.len() < 1_000 {
                    self.unanswered.insert(key.to_string(), value);
                }
                return Err(e);
            }
        };
        if taken || tried.is_none() {
            return Ok(taken);
        }
        match coord.get_many(&[key.to_string()]).await {
            Ok(mut v) => Ok(v.pop().flatten().as_deref() == Some(value.as_str())),
            Err(e) => {
                self.unanswered.insert(key.to_string(), value);
                Err(e)
            }
        }
    }
}
