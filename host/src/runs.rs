//! Run records: what happened to each period of a job, kept in Redis.
//!
//! One record per `(job, period)` at `lh:{job}:run:<period>` (JSON), written only through the
//! fence together with the run's checkpoint at `lh:{job}:ckpt:<period>`, in one script. A record
//! moves `running → done | failed`, or `running → waiting → running` while the job's inputs are
//! not ready. A `done` record is final: the period is never run again (I5).

use redis::AsyncCommands;
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use crate::keys::JobKeys;

/// Where a period's run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    /// Steps are being executed (or were, when the leader died: the next leader resumes).
    Running,
    /// The job said its inputs are not ready; the leader calls the same step again later.
    Waiting,
    /// The run completed. Final.
    Done,
    /// A step failed (the job reported failure, trapped, or ran out of time). Final in this
    /// version; `error` says why.
    Failed,
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
}

/// Reads the record of `period`; `Ok(None)` if it was never written. A record that does not
/// parse is an error naming the key.
pub async fn read<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> anyhow::Result<Option<RunRecord>> {
    let key = keys.run(period);
    let raw: Option<String> = redis::cmd("GET").arg(&key).query_async(conn).await?;
    raw.map(|r| {
        serde_json::from_str(&r).map_err(|e| anyhow::anyhow!("run record {key} is not valid: {e}"))
    })
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

/// Asks for a run of `period` (what `leasehold trigger` does). Returns false if it was already
/// requested and not yet taken up.
pub async fn request<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> redis::RedisResult<bool> {
    let added: i64 = conn.sadd(keys.requests(), period).await?;
    Ok(added == 1)
}

/// In one round trip: periods requested and not yet taken up, and periods whose run is open
/// (`running` or `waiting`).
pub async fn pending<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
) -> redis::RedisResult<(Vec<String>, Vec<String>)> {
    redis::pipe()
        .smembers(keys.requests())
        .smembers(keys.open_runs())
        .query_async(conn)
        .await
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
