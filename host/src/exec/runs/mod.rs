//! Run records: what happened to each period of a job, kept in Redis.
//!
//! One record per `(job, period)` at `lh:{job}:run:<period>` (JSON), written only through the
//! fence together with the run's checkpoint at `lh:{job}:ckpt:<period>`, in one script.
//!
//! ```text
//! (period fires) → pending → running → done
//!                     ↑          ├──→ waiting → running      (inputs not ready)
//!                     └──────────┤                           (a step failed, attempts left:
//!                                │                            pending with retry_at)
//!                                └──→ failed                 (attempts used up, run time over)
//! (period fires)  → missed | skipped                         (catch-up / overlap policy)
//! pending | running | waiting → cancelled                    (an operator's cancel)
//! ```
//!
//! A `done` record is final: the period is never run again (I5). `failed`, `missed`,
//! `skipped` and `cancelled` are final for the scheduler; an operator's trigger runs the period again as a new
//! attempt. The job's *cursor* (`lh:{job}:cursor`) is the start instant (RFC 3339, UTC) of the
//! newest period a leader has accounted for (given a record); it is written through the fence
//! with those records, so no period is accounted twice or skipped without a record.

mod ran_by;
mod requests;
mod state;

use redis::aio::ConnectionLike;

pub use ran_by::{RAN_BY_KEPT, RanBy};
pub use requests::{
    Cancel, Request, ScheduleCheck, Seen, Triggered, cancel, check_published_schedule,
    published_schedule, request, trigger, validate_period_shape,
};
use serde::{Deserialize, Serialize};
pub use state::{JobState, set_paused, state_of};

use crate::coord::term_store::{Store, TermStore as _};
use crate::store::keys::JobKeys;

/// Where a period's run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    /// Due (it fired, was triggered, or waits for a retry at `retry_at`), not started.
    Pending,
    /// Steps are being executed (or were, when the leader died: the next leader resumes).
    Running,
    /// The job said its inputs are not ready; the leader calls the same step again later.
    Waiting,
    /// The run completed. Final.
    Done,
    /// A step failed (the job reported failure, trapped, or ran out of time) on the last
    /// attempt, or the run exceeded its maximum run time; `error` and `failure` say why.
    Failed,
    /// The period fired while no leader ran the job and the catch-up policy did not run it.
    Missed,
    /// The period fired while an earlier run was open and the overlap policy is `skip`.
    Skipped,
    /// An operator cancelled the open run (`leasehold cancel`, `POST …/cancel`); the leader
    /// stopped it (a running step is stopped as at a term's end) and ended its tasks. Final for
    /// the scheduler; a trigger runs the period again as a new attempt.
    Cancelled,
    /// Shown in the run history only: the period's record could not be read. It is kept
    /// aside at `lh:{job}:corrupt:<period>` (or still at its place, until a leader moves it),
    /// and `error` says how large it is and why it does not parse. It blocks nothing.
    Corrupt,
    /// Shown in the run history only: an operator asked for a period that is neither one of
    /// the job's schedule nor has a run record (a trigger sent before any leader published the
    /// schedule, so it could not be checked). The leader that refused it kept this at
    /// `lh:{job}:refused:<period>`; `error` says why. It blocks nothing.
    Refused,
}

impl RunStatus {
    /// Whether the scheduler is done with the period (an operator may still re-run it, except
    /// when `done`).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Done
                | RunStatus::Failed
                | RunStatus::Missed
                | RunStatus::Skipped
                | RunStatus::Cancelled
                | RunStatus::Corrupt
                | RunStatus::Refused
        )
    }

    /// The status as it is written in records (`running`, `done`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Done => "done",
            RunStatus::Failed => "failed",
            RunStatus::Missed => "missed",
            RunStatus::Skipped => "skipped",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Corrupt => "corrupt",
            RunStatus::Refused => "refused",
        }
    }
}

/// One earlier attempt of the period, kept in the record's `attempts` list: a failed attempt
/// retried under the retry policy, or a final record (`failed`, `missed`, `skipped`) that an
/// operator ran again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedAttempt {
    /// The attempt number.
    pub attempt: u32,
    /// How the attempt ended (`failed`, or the `missed`/`skipped` record an operator re-ran).
    #[serde(default = "failed_status")]
    pub status: RunStatus,
    /// The step it ended at.
    pub step: u32,
    /// The class of the failure, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureKind>,
    /// Why, in words.
    pub error: String,
    /// When (RFC 3339, UTC).
    pub at: String,
}

fn failed_status() -> RunStatus {
    RunStatus::Failed
}

/// The most earlier attempts a record keeps (the oldest are dropped).
pub const ATTEMPTS_KEPT: usize = 20;

impl FailedAttempt {
    /// The final record `r` as an earlier attempt, when an operator runs its period again.
    pub fn of_final(r: &RunRecord) -> Self {
        FailedAttempt {
            attempt: r.attempt,
            status: r.status,
            step: r.step,
            failure: r.failure,
            error: r.error.clone().unwrap_or_default(),
            at: r
                .finished_at
                .clone()
                .unwrap_or_else(|| r.updated_at.clone()),
        }
    }
}

/// Why a run failed: the class of the error, for scripts and metrics (`error` has the words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// The job returned `job-error.failed`.
    JobError,
    /// The guest trapped: `unreachable`, a panic, a stack overflow, a table limit.
    Trap,
    /// The guest tried to grow its memory past the job's memory limit.
    MemoryLimit,
    /// A step ran past the job's step time limit.
    Timeout,
    /// A step returned a checkpoint larger than the job's write limit.
    StateTooLarge,
    /// A write would have taken the job past its storage quota (see [`crate::coord::quota`]).
    QuotaExceeded,
    /// The run was started by a component version this host does not have; a run never mixes
    /// versions.
    VersionChanged,
    /// The run took longer than the job's maximum run time.
    RunTimeout,
    /// A task of the run failed on every attempt (fan-out); its retries are the task's own,
    /// so the run is not retried.
    TaskFailed,
}

/// The name records, metrics and the `runs` table use (`task-failed`), not the Rust one.
impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(name)) => f.write_str(&name),
            _ => write!(f, "{self:?}"),
        }
    }
}

/// The record of one period's run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The period id.
    pub period: String,
    /// The period's fire time (RFC 3339, the job's zone).
    pub scheduled_at: String,
    /// Where the run stands.
    pub status: RunStatus,
    /// The next step to execute (the number of steps completed).
    pub step: u32,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// Token of the term that wrote this record.
    pub token: u64,
    /// Node that wrote this record.
    pub node: String,
    /// Content hash of the component version running the run.
    pub component: String,
    /// When the run started (RFC 3339, UTC).
    pub started_at: String,
    /// When the record was last written (RFC 3339, UTC).
    pub updated_at: String,
    /// When the run reached `done` or `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Why the run failed or waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The guest's last stderr lines (at most 2 KiB) in the step that failed, is retried or
    /// waits; cleared by a step that succeeds. Absent when that step wrote nothing to stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// The class of the failure, when `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureKind>,
    /// When a `pending` retry may start (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
    /// The attempts before this one, oldest first (the newest [`ATTEMPTS_KEPT`]): retried
    /// failures and re-run final records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<FailedAttempt>,
    /// The terms that wrote this record, oldest first (the newest [`RAN_BY_KEPT`]): who ran
    /// which steps of which attempt. Records written before this field existed have none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ran_by: Vec<RanBy>,
    /// The run waits for the tasks it submitted before its next step (`await-tasks`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub awaiting_tasks: bool,
    /// Set when the period is not one of the job's schedule any more (the schedule changed
    /// while the run was open, or before it was run again): the run goes on under the period it
    /// fired for, and this says which schedule the job has now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earlier_schedule: Option<String>,
}

impl RunRecord {
    /// A new record for `period`, `status` now.
    pub fn new(period: &crate::exec::spec::Period, status: RunStatus, now: &str) -> Self {
        Self::blank(&period.id, period.fire.to_rfc3339(), status, now)
    }

    /// The entry of a refused request for `period` ([`RunStatus::Refused`]), made `now`.
    pub fn refused(period: &str, now: &str) -> Self {
        Self::blank(period, String::new(), RunStatus::Refused, now)
    }

    /// A record of `period` (fired at `scheduled_at`) with `status` and nothing done, at `now`.
    fn blank(period: &str, scheduled_at: String, status: RunStatus, now: &str) -> Self {
        RunRecord {
            period: period.to_string(),
            scheduled_at,
            status,
            step: 0,
            attempt: 1,
            token: 0,
            node: String::new(),
            component: String::new(),
            started_at: now.to_string(),
            updated_at: now.to_string(),
            finished_at: status.is_final().then(|| now.to_string()),
            error: None,
            stderr: None,
            failure: None,
            retry_at: None,
            attempts: Vec::new(),
            ran_by: Vec::new(),
            awaiting_tasks: false,
            earlier_schedule: None,
        }
    }
}

/// A run record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The record exists but is not a run record (written by hand, or by another program).
    #[error("run record {key} is not valid: {source}")]
    Corrupt {
        /// The record's key.
        key: String,
        /// What did not parse.
        source: serde_json::Error,
    },
    /// Redis could not be asked.
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// The store could not be asked (a read through the seam, [`read_from`]).
    #[error(transparent)]
    Store(anyhow::Error),
}

/// Reads the record of `period`; `Ok(None)` if it was never written. A record that does not
/// parse is [`RecordError::Corrupt`], naming the key.
pub async fn read<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> Result<Option<RunRecord>, RecordError> {
    let key = keys.run(period);
    let raw: Option<String> = redis::cmd("GET").arg(&key).query_async(conn).await?;
    raw.map(|r| serde_json::from_str(&r).map_err(|source| RecordError::Corrupt { key, source }))
        .transpose()
}

/// [`read`], through the seam: `period`'s run record in `store`.
pub async fn read_from(
    store: &Store,
    keys: &JobKeys,
    period: &str,
) -> Result<Option<RunRecord>, RecordError> {
    let raw = store
        .read_key(keys.job(), &JobKeys::run_rest(period))
        .await
        .map_err(RecordError::Store)?;
    let key = keys.run(period);
    raw.map(|r| serde_json::from_slice(&r).map_err(|source| RecordError::Corrupt { key, source }))
        .transpose()
}

/// Reads the checkpoint of `period`'s run, through the seam.
pub async fn read_checkpoint_from(
    store: &Store,
    keys: &JobKeys,
    period: &str,
) -> anyhow::Result<Option<Vec<u8>>> {
    store
        .read_key(keys.job(), &JobKeys::checkpoint_rest(period))
        .await
}

pub use crate::store::keys::INDEXED;

/// Every run record of the job, newest period first, from the job's run index
/// (`lh:{job}:runs`) and the records, corrupt records kept aside and refused requests it names,
/// through the store (on either). A record that does not parse is listed as
/// [`RunStatus::Corrupt`] with its size, never an error: one bad record must not hide the
/// others.
pub async fn history(
    store: &Store,
    keys: &JobKeys,
    limit: usize,
) -> Result<Vec<RunRecord>, RecordError> {
    let periods = store
        .newest_runs(keys.job(), limit)
        .await
        .map_err(RecordError::Store)?;
    let mut out = Vec::with_capacity(periods.len());
    for chunk in periods.chunks(250) {
        let names: Vec<String> = chunk
            .iter()
            .flat_map(|p| {
                [
                    JobKeys::run_rest(p),
                    JobKeys::corrupt_rest(p),
                    JobKeys::refused_rest(p),
                ]
            })
            .collect();
        let raws = store
            .read_keys(keys.job(), &names)
            .await
            .map_err(RecordError::Store)?;
        for (period, trio) in chunk.iter().zip(raws.chunks(3)) {
            let (run, corrupt, refused) = (&trio[0], &trio[1], &trio[2]);
            if let Some(raw) = run {
                out.push(match serde_json::from_slice::<RunRecord>(raw) {
                    Ok(r) => r,
                    Err(e) => corrupt_entry(period, &keys.run(period), raw.len(), &e.to_string()),
                });
            }
            if let Some(raw) = corrupt {
                out.push(corrupt_entry(
                    period,
                    &keys.corrupt(period),
                    raw.len(),
                    "moved aside by a leader",
                ));
            }
            if let Some(raw) = refused {
                out.push(match serde_json::from_slice::<RunRecord>(raw) {
                    Ok(r) => r,
                    Err(e) => {
                        corrupt_entry(period, &keys.refused(period), raw.len(), &e.to_string())
                    }
                });
            }
        }
    }
    Ok(out)
}

/// Periods of every run record and corrupt record of the job, found by `SCAN` on the node of
/// the job's slot: what a leader adds to the run index once, for records written before the
/// index existed.
pub async fn unindexed(
    conn: &mut crate::store::Conn,
    keys: &JobKeys,
) -> redis::RedisResult<Vec<String>> {
    let mut periods = Vec::new();
    for (pattern, prefix) in [
        (keys.run_pattern(), keys.run("")),
        (keys.corrupt_pattern(), keys.corrupt("")),
    ] {
        for name in conn.scan_slot(&keys.lease(), &pattern).await? {
            periods.push(name[prefix.len()..].to_string());
        }
    }
    periods.sort();
    periods.dedup();
    Ok(periods)
}

/// The history's entry for an unreadable record of `period` at `key`.
fn corrupt_entry(period: &str, key: &str, size: usize, why: &str) -> RunRecord {
    RunRecord {
        attempt: 0,
        started_at: String::new(),
        updated_at: String::new(),
        finished_at: None,
        error: Some(format!(
            "the run record is not valid ({size} bytes at {key}): {why}"
        )),
        ..RunRecord::blank(period, String::new(), RunStatus::Corrupt, "")
    }
}
