//! The Redis coordinator. Atomic compare-and-act steps are Lua scripts on one key each, so they
//! are single-slot in Redis Cluster. Every command has a timeout: a Redis that does not answer is
//! treated exactly like one that is down (restarts pause; the agent fails closed).
//!
//! Three ways to reach Redis (`redis.mode`): one server (`single`, through the `redis` crate's
//! reconnecting connection manager), a Redis Cluster (`cluster`, the crate's cluster client:
//! MOVED/ASK handled there; every script and multi-key command here stays in one hash slot, and
//! pipelines are split per slot), or a master found through Sentinel (`sentinel`: the
//! connection is dropped on any transport error or a `READONLY` answer — a demoted master —
//! and the next call asks the Sentinels again).

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, FromRedisValue, IntoConnectionInfo, Pipeline, RedisFuture, Script, Value};
use tokio::sync::Mutex;

use super::{CoordError, Coordinator, TrailEntry};
use crate::clock::{ms, Millis};
use crate::config::RedisUrls;

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

/// Where the servers are.
enum Target {
    Single(redis::Client),
    Cluster(ClusterClient),
    Sentinel(Mutex<SentinelClient>),
}

/// A connection of any of the three kinds; cheap to clone (each is multiplexed).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(MultiplexedConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(cmd, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

pub struct RedisCoordinator {
    target: Target,
    addr: String,
    timeout: Duration,
    conn: Mutex<Option<Conn>>,
    /// Set when the connection must be made again (Sentinel: the master may have moved).
    stale: AtomicBool,
}

impl RedisCoordinator {
    /// Parse the URL; no connection is made until the first command (so a Redis that is down at
    /// start-up does not stop the agent: it fails closed and retries).
    pub fn new(url: &str, timeout: Duration) -> Result<Self, CoordError> {
        Self::with_ca(url, None, timeout)
    }

    /// From the `[redis]` config section (mode, URL, timeout, CA file).
    pub(crate) fn from_config(r: &crate::config::RedisConfig) -> Result<Self, CoordError> {
        use crate::config::RedisMode;
        match r.mode {
            RedisMode::Single => Self::with_ca(&r.url, Some(&r.ca_file), r.timeout),
            RedisMode::Cluster => Self::cluster(&r.url, r.timeout),
            RedisMode::Sentinel => Self::sentinel(&r.url, &r.sentinel_service, r.timeout),
        }
    }

    /// A Redis Cluster, from a comma-separated list of seed nodes (`redis://h1:6379,...`).
    pub fn cluster(urls: &str, timeout: Duration) -> Result<Self, CoordError> {
        let nodes = RedisUrls::parse(urls).into_vec();
        let addr = format!("cluster {}", redact(urls));
        let client = ClusterClient::builder(nodes.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .build()
            .map_err(|source| CoordError::Unreachable {
                addr: addr.clone(),
                source,
            })?;
        Ok(Self::from_target(Target::Cluster(client), addr, timeout))
    }

    /// The master called `service` by the Sentinels at `urls` (comma-separated); the URLs'
    /// username, password and database are the master's too.
    pub fn sentinel(urls: &str, service: &str, timeout: Duration) -> Result<Self, CoordError> {
        let nodes = RedisUrls::parse(urls).into_vec();
        let addr = format!("sentinel {} ({service})", redact(urls));
        let unreachable = |source| CoordError::Unreachable {
            addr: addr.clone(),
            source,
        };
        let first = nodes
            .first()
            .cloned()
            .unwrap_or_default()
            .into_connection_info()
            .map_err(unreachable)?;
        let master = SentinelNodeConnectionInfo {
            tls_mode: None,
            redis_connection_info: Some(first.redis.clone()),
        };
        let client = SentinelClient::build(
            nodes,
            service.to_string(),
            Some(master),
            SentinelServerType::Master,
        )
        .map_err(unreachable)?;
        Ok(Self::from_target(
            Target::Sentinel(Mutex::new(client)),
            addr,
            timeout,
        ))
    }

    fn from_target(target: Target, addr: String, timeout: Duration) -> Self {
        RedisCoordinator {
            target,
            addr,
            timeout,
            conn: Mutex::new(None),
            stale: AtomicBool::new(false),
        }
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
        Ok(Self::from_target(Target::Single(client), addr, timeout))
    }

    async fn conn(&self) -> Result<Conn, CoordError> {
        let mut guard = self.conn.lock().await;
        if self.stale.swap(false, Ordering::SeqCst) {
            *guard = None;
        }
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let made = tokio::time::timeout(self.timeout * 2, self.connect()).await;
        let c = match made {
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

    async fn connect(&self) -> redis::RedisResult<Conn> {
        match &self.target {
            Target::Single(client) => {
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(self.timeout)
                    .set_response_timeout(self.timeout)
                    .set_number_of_retries(1)
                    .set_max_delay(1000);
                let c = ConnectionManager::new_with_config(client.clone(), cfg).await?;
                Ok(Conn::Single(c))
            }
            Target::Cluster(client) => Ok(Conn::Cluster(client.get_async_connection().await?)),
            Target::Sentinel(client) => {
                let c = client.lock().await.get_async_connection().await?;
                Ok(Conn::Sentinel(c))
            }
        }
    }

    fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// One write op of two commands on one key, as a transaction (MULTI/EXEC).
    async fn atomic(&self, op: &super::Op) -> Result<(), CoordError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        add_op(&mut pipe, op);
        self.pipeline(&pipe).await
    }

    /// Run a pipeline in one round trip.
    async fn pipeline<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T, CoordError> {
        let mut c = self.conn().await?;
        match tokio::time::timeout(self.timeout, pipe.query_async::<T>(&mut c)).await {
            Ok(r) => r.map_err(|e| self.map_err(e)),
            Err(_) => Err(self.timed_out()),
        }
    }

    /// Keys grouped so that each group can be one pipeline: all of them on one server, one
    /// group per hash slot in a cluster (order kept within a group).
    fn by_slot<'a>(&self, keys: Vec<(usize, &'a str)>) -> Vec<Vec<(usize, &'a str)>> {
        if !self.is_cluster() {
            return vec![keys];
        }
        let mut groups: std::collections::BTreeMap<u16, Vec<(usize, &'a str)>> = Default::default();
        for (i, k) in keys {
            groups.entry(slot(k)).or_default().push((i, k));
        }
        groups.into_values().collect()
    }

    fn by_slot_ops<'a>(
        &self,
        ops: Vec<(usize, &'a super::Op)>,
    ) -> Vec<Vec<(usize, &'a super::Op)>> {
        if !self.is_cluster() {
            return vec![ops];
        }
        let mut groups: std::collections::BTreeMap<u16, Vec<(usize, &'a super::Op)>> =
            Default::default();
        for (i, op) in ops {
            groups.entry(slot(op.key())).or_default().push((i, op));
        }
        groups.into_values().collect()
    }

    fn timed_out(&self) -> CoordError {
        if matches!(self.target, Target::Sentinel(_)) {
            self.stale.store(true, Ordering::SeqCst);
        }
        CoordError::Timeout {
            addr: self.addr.clone(),
            timeout: self.timeout,
        }
    }

    fn map_err(&self, source: redis::RedisError) -> CoordError {
        let transport = source.is_io_error()
            || source.is_connection_dropped()
            || source.is_connection_refusal()
            || source.is_timeout();
        // NB: a master demoted by a failover answers writes with READONLY: it is not the
        // coordinator any more. Connect again (Sentinel asks for the new master; a single URL
        // re-resolves its name), and fail closed meanwhile.
        let demoted = source.code() == Some("READONLY");
        if demoted || (transport && !matches!(self.target, Target::Single(_))) {
            self.stale.store(true, Ordering::SeqCst);
        }
        if transport || demoted {
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
        keys: &[&str],
        args: &[String],
    ) -> Result<T, CoordError> {
        let mut c = self.conn().await?;
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(a);
        }
        match tokio::time::timeout(self.timeout, inv.invoke_async::<T>(&mut c)).await {
            Ok(r) => r.map_err(|e| self.map_err(e)),
            Err(_) => Err(self.timed_out()),
        }
    }
}

/// The commands of one batch op; only a `Counter` leaves a reply in the pipeline.
fn add_op(pipe: &mut Pipeline, op: &super::Op) {
    use super::Op;
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

/// The URL (or comma-separated URLs) without passwords, for logs and errors.
fn redact(urls: &str) -> String {
    let one = |url: &str| match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    };
    RedisUrls::parse(urls)
        .as_slice()
        .iter()
        .map(|u| one(u))
        .collect::<Vec<_>>()
        .join(",")
}

/// The Redis Cluster hash slot of a key (CRC16/XMODEM of its hash tag, or of the whole key).
pub(crate) fn slot(key: &str) -> u16 {
    let b = key.as_bytes();
    let tagged = b.iter().position(|&c| c == b'{').and_then(|open| {
        let close = b[open + 1..].iter().position(|&c| c == b'}')?;
        (close > 0).then(|| &b[open + 1..open + 1 + close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(b) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
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
        let r: i64 = self
            .script(&OWNER_TTL, &[key], &[token.to_string()])
            .await?;
        Ok(match r {
            -3 | -2 => None,
            -1 => Some(Millis::MAX),
            t => Some(t),
        })
    }

    async fn del_if_owner(&self, key: &str, token: &str) -> Result<bool, CoordError> {
        let r: i64 = self
            .script(&DEL_IF_OWNER, &[key], &[token.to_string()])
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
            .script(
                &INCR_CAPPED,
                &[key],
                &[cap.to_string(), px(ttl).to_string()],
            )
            .await?;
        Ok((r >= 0).then_some(r as u64))
    }

    async fn counter(&self, key: &str) -> Result<u64, CoordError> {
        let v: Option<u64> = self.query(redis::cmd("GET").arg(key)).await?;
        Ok(v.unwrap_or(0))
    }

    async fn decr(&self, key: &str) -> Result<(), CoordError> {
        self.script::<i64>(&DECR_FLOOR, &[key], &[])
            .await
            .map(|_| ())
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
        let op = super::Op::HsetTtl {
            key: key.to_string(),
            fields: fields.to_vec(),
            ttl,
        };
        self.atomic(&op).await
    }

    async fn index_touch(
        &self,
        key: &str,
        member: &str,
        score: Millis,
        prune_before: Millis,
    ) -> Result<(), CoordError> {
        let op = super::Op::IndexTouch {
            key: key.to_string(),
            member: member.to_string(),
            score,
            prune_before,
        };
        self.atomic(&op).await
    }

    async fn read_worker(
        &self,
        status: &str,
        keys: &[String],
    ) -> Result<super::WorkerRead, CoordError> {
        let all: Vec<&str> = std::iter::once(status)
            .chain(keys.iter().map(String::as_str))
            .collect();
        let raw: (i64, i64, i64, redis::Value, Vec<Option<String>>) =
            self.script(&READ_WORKER, &all, &[]).await?;
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
        // Pipelined, 1,000 per round trip (per slot in a cluster): a 10,000-node fleet is ten
        // round trips on one server.
        let indexed: Vec<(usize, &str)> = keys.iter().map(String::as_str).enumerate().collect();
        let mut out: Vec<HashMap<String, String>> = vec![HashMap::new(); keys.len()];
        for group in self.by_slot(indexed) {
            for chunk in group.chunks(1_000) {
                let mut pipe = redis::pipe();
                for (_, k) in chunk {
                    pipe.cmd("HGETALL").arg(*k);
                }
                let part: Vec<HashMap<String, String>> = self.pipeline(&pipe).await?;
                for ((i, _), fields) in chunk.iter().zip(part) {
                    out[*i] = fields;
                }
            }
        }
        Ok(out)
    }

    async fn batch(&self, ops: &[super::Op]) -> Result<Vec<u64>, CoordError> {
        use super::Op;
        let indexed: Vec<(usize, &Op)> = ops.iter().enumerate().collect();
        let mut counters: Vec<(usize, u64)> = Vec::new();
        for group in self.by_slot_ops(indexed) {
            let mut pipe = redis::pipe();
            let mut wanted = Vec::new();
            for (i, op) in &group {
                add_op(&mut pipe, op);
                if matches!(op, Op::Counter { .. }) {
                    wanted.push(*i);
                }
            }
            let got: Vec<Option<u64>> = self.pipeline(&pipe).await?;
            counters.extend(
                wanted
                    .into_iter()
                    .zip(got.into_iter().map(|v| v.unwrap_or(0))),
            );
        }
        counters.sort();
        Ok(counters.into_iter().map(|(_, v)| v).collect())
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
