//! The in-process coordinator: the same semantics as Redis for one agent on one machine, used when
//! no `REDIS_URL` is configured and by the deterministic scenario tests (with a fake clock).
//!
//! NB: it is safe only for a single agent process — two agents each with their own memory would
//! each hold "the" lock. The agent says so once at start-up. And it lives as long as the process:
//! an agent restart forgets the day's breaker count, cooldowns, escalation marks and fruitless
//! runs (docs/running.md).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{read_workers_by_parts, CoordError, Coordinator, Op, Reply, Request, TrailEntry};
use crate::clock::{ms, Clock, Millis};

enum Value {
    Str(String),
    Index(HashMap<String, Millis>),
    Hash(HashMap<String, String>),
    Stream(VecDeque<TrailEntry>, u64),
}

struct Entry {
    value: Value,
    expires: Option<Millis>,
}

type Data = HashMap<String, Entry>;

pub struct MemoryCoordinator {
    clock: Arc<dyn Clock>,
    data: Mutex<Data>,
}

impl MemoryCoordinator {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryCoordinator { clock, data: Mutex::new(HashMap::new()) }
    }
}

/// The string at `key` (`None`: absent, or a key of another type).
fn str_at(data: &Data, key: &str) -> Option<String> {
    let Some(Value::Str(s)) = data.get(key).map(|e| &e.value) else { return None };
    Some(s.clone())
}

/// The hash at `key` (empty when absent or of another type).
fn hash_at(data: &Data, key: &str) -> HashMap<String, String> {
    let Some(Value::Hash(h)) = data.get(key).map(|e| &e.value) else { return HashMap::new() };
    h.clone()
}

/// The counter at `key` (0 when absent or not a number).
fn counter_of(data: &Data, key: &str) -> u64 {
    str_at(data, key).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The entry at `key` while it holds `token` (compare-and-delete, compare-and-renew).
fn owned<'d>(data: &'d mut Data, key: &str, token: &str) -> Option<&'d mut Entry> {
    data.get_mut(key).filter(|e| matches!(&e.value, Value::Str(v) if v == token))
}

/// The value at `key`, `fresh()` when there is none (no TTL) or it is of another type (a key of
/// another type is replaced, its TTL kept).
fn typed<'d>(data: &'d mut Data, key: &str, fresh: fn() -> Value) -> &'d mut Value {
    let entry = data.entry(key.into()).or_insert_with(|| Entry { value: fresh(), expires: None });
    if std::mem::discriminant(&entry.value) != std::mem::discriminant(&fresh()) {
        entry.value = fresh();
    }
    &mut entry.value
}

#[async_trait]
impl Coordinator for MemoryCoordinator {
    fn describe(&self) -> String {
        "embedded in-process coordinator (single node only)".into()
    }

    fn single_node(&self) -> bool {
        true
    }

    async fn execute(&self, request: Request) -> Result<Reply, CoordError> {
        if let Request::Time = request {
            return Ok(Reply::Time(self.clock.now()));
        }
        // NB: by parts, each taking the lock itself (it is never held across an await).
        if let Request::ReadWorkers(workers) = request {
            return Ok(Reply::Workers(read_workers_by_parts(self, &workers).await?));
        }
        // On the map with expired keys already gone, as Redis would show it.
        let now = self.clock.now();
        let mut data = self.data.lock().unwrap_or_else(|p| p.into_inner());
        data.retain(|_, e| e.expires.is_none_or(|t| t > now));
        Ok(answer(&mut data, now, request))
    }
}

/// One request on the live map (`execute` answers `Time` without it, and reads workers by parts,
/// each part one of these).
fn answer(data: &mut Data, now: Millis, request: Request) -> Reply {
    match request {
        Request::GetMany(keys) => Reply::Values(keys.iter().map(|k| str_at(data, k)).collect()),
        Request::SetNx { key, value, ttl } if !data.contains_key(&key) => {
            data.insert(key, Entry { value: Value::Str(value), expires: Some(now + ms(ttl)) });
            Reply::Done(true)
        }
        Request::SetNx { .. } => Reply::Done(false),
        Request::Del(keys) => {
            data.retain(|k, _| !keys.contains(k));
            Reply::Ok
        }
        Request::OwnerTtl { key, token } => Reply::Ttl(
            owned(data, &key, &token).map(|e| e.expires.map_or(Millis::MAX, |t| t - now)),
        ),
        Request::DelIfOwner { key, token } => {
            Reply::Done(owned(data, &key, &token).is_some() && data.remove(&key).is_some())
        }
        Request::RenewIfOwner { key, token, ttl } => {
            let held = owned(data, &key, &token).map(|e| e.expires = Some(now + ms(ttl)));
            Reply::Done(held.is_some())
        }
        Request::HdelIfEqual { key, fields } => {
            let held = |f: &String, v: &String| fields.iter().any(|p| (&p.0, &p.1) == (f, v));
            Reply::Removed(hash_remove(data, &key, held))
        }
        Request::IncrCapped { key, cap, ttl } => {
            Reply::Taken(incr_capped(data, now, key, cap, ttl))
        }
        Request::Decr(key) => {
            if let Some(Entry { value: Value::Str(s), .. }) = data.get_mut(&key) {
                *s = s.parse().unwrap_or(0u64).saturating_sub(1).to_string();
            }
            Reply::Ok
        }
        Request::Hgetall(key) => Reply::Hash(hash_at(data, &key)),
        Request::Hget { key, field } => Reply::Values(vec![hash_at(data, &key).remove(&field)]),
        Request::HgetallMany(keys) => {
            Reply::Hashes(keys.iter().map(|k| hash_at(data, k)).collect())
        }
        Request::Append { key, fields, max_len } => {
            let stream = Entry { value: Value::Stream(VecDeque::new(), 0), expires: None };
            if let Value::Stream(q, seq) = &mut data.entry(key).or_insert(stream).value {
                *seq += 1;
                q.push_back((format!("{now}-{seq}"), fields.into_iter().collect()));
                q.drain(..q.len().saturating_sub(max_len));
            }
            Reply::Ok
        }
        Request::ReadRecent { key, count } => Reply::Entries(read_recent(data, &key, count)),
        Request::IndexMembers(key) => Reply::Members(index_members(data, &key)),
        Request::Batch(ops) => {
            Reply::Counters(ops.iter().filter_map(|op| apply_op(data, now, op)).collect())
        }
        Request::Time => Reply::Time(now),
        // NB: `execute` reads workers by parts (each part its own request); a reply of the
        // wrong kind is the caller's error, never a panic.
        Request::ReadWorkers(_) => Reply::Ok,
    }
}

/// The counter at `key` incremented unless it reached `cap`; a new one lives `ttl`.
fn incr_capped(data: &mut Data, now: Millis, key: String, cap: u64, ttl: Duration) -> Option<u64> {
    let cur = counter_of(data, &key);
    if cur >= cap {
        return None;
    }
    let expires = data.get(&key).and_then(|e| e.expires).or(Some(now + ms(ttl)));
    data.insert(key, Entry { value: Value::Str((cur + 1).to_string()), expires });
    Some(cur + 1)
}

/// An index's members with their scores, oldest first.
fn index_members(data: &Data, key: &str) -> Vec<(String, Millis)> {
    let Some(Value::Index(m)) = data.get(key).map(|e| &e.value) else { return Vec::new() };
    let mut v: Vec<(String, Millis)> = m.iter().map(|(k, s)| (k.clone(), *s)).collect();
    v.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    v
}

/// The newest `count` entries of a stream, newest first.
fn read_recent(data: &Data, key: &str, count: usize) -> Vec<TrailEntry> {
    let Some(Value::Stream(q, _)) = data.get(key).map(|e| &e.value) else { return Vec::new() };
    q.iter().rev().take(count).cloned().collect()
}

/// One op of a batch; only a `Counter` answers (its value).
fn apply_op(data: &mut Data, now: Millis, op: &Op) -> Option<u64> {
    match op {
        Op::Set { key, value, ttl } => {
            let value = Value::Str(value.clone());
            data.insert(key.clone(), Entry { value, expires: Some(now + ms(*ttl)) });
        }
        Op::Hset { key, fields, ttl } => {
            if let Value::Hash(h) = typed(data, key, || Value::Hash(HashMap::new())) {
                h.extend(fields.iter().cloned());
            }
            if let (Some(ttl), Some(e)) = (ttl, data.get_mut(key)) {
                e.expires = Some(now + ms(*ttl));
            }
        }
        // Add or refresh `member`, pruning members scored below `prune_before`.
        Op::IndexTouch { key, member, score, prune_before } => {
            if let Value::Index(m) = typed(data, key, || Value::Index(HashMap::new())) {
                m.insert(member.clone(), *score);
                m.retain(|_, s| prune_before.is_none_or(|before| *s >= before));
            }
        }
        Op::Hdel { key, fields } => {
            hash_remove(data, key, |f, _| fields.contains(f));
        }
        Op::Expire { key, ttl } => {
            if let Some(e) = data.get_mut(key) {
                e.expires = Some(now + ms(*ttl));
            }
        }
        Op::Counter { key } => return Some(counter_of(data, key)),
    }
    None
}

/// Remove the fields of the hash at `key` that `gone` picks (the hash goes with its last field,
/// as in Redis): how many went.
fn hash_remove(data: &mut Data, key: &str, gone: impl Fn(&String, &String) -> bool) -> u64 {
    let Some(Value::Hash(h)) = data.get_mut(key).map(|e| &mut e.value) else { return 0 };
    let before = h.len();
    h.retain(|f, v| !gone(f, &*v));
    let removed = before - h.len();
    if h.is_empty() {
        data.remove(key);
    }
    removed as u64
}

/// The in-process coordinator failing the requests `fails` picks, unanswered and not applied:
/// a Redis blip for unit tests.
#[cfg(test)]
pub(crate) struct Failing {
    pub(crate) inner: MemoryCoordinator,
    pub(crate) fails: Box<dyn Fn(&Request) -> bool + Send + Sync>,
}

#[cfg(test)]
#[async_trait]
impl Coordinator for Failing {
    fn describe(&self) -> String {
        "failing".into()
    }
    async fn execute(&self, request: Request) -> Result<Reply, CoordError> {
        if (self.fails)(&request) {
            return Err(CoordError::Timeout {
                addr: "failing".into(),
                timeout: Duration::from_millis(1),
            });
        }
        self.inner.execute(request).await
    }
}
