//! The in-process coordinator: the same semantics as Redis for one agent on one machine, used when
//! no `REDIS_URL` is configured and by the deterministic scenario tests (with a fake clock).
//!
//! NB: it is safe only for a single agent process — two agents each with their own memory would
//! each hold "the" lock. The agent says so once at start-up.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::{CoordError, Coordinator, Op, TrailEntry};
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
        MemoryCoordinator {
            clock,
            data: Mutex::new(HashMap::new()),
        }
    }

    /// The map with expired keys already gone, as Redis would show it.
    fn live(&self) -> (MutexGuard<'_, HashMap<String, Entry>>, Millis) {
        let now = self.clock.now();
        let mut data = self.data.lock().unwrap_or_else(|p| p.into_inner());
        data.retain(|_, e| e.expires.is_none_or(|t| t > now));
        (data, now)
    }

    fn get_str(data: &HashMap<String, Entry>, key: &str) -> Option<String> {
        match data.get(key).map(|e| &e.value) {
            Some(Value::Str(s)) => Some(s.clone()),
            _ => None,
        }
    }

    /// Merge `fields` into the hash at `key` (a key of another type is replaced).
    fn merge_hash(data: &mut HashMap<String, Entry>, key: &str, fields: &[(String, String)]) {
        let entry = data.entry(key.into()).or_insert_with(|| Entry {
            value: Value::Hash(HashMap::new()),
            expires: None,
        });
        if !matches!(entry.value, Value::Hash(_)) {
            entry.value = Value::Hash(HashMap::new());
        }
        if let Value::Hash(h) = &mut entry.value {
            for (k, v) in fields {
                h.insert(k.clone(), v.clone());
            }
        }
    }

    /// Add or refresh `member` of the index at `key`, pruning members scored below
    /// `prune_before` (a key of another type is replaced).
    fn touch_index(
        data: &mut HashMap<String, Entry>,
        key: &str,
        member: &str,
        score: Millis,
        prune_before: Millis,
    ) {
        let entry = data.entry(key.into()).or_insert_with(|| Entry {
            value: Value::Index(HashMap::new()),
            expires: None,
        });
        if !matches!(entry.value, Value::Index(_)) {
            entry.value = Value::Index(HashMap::new());
        }
        if let Value::Index(m) = &mut entry.value {
            m.insert(member.to_string(), score);
            m.retain(|_, s| *s >= prune_before);
        }
    }
}

#[async_trait]
impl Coordinator for MemoryCoordinator {
    fn describe(&self) -> String {
        "embedded in-process coordinator (single node only)".into()
    }

    fn single_node(&self) -> bool {
        true
    }

    async fn time(&self) -> Result<Millis, CoordError> {
        Ok(self.clock.now())
    }

    async fn get_many(&self, keys: &[String]) -> Result<Vec<Option<String>>, CoordError> {
        let (data, _) = self.live();
        Ok(keys.iter().map(|k| Self::get_str(&data, k)).collect())
    }

    async fn set_nx(&self, key: &str, value: &str, ttl: Duration) -> Result<bool, CoordError> {
        let (mut data, now) = self.live();
        if data.contains_key(key) {
            return Ok(false);
        }
        data.insert(
            key.into(),
            Entry {
                value: Value::Str(value.into()),
                expires: Some(now + ms(ttl)),
            },
        );
        Ok(true)
    }

    async fn del(&self, keys: &[String]) -> Result<(), CoordError> {
        let (mut data, _) = self.live();
        for k in keys {
            data.remove(k);
        }
        Ok(())
    }

    async fn owner_ttl(&self, key: &str, token: &str) -> Result<Option<Millis>, CoordError> {
        let (data, now) = self.live();
        Ok(match data.get(key) {
            Some(Entry {
                value: Value::Str(v),
                expires,
            }) if v == token => Some(expires.map_or(Millis::MAX, |t| t - now)),
            _ => None,
        })
    }

    async fn del_if_owner(&self, key: &str, token: &str) -> Result<bool, CoordError> {
        let (mut data, _) = self.live();
        if Self::get_str(&data, key).as_deref() == Some(token) {
            data.remove(key);
            return Ok(true);
        }
        Ok(false)
    }

    async fn incr_capped(
        &self,
        key: &str,
        cap: u64,
        ttl: Duration,
    ) -> Result<Option<u64>, CoordError> {
        let (mut data, now) = self.live();
        let cur: u64 = Self::get_str(&data, key)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if cur >= cap {
            return Ok(None);
        }
        let expires = data
            .get(key)
            .and_then(|e| e.expires)
            .or(Some(now + ms(ttl)));
        data.insert(
            key.into(),
            Entry {
                value: Value::Str((cur + 1).to_string()),
                expires,
            },
        );
        Ok(Some(cur + 1))
    }

    async fn decr(&self, key: &str) -> Result<(), CoordError> {
        let (mut data, _) = self.live();
        if let Some(Entry {
            value: Value::Str(s),
            ..
        }) = data.get_mut(key)
        {
            let cur: u64 = s.parse().unwrap_or(0);
            *s = cur.saturating_sub(1).to_string();
        }
        Ok(())
    }

    async fn hgetall(&self, key: &str) -> Result<HashMap<String, String>, CoordError> {
        let (data, _) = self.live();
        Ok(match data.get(key).map(|e| &e.value) {
            Some(Value::Hash(h)) => h.clone(),
            _ => HashMap::new(),
        })
    }

    async fn append(
        &self,
        key: &str,
        fields: &[(String, String)],
        max_len: usize,
    ) -> Result<(), CoordError> {
        let (mut data, now) = self.live();
        let entry = data.entry(key.into()).or_insert_with(|| Entry {
            value: Value::Stream(VecDeque::new(), 0),
            expires: None,
        });
        if let Value::Stream(q, seq) = &mut entry.value {
            *seq += 1;
            q.push_back((format!("{now}-{seq}"), fields.iter().cloned().collect()));
            while q.len() > max_len {
                q.pop_front();
            }
        }
        Ok(())
    }

    async fn index_members(&self, key: &str) -> Result<Vec<(String, Millis)>, CoordError> {
        let (data, _) = self.live();
        let mut v: Vec<(String, Millis)> = match data.get(key).map(|e| &e.value) {
            Some(Value::Index(m)) => m.iter().map(|(k, s)| (k.clone(), *s)).collect(),
            _ => Vec::new(),
        };
        v.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
        Ok(v)
    }

    async fn read_recent(&self, key: &str, count: usize) -> Result<Vec<TrailEntry>, CoordError> {
        let (data, _) = self.live();
        Ok(match data.get(key).map(|e| &e.value) {
            Some(Value::Stream(q, _)) => q.iter().rev().take(count).cloned().collect(),
            _ => Vec::new(),
        })
    }

    async fn batch(&self, ops: &[Op]) -> Result<Vec<u64>, CoordError> {
        let (mut data, now) = self.live();
        let mut counters = Vec::new();
        for op in ops {
            match op {
                Op::Set { key, value, ttl } => {
                    let value = Value::Str(value.clone());
                    let expires = Some(now + ms(*ttl));
                    data.insert(key.clone(), Entry { value, expires });
                }
                Op::Hset { key, fields, ttl } => {
                    Self::merge_hash(&mut data, key, fields);
                    if let (Some(ttl), Some(e)) = (ttl, data.get_mut(key)) {
                        e.expires = Some(now + ms(*ttl));
                    }
                }
                Op::IndexTouch {
                    key,
                    member,
                    score,
                    prune_before,
                } => Self::touch_index(&mut data, key, member, *score, *prune_before),
                Op::Counter { key } => counters.push(
                    Self::get_str(&data, key)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0),
                ),
            }
        }
        Ok(counters)
    }
}
