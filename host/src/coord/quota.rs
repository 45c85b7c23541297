//! Per-job storage quotas: what a job keeps in its store, counted where it writes.
//!
//! With `maxmemory-policy noeviction` required (see [`crate::store::deployment`]), a job that writes
//! without bound would fill Redis, and then every job's writes, run records and lease
//! acquisitions would fail: one buggy job would stop the cluster. So every guest write
//! (`store.write`, `store.create`) is counted in the same fenced-write script that applies it
//! ([`crate::coord::fence`]): the hash `lh:{job}:usage` keeps the job's keys and bytes (the length of
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
//! high); keys an operator deletes by hand are not subtracted — delete them with [`purge`]
//! (`leasehold purge JOB --prefix P`), which subtracts exactly what it deletes, or put the
//! count right with [`recount`] (`leasehold purge JOB --recount`). The quota
//! is on the job's data, not on its run records and checkpoints, which the host bounds itself
//! (one record per period, a checkpoint at most `max-write-bytes`).
//!
//! Fan-out tasks count too, in bytes (no keys): a submission's ids and payloads, and each
//! task's id and output, are added by the task scripts ([`crate::exec::tasks`]) and kept in
//! the run's task hash (`n:bytes`), and the fenced write that ends the run takes that sum off
//! again. A submission that would take the job past its quota of bytes adds nothing; an output
//! that would fails its task. A recount counts data keys only, so it drops the bytes of runs
//! still open (the count errs low).

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::store::keys::JobKeys;

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

/// Keys one [`purge`] script looks at per call (one `SCAN` step): each call is atomic and
/// short, so the job's leader and every other client are held up at most this long.
const PURGE_SCAN: u32 = 1000;

static PURGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: the job's usage hash.  ARGV: SCAN cursor, MATCH pattern, COUNT.
-- Deletes the matching keys of one SCAN step and subtracts each from the usage count (its full
-- key's length and its value's), in one script: a fenced write of the job sees either the key
-- and its count, or neither. Returns the next cursor, keys and bytes deleted.
local r = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
local keys, bytes = 0, 0
for _, k in ipairs(r[2]) do
  local n = redis.call('STRLEN', k)
  if redis.call('DEL', k) == 1 then
    keys = keys + 1
    bytes = bytes + #k + n
  end
end
if keys > 0 then
  local uk = tonumber(redis.call('HGET', KEYS[1], 'keys') or '0') - keys
  local ub = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0') - bytes
  redis.call('HSET', KEYS[1], 'keys', string.format('%.0f', math.max(uk, 0)),
    'bytes', string.format('%.0f', math.max(ub, 0)))
end
return {r[1], keys, bytes}
"#,
    )
});

static RECOUNT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: the job's usage hash.  ARGV: MATCH pattern of the job's data keys, COUNT.
-- Counts every data key of the job (its full key's length and its value's) and sets the usage
-- to the count, in one script, so no fenced write lands between the count and the set. Scans
-- the whole keyspace of the node that holds the job: Redis serves nothing else meanwhile.
local cursor, keys, bytes = '0', 0, 0
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', ARGV[2])
  cursor = r[1]
  for _, k in ipairs(r[2]) do
    keys = keys + 1
    bytes = bytes + #k + redis.call('STRLEN', k)
  end
until cursor == '0'
redis.call('HSET', KEYS[1], 'keys', string.format('%.0f', keys), 'bytes',
  string.format('%.0f', bytes))
return {keys, bytes}
"#,
    )
});

/// A `SCAN` pattern matching `prefix` literally (glob characters escaped).
fn literal_pattern(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

/// What [`purge`] deleted: keys and their bytes (as the quota counts them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    /// Keys deleted.
    pub keys: u64,
    /// Their bytes (full keys and values).
    pub bytes: u64,
}

/// Deletes every data key of the job whose key (as the guest names it) starts with `prefix`,
/// subtracting each from the job's usage as it goes (in short atomic steps of
/// [`PURGE_SCAN`] keys: see the script). An operator's write, not a term's: like `trigger`,
/// it is not fenced; a run writing the same keys meanwhile may write some again.
pub async fn purge<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    prefix: &str,
) -> Result<Purged, redis::RedisError> {
    let pattern = literal_pattern(&keys.data(prefix));
    let mut cursor = "0".to_string();
    let mut purged = Purged::default();
    loop {
        let (next, k, b): (String, u64, u64) = PURGE
            .key(keys.usage())
            .arg(&cursor)
            .arg(&pattern)
            .arg(PURGE_SCAN)
            .invoke_async(conn)
            .await?;
        purged.keys += k;
        purged.bytes += b;
        if next == "0" {
            return Ok(purged);
        }
        cursor = next;
    }
}

/// Counts every data key the job keeps and sets its usage to that: for a count that no longer
/// matches the data (keys deleted by hand, or written before quotas were counted). One script:
/// exact, but it scans the keyspace of the job's Redis node at once.
pub async fn recount<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
) -> Result<(u64, u64), redis::RedisError> {
    RECOUNT
        .key(keys.usage())
        .arg(literal_pattern(&keys.data("")))
        .arg(PURGE_SCAN)
        .invoke_async(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::literal_pattern;

    #[test]
    fn prefixes_match_literally() {
        assert_eq!(literal_pattern("lh:{j}:data:a/"), "lh:{j}:data:a/*");
        assert_eq!(literal_pattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\*");
    }
}
