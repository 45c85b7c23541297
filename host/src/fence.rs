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
//! 3. otherwise raises the fence to the token if it is higher, and sets every key given (in
//!    *create* mode only if none of them exists yet: an idempotency key).
//!
//! The acquire script raises the fence when a term starts (see [`crate::lease`]), so once term
//! `t` has begun no write of an earlier term is accepted, even before `t` writes anything.
//! All keys of a write belong to one job (one hash slot), so the script works on Redis Cluster.

use std::fmt;
use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::keys::JobKeys;
use crate::term::{Term, mono_ms};

static FENCED_WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: lease, fence, keys to set..., keys to delete...
-- ARGV: owner, token, number of keys to set, create ('1': only if no key to set exists),
--       values... (one per key to set)
local token = tonumber(ARGV[2])
local fence_token = redis.call('HGET', KEYS[2], 'token')
local fence_holder = redis.call('HGET', KEYS[2], 'holder') or ''
if fence_token then
  local f = tonumber(fence_token)
  if token < f then
    return {0, 'stale', fence_token, fence_holder}
  end
  if token == f and fence_holder ~= ARGV[1] then
    return {0, 'other-holder', fence_token, fence_holder}
  end
end
local lease = redis.call('GET', KEYS[1])
if lease ~= ARGV[1] then
  return {0, 'not-leaseholder', fence_token or '', lease or ''}
end
if (not fence_token) or token > tonumber(fence_token) then
  redis.call('HSET', KEYS[2], 'token', ARGV[2], 'holder', ARGV[1])
end
local sets = tonumber(ARGV[3])
if ARGV[4] == '1' then
  for i = 1, sets do
    if redis.call('EXISTS', KEYS[i + 2]) == 1 then
      return {1, 'exists', '', ''}
    end
  end
end
for i = 1, #KEYS - 2 do
  if i <= sets then
    redis.call('SET', KEYS[i + 2], ARGV[i + 4])
  else
    redis.call('DEL', KEYS[i + 2])
  end
end
return {1, '', '', ''}
"#,
    )
});

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
        }
    }
}

/// A fenced write failed.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// The fence refused the write.
    #[error("{0}")]
    Refused(Refusal),
    /// Redis could not be asked.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
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
    write_and_delete(conn, keys, owner, token, writes, &[]).await
}

/// Sets every `(key, value)` pair and deletes every key of `deletes`, all atomically in one
/// script, fenced by the term `(owner, token)`. All keys must be this job's.
pub async fn write_and_delete<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    owner: &str,
    token: u64,
    writes: &[(String, &[u8])],
    deletes: &[String],
) -> Result<(), FenceError> {
    invoke(conn, keys, (owner, token), writes, deletes, false)
        .await
        .map(|_| ())
}

/// Runs the script; `Ok(false)` when `create` found a key to set already there (nothing was
/// written).
async fn invoke<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    (owner, token): (&str, u64),
    writes: &[(String, &[u8])],
    deletes: &[String],
    create: bool,
) -> Result<bool, FenceError> {
    let mut inv = FENCED_WRITE.key(keys.lease());
    inv.key(keys.fence())
        .arg(owner)
        .arg(token)
        .arg(writes.len())
        .arg(if create { "1" } else { "0" });
    for (key, value) in writes {
        inv.key(key).arg(*value);
    }
    for key in deletes {
        inv.key(key);
    }
    let (ok, kind, fence_token, holder): (i64, String, String, String) =
        inv.invoke_async(conn).await?;
    if ok == 1 {
        return Ok(kind != "exists");
    }
    let fence_token = fence_token.parse().unwrap_or(0);
    Err(FenceError::Refused(match kind.as_str() {
        "stale" => Refusal::Stale {
            token,
            fence_token,
            fence_holder: holder,
        },
        "other-holder" => Refusal::OtherHolder {
            token,
            fence_holder: holder,
        },
        _ => Refusal::NotLeaseholder {
            lease_holder: holder,
        },
    }))
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
}

/// One write of a term: the keys to set and to delete, atomically, and whether it only
/// creates (sets nothing if a key to set exists).
#[derive(Clone, Copy)]
struct TermWrite<'a> {
    sets: &'a [(String, &'a [u8])],
    deletes: &'a [String],
    create: bool,
}

/// The one way a term writes (runner and guest alike): refused locally once `term` has ended
/// (I3), abandoned if the term ends while waiting for Redis, and a refusal by the fence ends
/// the term at once. Emits a `fenced write` debug event with the send time and the term's
/// deadline on the monotonic clock and the outcome, for history checks; the job and node
/// come from the caller's `job` span (see [`crate::logging`]).
pub async fn write_in_term<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    term: &Term,
    sets: &[(String, &[u8])],
    deletes: &[String],
) -> Result<(), TermWriteError> {
    let write = TermWrite {
        sets,
        deletes,
        create: false,
    };
    term_write(conn, keys, term, write).await.map(|_| ())
}

/// [`write_in_term`] in create mode: sets `key` only if it does not exist. `Ok(false)`: it
/// existed, nothing was written.
pub async fn create_in_term<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    term: &Term,
    key: String,
    value: &[u8],
) -> Result<bool, TermWriteError> {
    let sets = [(key, value)];
    let write = TermWrite {
        sets: &sets,
        deletes: &[],
        create: true,
    };
    term_write(conn, keys, term, write).await
}

async fn term_write<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    term: &Term,
    TermWrite {
        sets: writes,
        deletes,
        create,
    }: TermWrite<'_>,
) -> Result<bool, TermWriteError> {
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
        let write = invoke(conn, keys, (term.owner(), token), writes, deletes, create);
        match term.bound(write).await {
            Some(Ok(applied)) => Ok(applied),
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
            Some(Err(FenceError::Redis(e))) => Err(TermWriteError::Redis(e)),
            None => Err(TermWriteError::Ended),
        }
    };
    let result = match &outcome {
        Ok(true) => "accepted",
        Ok(false) => "exists",
        Err(TermWriteError::Ended) => "ended",
        Err(TermWriteError::Refused(_)) => "refused",
        Err(TermWriteError::Redis(_)) => "unavailable",
    };
    tracing::debug!(
        token,
        key = first_key,
        keys = writes.len() + deletes.len(),
        sent_ms,
        deadline_ms,
        result,
        "fenced write"
    );
    outcome
}
