//! Per-job storage quotas: what a job keeps in its store, counted where it writes.
//!
//! With `maxmemory-policy noeviction` required (see [`crate::deployment`]), a job that writes
//! without bound would fill Redis, and then every job's writes, run records and lease
//! acquisitions would fail: one buggy job would stop the cluster. So every guest write
//! (`store.write`, `store.create`) is counted in the same fenced-write script that applies it
//! ([`crate::fence`]): the hash `lh:{job}:usage` keeps the job's keys and bytes (the length of
//! every data key's full Redis key, namespace prefix included, plus its value's), and a write that would take either past the job's quota is
//! refused, atomically, with nothing written ([`QuotaUsage`], the WIT's `quota-exceeded`).
//!
//! Guarantees: the count moves only with the writes Redis applies, in the same script, so a
//! crash or a retry cannot make it drift from the data the quota has counted. A write that does not add keys or bytes
//! (overwriting with a value no longer than the old one) is never refused, so a job over a
//! lowered quota can still rewrite what it has.
//!
//! Non-guarantees: data keys written before the quota existed (host versions before world
//! 0.3.0) are not counted, and rewriting one counts only the change in its length, so a
//! shorter value can lower the count below what the job keeps (the count errs low, never
//! high); keys an operator deletes by hand are not subtracted. The quota
//! is on the job's data, not on its run records and checkpoints, which the host bounds itself
//! (one record per period, a checkpoint at most `max-write-bytes`).

use redis::aio::ConnectionLike;

use crate::keys::JobKeys;

/// A job's storage quota, as the host capped it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Most keys the job may keep.
    pub keys: u64,
    /// Most bytes (keys and values) the job may keep.
    pub bytes: u64,
}

/// What a job would keep after a refused write, and its quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "storage quota exceeded: the write would keep {keys} keys and {} (the quota is {max_keys} keys and {})",
    crate::units::show_size(*.bytes),
    crate::units::show_size(*.max_bytes)
)]
pub struct QuotaUsage {
    /// Keys the job would keep.
    pub keys: u64,
    /// Bytes the job would keep.
    pub bytes: u64,
    /// The quota of keys.
    pub max_keys: u64,
    /// The quota of bytes.
    pub max_bytes: u64,
}

/// What a job keeps now: `(keys, bytes)`, as counted by its writes.
pub async fn usage<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
) -> Result<(u64, u64), redis::RedisError> {
    let (k, b): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(keys.usage())
        .arg("keys")
        .arg("bytes")
        .query_async(conn)
        .await?;
    Ok((k.unwrap_or(0), b.unwrap_or(0)))
}
