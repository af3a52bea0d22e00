//! The Redis coordinator. Atomic compare-and-act steps are Lua scripts on one key each, so they
//! are single-slot in Redis Cluster. Every command has a timeout: a Redis that does not answer is
//! treated exactly like one that is down (restarts pause; the agent fails closed).

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue, Script};
use tokio::sync::Mutex;

use super::{CoordError, Coordinator, TrailEntry};
use crate::clock::{ms, Millis};

static OWNER_TTL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PTTL', KEYS[1]) end
return -3",
    )
});

static DEL_IF_OWNER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0",
    )
});

// NB: check and increment in one script, so two agents can never both take the last unit.
static INCR_CAPPED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = tonumber(redis.call('GET', KEYS[1]) or '0')
if v >= tonumber(ARGV[1]) then return -1 end
v = redis.call('INCR', KEYS[1])
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return v",
    )
});

static DECR_FLOOR: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = tonumber(redis.call('GET', KEYS[1]) or '0')
if v > 0 then return redis.call('DECR', KEYS[1]) end
return 0",
    )
});

// NB: a worker's clock, record and marks in one round trip. The record is read under pcall: a
// key of another type is that worker's problem, not a failed cycle. All keys are one node's,
// so one hash slot.
static READ_WORKER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local ok, rec = pcall(redis.call, 'HGETALL', KEYS[1])
local marks = {}
if #KEYS > 1 then marks = redis.call('MGET', unpack(KEYS, 2)) end
if ok then return {t[1], t[2], 1, rec, marks} end
local why = rec
if type(rec) == 'table' then why = rec.err or rec['err'] end
return {t[1], t[2], 0, tostring(why), marks}",
    )
});

pub struct RedisCoordinator {
    client: redis::Client,
    addr: String,
    timeout: Duration,
    conn: Mutex<Option<ConnectionManager>>,
}

impl RedisCoordinator {
    /// Parse the URL; no connection is made until the first command (so a Redis that is down at
    /// start-up does not stop the agent: it fails closed and retries).
    pub fn new(url: &str, timeout: Duration) -> Result<Self, CoordError> {
        Self::with_ca(url, None, timeout)
    }

    /// From the `[redis]` config section (URL, timeout, CA file).
    pub(crate) fn from_config(r: &crate::config::RedisConfig) -> Result<Self, CoordError> {
        Self::with_ca(&r.url, Some(&r.ca_file), r.timeout)
    }

    /// Like [`RedisCoordinator::new`], trusting the CA in the PEM file `ca_file` for a
    /// `rediss://` server (instead of the system's roots).
    pub fn with_ca(
        url: &str,
        ca_file: Option<&str>,
        timeout: Duration,
    ) -> Result<Self, CoordError> {
        let addr = redact(url);
        let unreachable = |source| CoordError::Unreachable {
            addr: addr.clone(),
            source,
        };
        let client = match ca_file.filter(|f| !f.is_empty()) {
            None => redis::Client::open(url).map_err(unreachable)?,
            Some(path) => {
                let root = std::fs::read(path).map_err(|e| CoordError::Command {
                    addr: addr.clone(),
                    detail: format!("cannot read redis.ca_file {path}: {e}"),
                })?;
                let certs = redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root),
                };
                redis::Client::build_with_tls(url, certs).map_err(unreachable)?
            }
        };
        Ok(RedisCoordinator {
            client,
            addr,
            timeout,
            conn: Mutex::new(None),
        })
    }

    async fn conn(&self) -> Result<ConnectionManager, CoordError> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout)
            .set_number_of_retries(1)
            .set_max_delay(1000);
        let fut = ConnectionManager::new_with_config(self.client.clone(), cfg);
        let c = match tokio::time::timeout(self.timeout * 2, fut).await {
            Ok(Ok(c)) => c,
            Ok(Err(source)) => {
                return Err(CoordError::Unreachable {
                    addr: self.addr.clone(),
                    source,
                })
            }
            Err(_) => return Err(self.timed_out()),
        };
        *guard = Some(c.clone());
        Ok(c)
    }

    fn timed_out(&self) -> CoordError {
        CoordError::Timeout {
            addr: self.addr.clone(),
            timeout: self.timeout,
        }
    }

    fn map_err(&self, source: redis::RedisError) -> CoordError {
        if source.is_io_error()
            || source.is_connection_dropped()
            || source.is_connection_refusal()
            || source.is_timeout()
        {
            CoordError::Unreachable {
                addr: self.addr.clone(),
                source,
            }
        } else {
            CoordError::Command {
                addr: self.addr.clone(),
                detail: source.to_string(),
            }
        }
    }

    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, CoordError> {
        let mut c = self.conn().await?;
        match tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut c)).await {
            Ok(r) => r.map_err(|e| self.map_err(e)),
            Err(_) => Err(self.timed_out()),
        }
    }

    /// Run one of the scripts above (built once: `Script::new` hashes the source, and EVALSHA
    /// falls back to EVAL only when the server has not seen it).
    async fn script<T: FromRedisValue>(
        &self,
        script: &Script,
        key: &str,
        args: &[String],
    ) -> Result<T, CoordError> {
        let mut c = self.conn().await?;
        let mut inv = script.key(key);
        for a in args {
            inv.arg(a);
        }
        match tokio::time::timeout(self.timeout, inv.invoke_async::<T>(&mut c)).await {
            Ok(r) => r.map_err(|e| self.map_err(e)),
            Err(_) => Err(self.timed_out()),
        }
    }
}

/// A hash's fields from HGETALL's flat reply; `Err` names what is not UTF-8.
fn record_fields(v: redis::Value) -> Result<HashMap<String, String>, String> {
    let flat: Vec<Vec<u8>> =
        Vec::from_redis_value(&v).map_err(|e| format!("unexpected reply: {e}"))?;
    let text = |b: Vec<u8>| String::from_utf8(b).map_err(|e| format!("a field is not UTF-8 ({e})"));
    let mut fields = HashMap::new();
    let mut it = flat.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        fields.insert(text(k)?, text(v)?);
    }
    Ok(fields)
}

/// The URL without its password, for logs and errors.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

fn px(ttl: Duration) -> i64 {
    ms(ttl).max(1)
}

#[async_trait]
impl Coordinator for RedisCoordinator {
    fn describe(&self) -> String {
        format!("redis at {}", self.addr)
    }

    fn single_node(&self) -> bool {
        false
    }

    async fn time(&self) -> Result<Millis, CoordError> {
        let (secs, micros): (i64, i64) = self.query(&redis::cmd("TIME")).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    async fn get_many(&self, keys: &[String]) -> Result<Vec<Option<String>>, CoordError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // NB: MGET of one node's keys is single-slot thanks to the hash tag.
        self.query(redis::cmd("MGET").arg(keys)).await
    }

    async fn set_nx(&self, key: &str, value: &str, ttl: Duration) -> Result<bool, CoordError> {
        let r: Option<String> = self
            .query(
                redis::cmd("SET")
                    .arg(key)
                    .arg(value)
                    .arg("NX")
                    .arg("PX")
                    .arg(px(ttl)),
            )
            .await?;
        Ok(r.is_some())
    }

    async fn set(&self, key: &str, value: &str, ttl: Duration) -> Result<(), CoordError> {
        self.query::<()>(redis::cmd("SET").arg(key).arg(value).arg("PX").arg(px(ttl)))
            .await
    }

    async fn del(&self, keys: &[String]) -> Result<(), CoordError> {
        if keys.is_empty() {
            return Ok(());
        }
        self.query::<()>(redis::cmd("DEL").arg(keys)).await
    }

    async fn owner_ttl(&self, key: &str, token: &str) -> Result<Option<Millis>, CoordError> {
        let r: i64 = self.script(&OWNER_TTL, key, &[token.to_string()]).await?;
        Ok(match r {
            -3 | -2 => None,
            -1 => Some(Millis::MAX),
            t => Some(t),
        })
    }

    async fn del_if_owner(&self, key: &str, token: &str) -> Result<bool, CoordError> {
        let r: i64 = self
            .script(&DEL_IF_OWNER, key, &[token.to_string()])
            .await?;
        Ok(r == 1)
    }

    async fn incr_capped(
        &self,
        key: &str,
        cap: u64,
        ttl: Duration,
    ) -> Result<Option<u64>, CoordError> {
        let r: i64 = self
            .script(&INCR_CAPPED, key, &[cap.to_string(), px(ttl).to_string()])
            .await?;
        Ok((r >= 0).then_some(r as u64))
    }

    async fn counter(&self, key: &str) -> Result<u64, CoordError> {
        let v: Option<u64> = self.query(redis::cmd("GET").arg(key)).await?;
        Ok(v.unwrap_or(0))
    }

    async fn decr(&self, key: &str) -> Result<(), CoordError> {
        self.script::<i64>(&DECR_FLOOR, key, &[]).await.map(|_| ())
    }

    async fn hgetall(&self, key: &str) -> Result<HashMap<String, String>, CoordError> {
        self.query(redis::cmd("HGETALL").arg(key)).await
    }

    async fn hset(&self, key: &str, fields: &[(String, String)]) -> Result<(), CoordError> {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(key);
        for (k, v) in fields {
            cmd.arg(k).arg(v);
        }
        self.query::<()>(&cmd).await
    }

    async fn append(
        &self,
        key: &str,
        fields: &[(String, String)],
        max_len: usize,
    ) -> Result<(), CoordError> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(key).arg("MAXLEN").arg(max_len).arg("*");
        for (k, v) in fields {
            cmd.arg(k).arg(v);
        }
        self.query::<()>(&cmd).await
    }

    async fn hset_ttl(
        &self,
        key: &str,
        fields: &[(String, String)],
        ttl: Duration,
    ) -> Result<(), CoordError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let hset = pipe.cmd("HSET").arg(key);
        for (k, v) in fields {
            hset.arg(k).arg(v);
        }
        pipe.ignore().cmd("PEXPIRE").arg(key).arg(px(ttl)).ignore();
        let mut c = self.conn().await?;
        match tokio::time::timeout(self.timeout, pipe.query_async::<()>(&mut c)).await {
            Ok(r) => r.map_err(|e| self.map_err(e)),
            Err(_) => Err(self.timed_out()),
        }
    }

    async fn index_touch(
        &self,
        key: &str,
        member: &str,
        score: Millis,
        prune_before: Millis,
    ) -> Result<(), CoordError> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("ZADD")
            .arg(key)
            .arg(score)
            .arg(member)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(key)
            .arg("-inf")
            .arg(format!("({prune_before}"))
            .ignore();
        let mut c = self.conn().await?;
        match tokio::time::timeout(self.timeout, pipe.query_async::<()>(&mut c)).await {
            Ok(r) => r.map_err(|e| self.map_err(e)),
            Err(_) => Err(self.timed_out()),
        }
    }

    async fn read_worker(
        &self,
        status: &str,
        keys: &[String],
    ) -> Result<super::WorkerRead, CoordError> {
        let mut c = self.conn().await?;
        let mut inv = READ_WORKER.key(status);
        for k in keys {
            inv.key(k);
        }
        let raw: (i64, i64, i64, redis::Value, Vec<Option<String>>) =
            match tokio::time::timeout(self.timeout, inv.invoke_async(&mut c)).await {
                Ok(r) => r.map_err(|e| self.map_err(e))?,
                Err(_) => return Err(self.timed_out()),
            };
        let (secs, micros, ok, rec, values) = raw;
        let record = if ok == 1 {
            record_fields(rec)
        } else {
            Err(String::from_redis_value(&rec).unwrap_or_else(|_| "unreadable".into()))
        };
        Ok(super::WorkerRead {
            now: secs * 1000 + micros / 1000,
            record,
            values,
        })
    }

    async fn hgetall_many(
        &self,
        keys: &[String],
    ) -> Result<Vec<HashMap<String, String>>, CoordError> {
        // Pipelined in chunks: a 10,000-node fleet is ten round trips, none of them huge.
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(1_000) {
            let mut pipe = redis::pipe();
            for k in chunk {
                pipe.cmd("HGETALL").arg(k);
            }
            let mut c = self.conn().await?;
            let part: Vec<HashMap<String, String>> =
                match tokio::time::timeout(self.timeout, pipe.query_async(&mut c)).await {
                    Ok(r) => r.map_err(|e| self.map_err(e))?,
                    Err(_) => return Err(self.timed_out()),
                };
            out.extend(part);
        }
        Ok(out)
    }

    async fn batch(&self, ops: &[super::Op]) -> Result<Vec<u64>, CoordError> {
        use super::Op;
        let mut pipe = redis::pipe();
        for op in ops {
            match op {
                Op::Set { key, value, ttl } => {
                    pipe.cmd("SET").arg(key).arg(value).arg("PX").arg(px(*ttl));
                    pipe.ignore();
                }
                Op::HsetTtl { key, fields, ttl } => {
                    let hset = pipe.cmd("HSET").arg(key);
                    for (k, v) in fields {
                        hset.arg(k).arg(v);
                    }
                    pipe.ignore().cmd("PEXPIRE").arg(key).arg(px(*ttl)).ignore();
                }
                Op::Hset { key, fields } => {
                    let hset = pipe.cmd("HSET").arg(key);
                    for (k, v) in fields {
                        hset.arg(k).arg(v);
                    }
                    pipe.ignore();
                }
                Op::IndexTouch {
                    key,
                    member,
                    score,
                    prune_before,
                } => {
                    pipe.cmd("ZADD").arg(key).arg(*score).arg(member).ignore();
                    pipe.cmd("ZREMRANGEBYSCORE")
                        .arg(key)
                        .arg("-inf")
                        .arg(format!("({prune_before}"))
                        .ignore();
                }
                Op::Counter { key } => {
                    pipe.cmd("GET").arg(key);
                }
            }
        }
        let mut c = self.conn().await?;
        let counters: Vec<Option<u64>> =
            match tokio::time::timeout(self.timeout, pipe.query_async(&mut c)).await {
                Ok(r) => r.map_err(|e| self.map_err(e))?,
                Err(_) => return Err(self.timed_out()),
            };
        Ok(counters.into_iter().map(|v| v.unwrap_or(0)).collect())
    }

    async fn index_members(&self, key: &str) -> Result<Vec<(String, Millis)>, CoordError> {
        let flat: Vec<(String, f64)> = self
            .query(
                redis::cmd("ZRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES"),
            )
            .await?;
        Ok(flat.into_iter().map(|(m, s)| (m, s as Millis)).collect())
    }

    async fn read_recent(&self, key: &str, count: usize) -> Result<Vec<TrailEntry>, CoordError> {
        let raw: Vec<(String, Vec<String>)> = self
            .query(
                redis::cmd("XREVRANGE")
                    .arg(key)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(count),
            )
            .await?;
        Ok(raw
            .into_iter()
            .map(|(id, flat)| {
                let map = flat
                    .chunks(2)
                    .filter_map(|c| match c {
                        [k, v] => Some((k.clone(), v.clone())),
                        _ => None,
                    })
                    .collect();
                (id, map)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            super::redact("redis://:s3cret@redis.vigil:6379/0"),
            "redis://***@redis.vigil:6379/0"
        );
        assert_eq!(
            super::redact("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }
}
