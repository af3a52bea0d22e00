//! The [`Coordinator`] over Redis: each [`Request`] as one command, one pipeline or one Lua
//! script (the plain writes and the counter read are ops of [`Request::Batch`]: one
//! pipeline), and the scripts themselves (built once: `Script::new` hashes the source). Apart
//! from the connection (coord/redis.rs) so that what Vigil asks of Redis reads in one place,
//! without the plumbing of the three ways to reach it.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::{FromRedisValue, Pipeline, Script};

use super::{RedisCoordinator, Target};
use crate::clock::{ms, Millis};
use crate::coord::{
    CoordError, Coordinator, NodeRead, Op, RecordUnreadable, Reply, Request, Result, TrailEntry,
    WorkerKeys, WorkerRead, MAX_RECORD_BYTES, MAX_RECORD_FIELDS,
};

/// A Lua script, built once on first use (`Script::new` hashes the source).
macro_rules! lua {
    ($source:literal) => {
        LazyLock::new(|| Script::new($source))
    };
}

static OWNER_TTL: LazyLock<Script> = lua!(
    r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PTTL', KEYS[1]) end
return -3"
);

static DEL_IF_OWNER: LazyLock<Script> = lua!(
    r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"
);

// NB: compare and renew in one script: a lease that lapsed and was taken by another is theirs.
static RENEW_IF_OWNER: LazyLock<Script> = lua!(
    r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0"
);

// NB: compare and delete each field in one script: an entry its member rewrote since the caller
// read it (a member back from a long silence) stays. ARGV: field, value, field, value, …
static HDEL_IF_EQUAL: LazyLock<Script> = lua!(
    r"
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return n"
);

// NB: check and increment in one script, so two agents can never both take the last unit.
static INCR_CAPPED: LazyLock<Script> = lua!(
    r"
local v = tonumber(redis.call('GET', KEYS[1]) or '0')
if v >= tonumber(ARGV[1]) then return -1 end
v = redis.call('INCR', KEYS[1])
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return v"
);

static DECR_FLOOR: LazyLock<Script> = lua!(
    r"
local v = tonumber(redis.call('GET', KEYS[1]) or '0')
if v > 0 then return redis.call('DECR', KEYS[1]) end
return 0"
);

// NB: a node's clock and every worker's record and marks in one round trip: the cycle's one
// read, whatever the number of workers. ARGV[1] and ARGV[2] are the record bounds
// (`crate::coord::MAX_RECORD_FIELDS` and `MAX_RECORD_BYTES`), ARGV[3] `1` to read the clock here
// (`0` in a cluster, whose clock is one master's, read apart: the reply's clock is then 0 0),
// then one count per worker: its record is the next key, its marks the count keys after it.
// Each record is read under pcall: a key of another type is that worker's problem, not a failed
// cycle; a record over the bounds is that worker's problem too, and never leaves the server. The
// marks of every worker are one MGET (of at most 1,000 keys each: Lua's unpack has a limit near
// 8,000, some 470 workers). All keys are one node's, so one hash slot.
static READ_WORKERS: LazyLock<Script> = lua!(
    r"
local t = {0, 0}
if ARGV[3] == '1' then t = redis.call('TIME') end
local maxf, maxb = tonumber(ARGV[1]), tonumber(ARGV[2])
local marks, at, k = {}, {}, 1
for w = 4, #ARGV do
  local n = tonumber(ARGV[w])
  at[w] = #marks
  for j = 1, n do marks[#marks + 1] = KEYS[k + j] end
  k = k + 1 + n
end
local values = {}
for i = 1, #marks, 1000 do
  local part = redis.call('MGET', unpack(marks, i, math.min(i + 999, #marks)))
  for j = 1, #part do values[#values + 1] = part[j] end
end
local out = {t[1], t[2]}
k = 1
for w = 4, #ARGV do
  local n = tonumber(ARGV[w])
  local ok, rec = pcall(redis.call, 'HGETALL', KEYS[k])
  if ok and #rec > 0 then
    local bytes = 0
    for j = 1, #rec do bytes = bytes + #rec[j] end
    if #rec / 2 > maxf or bytes > maxb then
      ok, rec = false, 'the record holds ' .. (#rec / 2) .. ' fields of ' .. bytes .. ' bytes, over the ' .. ARGV[1] .. ' fields and ' .. ARGV[2] .. ' bytes the agent reads'
    end
  end
  local mine = {}
  for j = 1, n do mine[j] = values[at[w] + j] end
  if ok then
    out[#out + 1] = {1, rec, mine}
  else
    local why = rec
    if type(rec) == 'table' then why = rec.err or rec['err'] end
    out[#out + 1] = {0, tostring(why), mine}
  end
  k = k + 1 + n
end
return out"
);

#[async_trait]
impl Coordinator for RedisCoordinator {
    fn describe(&self) -> String {
        format!("redis at {}", self.addr)
    }

    async fn execute(&self, request: Request) -> Result<Reply> {
        let c = self;
        Ok(match request {
            Request::Time => Reply::Time(c.clock().await?),
            Request::GetMany(keys) if keys.is_empty() => Reply::Values(Vec::new()),
            // NB: MGET of one node's keys is single-slot thanks to the hash tag.
            Request::GetMany(keys) => Reply::Values(c.query(redis::cmd("MGET").arg(&keys)).await?),
            Request::SetNx { key, value, ttl } => {
                let mut set = redis::cmd("SET");
                set.arg(key).arg(value).arg("NX").arg("PX").arg(px(ttl));
                Reply::Done(c.query::<Option<String>>(&set).await?.is_some())
            }
            Request::Del(keys) if keys.is_empty() => Reply::Ok,
            Request::Del(keys) => {
                c.query(redis::cmd("DEL").arg(&keys)).await.map(|()| Reply::Ok)?
            }
            Request::OwnerTtl { key, token } => {
                let left: i64 = c.script(&OWNER_TTL, &[&key], &[token]).await?;
                Reply::Ttl(match left {
                    -3 | -2 => None,
                    -1 => Some(Millis::MAX),
                    t => Some(t),
                })
            }
            Request::DelIfOwner { key, token } => {
                Reply::Done(c.script::<i64>(&DEL_IF_OWNER, &[&key], &[token]).await? == 1)
            }
            Request::RenewIfOwner { key, token, ttl } => {
                let args = [token, ttl.as_millis().max(1).to_string()];
                Reply::Done(c.script::<i64>(&RENEW_IF_OWNER, &[&key], &args).await? == 1)
            }
            Request::HdelIfEqual { key, fields } => c.hdel_if_equal(&key, fields).await?,
            Request::IncrCapped { key, cap, ttl } => {
                let args = [cap.to_string(), px(ttl).to_string()];
                let taken: i64 = c.script(&INCR_CAPPED, &[&key], &args).await?;
                Reply::Taken((taken >= 0).then_some(taken as u64))
            }
            Request::Decr(key) => {
                c.script(&DECR_FLOOR, &[&key], &[]).await.map(|_: i64| Reply::Ok)?
            }
            Request::Hgetall(key) => Reply::Hash(c.query(redis::cmd("HGETALL").arg(&key)).await?),
            Request::Hget { key, field } => {
                Reply::Values(vec![c.query(redis::cmd("HGET").arg(&key).arg(&field)).await?])
            }
            Request::HgetallMany(keys) => Reply::Hashes(c.hgetall_many(&keys).await?),
            Request::Append { key, fields, max_len } => {
                let mut xadd = redis::cmd("XADD");
                xadd.arg(&key).arg("MAXLEN").arg(max_len).arg("*").arg(&fields);
                c.query(&xadd).await.map(|()| Reply::Ok)?
            }
            Request::ReadRecent { key, count } => Reply::Entries(c.read_recent(&key, count).await?),
            Request::IndexMembers(key) => Reply::Members(c.index_members(&key).await?),
            Request::Batch(ops) => Reply::Counters(c.batch(&ops).await?),
            Request::ReadWorkers(workers) => Reply::Workers(c.read_workers(&workers).await?),
        })
    }
}

impl RedisCoordinator {
    /// [`Request::HdelIfEqual`]: one script on one key (one slot); none asked, no round trip.
    async fn hdel_if_equal(&self, key: &str, fields: Vec<(String, String)>) -> Result<Reply> {
        if fields.is_empty() {
            return Ok(Reply::Removed(0));
        }
        let args: Vec<String> = fields.into_iter().flat_map(|(f, v)| [f, v]).collect();
        let removed: i64 = self.script(&HDEL_IF_EQUAL, &[key], &args).await?;
        Ok(Reply::Removed(removed.max(0) as u64))
    }

    async fn read_workers(&self, workers: &[WorkerKeys]) -> Result<NodeRead> {
        // NB: the script's `TIME` is the clock of the node's own master; a cluster's is another
        // (`clock`): read first, as the script reads its own before the records.
        let apart = match self.target {
            Target::Cluster(_) => Some(self.clock().await?),
            Target::Single(_) | Target::Sentinel(_) => None,
        };
        let here = if apart.is_some() { "0" } else { "1" };
        let mut keys: Vec<&str> = Vec::new();
        let mut args =
            vec![MAX_RECORD_FIELDS.to_string(), MAX_RECORD_BYTES.to_string(), here.to_string()];
        for w in workers {
            keys.push(&w.record);
            keys.extend(w.keys.iter().map(String::as_str));
            args.push(w.keys.len().to_string());
        }
        let raw: Vec<redis::Value> = self.script(&READ_WORKERS, &keys, &args).await?;
        let bad = |what: &str| CoordError::Command {
            addr: self.addr.clone(),
            source: format!("the workers read answered {what}").into(),
        };
        let mut it = raw.into_iter();
        let (Some(secs), Some(micros)) = (it.next(), it.next()) else {
            return Err(bad("without the clock"));
        };
        let clock = |v| i64::from_redis_value(v).map_err(|_| bad("a clock that is not a number"));
        let now = match apart {
            Some(now) => now,
            None => clock(&secs)? * 1000 + clock(&micros)? / 1000,
        };
        let mut reads = Vec::with_capacity(workers.len());
        for one in it {
            let (ok, rec, values): (i64, redis::Value, Vec<Option<String>>) =
                FromRedisValue::from_redis_value(&one)
                    .map_err(|_| bad("a worker of another shape"))?;
            let record = if ok == 1 {
                record_fields(rec)
            } else {
                let why = String::from_redis_value(&rec).unwrap_or_else(|_| "unreadable".into());
                Err(RecordUnreadable::Refused(why))
            };
            reads.push(WorkerRead { now, record, values });
        }
        Ok(NodeRead { now, workers: reads })
    }

    async fn hgetall_many(&self, keys: &[String]) -> Result<Vec<HashMap<String, String>>> {
        // Pipelined, 1,000 per round trip (per slot in a cluster): a 10,000-node fleet is ten
        // round trips on one server.
        let indexed: Vec<(usize, &str)> = keys.iter().map(String::as_str).enumerate().collect();
        let mut out: Vec<HashMap<String, String>> = vec![HashMap::new(); keys.len()];
        for group in self.by_slot(indexed, |k| *k) {
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

    async fn batch(&self, ops: &[Op]) -> Result<Vec<u64>> {
        let indexed: Vec<(usize, &Op)> = ops.iter().enumerate().collect();
        let mut counters: Vec<(usize, u64)> = Vec::new();
        for group in self.by_slot(indexed, |op| op.key()) {
            let mut pipe = redis::pipe();
            group.iter().for_each(|(_, op)| add_op(&mut pipe, op));
            let got: Vec<Option<u64>> = self.pipeline(&pipe).await?;
            let wanted = group.iter().filter(|(_, op)| matches!(op, Op::Counter { .. }));
            counters.extend(wanted.map(|(i, _)| *i).zip(got.into_iter().map(|v| v.unwrap_or(0))));
        }
        counters.sort();
        Ok(counters.into_iter().map(|(_, v)| v).collect())
    }

    async fn index_members(&self, key: &str) -> Result<Vec<(String, Millis)>> {
        let flat: Vec<(String, f64)> =
            self.query(redis::cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES")).await?;
        Ok(flat.into_iter().map(|(m, s)| (m, s as Millis)).collect())
    }

    /// Each entry's fields read as a map (pairs of name and value).
    async fn read_recent(&self, key: &str, count: usize) -> Result<Vec<TrailEntry>> {
        self.query(redis::cmd("XREVRANGE").arg(key).arg("+").arg("-").arg("COUNT").arg(count)).await
    }
}

/// The commands of one batch op; only a `Counter` leaves a reply in the pipeline.
fn add_op(pipe: &mut Pipeline, op: &Op) {
    match op {
        Op::Set { key, value, ttl } => {
            pipe.cmd("SET").arg(key).arg(value).arg("PX").arg(px(*ttl)).ignore();
        }
        Op::Hset { key, fields, ttl } => {
            pipe.cmd("HSET").arg(key).arg(fields).ignore();
            if let Some(ttl) = ttl {
                pipe.cmd("PEXPIRE").arg(key).arg(px(*ttl)).ignore();
            }
        }
        Op::IndexTouch { key, member, score, prune_before } => {
            pipe.cmd("ZADD").arg(key).arg(*score).arg(member).ignore();
            if let Some(before) = prune_before {
                let below = format!("({before}");
                pipe.cmd("ZREMRANGEBYSCORE").arg(key).arg("-inf").arg(below).ignore();
            }
        }
        Op::Counter { key } => {
            pipe.cmd("GET").arg(key);
        }
        Op::Hdel { key, fields } => {
            if !fields.is_empty() {
                pipe.cmd("HDEL").arg(key).arg(fields).ignore();
            }
        }
        Op::Expire { key, ttl } => {
            pipe.cmd("PEXPIRE").arg(key).arg(px(*ttl)).ignore();
        }
    }
}

/// A hash's fields from HGETALL's flat reply; `Err` names what is not UTF-8.
fn record_fields(v: redis::Value) -> Result<HashMap<String, String>, RecordUnreadable> {
    let flat: Vec<Vec<u8>> =
        Vec::from_redis_value(&v).map_err(|e| RecordUnreadable::Reply(e.to_string()))?;
    let text = |b: Vec<u8>| String::from_utf8(b).map_err(RecordUnreadable::NotUtf8);
    let mut fields = HashMap::new();
    let mut it = flat.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        fields.insert(text(k)?, text(v)?);
    }
    Ok(fields)
}
fn px(ttl: Duration) -> i64 {
    ms(ttl).max(1)
}
