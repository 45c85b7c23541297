//! The checks every term's and every task's script makes in Redis, as Lua to prepend to a
//! script, and how their refusals read ([`Refusal`]): shared by the fenced write
//! ([`crate::coord::fence`]) and the task scripts ([`crate::exec::tasks`]), which depend on this module and
//! not on each other's checks.
//!
//! * `term_check` — the writer's term is the newest (I1) and still holds the lease (I2);
//! * `claim_holds` — a task's worker still holds its claim on the task's stream entry;
//! * `run_ended` — a task's run is over (done, failed, or run again): I12.

use std::fmt;

use crate::coord::quota::QuotaUsage;

/// The consumer group of every job's task stream.
pub const GROUP: &str = "workers";

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

/// Lua, for every script a term writes with: `term_check(lease key, fence key, owner, token)`
/// returns the refusal reply (`{0, kind, fence token, holder}`) when the fence holds a higher
/// token, or the same token of another holder (I1), or the lease is not the owner's (I2); `nil`
/// and the fence's token when the term may write. Nothing is written.
pub(crate) const TERM_CHECK: &str = r#"
local function term_check(lease_key, fence_key, owner, token_s)
  local token = tonumber(token_s)
  local fence_token = redis.call('HGET', fence_key, 'token')
  local fence_holder = redis.call('HGET', fence_key, 'holder') or ''
  if fence_token then
    local f = tonumber(fence_token)
    if token < f then
      return {0, 'stale', fence_token, fence_holder}
    end
    if token == f and fence_holder ~= owner then
      return {0, 'other-holder', fence_token, fence_holder}
    end
  end
  local lease = redis.call('GET', lease_key)
  if lease ~= owner then
    return {0, 'not-leaseholder', fence_token or '', lease or ''}
  end
  return nil, fence_token
end
"#;

/// Lua, for every script a task's worker writes with: `claim_holds(stream, group, entry,
/// consumer, deliveries)` is true while the worker's claim on the task's stream entry is still
/// its own: the entry is pending for that consumer, delivered exactly as many times as when it
/// was claimed (a worker that took it over since has claimed it once more).
pub(crate) const CLAIM_CHECK: &str = r#"
local function claim_holds(stream, group, entry, consumer, deliveries)
  local p = redis.call('XPENDING', stream, group, entry, entry, 1)
  return p[1] ~= nil and p[1][2] == consumer and tonumber(p[1][4]) == tonumber(deliveries)
end
"#;

/// Lua, for every script that acts on a task: `run_ended(rec, run)` is true when the task's
/// record `rec` (decoded, `nil` when absent) says its run is over: the record is gone (a run
/// that ends deletes its tasks' records) or belongs to another attempt of the run than `run`
/// (a re-run submitted the task anew; `'0'` and records without an attempt match any).
pub(crate) const RUN_ENDED: &str = r#"
local function run_ended(rec, run)
  if not rec then
    return true
  end
  return rec.run ~= nil and run ~= '0' and rec.run ~= '0' and tostring(rec.run) ~= run
end
"#;

/// Why the fence refused a write. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A newer term has begun: the fence holds a higher token.
    Stale {
        /// The writer's token.
        token: u64,
        /// The fence's token.
        fence_token: u64,
        /// The fence's holder.
        fence_holder: String,
    },
    /// The fence holds the same token from another holder (a counter that went backwards).
    OtherHolder {
        /// The token both claim.
        token: u64,
        /// The holder the fence knows for it.
        fence_holder: String,
    },
    /// The writer's term no longer holds the lease in Redis.
    NotLeaseholder {
        /// The lease's current owner, empty when nobody holds it.
        lease_holder: String,
    },
    /// A task's worker no longer holds its claim on the task: another worker took it over
    /// (this one stopped answering), or the task was requeued or finished meanwhile.
    ClaimLost {
        /// The worker (its consumer name).
        consumer: String,
    },
    /// The task's run is over: it is done or failed (its tasks ended with it), or the period
    /// was run again (the task belongs to an earlier attempt).
    RunEnded {
        /// The task id.
        task: String,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Stale {
                token,
                fence_token,
                fence_holder,
            } => write!(
                f,
                "fenced: token {token} is older than token {fence_token} of {fence_holder}"
            ),
            Refusal::OtherHolder {
                token,
                fence_holder,
            } => write!(f, "fenced: token {token} belongs to {fence_holder}"),
            Refusal::NotLeaseholder { lease_holder } if lease_holder.is_empty() => {
                write!(f, "fenced: the lease has expired or was released")
            }
            Refusal::NotLeaseholder { lease_holder } => {
                write!(f, "fenced: the lease is held by {lease_holder}")
            }
            Refusal::ClaimLost { consumer } => write!(
                f,
                "fenced: worker {consumer} no longer holds its claim on the task (another worker took it over, or the task was queued again)"
            ),
            Refusal::RunEnded { task } => write!(
                f,
                "fenced: task {task}'s run has ended (done, failed, or run again as a new attempt); a task of an ended run changes nothing"
            ),
        }
    }
}

/// A fenced write failed.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// The fence refused the write.
    #[error("{0}")]
    Refused(Refusal),
    /// The write would take the job past its storage quota; nothing was written.
    #[error("{0}")]
    Quota(QuotaUsage),
    /// Redis could not be asked.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// A refusal reply of [`TERM_CHECK`] (or a claim check) as a [`Refusal`]: `kind`, the writer's
/// `token`, and the reply's fence token and holder (or consumer).
pub(crate) fn refusal(kind: &str, token: u64, fence_token: &str, holder: String) -> Refusal {
    let fence_token = fence_token.parse().unwrap_or(0);
    match kind {
        "stale" => Refusal::Stale {
            token,
            fence_token,
            fence_holder: holder,
        },
        "other-holder" => Refusal::OtherHolder {
            token,
            fence_holder: holder,
        },
        "claim-lost" => Refusal::ClaimLost { consumer: holder },
        "run-ended" => Refusal::RunEnded { task: holder },
        _ => Refusal::NotLeaseholder {
            lease_holder: holder,
        },
    }
}
