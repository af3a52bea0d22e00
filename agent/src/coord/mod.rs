//! Coordination: the primitives the safeguards are built from — the shared clock, keys with a
//! TTL, compare-and-delete (of a key, or of a hash's fields), capped counters, hashes, a node's
//! workers read in one round trip, the decision trail — as one request type, [`Request`], run by
//! the one method of [`Coordinator`].
//!
//! Map: `keys.rs` names every key. Two backends implement the trait: `redis.rs` (a fleet; the
//! connection, with the commands and Lua scripts in redis/commands.rs) and `memory.rs` (one
//! machine, no Redis). The coordination primitives built on the trait live here too, each in one
//! place: `lease.rs` (the node lock, a pool's maintenance claim: claim, time left, release by
//! compare-and-delete) and `caps.rs` (the breaker and the fleet budget, their one owner: keys,
//! rules, take, refund). A feature's own Redis schema lives with the feature (the hang path's
//! marks: `crate::hang::marks`). The engine (`crate::hang::restart`, opportunistic
//! maintenance) calls them, so the same behaviour — and the same test suite — covers both
//! backends. Alert de-duplication is a SET NX claim made by `crate::alerts::gate`.

pub(crate) mod caps;
pub(crate) mod keys;
pub(crate) mod lease;
pub mod memory;
pub mod redis;
pub mod tally;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::Millis;

pub use keys::Keys;
pub use tally::Tally;

// NB: a field named `source` is the error's source (`Error::source`): thiserror reads the name.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("redis at {addr} is unreachable ({source}); restarts are paused until it returns")]
    Unreachable { addr: String, source: ::redis::RedisError },
    #[error(
        "redis at {addr} did not answer within {timeout:?}; restarts are paused until it does"
    )]
    Timeout { addr: String, timeout: Duration },
    #[error("redis at {addr} answered a command with an error: {source}")]
    Command { addr: String, source: crate::BoxError },
}

/// What a call to shared storage gives: its answer, or the [`CoordError`] that stopped it.
pub(crate) type Result<T, E = CoordError> = std::result::Result<T, E>;

/// The slice of (field, value) pairs of a hash write (or of a stream entry), in order: unsized,
/// so always passed as `&Fields`.
pub type Fields = [(String, String)];

/// One trail entry as stored: its stream id and its fields.
pub type TrailEntry = (String, HashMap<String, String>);

/// The most fields, and bytes of names and values together, of a status record the agent reads.
/// A worker's record holds a dozen short fields (five more per rank of a container of several
/// ranks, at most 32); one over these bounds (multi-MB junk written by whoever holds Redis
/// credentials for it) is read as unreadable: that worker is unreachable, alerted, and its
/// record never reaches the agent's memory. The worker API's
/// body limit (64 KiB) keeps a worker that writes through it well inside.
pub const MAX_RECORD_FIELDS: usize = 256;
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// Why `record` is over [`MAX_RECORD_FIELDS`] or [`MAX_RECORD_BYTES`], if it is.
pub(crate) fn oversized(record: &HashMap<String, String>) -> Option<RecordUnreadable> {
    let bytes: usize = record.iter().map(|(k, v)| k.len() + v.len()).sum();
    (record.len() > MAX_RECORD_FIELDS || bytes > MAX_RECORD_BYTES)
        .then_some(RecordUnreadable::Oversized { fields: record.len(), bytes })
}

/// Why a worker's status record cannot be read: that worker's problem only (no record: it is
/// `unreachable`, one alert naming the key and this), never the cycle's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordUnreadable {
    /// More than the agent reads (a worker writing without bound).
    #[error("the record holds {fields} fields of {bytes} bytes, over the {MAX_RECORD_FIELDS} fields and {MAX_RECORD_BYTES} bytes the agent reads")]
    Oversized { fields: usize, bytes: usize },
    /// Redis refused to read it as a hash (a key of another type: `WRONGTYPE …`).
    #[error("{0}")]
    Refused(String),
    /// A reply of an unexpected shape.
    #[error("unexpected reply: {0}")]
    Reply(String),
    /// A field or value that is not UTF-8.
    #[error("a field is not UTF-8 ({0})")]
    NotUtf8(#[source] std::string::FromUtf8Error),
}

/// One worker's keys in a [`Request::ReadWorkers`]: its status record and its string marks.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerKeys {
    /// The status record (a hash).
    pub record: String,
    /// The string keys read with it, in the order their values come back.
    pub keys: Vec<String>,
}

/// What a node's cycle reads in one round trip (see [`Request::ReadWorkers`]): the store's
/// clock and each worker's record and marks, in the order they were asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeRead {
    /// The store's clock at the read.
    pub now: Millis,
    pub workers: Vec<WorkerRead>,
}

/// What one worker's verdict needs (see [`Request::ReadWorkers`]).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRead {
    /// The store's clock at the read.
    pub now: Millis,
    /// The status record's fields, or why the record cannot be read (a key of another type,
    /// bytes that are not UTF-8): that worker's problem only.
    pub record: Result<HashMap<String, String>, RecordUnreadable>,
    /// The string keys asked for, in order (`None`: missing or expired).
    pub values: Vec<Option<String>>,
}

/// One plain write (or counter read): the vocabulary of [`Request::Batch`]. A single
/// `set`, `hset` or `counter` is a batch of one.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Set a string key with a TTL.
    Set { key: String, value: String, ttl: Duration },
    /// Write a hash's fields (merged with those it has) and, with a `ttl`, (re)set its TTL:
    /// records that vanish when their writer stops.
    Hset { key: String, fields: Vec<(String, String)>, ttl: Option<Duration> },
    /// Add or refresh `member` in a sorted-set index with `score` (ms), and, with a
    /// `prune_before`, drop members whose score is below it, so the index never needs
    /// `KEYS`/`SCAN` (pruning is one more command: a writer that touches the index every cycle
    /// prunes now and then).
    IndexTouch { key: String, member: String, score: Millis, prune_before: Option<Millis> },
    /// Read a counter (0 when absent); its value is returned by `batch`.
    Counter { key: String },
    /// Remove fields of a hash (absent ones are no error; the hash goes with its last field).
    Hdel { key: String, fields: Vec<String> },
    /// Set an existing key's TTL (an absent key stays absent: nothing is written back).
    Expire { key: String, ttl: Duration },
}

impl Op {
    /// The key the op writes (or reads).
    pub fn key(&self) -> &str {
        match self {
            Op::Set { key, .. }
            | Op::Hset { key, .. }
            | Op::IndexTouch { key, .. }
            | Op::Counter { key }
            | Op::Hdel { key, .. }
            | Op::Expire { key, .. } => key,
        }
    }
}

/// One request to shared storage: the whole vocabulary of [`Coordinator::execute`]. Every time
/// is the store's own clock.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// The store's clock (Redis `TIME`), so node clock skew never changes a verdict.
    Time,
    /// Values of several string keys at once (missing or expired keys are `None`).
    GetMany(Vec<String>),
    /// Set only if absent (first writer wins); true when this call set it.
    SetNx { key: String, value: String, ttl: Duration },
    /// Remove the keys (absent ones are no error).
    Del(Vec<String>),
    /// Remaining TTL in ms when `key` still holds `token`; `None` when it is gone or someone else's.
    OwnerTtl { key: String, token: String },
    /// Compare-and-delete: remove `key` only if it still holds `token`.
    DelIfOwner { key: String, token: String },
    /// Compare-and-renew: `key`'s TTL set to `ttl` only if it still holds `token` (its owner's).
    RenewIfOwner { key: String, token: String, ttl: Duration },
    /// Compare-and-delete of a hash's fields: each `(field, value)` removed only if the field
    /// still holds `value`, atomically (one rewritten since it was read stays; the hash goes
    /// with its last field). How many were removed.
    HdelIfEqual { key: String, fields: Vec<(String, String)> },
    /// Increment a counter unless it already reached `cap`, atomically; the TTL is set when the
    /// counter is created. The new value, or `None` when the cap was reached.
    IncrCapped { key: String, cap: u64, ttl: Duration },
    /// Give back one unit of a counter (never below zero).
    Decr(String),
    /// A hash's fields (empty when it is absent).
    Hgetall(String),
    /// One field of a hash (`None` when the hash or the field is absent).
    Hget { key: String, field: String },
    /// Several hashes at once (a missing one is empty): the fleet view reads every node's
    /// record in a few round trips, not one per node.
    HgetallMany(Vec<String>),
    /// Append to a bounded stream (oldest entries trimmed past `max_len`).
    Append { key: String, fields: Vec<(String, String)>, max_len: usize },
    /// The newest `count` entries of a stream, newest first.
    ReadRecent { key: String, count: usize },
    /// Members of an index with their scores, oldest first.
    IndexMembers(String),
    /// Several writes (and counter reads) in one round trip, applied in order and not atomic:
    /// the node's once-per-cycle writes.
    Batch(Vec<Op>),
    /// The clock and, for each worker, its status record and several string keys, all of
    /// *one node* (one hash slot), in one round trip (two on a Redis Cluster: the fleet's one
    /// clock is read apart, from slot 0's master): everything the node's verdicts need (a
    /// cycle reads its whole node at once; an empty list reads the clock alone). A record that
    /// cannot be read is returned as such (`record: Err`); only a transport failure is an error.
    ReadWorkers(Vec<WorkerKeys>),
}

/// What a [`Request`] returns, one variant per request shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `Time`.
    Time(Millis),
    /// `GetMany`; `Hget` (one value).
    Values(Vec<Option<String>>),
    /// `SetNx`, `DelIfOwner`, `RenewIfOwner`.
    Done(bool),
    /// `Del`, `Decr`, `Append`.
    Ok,
    /// `OwnerTtl`.
    Ttl(Option<Millis>),
    /// `IncrCapped`.
    Taken(Option<u64>),
    /// `HdelIfEqual`: how many fields it removed.
    Removed(u64),
    /// `Hgetall`.
    Hash(HashMap<String, String>),
    /// `HgetallMany`.
    Hashes(Vec<HashMap<String, String>>),
    /// `ReadRecent`.
    Entries(Vec<TrailEntry>),
    /// `IndexMembers`.
    Members(Vec<(String, Millis)>),
    /// `Batch`: the values of its `Counter` ops, in order.
    Counters(Vec<u64>),
    /// `ReadWorkers`.
    Workers(NodeRead),
}

/// Shared storage: one method. A backend (Redis, in-process) answers every [`Request`]; a
/// decorator (a counting, fault-injecting or switchable wrapper) is one `execute` that passes
/// the request on, so it can never forget an operation. The typed calls the agent makes
/// (`coord.time()`, `coord.set_nx(..)`, …) are thin methods on `dyn Coordinator` below.
#[async_trait]
pub trait Coordinator: Send + Sync {
    /// Where this coordinator lives, for logs and `vigil doctor`.
    fn describe(&self) -> String;
    /// True for the in-process store, which is safe for one agent on one node only.
    fn single_node(&self) -> bool {
        false
    }
    /// Run one request: one round trip on Redis.
    async fn execute(&self, request: Request) -> Result<Reply>;
}

/// A reply of the wrong shape: a backend's bug, reported as a failed command (never a panic).
fn mismatch(coord: &dyn Coordinator, asked: &str, reply: Reply) -> CoordError {
    // NB: the error's text says "redis at" itself; a Redis coordinator's `describe()` too.
    let described = coord.describe();
    let addr = described.strip_prefix("redis at ").unwrap_or(&described).into();
    CoordError::Command { addr, source: format!("{asked} was answered with {reply:?}").into() }
}

macro_rules! call {
    ($coord:expr, $request:expr, $name:literal, $pat:pat => $out:expr) => {
        match $coord.execute($request).await? {
            $pat => Ok($out),
            other => Err(mismatch($coord, $name, other)),
        }
    };
}

/// The typed calls: each builds one [`Request`] and unpacks its [`Reply`].
impl<'a> dyn Coordinator + 'a {
    pub async fn time(&self) -> Result<Millis> {
        call!(self, Request::Time, "TIME", Reply::Time(t) => t)
    }

    pub async fn get_many(&self, keys: &[String]) -> Result<Vec<Option<String>>> {
        call!(self, Request::GetMany(keys.to_vec()), "MGET", Reply::Values(v) => v)
    }

    /// One string key's value (`None` when absent): `get_many` of one key.
    pub async fn get(&self, key: &str) -> Result<Option<String>> {
        Ok(self.get_many(&[key.to_string()]).await?.into_iter().flatten().next())
    }

    pub async fn set_nx(&self, key: &str, value: &str, ttl: Duration) -> Result<bool> {
        let request = Request::SetNx { key: key.into(), value: value.into(), ttl };
        call!(self, request, "SET NX", Reply::Done(b) => b)
    }

    pub async fn del(&self, keys: &[String]) -> Result<()> {
        call!(self, Request::Del(keys.to_vec()), "DEL", Reply::Ok => ())
    }

    pub async fn owner_ttl(&self, key: &str, token: &str) -> Result<Option<Millis>> {
        let request = Request::OwnerTtl { key: key.into(), token: token.into() };
        call!(self, request, "owner TTL", Reply::Ttl(t) => t)
    }

    pub async fn del_if_owner(&self, key: &str, token: &str) -> Result<bool> {
        let request = Request::DelIfOwner { key: key.into(), token: token.into() };
        call!(self, request, "compare-and-delete", Reply::Done(b) => b)
    }

    pub async fn renew_if_owner(&self, key: &str, token: &str, ttl: Duration) -> Result<bool> {
        let request = Request::RenewIfOwner { key: key.into(), token: token.into(), ttl };
        call!(self, request, "compare-and-renew", Reply::Done(b) => b)
    }

    /// Compare-and-delete of hash fields (see [`Request::HdelIfEqual`]): how many went.
    pub async fn hdel_if_equal(&self, key: &str, fields: &Fields) -> Result<u64> {
        let request = Request::HdelIfEqual { key: key.into(), fields: fields.to_vec() };
        call!(self, request, "compare-and-delete of hash fields", Reply::Removed(n) => n)
    }

    pub async fn incr_capped(&self, key: &str, cap: u64, ttl: Duration) -> Result<Option<u64>> {
        let request = Request::IncrCapped { key: key.into(), cap, ttl };
        call!(self, request, "capped INCR", Reply::Taken(v) => v)
    }

    pub async fn decr(&self, key: &str) -> Result<()> {
        call!(self, Request::Decr(key.into()), "DECR", Reply::Ok => ())
    }

    pub async fn hget(&self, key: &str, field: &str) -> Result<Option<String>> {
        let (key, field) = (key.into(), field.into());
        call!(self, Request::Hget { key, field }, "HGET", Reply::Values(mut v) => v.pop().flatten())
    }

    pub async fn hgetall(&self, key: &str) -> Result<HashMap<String, String>> {
        call!(self, Request::Hgetall(key.into()), "HGETALL", Reply::Hash(h) => h)
    }

    pub async fn hgetall_many(&self, keys: &[String]) -> Result<Vec<HashMap<String, String>>> {
        call!(self, Request::HgetallMany(keys.to_vec()), "HGETALL (many)", Reply::Hashes(h) => h)
    }

    pub async fn append(&self, key: &str, fields: &Fields, max_len: usize) -> Result<()> {
        let request = Request::Append { key: key.into(), fields: fields.to_vec(), max_len };
        call!(self, request, "XADD", Reply::Ok => ())
    }

    pub async fn read_recent(&self, key: &str, count: usize) -> Result<Vec<TrailEntry>> {
        let request = Request::ReadRecent { key: key.into(), count };
        call!(self, request, "XREVRANGE", Reply::Entries(e) => e)
    }

    pub async fn index_members(&self, key: &str) -> Result<Vec<(String, Millis)>> {
        call!(self, Request::IndexMembers(key.into()), "ZRANGE", Reply::Members(m) => m)
    }

    pub async fn batch(&self, ops: &[Op]) -> Result<Vec<u64>> {
        call!(self, Request::Batch(ops.to_vec()), "batch", Reply::Counters(c) => c)
    }

    /// The clock and every listed worker's record and marks, in one round trip.
    pub async fn read_workers(&self, workers: &[WorkerKeys]) -> Result<NodeRead> {
        let request = Request::ReadWorkers(workers.to_vec());
        let read = call!(self, request, "workers read", Reply::Workers(r) => r)?;
        if read.workers.len() != workers.len() {
            let reply = Reply::Workers(read);
            return Err(mismatch(self, "workers read (one answer per worker)", reply));
        }
        Ok(read)
    }

    /// One worker's clock, record and marks: `read_workers` of one.
    pub async fn read_worker(&self, record: &str, keys: &[String]) -> Result<WorkerRead> {
        let one = WorkerKeys { record: record.into(), keys: keys.to_vec() };
        let mut read = self.read_workers(std::slice::from_ref(&one)).await?;
        // `read_workers` answered one read per worker asked, or failed.
        let none = || mismatch(self, "worker read", Reply::Workers(NodeRead::default()));
        read.workers.pop().ok_or_else(none)
    }

    /// Set unconditionally with a TTL.
    pub async fn set(&self, key: &str, value: &str, ttl: Duration) -> Result<()> {
        self.batch(&[Op::Set { key: key.into(), value: value.into(), ttl }]).await.map(drop)
    }

    /// Write a hash's fields; with a `ttl`, (re)set its TTL too (see [`Op::Hset`]).
    pub async fn hset(&self, key: &str, fields: &Fields, ttl: Option<Duration>) -> Result<()> {
        self.batch(&[Op::Hset { key: key.into(), fields: fields.to_vec(), ttl }]).await.map(drop)
    }

    /// Read a counter (0 when absent).
    pub async fn counter(&self, key: &str) -> Result<u64> {
        Ok(self.batch(&[Op::Counter { key: key.into() }]).await?.first().copied().unwrap_or(0))
    }
}

/// [`Request::ReadWorkers`] built from the single requests (the clock, then a record and its
/// marks per worker), for a backend without a native one (the in-process store) and for a
/// decorator that wants to see the parts (the simulation's fault gate).
pub async fn read_workers_by_parts(
    coord: &dyn Coordinator,
    workers: &[WorkerKeys],
) -> Result<NodeRead> {
    let now = coord.time().await?;
    let mut reads = Vec::with_capacity(workers.len());
    for w in workers {
        let record = match coord.hgetall(&w.record).await {
            Ok(fields) => oversized(&fields).map_or(Ok(fields), Err),
            Err(CoordError::Command { source, .. }) => {
                Err(RecordUnreadable::Refused(source.to_string()))
            }
            Err(e) => return Err(e),
        };
        reads.push(WorkerRead { now, record, values: coord.get_many(&w.keys).await? });
    }
    Ok(NodeRead { now, workers: reads })
}

/// Heartbeat value for a status record: seconds since the epoch with millisecond decimals.
pub fn heartbeat_value(now: Millis) -> String {
    format!("{}.{:03}", now.div_euclid(1000), now.rem_euclid(1000))
}

/// Write (part of) a worker's status record, stamping `heartbeat_field` (`heartbeat`, or
/// `heartbeat@3`: a rank's) with the store's clock, under the record's own prefix. Used by
/// `vigil beat` and by the local status API; a worker confined by the worker ACL of
/// docs/security.md may call it: it sends `TIME` and `HSET` of its record, nothing else.
pub async fn write_status(
    coord: &dyn Coordinator,
    keys: &Keys,
    worker: &str,
    fields: &Fields,
    heartbeat_field: &str,
) -> Result<Millis> {
    let now = coord.time().await?;
    let mut all: Vec<(String, String)> = fields.to_vec();
    all.push((heartbeat_field.into(), heartbeat_value(now)));
    coord.hset(&keys.status(worker), &all, None).await?;
    Ok(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_value_has_millisecond_decimals() {
        assert_eq!(heartbeat_value(1_800_000_000_025), "1800000000.025");
    }

    /// A coordinator described as the Redis one is (its URL redacted).
    struct Described;

    #[async_trait]
    impl Coordinator for Described {
        fn describe(&self) -> String {
            "redis at redis://:***@redis.vigil:6379/0".into()
        }
        async fn execute(&self, _: Request) -> Result<Reply> {
            Ok(Reply::Ok)
        }
    }

    #[test]
    fn a_reply_of_the_wrong_shape_names_redis_once() {
        let text = mismatch(&Described, "TIME", Reply::Ok).to_string();
        assert!(!text.contains("redis at redis at"), "{text}");
        assert!(text.starts_with("redis at redis://:***@redis.vigil:6379/0 answered"), "{text}");
    }
}
