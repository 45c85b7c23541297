//! Fan-out in Redis: a run's tasks, the stream workers take them from, and the scripts that keep
//! every result fenced (issue: a job's leader hands tasks to worker replicas).
//!
//! **Layout** (one job `J`, one hash slot): the stream `lh:{J}:tasks` holds one entry per
//! task attempt (`period`, `id`, `attempt`, the run's attempt `run`, and the submitting term's
//! `token` and `owner`),
//! read by every host through the consumer group [`GROUP`]; the hash `lh:{J}:task:<period>`
//! holds each task's record (`t:<id>`: state, attempt, its current stream entry, its term, its
//! last error) and the run's counters (`n:submitted`, `n:finished`, `n:failed`); the hash
//! `lh:{J}:taskdata:<period>` holds payloads (`p:<id>`) and outputs (`o:<id>`).
//!
//! **Who writes what**, each in one script:
//!
//! * [`submit`] — a step's term: checked like every term write (stale token, other holder, not
//!   the leaseholder: [`crate::checks::TERM_CHECK`]); ids already submitted are left alone, so a
//!   re-executed step submits nothing twice.
//! * [`complete`] — a worker, *as the term that submitted the task* and only while it holds its
//!   claim on the entry ([`crate::checks::CLAIM_CHECK`]: pending for this consumer, delivered as
//!   many times as when claimed) and the entry is still the task's current one. So a result of
//!   an older term (a newer one leads), of a zombie worker (another took the task over), or of a
//!   task already finished, is refused and never seen. An output is accepted once per task id.
//!   A failed attempt is queued again as a new entry, up to the task's attempts; then the task
//!   is failed, and the run with it.
//! * [`adopt`] — a new leader resuming a run: every unfinished task gets a new entry of its
//!   term, and the old entries are dropped, so results of the old term's attempts are refused
//!   (the tasks run again under the new term; finished ones keep their outputs).
//! * **A run's end ends its tasks** (I12): the runner's write of a final record (`done`,
//!   `failed`) acknowledges and deletes every queued entry of the run
//!   ([`crate::fence::Bookkeeping::end_tasks`]) and deletes its task records and data, in the
//!   same fenced write. Every task script then checks the task's record first
//!   ([`crate::checks::RUN_ENDED`]): gone, or of another attempt of the run (a re-run submits its
//!   tasks anew, each entry naming its run attempt), and a task's `store` write, its result and
//!   its claim refresh are refused as "the task's run has ended", so a worker stops the task and
//!   says why.
//! * A worker's claim is its own state: [`fetch`] takes new entries (`XREADGROUP`), or entries
//!   whose worker stopped answering (`XAUTOCLAIM` after the claim's idle time: the lease TTL,
//!   the members' TTL), and [`refresh`] keeps a running task's claim fresh every heartbeat.
//!
//! Every key of a job's tasks shares the job's hash tag, so each script touches one slot
//! (Redis Cluster).

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use crate::checks::{CLAIM_CHECK, FenceError, RUN_ENDED, TERM_CHECK, refusal};
use crate::keys::JobKeys;

/// The consumer group of every job's task stream.
pub const GROUP: &str = "workers";
/// Most tasks one `submit` may carry.
pub const MOST_PER_SUBMIT: usize = 10_000;
/// Most bytes of payloads one `submit` may carry.
pub const MOST_BYTES_PER_SUBMIT: u64 = 64 << 20;
/// Most tasks one run may submit in all (task data is not counted against the job's storage
/// quota: this bounds what a run keeps in Redis until it ends).
pub const MOST_PER_RUN: u32 = 100_000;
/// Longest task id, in bytes.
pub const ID_MAX: usize = 128;

/// A worker's claim on one task's stream entry, and the task it is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The stream entry.
    pub entry: String,
    /// The worker (its consumer name).
    pub consumer: String,
    /// How many times the entry had been delivered when this worker claimed it.
    pub deliveries: u64,
    /// The period of the task's run.
    pub period: String,
    /// The task id.
    pub id: String,
    /// The attempt of the run that submitted the task (0 in entries of hosts before it was
    /// recorded): a re-run of the period is a new attempt, and ends the old attempt's tasks.
    pub run: u32,
}

/// A task as a worker took it from the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The claim.
    pub claim: Claim,
    /// The run's period.
    pub period: String,
    /// The task id.
    pub id: String,
    /// The attempt, from 1.
    pub attempt: u32,
    /// The submitting term's token.
    pub token: u64,
    /// The submitting term's owner.
    pub owner: String,
    /// The component version the task's run runs with (`sha256:…`).
    pub component: String,
    /// The run's scheduled time (RFC 3339).
    pub scheduled_at: String,
    /// Taken over from a worker that stopped answering.
    pub reclaimed: bool,
}

/// The run a task is submitted for: its period, attempt, scheduled time and component version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOf {
    /// The period.
    pub period: String,
    /// The run's attempt (from 1; 0 when unknown, as in tests outside a runner).
    pub attempt: u32,
    /// Its scheduled time (RFC 3339).
    pub scheduled_at: String,
    /// The component version the run runs with.
    pub component: String,
}

/// How many attempts each task of a job gets: the job's `retry-attempts` when it sets more than
/// one, else [`DEFAULT_ATTEMPTS`].
pub fn attempts(policies: &crate::spec::Policies) -> u32 {
    if policies.retry_attempts > 1 {
        policies.retry_attempts
    } else {
        DEFAULT_ATTEMPTS
    }
}

/// Attempts per task when the job sets no retry policy.
pub const DEFAULT_ATTEMPTS: u32 = 3;

/// How far a run's tasks are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Tasks submitted.
    pub submitted: u32,
    /// Tasks finished (an output, or failed on every attempt).
    pub finished: u32,
    /// Tasks failed on every attempt.
    pub failed: u32,
}

impl Progress {
    /// Every task submitted has finished.
    pub fn done(&self) -> bool {
        self.finished >= self.submitted
    }
}

/// How a worker's attempt at a task ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// `run-task` returned this output.
    Output(Vec<u8>),
    /// It failed (the job's error, a trap, a limit): the message.
    Failed(String),
}

/// What [`complete`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completed {
    /// The output was accepted: the task is done.
    Done,
    /// The failed attempt was recorded and the task queued again.
    Retried,
    /// The failed attempt was the last: the task failed (and the run with it).
    Failed,
    /// Refused: the submitting term no longer leads, the claim or entry is not this worker's
    /// any more, or the task's run has ended. Nothing was written.
    Refused(crate::checks::Refusal),
}

static SUBMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TERM_CHECK}{}",
        r#"
-- KEYS: lease, fence, tasks stream, the run's task hash, its data hash.
-- ARGV: owner, token, group, period, work channel, number of tasks, the run's component
--       version, its scheduled time, the most tasks a run may have, the run's attempt, then
--       (id, payload) pairs.
local refused = term_check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refused then
  return refused
end
-- The run's bound: nothing is added when the new tasks would take it past it.
local new = 0
for i = 1, tonumber(ARGV[6]) do
  if redis.call('HEXISTS', KEYS[4], 't:' .. ARGV[9 + 2 * i]) == 0 then
    new = new + 1
  end
end
local submitted = tonumber(redis.call('HGET', KEYS[4], 'n:submitted') or '0')
if submitted + new > tonumber(ARGV[9]) then
  return {1, 'too-many', tostring(submitted), ''}
end
-- The group exists from the first task on (an error when it already does is expected).
redis.pcall('XGROUP', 'CREATE', KEYS[3], ARGV[3], '0', 'MKSTREAM')
local added = 0
for i = 1, tonumber(ARGV[6]) do
  local id, payload = ARGV[9 + 2 * i], ARGV[10 + 2 * i]
  if redis.call('HEXISTS', KEYS[4], 't:' .. id) == 0 then
    local entry = redis.call('XADD', KEYS[3], '*', 'period', ARGV[4], 'id', id, 'attempt', '1',
      'token', ARGV[2], 'owner', ARGV[1], 'component', ARGV[7], 'scheduled', ARGV[8],
      'run', ARGV[10])
    redis.call('HSET', KEYS[4], 't:' .. id, cjson.encode({state = 'queued', attempt = 1,
      entry = entry, token = ARGV[2], owner = ARGV[1], component = ARGV[7],
      scheduled = ARGV[8], run = ARGV[10]}))
    redis.call('HSET', KEYS[5], 'p:' .. id, payload)
    redis.call('HINCRBY', KEYS[4], 'n:submitted', 1)
    added = added + 1
  end
end
if added > 0 then
  redis.call('PUBLISH', ARGV[5], 'tasks')
end
return {1, 'submitted', tostring(added), ''}
"#
    ))
});

static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TERM_CHECK}{CLAIM_CHECK}{RUN_ENDED}{}",
        r#"
-- KEYS: lease, fence, tasks stream, the run's task hash, its data hash.
-- ARGV: owner, token (the submitting term's), group, entry, consumer, deliveries, id,
--       'ok' or 'fail', output or error, attempts allowed, period, work channel, notice channel,
--       the run attempt the task was submitted for.
local refused = term_check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refused then
  return refused
end
local raw = redis.call('HGET', KEYS[4], 't:' .. ARGV[7])
local rec = raw and cjson.decode(raw)
if run_ended(rec, ARGV[14]) then
  -- The run is over (done, failed: its task records went with it) or was run again.
  redis.call('XACK', KEYS[3], ARGV[3], ARGV[4])
  redis.call('XDEL', KEYS[3], ARGV[4])
  return {0, 'run-ended', '', ARGV[7]}
end
if not claim_holds(KEYS[3], ARGV[3], ARGV[4], ARGV[5], ARGV[6]) then
  return {0, 'claim-lost', '', ARGV[5]}
end
if rec.entry ~= ARGV[4] or rec.state ~= 'queued' then
  -- Not this task's current attempt any more (adopted, requeued or finished): drop the entry.
  redis.call('XACK', KEYS[3], ARGV[3], ARGV[4])
  redis.call('XDEL', KEYS[3], ARGV[4])
  return {0, 'claim-lost', '', ARGV[5]}
end
redis.call('XACK', KEYS[3], ARGV[3], ARGV[4])
redis.call('XDEL', KEYS[3], ARGV[4])
local outcome
if ARGV[8] == 'ok' then
  redis.call('HSET', KEYS[5], 'o:' .. ARGV[7], ARGV[9])
  rec.state = 'done'
  redis.call('HINCRBY', KEYS[4], 'n:finished', 1)
  outcome = 'done'
elseif rec.attempt < tonumber(ARGV[10]) then
  rec.attempt = rec.attempt + 1
  rec.error = ARGV[9]
  rec.entry = redis.call('XADD', KEYS[3], '*', 'period', ARGV[11], 'id', ARGV[7], 'attempt',
    tostring(rec.attempt), 'token', ARGV[2], 'owner', ARGV[1], 'component', rec.component,
    'scheduled', rec.scheduled, 'run', rec.run or '0')
  redis.call('PUBLISH', ARGV[12], 'tasks')
  outcome = 'retried'
else
  rec.state = 'failed'
  rec.error = ARGV[9]
  redis.call('HINCRBY', KEYS[4], 'n:finished', 1)
  redis.call('HINCRBY', KEYS[4], 'n:failed', 1)
  outcome = 'failed'
end
redis.call('HSET', KEYS[4], 't:' .. ARGV[7], cjson.encode(rec))
if outcome ~= 'retried' then
  local n = redis.call('HMGET', KEYS[4], 'n:submitted', 'n:finished')
  if tonumber(n[2] or '0') >= tonumber(n[1] or '0') then
    redis.call('PUBLISH', ARGV[13], 'tasks-done')
  end
end
return {1, outcome, '', ''}
"#
    ))
});

static ADOPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TERM_CHECK}{}",
        r#"
-- KEYS: lease, fence, tasks stream, the run's task hash.
-- ARGV: owner, token (the adopting term's), group, period, work channel.
local refused = term_check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refused then
  return refused
end
redis.pcall('XGROUP', 'CREATE', KEYS[3], ARGV[3], '0', 'MKSTREAM')
local all = redis.call('HGETALL', KEYS[4])
local adopted = 0
for i = 1, #all, 2 do
  local field = all[i]
  if string.sub(field, 1, 2) == 't:' then
    local rec = cjson.decode(all[i + 1])
    if rec.state == 'queued' and rec.owner ~= ARGV[1] then
      redis.call('XACK', KEYS[3], ARGV[3], rec.entry)
      redis.call('XDEL', KEYS[3], rec.entry)
      rec.token, rec.owner = ARGV[2], ARGV[1]
      rec.entry = redis.call('XADD', KEYS[3], '*', 'period', ARGV[4], 'id',
        string.sub(field, 3), 'attempt', tostring(rec.attempt), 'token', ARGV[2], 'owner', ARGV[1],
        'component', rec.component, 'scheduled', rec.scheduled, 'run', rec.run or '0')
      redis.call('HSET', KEYS[4], field, cjson.encode(rec))
      adopted = adopted + 1
    end
  end
end
if adopted > 0 then
  redis.call('PUBLISH', ARGV[5], 'tasks')
end
return {1, 'adopted', tostring(adopted), ''}
"#
    ))
});

static FETCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: tasks stream.  ARGV: group, consumer, idle ms after which a claim lapses, count.
-- New entries first; else entries whose worker stopped refreshing its claim. Each with how
-- many times it has been delivered (this delivery included), and whether it was taken over.
redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
local out = {}
local function add(entries, reclaimed)
  for _, e in ipairs(entries) do
    if e[2] then
      local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
      table.insert(out, {e[1], e[2], p[1] and p[1][4] or 1, reclaimed})
    end
  end
end
local fresh = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[4], 'STREAMS',
  KEYS[1], '>')
if fresh then
  add(fresh[1][2], 0)
end
-- Lapsed claims anywhere in the pending list (XAUTOCLAIM looks at ten entries per COUNT a
-- call: walk on from its cursor, a bounded number of times).
local cursor, walked = '0-0', 0
while #out == 0 and walked < 100 do
  local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], cursor, 'COUNT',
    ARGV[4])
  add(claimed[2], 1)
  cursor, walked = claimed[1], walked + 1
  if cursor == '0-0' then
    break
  end
end
return out
"#,
    )
});

static REFRESH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{CLAIM_CHECK}{RUN_ENDED}{}",
        r#"
-- KEYS: tasks stream, the run's task hash.  ARGV: group, entry, consumer, deliveries, id, run.
-- Resets the entry's idle time while this worker still holds it (JUSTID: not a delivery);
-- 2 when the task's run has ended, 0 when the claim is another's.
local raw = redis.call('HGET', KEYS[2], 't:' .. ARGV[5])
if run_ended(raw and cjson.decode(raw), ARGV[6]) then
  return 2
end
if not claim_holds(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[2], 'JUSTID')
return 1
"#
    ))
});

static DROP_STALE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: tasks stream, the run's task hash.  ARGV: group, entry, id.
-- An entry that is not its task's current attempt (the run ended, the task was adopted or
-- finished) is dropped; nothing else is touched.
local raw = redis.call('HGET', KEYS[2], 't:' .. ARGV[3])
if raw and cjson.decode(raw).entry == ARGV[2] then
  return 0
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
"#,
    )
});

/// Checks a task id (see `tasks.task.id` in the WIT).
pub fn validate_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("task id is empty".into());
    }
    if id.len() > ID_MAX {
        return Err(format!("task id is {} bytes, more than {ID_MAX}", id.len()));
    }
    if let Some(b) = id.bytes().find(|b| !(b'!'..=b'~').contains(b)) {
        return Err(format!(
            "task id {id:?} contains byte 0x{b:02x}; only printable ASCII without spaces is allowed"
        ));
    }
    Ok(())
}

/// A term script's reply: `{1, word, value, _}` or a refusal.
fn reply(token: u64, v: Value) -> Result<(String, String), FenceError> {
    let (ok, kind, a, b): (i64, String, String, String) =
        redis::from_redis_value(v).map_err(redis::RedisError::from)?;
    if ok == 1 {
        Ok((kind, a))
    } else {
        Err(FenceError::Refused(refusal(&kind, token, &a, b)))
    }
}

/// What [`submit`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// This many tasks were added (ids already submitted were left alone).
    Added(u32),
    /// Nothing was added: the run would have more than [`MOST_PER_RUN`] tasks; it has this
    /// many.
    TooMany(u32),
}

/// Submits `tasks` (id, payload) for the run `run` as the term `(owner, token)`: ids already
/// submitted are left alone, and nothing is added past [`MOST_PER_RUN`] tasks for the run.
pub async fn submit<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    (owner, token): (&str, u64),
    run: &RunOf,
    tasks: &[(String, Vec<u8>)],
) -> Result<Submitted, FenceError> {
    let period = run.period.as_str();
    let mut inv = SUBMIT.key(keys.lease());
    inv.key(keys.fence())
        .key(keys.tasks())
        .key(keys.task_runs(period))
        .key(keys.task_data(period))
        .arg(owner)
        .arg(token)
        .arg(GROUP)
        .arg(period)
        .arg(keys.work_channel())
        .arg(tasks.len())
        .arg(&run.component)
        .arg(&run.scheduled_at)
        .arg(MOST_PER_RUN)
        .arg(run.attempt);
    for (id, payload) in tasks {
        inv.arg(id).arg(payload.as_slice());
    }
    let v: Value = inv.invoke_async(conn).await?;
    let (kind, n) = reply(token, v)?;
    let n = n.parse().unwrap_or(0);
    Ok(if kind == "too-many" {
        Submitted::TooMany(n)
    } else {
        Submitted::Added(n)
    })
}

/// Takes up to `count` tasks for `consumer`: new ones first, else ones whose claim lapsed
/// (idle for `lapse`).
pub async fn fetch<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    consumer: &str,
    lapse: Duration,
    count: usize,
) -> redis::RedisResult<Vec<Fetched>> {
    // Entry id, its fields, deliveries, reclaimed (1 or 0).
    type Row = (String, Vec<(String, String)>, u64, i64);
    let rows: Vec<Row> = FETCH
        .key(keys.tasks())
        .arg(GROUP)
        .arg(consumer)
        .arg(lapse.as_millis() as u64)
        .arg(count)
        .invoke_async(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(entry, fields, deliveries, reclaimed)| {
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            Fetched {
                claim: Claim {
                    entry,
                    consumer: consumer.to_string(),
                    deliveries,
                    period: field("period"),
                    id: field("id"),
                    run: field("run").parse().unwrap_or(0),
                },
                period: field("period"),
                id: field("id"),
                attempt: field("attempt").parse().unwrap_or(1),
                token: field("token").parse().unwrap_or(0),
                owner: field("owner"),
                component: field("component"),
                scheduled_at: field("scheduled"),
                reclaimed: reclaimed == 1,
            }
        })
        .collect())
}

/// The payload of `task`, if the entry is still the task's current attempt (`None`: the entry
/// is stale and was dropped, see [`DROP_STALE`]).
pub async fn payload<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    task: &Fetched,
) -> redis::RedisResult<Option<Vec<u8>>> {
    let dropped: i64 = DROP_STALE
        .key(keys.tasks())
        .key(keys.task_runs(&task.period))
        .arg(GROUP)
        .arg(&task.claim.entry)
        .arg(&task.id)
        .invoke_async(conn)
        .await?;
    if dropped == 1 {
        return Ok(None);
    }
    redis::cmd("HGET")
        .arg(keys.task_data(&task.period))
        .arg(format!("p:{}", task.id))
        .query_async(conn)
        .await
}

/// What [`refresh`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The claim is this worker's: its idle time was reset.
    Yes,
    /// Another worker took the task over, or it was requeued or finished meanwhile.
    TakenOver,
    /// The task's run is over (done, failed or run again): the task may change nothing.
    RunEnded,
}

/// Keeps `claim` fresh (resets its idle time) while it is this worker's and its run is open.
pub async fn refresh<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    claim: &Claim,
) -> redis::RedisResult<Held> {
    let held: i64 = REFRESH
        .key(keys.tasks())
        .key(keys.task_runs(&claim.period))
        .arg(GROUP)
        .arg(&claim.entry)
        .arg(&claim.consumer)
        .arg(claim.deliveries)
        .arg(&claim.id)
        .arg(claim.run)
        .invoke_async(conn)
        .await?;
    Ok(match held {
        1 => Held::Yes,
        2 => Held::RunEnded,
        _ => Held::TakenOver,
    })
}

/// Records `attempt` of `task` as its submitting term and under the worker's claim (see the
/// module doc); `attempts`: how many attempts the task is allowed.
pub async fn complete<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    task: &Fetched,
    attempt: &Attempt,
    attempts: u32,
) -> redis::RedisResult<Completed> {
    let (word, value): (&str, &[u8]) = match attempt {
        Attempt::Output(o) => ("ok", o),
        Attempt::Failed(e) => ("fail", e.as_bytes()),
    };
    let v: Value = COMPLETE
        .key(keys.lease())
        .key(keys.fence())
        .key(keys.tasks())
        .key(keys.task_runs(&task.period))
        .key(keys.task_data(&task.period))
        .arg(&task.owner)
        .arg(task.token)
        .arg(GROUP)
        .arg(&task.claim.entry)
        .arg(&task.claim.consumer)
        .arg(task.claim.deliveries)
        .arg(&task.id)
        .arg(word)
        .arg(value)
        .arg(attempts)
        .arg(&task.period)
        .arg(keys.work_channel())
        .arg(keys.notice_channel())
        .arg(task.claim.run)
        .invoke_async(conn)
        .await?;
    Ok(match reply(task.token, v) {
        Ok((kind, _)) => match kind.as_str() {
            "done" => Completed::Done,
            "retried" => Completed::Retried,
            _ => Completed::Failed,
        },
        Err(FenceError::Refused(r)) => Completed::Refused(r),
        Err(FenceError::Redis(e)) => return Err(e),
        Err(FenceError::Quota(_)) => unreachable!("task results are not counted against a quota"),
    })
}

/// Gives every unfinished task of `period`'s run to the term `(owner, token)`: a new entry of
/// that term each, the old entries dropped. Returns how many were adopted.
pub async fn adopt<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    (owner, token): (&str, u64),
    period: &str,
) -> Result<u32, FenceError> {
    let v: Value = ADOPT
        .key(keys.lease())
        .key(keys.fence())
        .key(keys.tasks())
        .key(keys.task_runs(period))
        .arg(owner)
        .arg(token)
        .arg(GROUP)
        .arg(period)
        .arg(keys.work_channel())
        .invoke_async(conn)
        .await?;
    Ok(reply(token, v)?.1.parse().unwrap_or(0))
}

/// How far `period`'s tasks are.
pub async fn progress<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> redis::RedisResult<Progress> {
    let (s, f, x): (Option<u32>, Option<u32>, Option<u32>) = redis::cmd("HMGET")
        .arg(keys.task_runs(period))
        .arg("n:submitted")
        .arg("n:finished")
        .arg("n:failed")
        .query_async(conn)
        .await?;
    Ok(Progress {
        submitted: s.unwrap_or(0),
        finished: f.unwrap_or(0),
        failed: x.unwrap_or(0),
    })
}

/// The output of task `id` of `period`'s run, once it is done.
pub async fn output<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
    id: &str,
) -> redis::RedisResult<Option<Vec<u8>>> {
    redis::cmd("HGET")
        .arg(keys.task_data(period))
        .arg(format!("o:{id}"))
        .query_async(conn)
        .await
}

/// The first (by id) task of `period`'s run that failed on every attempt: its id, attempts and
/// last error.
pub async fn first_failure<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> redis::RedisResult<Option<(String, u32, String)>> {
    let all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.task_runs(period))
        .query_async(conn)
        .await?;
    let mut failed: Vec<(String, u32, String)> = all
        .into_iter()
        .filter_map(|(field, raw)| {
            let id = field.strip_prefix("t:")?;
            let rec: serde_json::Value = serde_json::from_str(&raw).ok()?;
            (rec["state"] == "failed").then(|| {
                (
                    id.to_string(),
                    rec["attempt"].as_u64().unwrap_or(0) as u32,
                    rec["error"].as_str().unwrap_or("").to_string(),
                )
            })
        })
        .collect();
    failed.sort();
    Ok(failed.into_iter().next())
}

#[cfg(test)]
mod tests {
    use super::validate_id;

    #[test]
    fn task_ids_are_printable_and_bounded() {
        assert!(validate_id("chunk-0007").is_ok());
        assert!(validate_id(&"x".repeat(128)).is_ok());
        for bad in ["", "a b", "é", "nul\0"] {
            assert!(validate_id(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_id(&"x".repeat(129)).is_err());
    }
}
