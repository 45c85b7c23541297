//! The fence: the destination's guard against writes from an old term (I1, I2).
//!
//! Per job namespace the hash `lh:{job}:fence` keeps the highest token accepted and its
//! holder. A fenced write is one script that, atomically in Redis:
//!
//! 1. refuses a token below the fence's token (**stale**), or equal to it from another holder
//!    (**other holder**) — tokens are unique per term, so an equal token from someone else can
//!    only come from a counter that went backwards;
//! 2. refuses the write unless the lease still holds the writer's owner value at the moment
//!    Redis applies it (**not leaseholder**) — the compare etcd does on the leader key's
//!    revision, possible because lease and data live in the same Redis;
//! 3. otherwise raises the fence to the token if it is higher; for a guest's write, counts the
//!    keys and bytes it adds against the job's storage quota and refuses it beyond
//!    ([`crate::quota`]; a key it deletes comes off the count); and sets every key given (in
//!    *create* mode only if none of them exists yet: an idempotency key), deletes the keys to
//!    delete, and applies the run bookkeeping that goes with them ([`Bookkeeping`]): periods
//!    added to or removed from the open-runs index, operator requests cleared — each only
//!    if it still carries the id of the request that was served — and periods added to the
//!    run index.
//!
//! Every write a term makes goes through this script, so a term that has ended (its lease
//! expired, a newer term began) can change nothing: not a record, a checkpoint, the cursor,
//! the index, or an operator's request.
//!
//! The acquire script raises the fence when a term starts (see [`crate::lease`]), so once term
//! `t` has begun no write of an earlier term is accepted, even before `t` writes anything.
//! All keys of a write belong to one job (one hash slot), so the script works on Redis Cluster.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::checks::{CLAIM_CHECK, RUN_ENDED, TERM_CHECK, refusal};
pub use crate::checks::{FenceError, Refusal};
use crate::keys::JobKeys;
use crate::quota::{Quota, QuotaUsage};
use crate::redis_conn::Conn;
use crate::term::{Term, mono_ms};

static FENCED_WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TERM_CHECK}{CLAIM_CHECK}{RUN_ENDED}{}",
        r#"
-- KEYS: lease, fence, open-runs index, requests, usage, run index, tasks stream, a run's task
--       hash (the task's, for a task's write; the ending run's, for a run's end; else unused),
--       the write's answer kept for a resend (with a write id; else unused),
--       keys to set..., keys to delete...
-- ARGV: owner, token, number of keys to set, create ('1': only if no key to set exists),
--       number of index additions, of index removals, of request clearings,
--       quota of keys and of bytes ('' and '': the keys to set are not counted),
--       number of run-index additions, the task group, a task's claim (entry, consumer,
--       deliveries, task id, run attempt; '' when the write is a step's), '1' when the write
--       ends a run (its tasks' entries are acknowledged and deleted), the write's id ('': none),
--       values... (one per key to set), periods to add to the index...,
--       periods to remove from it..., (period, request id) pairs to clear..., periods to add
--       to the run index...
local K, A = 9, 18
local refused, fence_token = term_check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refused then
  return refused
end
-- A write with an id answers a resend of itself (a client that lost the reply and sent the
-- call again) as it answered the first time, without applying it twice.
local function applied(kind, a, b)
  if ARGV[18] ~= '' then
    redis.call('SET', KEYS[9], kind .. '|' .. a .. '|' .. b, 'PX', 60000)
  end
  return {1, kind, a, b}
end
if ARGV[18] ~= '' then
  local prior = redis.call('GET', KEYS[9])
  if prior then
    local kind, a, b = string.match(prior, '^([^|]*)|([^|]*)|(.*)$')
    return {1, kind, a, b}
  end
end
-- A task's write also needs its run to be open (not ended, not run again), and the worker's
-- claim on the task's current entry.
if ARGV[12] ~= '' then
  local raw = redis.call('HGET', KEYS[8], 't:' .. ARGV[15])
  local rec = raw and cjson.decode(raw)
  if run_ended(rec, ARGV[16]) then
    return {0, 'run-ended', fence_token or '', ARGV[15]}
  end
  if rec.entry ~= ARGV[12] or rec.state ~= 'queued'
      or not claim_holds(KEYS[7], ARGV[11], ARGV[12], ARGV[13], ARGV[14]) then
    return {0, 'claim-lost', fence_token or '', ARGV[13]}
  end
end
local token = tonumber(ARGV[2])
if (not fence_token) or token > tonumber(fence_token) then
  redis.call('HSET', KEYS[2], 'token', ARGV[2], 'holder', ARGV[1])
end
local sets = tonumber(ARGV[3])
if ARGV[4] == '1' then
  for i = 1, sets do
    if redis.call('EXISTS', KEYS[K + i]) == 1 then
      return applied('exists', '', '')
    end
  end
end
-- The storage quota: count what the keys to set add, refuse (nothing written) if it would
-- take the job past its quota in a dimension the write grows.
local usage = {'', ''}
if ARGV[8] ~= '' then
  local dkeys, dbytes = 0, 0
  for i = 1, sets do
    local k = KEYS[K + i]
    if redis.call('EXISTS', k) == 0 then
      dkeys = dkeys + 1
      dbytes = dbytes + #k
    end
    dbytes = dbytes + #ARGV[A + i] - redis.call('STRLEN', k)
  end
  -- A key deleted comes off the count (its full key and its value).
  for i = sets + 1, #KEYS - K do
    local k = KEYS[K + i]
    if redis.call('EXISTS', k) == 1 then
      dkeys = dkeys - 1
      dbytes = dbytes - #k - redis.call('STRLEN', k)
    end
  end
  local keys = tonumber(redis.call('HGET', KEYS[5], 'keys') or '0') + dkeys
  local bytes = tonumber(redis.call('HGET', KEYS[5], 'bytes') or '0') + dbytes
  if keys < 0 then
    keys = 0
  end
  if bytes < 0 then
    bytes = 0
  end
  if (dkeys > 0 and keys > tonumber(ARGV[8])) or (dbytes > 0 and bytes > tonumber(ARGV[9])) then
    return {0, 'quota', string.format('%.0f', keys), string.format('%.0f', bytes)}
  end
  redis.call('HSET', KEYS[5], 'keys', string.format('%.0f', keys), 'bytes', string.format('%.0f', bytes))
  usage = {string.format('%.0f', keys), string.format('%.0f', bytes)}
end
-- A run that ends ends its tasks: every entry still queued is acknowledged and deleted, so no
-- worker's claim on it holds and no worker fetches it (their records go with the run's keys).
if ARGV[17] == '1' then
  local all = redis.call('HGETALL', KEYS[8])
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 't:' then
      local rec = cjson.decode(all[i + 1])
      if rec.state == 'queued' and rec.entry then
        redis.call('XACK', KEYS[7], ARGV[11], rec.entry)
        redis.call('XDEL', KEYS[7], rec.entry)
      end
    end
  end
end
local deleted = 0
for i = 1, #KEYS - K do
  if i <= sets then
    redis.call('SET', KEYS[K + i], ARGV[A + i])
  else
    deleted = deleted + redis.call('DEL', KEYS[K + i])
  end
end
local a = A + sets
for i = 1, tonumber(ARGV[5]) do
  redis.call('SADD', KEYS[3], ARGV[a + i])
end
a = a + tonumber(ARGV[5])
for i = 1, tonumber(ARGV[6]) do
  redis.call('SREM', KEYS[3], ARGV[a + i])
end
a = a + tonumber(ARGV[6])
-- A request is cleared only if it is still the one served: an operator's newer request (a new
-- id) survives a leader's clearing of an older one.
for i = 1, tonumber(ARGV[7]) do
  local period, id = ARGV[a + 2 * i - 1], ARGV[a + 2 * i]
  local v = redis.call('HGET', KEYS[4], period)
  if v and (v == id or string.sub(v, 1, #id + 1) == id .. ' ') then
    redis.call('HDEL', KEYS[4], period)
  end
end
a = a + 2 * tonumber(ARGV[7])
-- The run index: every period with a record (or a record moved aside), for the run history.
for i = 1, tonumber(ARGV[10]) do
  redis.call('ZADD', KEYS[6], 0, ARGV[a + i])
end
return applied(tostring(deleted), usage[1], usage[2])
"#
    ))
});

/// The run bookkeeping a term write changes together with its keys, atomically.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bookkeeping<'a> {
    /// Periods added to the open-runs index (`lh:{job}:open`).
    pub open_add: &'a [String],
    /// Periods removed from the open-runs index.
    pub open_remove: &'a [String],
    /// Operator requests cleared, as `(period, request id)`: each is removed only if the
    /// request for the period still has that id.
    pub clear_requests: &'a [(String, String)],
    /// Periods added to the run index (`lh:{job}:runs`): every period whose record is written.
    pub runs_add: &'a [String],
    /// The period whose run this write ends (a final record): its tasks still queued are
    /// acknowledged and deleted from the stream, so no worker's claim on them holds and no
    /// task of the run can write again.
    pub end_tasks: Option<&'a str>,
}

/// Sets every `(key, value)` pair (full Redis keys of this job), fenced by the term
/// `(owner, token)`.
pub async fn write<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    owner: &str,
    token: u64,
    writes: &[(String, &[u8])],
) -> Result<(), FenceError> {
    let write = TermWrite::new(writes, &[]);
    invoke(conn, keys, (owner, token), &write).await.map(drop)
}

/// What one term write does: keys to set, keys to delete, bookkeeping, all or nothing.
#[derive(Clone, Copy, Debug)]
pub struct TermWrite<'a> {
    /// `(key, value)` pairs to set (full Redis keys of this job).
    pub sets: &'a [(String, &'a [u8])],
    /// Keys to delete.
    pub deletes: &'a [String],
    /// Set nothing if a key to set exists (an idempotency key).
    pub create: bool,
    /// The run bookkeeping that goes with the keys.
    pub book: Bookkeeping<'a>,
    /// Count the keys to set against this quota (a guest's write); `None` for the host's own
    /// records.
    pub quota: Option<Quota>,
    /// A task's write: applied only while the worker still holds this claim on the task.
    pub claim: Option<&'a crate::tasks::Claim>,
    /// This write's id (fresh per call), for a write whose answer depends on what it finds
    /// (`create`, `delete`): a resend of the same call (the Redis Cluster client sends a script
    /// again after a dropped connection, whether or not it was applied) answers as the first
    /// did for 60 s, instead of "exists" or "did not exist" for its own effect.
    pub id: Option<&'a str>,
}

impl<'a> TermWrite<'a> {
    /// Sets `sets` and deletes `deletes`.
    pub fn new(sets: &'a [(String, &'a [u8])], deletes: &'a [String]) -> Self {
        TermWrite {
            sets,
            deletes,
            create: false,
            book: Bookkeeping::default(),
            quota: None,
            claim: None,
            id: None,
        }
    }

    /// With `book` applied in the same script.
    pub fn with(mut self, book: Bookkeeping<'a>) -> Self {
        self.book = book;
        self
    }
}

/// What an applied term write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// False when `create` found a key to set already there: nothing was written.
    pub created: bool,
    /// How many of the keys to delete existed (and were deleted).
    pub deleted: u32,
    /// `(keys, bytes)` the job keeps after a write counted against its quota.
    pub usage: Option<(u64, u64)>,
}

/// Runs the script as the term `(owner, token)`, with none of [`term_write`]'s local checks:
/// the primitive under every term write (tests and the demo send writes as a given term with
/// it).
pub async fn invoke<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    (owner, token): (&str, u64),
    write: &TermWrite<'_>,
) -> Result<Written, FenceError> {
    let (script_keys, args) = script_call(keys, (owner, token), write);
    let mut inv = FENCED_WRITE.prepare_invoke();
    for k in &script_keys {
        inv.key(k);
    }
    for a in &args {
        inv.arg(a.as_slice());
    }
    let reply: (i64, String, String, String) = inv.invoke_async(conn).await?;
    answer(reply, token, write)
}

/// [`invoke`], with `WAIT count timeout` sent right behind the script in one pipeline on one
/// connection, so the replicas it counts are those that acknowledged this very write (a
/// `WAIT` sent on its own could go on a connection that reconnected after the write, where it
/// waits for nothing and answers at once). Returns the write's outcome and, when it was
/// applied, how many replicas acknowledged it.
async fn invoke_replicated(
    conn: &mut Conn,
    keys: &JobKeys,
    (owner, token): (&str, u64),
    write: &TermWrite<'_>,
    r: crate::term::Replicas,
) -> Result<(Written, i64), FenceError> {
    let (script_keys, args) = script_call(keys, (owner, token), write);
    let mut batch = crate::redis_conn::Batch::new();
    let w = batch.script(&FENCED_WRITE, &script_keys, args);
    let mut wait = redis::cmd("WAIT");
    wait.arg(r.count).arg(r.timeout.as_millis() as u64);
    let n = batch.cmd(&keys.lease(), wait);
    let mut replies = conn.batch("replicated-write", &batch).await;
    let acked = std::mem::replace(&mut replies[n], Ok(redis::Value::Nil));
    let reply: (i64, String, String, String) =
        redis::from_redis_value(std::mem::replace(&mut replies[w], Ok(redis::Value::Nil))?)
            .map_err(redis::RedisError::from)?;
    let written = answer(reply, token, write)?;
    let acked: i64 = redis::from_redis_value(acked?).map_err(redis::RedisError::from)?;
    Ok((written, acked))
}

/// The fenced-write script's keys and arguments for `write` as the term `(owner, token)` (the
/// layout is the script's header).
fn script_call(
    keys: &JobKeys,
    (owner, token): (&str, u64),
    write: &TermWrite<'_>,
) -> (Vec<String>, Vec<Vec<u8>>) {
    let book = &write.book;
    let mut k = vec![
        keys.lease(),
        keys.fence(),
        keys.open_runs(),
        keys.requests(),
        keys.usage(),
        keys.runs(),
        keys.tasks(),
        match (write.claim, book.end_tasks) {
            (Some(c), _) => keys.task_runs(&c.period),
            (None, Some(period)) => keys.task_runs(period),
            (None, None) => keys.tasks(),
        },
        match write.id {
            Some(id) => keys.applied(id),
            None => keys.tasks(),
        },
    ];
    let text = |v: &dyn ToString| v.to_string().into_bytes();
    let mut a: Vec<Vec<u8>> = vec![
        text(&owner),
        text(&token),
        text(&write.sets.len()),
        text(&if write.create { "1" } else { "0" }),
        text(&book.open_add.len()),
        text(&book.open_remove.len()),
        text(&book.clear_requests.len()),
    ];
    match write.quota {
        Some(q) => a.extend([text(&q.keys), text(&q.bytes)]),
        None => a.extend([Vec::new(), Vec::new()]),
    }
    a.push(text(&book.runs_add.len()));
    a.push(text(&crate::tasks::GROUP));
    match write.claim {
        Some(c) => a.extend([
            text(&c.entry),
            text(&c.consumer),
            text(&c.deliveries),
            text(&c.id),
            text(&c.run),
        ]),
        None => a.extend(std::iter::repeat_n(Vec::new(), 5)),
    }
    a.push(if book.end_tasks.is_some() {
        b"1".to_vec()
    } else {
        Vec::new()
    });
    a.push(
        write
            .id
            .map(|id| id.as_bytes().to_vec())
            .unwrap_or_default(),
    );
    for (key, value) in write.sets {
        k.push(key.clone());
        a.push(value.to_vec());
    }
    k.extend(write.deletes.iter().cloned());
    a.extend(
        book.open_add
            .iter()
            .chain(book.open_remove)
            .map(|p| text(p)),
    );
    for (period, id) in book.clear_requests {
        a.extend([text(period), text(id)]);
    }
    a.extend(book.runs_add.iter().map(|p| text(p)));
    (k, a)
}

/// The script's reply `(ok, kind, a, b)` as the write's outcome.
fn answer(
    (ok, kind, fence_token, holder): (i64, String, String, String),
    token: u64,
    write: &TermWrite<'_>,
) -> Result<Written, FenceError> {
    if ok == 1 {
        return Ok(Written {
            created: kind != "exists",
            deleted: kind.parse().unwrap_or(0),
            usage: fence_token.parse().ok().zip(holder.parse().ok()),
        });
    }
    if let ("quota", Some(q)) = (kind.as_str(), write.quota) {
        return Err(FenceError::Quota(QuotaUsage {
            keys: fence_token.parse().unwrap_or(u64::MAX),
            bytes: holder.parse().unwrap_or(u64::MAX),
            max_keys: q.keys,
            max_bytes: q.bytes,
        }));
    }
    Err(FenceError::Refused(refusal(
        &kind,
        token,
        &fence_token,
        holder,
    )))
}

/// The fence's current `(token, holder)`, if any write or term has set it.
pub async fn current<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
) -> Result<Option<(u64, String)>, redis::RedisError> {
    let (token, holder): (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(keys.fence())
        .arg("token")
        .arg("holder")
        .query_async(conn)
        .await?;
    Ok(token
        .and_then(|t| t.parse().ok())
        .map(|t| (t, holder.unwrap_or_default())))
}

/// Why a term's write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TermWriteError {
    /// The term had ended (locally) before or while the write was on its way.
    #[error("the term has ended")]
    Ended,
    /// The fence refused the write; the term has been ended.
    #[error("{0}")]
    Refused(Refusal),
    /// Redis could not be asked.
    #[error("redis: {0}")]
    Redis(redis::RedisError),
    /// The write would take the job past its storage quota; nothing was written and the term
    /// goes on.
    #[error("{0}")]
    QuotaExceeded(QuotaUsage),
    /// The write was applied on the primary, but fewer replicas than the term requires
    /// acknowledged it in time: it may be lost if the primary fails over.
    #[error(
        "written on the primary, but acknowledged by {acked} of the {wanted} replicas required within {}",
        crate::units::show(*.timeout)
    )]
    NotReplicated {
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas required.
        wanted: u32,
        /// How long the write waited.
        timeout: std::time::Duration,
    },
}

/// The one way a term writes (runner and guest alike): refused locally once `term` has ended
/// (I3), abandoned if the term ends while waiting for Redis, and a refusal by the fence ends
/// the term at once. Emits a `fenced write` debug event with the send time and the term's
/// deadline on the monotonic clock and the outcome, for history checks; the job and node
/// come from the caller's `job` span (see [`crate::logging`]).
pub async fn write_in_term(
    conn: &mut Conn,
    keys: &JobKeys,
    term: &Term,
    write: TermWrite<'_>,
) -> Result<(), TermWriteError> {
    term_write(conn, keys, term, write).await.map(drop)
}

/// [`write_in_term`], saying what was written: whether a `create` created its key, and the
/// job's storage after a write counted against its quota (a guest's `store` writes).
pub async fn term_write(
    conn: &mut Conn,
    keys: &JobKeys,
    term: &Term,
    write: TermWrite<'_>,
) -> Result<Written, TermWriteError> {
    let (writes, deletes) = (write.sets, write.deletes);
    let token = term.token();
    let sent_ms = mono_ms(std::time::Instant::now());
    let deadline_ms = term.deadline_ms();
    let first_key = writes
        .first()
        .map(|w| w.0.as_str())
        .or(deletes.first().map(String::as_str))
        .unwrap_or("");
    let outcome = if !term.still_leader() {
        Err(TermWriteError::Ended)
    } else {
        let term_id = (term.owner(), token);
        let call = async {
            match term.replicas() {
                None => invoke(conn, keys, term_id, &write).await.map(|w| (w, None)),
                Some(r) => invoke_replicated(conn, keys, term_id, &write, r)
                    .await
                    .map(|(w, acked)| (w, Some((r, acked)))),
            }
        };
        match term.bound(call).await {
            Some(Ok((applied, None))) => Ok(applied),
            Some(Ok((_, Some((r, acked))))) if acked < i64::from(r.count) => {
                Err(TermWriteError::NotReplicated {
                    acked: acked.max(0) as u32,
                    wanted: r.count,
                    timeout: r.timeout,
                })
            }
            Some(Ok((applied, Some(_)))) => Ok(applied),
            Some(Err(FenceError::Refused(refusal))) => {
                tracing::warn!(
                    token,
                    key = first_key,
                    "write refused: {refusal}; stepping down"
                );
                term.end();
                crate::metrics::get().fence_refused(keys.job());
                Err(TermWriteError::Refused(refusal))
            }
            Some(Err(FenceError::Quota(usage))) => Err(TermWriteError::QuotaExceeded(usage)),
            Some(Err(FenceError::Redis(e))) => Err(TermWriteError::Redis(e)),
            None => Err(TermWriteError::Ended),
        }
    };
    let result = match &outcome {
        Ok(w) if w.created => "accepted",
        Ok(_) => "exists",
        Err(TermWriteError::Ended) => "ended",
        Err(TermWriteError::Refused(_)) => "refused",
        Err(TermWriteError::Redis(_)) => "unavailable",
        Err(TermWriteError::NotReplicated { .. }) => "unreplicated",
        Err(TermWriteError::QuotaExceeded(_)) => "quota",
    };
    tracing::debug!(
        token,
        key = first_key,
        keys = writes.len() + deletes.len(),
        index = write.book.open_add.len() + write.book.open_remove.len(),
        cleared = write.book.clear_requests.len(),
        sent_ms,
        deadline_ms,
        result,
        "fenced write"
    );
    outcome
}
