//! A lease: a key held by one owner for a while — SET NX with a TTL and a random token — whose
//! time left is read, and which is released, only by that owner (compare-and-delete). The node's
//! restart lock and a pool's opportunistic-maintenance claim are leases.
//!
//! NB: Redis expires a key by the wall clock, and a lease can outlive its holder's pause: the
//! holder checks the time left ([`Lease::left`]) or renews it ([`Lease::renew`]) right before
//! acting, never only at the claim.

use std::time::Duration;

use crate::clock::{ms, Millis};
use crate::coord::{CoordError, Coordinator};

/// Whether a lease with `left` of its TTL still covers an action that may take `needed` (a lost
/// lease covers nothing).
pub(crate) fn covers(left: Option<Millis>, needed: Duration) -> bool {
    matches!(left, Some(ttl) if ttl >= ms(needed))
}

/// A lease this owner took (or believes it holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lease {
    key: String,
    token: String,
}

impl Lease {
    /// Take `key` for `ttl` under `token`; `Ok(None)` when someone else holds it.
    ///
    /// NB: a SET NX whose reply was lost may have been applied: on an error the key is released
    /// by our token before the error is returned, so a lost reply never leaves an orphan lease.
    pub(crate) async fn take(
        coord: &dyn Coordinator,
        key: impl Into<String>,
        token: impl Into<String>,
        ttl: Duration,
    ) -> Result<Option<Lease>, CoordError> {
        let lease = Lease { key: key.into(), token: token.into() };
        match coord.set_nx(&lease.key, &lease.token, ttl).await {
            Ok(true) => Ok(Some(lease)),
            Ok(false) => Ok(None),
            Err(e) => {
                let _ = coord.del_if_owner(&lease.key, &lease.token).await;
                Err(e)
            }
        }
    }

    /// A fresh random token, for [`Lease::take`].
    pub(crate) fn random_token() -> String {
        format!("{:016x}", rand::random::<u64>())
    }

    /// Time left on the lease while it is still ours; `None` when it expired or was taken over.
    pub(crate) async fn left(&self, coord: &dyn Coordinator) -> Result<Option<Millis>, CoordError> {
        coord.owner_ttl(&self.key, &self.token).await
    }

    /// Renew it to `ttl` if it is still ours (compare-and-renew); `true` when it was.
    pub(crate) async fn renew(
        &self,
        coord: &dyn Coordinator,
        ttl: Duration,
    ) -> Result<bool, CoordError> {
        coord.renew_if_owner(&self.key, &self.token, ttl).await
    }

    /// Release it if it is still ours (compare-and-delete); `true` when it was.
    pub(crate) async fn release(&self, coord: &dyn Coordinator) -> Result<bool, CoordError> {
        coord.del_if_owner(&self.key, &self.token).await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_lease_must_cover_the_whole_action() {
        let need = std::time::Duration::from_secs(10);
        assert!(super::covers(Some(10_000), need));
        assert!(!super::covers(Some(9_999), need));
        assert!(!super::covers(None, need), "a lost lease covers nothing");
    }
}
