//! The Redis coordinator. Atomic compare-and-act steps are Lua scripts on one key each, so they
//! are single-slot in Redis Cluster. Every command has a timeout: a Redis that does not answer is
//! treated exactly like one that is down (restarts pause; the agent fails closed).
//!
//! Three ways to reach Redis (`redis.mode`): one server (`single`, through the `redis` crate's
//! reconnecting connection manager), a Redis Cluster (`cluster`, the crate's cluster client:
//! MOVED/ASK handled there; every script and multi-key command here stays in one hash slot, and
//! pipelines are split per slot; its clock, `TIME`, is always one master's: see
//! [`RedisCoordinator::clock`]), or a master found through Sentinel (`sentinel`: the
//! connection is dropped on any transport error or a `READONLY` answer — a demoted master —
//! and the next call asks the Sentinels again). In every mode a call that times out drops the
//! connection too: the next call makes a fresh one.
//!
//! Map: this file is the connection (the three targets, reconnecting, timeouts, errors, hash
//! slots); redis/commands.rs is the [`super::Coordinator`] implementation, one command, pipeline
//! or script per request.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, FromRedisValue, IntoConnectionInfo, Pipeline, RedisFuture, Script, Value};
use tokio::sync::Mutex;

use super::{CoordError, Result};
use crate::clock::Millis;
use crate::config::{RedisConfig, RedisMode};
use crate::redact;

mod commands;

/// The hash slot whose master is a cluster's one clock ([`RedisCoordinator::clock`]).
const CLOCK_SLOT: u16 = 0;

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
    /// Where it is, for errors and logs: the URL(s) with every password hidden
    /// ([`redact::urls`]).
    addr: String,
    timeout: Duration,
    conn: Mutex<Option<Conn>>,
    /// Set when the connection must be made again by the next call: a call timed out (any
    /// mode, at most once per [`RedisCoordinator::replace_due`]), or the master may have moved
    /// (Sentinel, or a `READONLY` answer in any mode).
    stale: AtomicBool,
    /// When a timed-out connection was last dropped.
    replaced: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// The TLS an address asks for (a rediss:// URL, `#insecure` or not); `None`: plain. A
/// Sentinel's master is reached with the Sentinels' (with none, its password went over plain
/// TCP beside TLS Sentinels), and a cluster's seeds say whether `redis.ca_file` applies.
fn tls_of(addr: &redis::ConnectionAddr) -> Option<redis::TlsMode> {
    match addr {
        redis::ConnectionAddr::TcpTls { insecure: true, .. } => Some(redis::TlsMode::Insecure),
        redis::ConnectionAddr::TcpTls { .. } => Some(redis::TlsMode::Secure),
        _ => None,
    }
}

/// The root certificate of `redis.ca_file`, when one is set.
fn read_ca(ca_file: Option<&str>, addr: &str) -> Result<Option<redis::TlsCertificates>> {
    let Some(path) = ca_file.filter(|f| !f.is_empty()) else { return Ok(None) };
    let root = std::fs::read(path).map_err(|e| CoordError::Command {
        addr: addr.to_string(),
        source: format!("cannot read redis.ca_file {path}: {e}").into(),
    })?;
    Ok(Some(redis::TlsCertificates { client_tls: None, root_cert: Some(root) }))
}

#[cfg(any(test, feature = "bench"))]
impl RedisCoordinator {
    /// One server at `url`, with the system's roots: [`RedisCoordinator::with_ca`] without a CA.
    pub fn new(url: &str, timeout: Duration) -> Result<Self> {
        Self::with_ca(url, None, timeout)
    }
}

impl RedisCoordinator {
    /// From the `[redis]` config section (mode, URL, timeout, CA file).
    pub(crate) fn from_config(r: &RedisConfig) -> Result<Self> {
        match r.mode {
            RedisMode::Single => Self::with_ca(r.url.expose(), Some(&r.ca_file), r.timeout),
            RedisMode::Cluster => Self::cluster(r.url.expose(), Some(&r.ca_file), r.timeout),
            RedisMode::Sentinel => Self::sentinel(r.url.expose(), &r.sentinel_service, r.timeout),
        }
    }

    /// A Redis Cluster, from a comma-separated list of seed nodes (`redis://h1:6379,...`), its
    /// TLS verified against `ca_file` when one is given.
    pub fn cluster(urls: &str, ca_file: Option<&str>, timeout: Duration) -> Result<Self> {
        let nodes = RedisConfig::servers(urls);
        let addr = format!("cluster {}", redact::urls(urls));
        let unreachable = |source| CoordError::Unreachable { addr: addr.clone(), source };
        let mut builder = ClusterClient::builder(nodes.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout);
        // NB: `certs` turns verification on: a `#insecure` cluster verifies nothing, as before.
        let first = nodes.first().and_then(|u| u.as_str().into_connection_info().ok());
        let insecure = first.is_some_and(|i| tls_of(&i.addr) == Some(redis::TlsMode::Insecure));
        if let Some(certs) = read_ca(ca_file.filter(|_| !insecure), &addr)? {
            builder = builder.certs(certs);
        }
        let client = builder.build().map_err(unreachable)?;
        Ok(Self::from_target(Target::Cluster(client), addr, timeout))
    }

    /// The master called `service` by the Sentinels at `urls` (comma-separated); the URLs'
    /// username, password and database are the master's too.
    pub fn sentinel(urls: &str, service: &str, timeout: Duration) -> Result<Self> {
        let nodes = RedisConfig::servers(urls);
        let addr = format!("sentinel {} ({service})", redact::urls(urls));
        let unreachable = |source| CoordError::Unreachable { addr: addr.clone(), source };
        let seed = nodes.first().cloned().unwrap_or_default();
        let first = seed.into_connection_info().map_err(unreachable)?;
        let master = SentinelNodeConnectionInfo {
            tls_mode: tls_of(&first.addr),
            redis_connection_info: Some(first.redis.clone()),
        };
        let name = service.to_string();
        let client = SentinelClient::build(nodes, name, Some(master), SentinelServerType::Master)
            .map_err(unreachable)?;
        Ok(Self::from_target(Target::Sentinel(Mutex::new(client)), addr, timeout))
    }

    fn from_target(target: Target, addr: String, timeout: Duration) -> Self {
        RedisCoordinator {
            target,
            addr,
            timeout,
            conn: Mutex::new(None),
            stale: false.into(),
            replaced: Default::default(),
        }
    }

    /// One server at `url`, a `rediss://` one verified against the CA in the PEM file `ca_file`
    /// when one is given (instead of the system's roots). Only the URL is parsed: no connection
    /// is made until the first command (so a Redis that is down at start-up does not stop the
    /// agent: it fails closed and retries).
    pub fn with_ca(url: &str, ca_file: Option<&str>, timeout: Duration) -> Result<Self> {
        let addr = redact::urls(url);
        let unreachable = |source| CoordError::Unreachable { addr: addr.clone(), source };
        let client = match read_ca(ca_file, &addr)? {
            None => redis::Client::open(url).map_err(unreachable)?,
            Some(certs) => redis::Client::build_with_tls(url, certs).map_err(unreachable)?,
        };
        Ok(Self::from_target(Target::Single(client), addr, timeout))
    }

    async fn conn(&self) -> Result<Conn> {
        let mut guard = self.conn.lock().await;
        if self.stale.swap(false, Ordering::SeqCst) {
            *guard = None;
        }
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let made = tokio::time::timeout(self.timeout * 2, self.connect()).await;
        let unreachable = |source| CoordError::Unreachable { addr: self.addr.clone(), source };
        let c = made.map_err(|_| self.timed_out())?.map_err(unreachable)?;
        *guard = Some(c.clone());
        Ok(c)
    }

    async fn connect(&self) -> redis::RedisResult<Conn> {
        Ok(match &self.target {
            Target::Single(client) => {
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(self.timeout)
                    .set_response_timeout(self.timeout)
                    .set_number_of_retries(1)
                    .set_max_delay(1000);
                Conn::Single(ConnectionManager::new_with_config(client.clone(), cfg).await?)
            }
            Target::Cluster(client) => Conn::Cluster(client.get_async_connection().await?),
            Target::Sentinel(client) => {
                Conn::Sentinel(client.lock().await.get_async_connection().await?)
            }
        })
    }

    /// `call` bounded by the timeout, its error classified ([`Self::map_err`]).
    async fn bounded<T>(&self, call: impl Future<Output = redis::RedisResult<T>>) -> Result<T> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r.map_err(|e| self.map_err(e)),
            Err(_) => Err(self.timed_out()),
        }
    }

    /// Run a pipeline in one round trip.
    async fn pipeline<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T> {
        let mut c = self.conn().await?;
        self.bounded(pipe.query_async(&mut c)).await
    }

    /// Items grouped so that each group can be one pipeline: all of them on one server, one
    /// group per hash slot of their `key` in a cluster (order kept within a group).
    fn by_slot<T>(&self, items: Vec<(usize, T)>, key: impl Fn(&T) -> &str) -> Vec<Vec<(usize, T)>> {
        if !matches!(self.target, Target::Cluster(_)) {
            return vec![items];
        }
        let mut groups: std::collections::BTreeMap<u16, Vec<(usize, T)>> = Default::default();
        for (i, item) in items {
            groups.entry(slot(key(&item))).or_default().push((i, item));
        }
        groups.into_values().collect()
    }

    /// The error of a call (or a connect) that did not answer within its timeout. The connection
    /// is dropped, in every mode, so that the next call makes a fresh one.
    fn timed_out(&self) -> CoordError {
        // NB: a connection whose path went silent (the Redis pod rescheduled behind its Service,
        // the old path black-holed) never fails by itself: the kernel gives the socket up only
        // after ~15 min, and every call fails closed until then although Redis is back. The
        // `single` mode's connection manager does not reconnect on this outer timeout (it sees
        // no error) nor on its own response timeout (see `map_err`), so only a fresh connection
        // helps; Sentinel's master may have moved (asked again at every timeout, as always),
        // and a cluster's rebuilt connection reads the slots again.
        if matches!(self.target, Target::Sentinel(_)) || self.replace_due() {
            self.stale.store(true, Ordering::SeqCst);
        }
        CoordError::Timeout { addr: self.addr.clone(), timeout: self.timeout }
    }

    /// Whether a connection that timed out may be dropped now: once per two timeouts at most.
    /// NB: a Redis that is slow but alive times calls out too; dropping the connection at each
    /// would hand it a reconnect (a handshake, TLS and AUTH) per call, each old socket open until
    /// its own call timed out — hundreds of agents' worth of them at once.
    fn replace_due(&self) -> bool {
        let now = tokio::time::Instant::now();
        let mut last = self.replaced.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|t| now.saturating_duration_since(t) >= self.timeout * 2);
        if due {
            *last = Some(now);
        }
        due
    }

    /// A failed call's error, classified (unreachable, or a command Redis refused); marks the
    /// connection stale when the next call must make a fresh one.
    fn map_err(&self, source: redis::RedisError) -> CoordError {
        let transport = source.is_io_error()
            || source.is_connection_dropped()
            || source.is_connection_refusal()
            || source.is_timeout();
        // NB: a master demoted by a failover answers writes with READONLY: it is not the
        // coordinator any more. Connect again (Sentinel asks for the new master; a single URL
        // re-resolves its name), and fail closed meanwhile.
        let demoted = source.code() == Some("READONLY");
        // NB: `single` mode's connection manager reconnects by itself after a dropped or refused
        // connection (and after any other socket error: it ends the connection, whose next call
        // then fails as dropped), but a response timeout (io `TimedOut`) is "retry immediately"
        // to the `redis` crate: it keeps the silent connection for good. So a timeout drops the
        // connection here, as in `timed_out`; the other modes drop it on any transport error.
        // A reconnection Redis refused at AUTH (a password rotated, then rolled back; a Redis at
        // `maxclients` as it takes the fleet back) is no I/O error to the manager: it answers
        // that refusal to every later call, for good, and never tries again. Dropped here too.
        let refused_at_auth = source.kind() == redis::ErrorKind::AuthenticationFailed;
        let replace = match self.target {
            Target::Single(_) => refused_at_auth || (source.is_timeout() && self.replace_due()),
            Target::Cluster(_) | Target::Sentinel(_) => transport,
        };
        if demoted || replace {
            self.stale.store(true, Ordering::SeqCst);
        }
        if transport || demoted {
            CoordError::Unreachable { addr: self.addr.clone(), source }
        } else {
            CoordError::Command { addr: self.addr.clone(), source: source.into() }
        }
    }

    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        let mut c = self.conn().await?;
        self.bounded(cmd.query_async(&mut c)).await
    }

    /// The store's clock: `TIME`, in ms. NB: in a cluster, `TIME` names no key, and the crate
    /// sends such a command to a master at random: heartbeats stamped by one master's clock
    /// would be judged by another's, seconds apart when NTP drifts. Every `TIME` goes to the
    /// master of [`CLOCK_SLOT`] instead: one clock for the fleet (a failover moves it to the
    /// promoted replica, as it moves a single server's).
    async fn clock(&self) -> Result<Millis> {
        let time = redis::cmd("TIME");
        let mut c = self.conn().await?;
        let (secs, micros): (i64, i64) = if let Conn::Cluster(cluster) = &mut c {
            let master = Route::new(CLOCK_SLOT, SlotAddr::Master);
            let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(master));
            let answer = self.bounded(cluster.route_command(&time, to)).await?;
            <(i64, i64)>::from_redis_value(&answer).map_err(|e| self.map_err(e))?
        } else {
            self.bounded(time.query_async(&mut c)).await?
        };
        Ok(secs * 1000 + micros / 1000)
    }

    /// Run one of the scripts of redis/commands.rs (built once: `Script::new` hashes the source, and EVALSHA
    /// falls back to EVAL only when the server has not seen it).
    async fn script<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
    ) -> Result<T> {
        let mut c = self.conn().await?;
        let mut inv = script.prepare_invoke();
        inv.key(keys).arg(args);
        self.bounded(inv.invoke_async(&mut c)).await
    }
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
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_logs() {
        let c = RedisCoordinator::new("redis://:s3cret@redis.vigil:6379/0", Duration::from_secs(1))
            .unwrap();
        assert_eq!(c.addr, "redis://:***@redis.vigil:6379/0");
        let c = RedisCoordinator::cluster(
            "redis://u:s3cret@a:1,redis://u:s3cret@b:2",
            None,
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(c.addr, "cluster redis://u:***@a:1,redis://u:***@b:2");
    }

    #[test]
    fn a_sentinel_s_master_is_reached_as_the_sentinels_are() {
        let tls = |url: &str| tls_of(&url.into_connection_info().unwrap().addr);
        assert!(tls("redis://:pw@s:26379").is_none(), "plain Sentinels, plain master");
        assert!(tls("rediss://:pw@s:26379") == Some(redis::TlsMode::Secure));
        assert!(tls("rediss://:pw@s:26379/#insecure") == Some(redis::TlsMode::Insecure));
    }

    /// Whether `fail` left `c`'s connection to be made again by the next call (as the first
    /// timeout in a while: the last replacement forgotten).
    fn stale_after(
        c: &RedisCoordinator,
        fail: impl FnOnce(&RedisCoordinator) -> CoordError,
    ) -> bool {
        c.stale.store(false, Ordering::SeqCst);
        c.replaced.lock().unwrap().take();
        let _ = fail(c);
        c.stale.load(Ordering::SeqCst)
    }

    fn io(kind: std::io::ErrorKind) -> redis::RedisError {
        std::io::Error::new(kind, "test").into()
    }

    /// A silent connection (its path black-holed) is replaced in every mode: after the outer
    /// timeout and after the crate's response timeout (io `TimedOut`, which `single` mode's
    /// connection manager would never reconnect on). A demoted master's `READONLY` too; a dropped
    /// connection only where no connection manager reconnects by itself, and a reconnection
    /// refused at AUTH where one would answer it for good (`single`); a refused command never.
    #[test]
    fn a_timeout_replaces_the_connection_in_every_mode() {
        let t = Duration::from_secs(1);
        let single = RedisCoordinator::new("redis://127.0.0.1:6379", t).unwrap();
        let cluster = RedisCoordinator::cluster("redis://127.0.0.1:7000", None, t).unwrap();
        let sentinel = RedisCoordinator::sentinel("redis://127.0.0.1:26379", "vigil", t).unwrap();
        for (mode, c) in [("single", &single), ("cluster", &cluster), ("sentinel", &sentinel)] {
            assert!(stale_after(c, |c| c.timed_out()), "{mode}: the outer timeout");
            // A second timeout at once (a slow Redis) drops no connection again: Sentinel's
            // master is asked for at each.
            c.stale.store(false, Ordering::SeqCst);
            let _ = c.timed_out();
            assert_eq!(c.stale.load(Ordering::SeqCst), mode == "sentinel", "{mode}: slow");
            c.stale.store(false, Ordering::SeqCst);
            c.replaced.lock().unwrap().take();
            let err = c.map_err(io(std::io::ErrorKind::TimedOut));
            assert!(matches!(err, CoordError::Unreachable { .. }), "{mode}: {err}");
            assert!(c.stale.load(Ordering::SeqCst), "{mode}: the response timeout");
            let demoted = || redis::RedisError::from((redis::ErrorKind::ReadOnly, "demoted"));
            assert!(stale_after(c, |c| c.map_err(demoted())), "{mode}: READONLY");
            let refused = || redis::RedisError::from((redis::ErrorKind::ResponseError, "type"));
            assert!(!stale_after(c, |c| c.map_err(refused())), "{mode}: a refused command");
            let reset = stale_after(c, |c| c.map_err(io(std::io::ErrorKind::ConnectionReset)));
            assert_eq!(reset, mode != "single", "{mode}: a dropped connection");
            let auth = || redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "no"));
            let refused_at_auth = stale_after(c, |c| c.map_err(auth()));
            assert_eq!(refused_at_auth, mode == "single", "{mode}: a reconnection refused at AUTH");
        }
        let err = single.timed_out().to_string();
        assert!(err.contains("did not answer within 1s; restarts are paused"), "{err}");
    }
}
