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
//!   the leaseholder: [`crate::coord::checks::TERM_CHECK`]); ids already submitted are left alone, so a
//!   re-executed step submits nothing twice.
//! * [`complete`] — a worker, *as the term that submitted the task* and only while it holds its
//!   claim on the entry ([`crate::coord::checks::CLAIM_CHECK`]: pending for this consumer, delivered as
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
//!   ([`crate::coord::fence::Bookkeeping::end_tasks`]) and deletes its task records and data, in the
//!   same fenced write. Every task script then checks the task's record first
//!   ([`crate::coord::checks::RUN_ENDED`]): gone, or of another attempt of the run (a re-run submits its
//!   tasks anew, each entry naming its run attempt), and a task's `store` write, its result and
//!   its claim refresh are refused as "the task's run has ended", so a worker stops the task and
//!   says why.
//! * A worker's claim is its own state: [`fetch`] takes new entries (`XREADGROUP`), or entries
//!   whose worker stopped answering (`XAUTOCLAIM` after the claim's idle time: the lease TTL,
//!   the members' TTL), and [`refresh`] keeps a running task's claim fresh every heartbeat.
//!
//! Every key of a job's tasks shares the job's hash tag, so each script touches one slot
//! (Redis Cluster).

use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionLike;

use crate::coord::checks::{FenceError, refusal};

mod read;
mod scripts;
mod worker;
use crate::store::keys::JobKeys;
pub use read::{
    TaskCounts, TaskView, first_failure, output, progress, task_counts, tasks_of, tasks_summary,
};
use scripts::{ADOPT, SUBMIT};
pub use worker::{Held, complete, fetch, give_back, payload, refresh};

pub use crate::coord::checks::{Claim, GROUP};
/// Most tasks one `submit` may carry.
pub const MOST_PER_SUBMIT: usize = 10_000;
/// Most bytes of payloads one `submit` may carry.
pub const MOST_BYTES_PER_SUBMIT: u64 = 64 << 20;
/// Most tasks one run may submit in all (task data is not counted against the job's storage
/// quota: this bounds what a run keeps in Redis until it ends).
pub const MOST_PER_RUN: u32 = 100_000;
/// Longest task id, in bytes.
pub const ID_MAX: usize = 128;
/// Deliveries of one attempt's stream entry after which a worker records the attempt failed
/// instead of running it (every earlier delivery's worker stopped answering).
pub const MOST_DELIVERIES: u64 = 3;

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
    /// How long it waits before it runs: what is left of its back-off after a failed or
    /// not-ready attempt (in Redis's clock, when it was fetched).
    pub wait: Duration,
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
pub fn attempts(policies: &crate::exec::spec::Policies) -> u32 {
    if policies.retry_attempts > 1 {
        policies.retry_attempts
    } else {
        DEFAULT_ATTEMPTS
    }
}

/// Attempts per task when the job sets no retry policy.
pub const DEFAULT_ATTEMPTS: u32 = 3;

/// The wait before attempt `next` of a task (from 2), or before a task that was not ready runs
/// again as attempt `next`: the job's retry back-off when it sets a retry policy
/// (`retry.backoff`, doubling to `retry.max-backoff`), else 1 s doubling to 30 s.
pub fn backoff(policies: &crate::exec::spec::Policies, next: u32) -> Duration {
    if policies.retry_attempts > 1 {
        policies.retry_delay(next)
    } else {
        let doublings = next.saturating_sub(2).min(5);
        (DEFAULT_BACKOFF * (1 << doublings)).min(Duration::from_secs(30))
    }
}

/// The first wait between a task's attempts when the job sets no retry policy.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);

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
    /// It answered `not-ready`: queued again after the back-off, as the same attempt.
    NotReady(String),
}

/// What [`complete`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completed {
    /// The output was accepted: the task is done.
    Done,
    /// The failed attempt was recorded and the task queued again.
    Retried,
    /// The task was not ready: queued again as the same attempt.
    Waiting,
    /// The failed attempt was the last: the task failed (and the run with it).
    Failed,
    /// Refused: the submitting term no longer leads, the claim or entry is not this worker's
    /// any more, or the task's run has ended. Nothing was written.
    Refused(crate::coord::checks::Refusal),
}

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
    reply3(token, v).map(|(kind, a, _)| (kind, a))
}

/// [`reply`] with the answer's second value too.
fn reply3(token: u64, v: Value) -> Result<(String, String, String), FenceError> {
    let (ok, kind, a, b): (i64, String, String, String) =
        redis::from_redis_value(v).map_err(redis::RedisError::from)?;
    if ok == 1 {
        Ok((kind, a, b))
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
    /// Nothing was added: the payloads would take the job past its storage quota of bytes
    /// (what it would keep: keys, bytes).
    Quota(u64, u64),
}

/// Submits `tasks` (id, payload) for the run `run` as the term `(owner, token)`: ids already
/// submitted are left alone, and nothing is added past [`MOST_PER_RUN`] tasks for the run, nor
/// when the payloads would take the job past `quota_bytes` (they count against its storage
/// quota until the run ends, as its tasks' outputs do).
pub async fn submit<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    (owner, token): (&str, u64),
    run: &RunOf,
    tasks: &[(String, Vec<u8>)],
    quota_bytes: u64,
) -> Result<Submitted, FenceError> {
    let period = run.period.as_str();
    let mut inv = SUBMIT.key(keys.lease());
    inv.key(keys.fence())
        .key(keys.tasks())
        .key(keys.task_runs(period))
        .key(keys.task_data(period))
        .key(keys.usage())
        .arg(owner)
        .arg(token)
        .arg(GROUP)
        .arg(period)
        .arg(keys.work_channel())
        .arg(tasks.len())
        .arg(&run.component)
        .arg(&run.scheduled_at)
        .arg(MOST_PER_RUN)
        .arg(run.attempt)
        .arg(quota_bytes);
    for (id, payload) in tasks {
        inv.arg(id).arg(payload.as_slice());
    }
    let v: Value = inv.invoke_async(conn).await?;
    let (kind, n, keys_kept) = reply3(token, v)?;
    Ok(match kind.as_str() {
        "too-many" => Submitted::TooMany(n.parse().unwrap_or(0)),
        "quota" => Submitted::Quota(keys_kept.parse().unwrap_or(0), n.parse().unwrap_or(0)),
        _ => Submitted::Added(n.parse().unwrap_or(0)),
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
