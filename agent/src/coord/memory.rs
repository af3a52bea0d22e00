//! The in-process coordinator: the same semantics as Redis for one agent on one machine, used when
//! no `REDIS_URL` is configured and by the deterministic scenario tests (with a fake clock).
//!
//! NB: it is safe only for a single agent process — two agents each with their own memory would
//! each hold "the" lock. The agent says so once at start-up.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
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

pub struct MemoryCoordinator {
    clock: Arc<dyn Clock>,
    data: Mutex<HashMap<String, Entry>>,
}

impl MemoryCoordinator {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryCoordinator { clock, data: Mutex::new(HashMap::new()) }
    }

    /// The map with expired keys already gone, as Redis would show it.
    fn live(&self) -> (MutexGuard<'_, HashMap<String, Entry>>, Millis) {
        let now = self.clock.now();
        let mut data = self.data.lock().unwrap_or_else(|p| p.into_inner());
        data.retain(|_, e| e.expires.is_none_or(|t| t > now));
        (data, now)
    }

    /// `key` holds `token` (compare-and-delete, compare-and-renew).
    fn holds(data: &HashMap<String, Entry>, key: &str, token: &str) -> bool {
        Self::get_str(data, key).as_deref() == Some(token)
    }

    fn get_str(data: &HashMap<String, Entry>, key: &str) -> Option<String> {
        match data.get(key).map(|e| &e.value) {
            Some(Value::Str(s)) => Some(s.clone()),
            _ => None,
        }
    }
}

/// The counter at `key` (0 when absent or not a number).
fn counter_of(data: &HashMap<String, Entry>, key: &str) -> u64 {
    MemoryCoordinator::get_str(data, key).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The value at `key`, `fresh()` when there is none (no TTL) or it is of another type (a key of
/// another type is replaced, its TTL kept).
fn typed<'d>(
    data: &'d mut HashMap<String, Entry>,
    key: &str,
    fresh: fn() -> Value,
) -> &'d mut Value {
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
        Ok(match request {
            Request::Time => Reply::Time(self.clock.now()),
            Request::GetMany(keys) => {
                let (data, _) = self.live();
                Reply::Values(keys.iter().map(|k| Self::get_str(&data, k)).collect())
            }
            Request::SetNx { key, value, ttl } => Reply::Done(set_nx(self, key, value, ttl)),
            Request::Del(keys) => {
                let (mut data, _) = self.live();
                for k in keys {
                    data.remove(&k);
                }
                Reply::Ok
            }
            Request::OwnerTtl { key, token } => Reply::Ttl(owner_ttl(self, &key, &token)),
            Request::DelIfOwner { key, token } => {
                let (mut data, _) = self.live();
                let owned = Self::holds(&data, &key, &token);
                if owned {
                    data.remove(&key);
                }
                Reply::Done(owned)
            }
            Request::RenewIfOwner { key, token, ttl } => {
                let (mut data, now) = self.live();
                let owned = Self::holds(&data, &key, &token);
                if let (true, Some(e)) = (owned, data.get_mut(&key)) {
                    e.expires = Some(now + ttl.as_millis() as Millis);
                }
                Reply::Done(owned)
            }
            Request::IncrCapped { key, cap, ttl } => Reply::Taken(incr_capped(self, key, cap, ttl)),
            Request::Decr(key) => {
                decr(self, &key);
                Reply::Ok
            }
            Request::Hgetall(key) => Reply::Hash(hgetall(self, &key)),
            Request::Hget { key, field } => Reply::Values(vec![hgetall(self, &key).remove(&field)]),
            Request::HgetallMany(keys) => {
                Reply::Hashes(keys.iter().map(|k| hgetall(self, k)).collect())
            }
            Request::Append { key, fields, max_len } => {
                append(self, key, fields, max_len);
                Reply::Ok
            }
            Request::ReadRecent { key, count } => Reply::Entries(read_recent(self, &key, count)),
            Request::IndexMembers(key) => Reply::Members(index_members(self, &key)),
            Request::Batch(ops) => Reply::Counters(batch(self, &ops)),
            Request::ReadWorkers(workers) => {
                Reply::Workers(read_workers_by_parts(self, &workers).await?)
            }
        })
    }
}

fn set_nx(c: &MemoryCoordinator, key: String, value: String, ttl: Duration) -> bool {
    let (mut data, now) = c.live();
    if data.contains_key(&key) {
        return false;
    }
    let expires = Some(now + ms(ttl));
    data.insert(key, Entry { value: Value::Str(value), expires });
    true
}

fn owner_ttl(c: &MemoryCoordinator, key: &str, token: &str) -> Option<Millis> {
    let (data, now) = c.live();
    match data.get(key) {
        Some(Entry { value: Value::Str(v), expires }) if v == token => {
            Some(expires.map_or(Millis::MAX, |t| t - now))
        }
        _ => None,
    }
}

fn incr_capped(c: &MemoryCoordinator, key: String, cap: u64, ttl: Duration) -> Option<u64> {
    let (mut data, now) = c.live();
    let cur = counter_of(&data, &key);
    if cur >= cap {
        return None;
    }
    let expires = data.get(&key).and_then(|e| e.expires).or(Some(now + ms(ttl)));
    data.insert(key, Entry { value: Value::Str((cur + 1).to_string()), expires });
    Some(cur + 1)
}

fn decr(c: &MemoryCoordinator, key: &str) {
    let (mut data, _) = c.live();
    if let Some(Entry { value: Value::Str(s), .. }) = data.get_mut(key) {
        let cur: u64 = s.parse().unwrap_or(0);
        *s = cur.saturating_sub(1).to_string();
    }
}

fn hgetall(c: &MemoryCoordinator, key: &str) -> HashMap<String, String> {
    let (data, _) = c.live();
    match data.get(key).map(|e| &e.value) {
        Some(Value::Hash(h)) => h.clone(),
        _ => HashMap::new(),
    }
}

fn append(c: &MemoryCoordinator, key: String, fields: Vec<(String, String)>, max_len: usize) {
    let (mut data, now) = c.live();
    let entry = data
        .entry(key)
        .or_insert_with(|| Entry { value: Value::Stream(VecDeque::new(), 0), expires: None });
    if let Value::Stream(q, seq) = &mut entry.value {
        *seq += 1;
        q.push_back((format!("{now}-{seq}"), fields.into_iter().collect()));
        while q.len() > max_len {
            q.pop_front();
        }
    }
}

fn index_members(c: &MemoryCoordinator, key: &str) -> Vec<(String, Millis)> {
    let (data, _) = c.live();
    let mut v: Vec<(String, Millis)> = match data.get(key).map(|e| &e.value) {
        Some(Value::Index(m)) => m.iter().map(|(k, s)| (k.clone(), *s)).collect(),
        _ => Vec::new(),
    };
    v.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    v
}

fn read_recent(c: &MemoryCoordinator, key: &str, count: usize) -> Vec<TrailEntry> {
    let (data, _) = c.live();
    match data.get(key).map(|e| &e.value) {
        Some(Value::Stream(q, _)) => q.iter().rev().take(count).cloned().collect(),
        _ => Vec::new(),
    }
}

fn batch(c: &MemoryCoordinator, ops: &[Op]) -> Vec<u64> {
    let (mut data, now) = c.live();
    let mut counters = Vec::new();
    for op in ops {
        match op {
            Op::Set { key, value, ttl } => {
                let value = Value::Str(value.clone());
                let expires = Some(now + ms(*ttl));
                data.insert(key.clone(), Entry { value, expires });
            }
            Op::Hset { key, fields, ttl } => {
                if let Value::Hash(h) = typed(&mut data, key, || Value::Hash(HashMap::new())) {
                    h.extend(fields.iter().cloned());
                }
                if let (Some(ttl), Some(e)) = (ttl, data.get_mut(key)) {
                    e.expires = Some(now + ms(*ttl));
                }
            }
            // Add or refresh `member`, pruning members scored below `prune_before`.
            Op::IndexTouch { key, member, score, prune_before } => {
                let prune_before = prune_before.unwrap_or(Millis::MIN);
                if let Value::Index(m) = typed(&mut data, key, || Value::Index(HashMap::new())) {
                    m.insert(member.clone(), *score);
                    m.retain(|_, s| *s >= prune_before);
                }
            }
            Op::Hdel { key, fields } => {
                if let Some(Value::Hash(h)) = data.get_mut(key).map(|e| &mut e.value) {
                    for f in fields {
                        h.remove(f);
                    }
                    if h.is_empty() {
                        data.remove(key);
                    }
                }
            }
            Op::Counter { key } => counters.push(counter_of(&data, key)),
        }
    }
    counters
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
