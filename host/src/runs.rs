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
//! ```
//!
//! A `done` record is final: the period is never run again (I5). `failed`, `missed` and
//! `skipped` are final for the scheduler; an operator's trigger runs the period again as a new
//! attempt. The job's *cursor* (`lh:{job}:cursor`) is the start instant (RFC 3339, UTC) of the
//! newest period a leader has accounted for (given a record); it is written through the fence
//! with those records, so no period is accounted twice or skipped without a record.

use redis::AsyncCommands;
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use crate::keys::JobKeys;

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
}

impl RunStatus {
    /// Whether the scheduler is done with the period (an operator may still re-run it, except
    /// when `done`).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Done | RunStatus::Failed | RunStatus::Missed | RunStatus::Skipped
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
        }
    }
}

/// One failed attempt, kept in the record's `attempts` list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedAttempt {
    /// The attempt number.
    pub attempt: u32,
    /// The step that failed.
    pub step: u32,
    /// The class of the failure.
    pub failure: FailureKind,
    /// Why, in words.
    pub error: String,
    /// When (RFC 3339, UTC).
    pub at: String,
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
    /// The run was started by a component version this host does not have; a run never mixes
    /// versions.
    VersionChanged,
    /// The run took longer than the job's maximum run time.
    RunTimeout,
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
    /// The class of the failure, when `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureKind>,
    /// When a `pending` retry may start (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
    /// The failed attempts before this one (the newest 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<FailedAttempt>,
}

impl RunRecord {
    /// A new record for `period`, `status` now.
    pub fn new(period: &crate::spec::Period, status: RunStatus, now: &str) -> Self {
        RunRecord {
            period: period.id.clone(),
            scheduled_at: period.fire.to_rfc3339(),
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
            failure: None,
            retry_at: None,
            attempts: Vec::new(),
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

/// Reads the checkpoint of `period`'s run.
pub async fn read_checkpoint<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> redis::RedisResult<Option<Vec<u8>>> {
    redis::cmd("GET")
        .arg(keys.checkpoint(period))
        .query_async(conn)
        .await
}

/// What a trigger did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Triggered {
    /// A run of the period was requested.
    Requested,
    /// A run was already requested and not yet taken up.
    AlreadyRequested,
    /// The period is done; it is never run again.
    AlreadyDone(Box<RunRecord>),
    /// The period's run is open (pending, running, waiting); it goes on (the request makes sure
    /// the leader looks at it).
    AlreadyOpen(Box<RunRecord>),
    /// The period had failed, been missed or skipped: a new attempt was requested.
    Rerun(Box<RunRecord>),
}

impl Triggered {
    /// One line for people.
    pub fn describe(&self, job: &str, period: &str) -> String {
        match self {
            Triggered::Requested => format!("requested a run of {job} for period {period}"),
            Triggered::AlreadyRequested => {
                format!("a run of {job} for period {period} was already requested")
            }
            Triggered::AlreadyDone(r) => format!(
                "{job} period {period} is already done (token {}, node {}); not run again",
                r.token, r.node
            ),
            Triggered::AlreadyOpen(r) => format!(
                "{job} period {period} is already {} (step {}, attempt {}); the leader carries it on",
                r.status.as_str(),
                r.step,
                r.attempt
            ),
            Triggered::Rerun(r) => format!(
                "requested a new run of {job} for period {period}, which was {}{}",
                r.status.as_str(),
                r.error
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ),
        }
    }

    /// A short status word for the HTTP API.
    pub fn word(&self) -> &'static str {
        match self {
            Triggered::Requested => "requested",
            Triggered::AlreadyRequested => "already-requested",
            Triggered::AlreadyDone(_) => "already-done",
            Triggered::AlreadyOpen(_) => "already-open",
            Triggered::Rerun(_) => "rerun-requested",
        }
    }
}

/// Asks for a run of `period` now (CLI and HTTP), deduplicated with the schedule: a done
/// period is never run again, an open run is left alone, and a failed, missed or skipped
/// period gets a new attempt. The caller validates the period against the schedule when it
/// knows it.
pub async fn trigger<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> anyhow::Result<Triggered> {
    let existing = read(conn, keys, period).await?;
    Ok(match existing {
        Some(r) if r.status == RunStatus::Done => Triggered::AlreadyDone(Box::new(r)),
        Some(r) if !r.status.is_final() => {
            // Also a request: the leader finds the run even if its open mark was lost.
            request(conn, keys, period).await?;
            Triggered::AlreadyOpen(Box::new(r))
        }
        Some(r) => {
            request(conn, keys, period).await?;
            Triggered::Rerun(Box::new(r))
        }
        None if request(conn, keys, period).await? => Triggered::Requested,
        None => Triggered::AlreadyRequested,
    })
}

/// Checks the shape of a period id (`YYYY-MM-DD` or `YYYY-MM-DDTHH:MM:SS`).
pub fn validate_period_shape(period: &str) -> anyhow::Result<()> {
    let ok = chrono::NaiveDate::parse_from_str(period, "%Y-%m-%d").is_ok()
        || chrono::NaiveDateTime::parse_from_str(period, "%Y-%m-%dT%H:%M:%S").is_ok();
    anyhow::ensure!(
        ok,
        "period {period:?} is not a period id (YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS)"
    );
    Ok(())
}

/// Asks for a run of `period`. Returns false if it was already requested and not yet taken up.
pub async fn request<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> redis::RedisResult<bool> {
    let added: i64 = conn.sadd(keys.requests(), period).await?;
    Ok(added == 1)
}

/// What a leader reads every round, in one round trip.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobState {
    /// Periods requested by operators and not yet taken up.
    pub requested: Vec<String>,
    /// Periods whose run is open (`pending`, `running` or `waiting`).
    pub open: Vec<String>,
    /// Why the job is paused (who and when), if it is.
    pub paused: Option<String>,
    /// The start instant of the newest period accounted for (RFC 3339; older versions wrote a
    /// wall-clock time).
    pub cursor: Option<String>,
}

/// Reads the job's [`JobState`] in one round trip.
pub async fn state<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
) -> redis::RedisResult<JobState> {
    let (requested, open, paused, cursor) = redis::pipe()
        .smembers(keys.requests())
        .smembers(keys.open_runs())
        .get(keys.paused())
        .get(keys.cursor())
        .query_async(conn)
        .await?;
    Ok(JobState {
        requested,
        open,
        paused,
        cursor,
    })
}

/// Pauses the job (`reason` says who and when) or resumes it (`None`). Operator actions, like
/// requests, are not fenced: they are inputs to the leader, not results.
pub async fn set_paused<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
    reason: Option<&str>,
) -> redis::RedisResult<()> {
    match reason {
        Some(r) => conn.set(keys.paused(), r).await,
        None => conn.del(keys.paused()).await,
    }
}

/// Every run record of the job, newest period first (one `SCAN` of the job's run keys).
pub async fn history<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
    limit: usize,
) -> Result<Vec<RunRecord>, RecordError> {
    let mut names: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(keys.run_pattern())
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        names.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    names.sort();
    names.dedup();
    names.reverse();
    names.truncate(limit);
    let mut out = Vec::with_capacity(names.len());
    for chunk in names.chunks(500) {
        let raws: Vec<Option<String>> = redis::cmd("MGET").arg(chunk).query_async(conn).await?;
        for (name, raw) in chunk.iter().zip(raws) {
            if let Some(raw) = raw {
                out.push(
                    serde_json::from_str(&raw).map_err(|source| RecordError::Corrupt {
                        key: name.clone(),
                        source,
                    })?,
                );
            }
        }
    }
    Ok(out)
}

/// Notes that `period`'s run is open (`open == true`) or finished. The index only tells a
/// leader which records to look at; the records themselves decide, so a stale entry costs one
/// read and is then removed.
pub async fn mark_open<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
    open: bool,
) -> redis::RedisResult<()> {
    let _: i64 = if open {
        conn.sadd(keys.open_runs(), period).await?
    } else {
        conn.srem(keys.open_runs(), period).await?
    };
    Ok(())
}

/// Marks a request as taken up.
pub async fn clear_request<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> redis::RedisResult<()> {
    let _: i64 = conn.srem(keys.requests(), period).await?;
    Ok(())
}
