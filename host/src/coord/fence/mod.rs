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
//!    ([`crate::coord::quota`]; a key it deletes comes off the count); and sets every key given (in
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
//! The acquire script raises the fence when a term starts (see [`crate::coord::lease`]), so once term
//! `t` has begun no write of an earlier term is accepted, even before `t` writes anything.
//! All keys of a write belong to one job (one hash slot), so the script works on Redis Cluster.

use redis::aio::ConnectionLike;

mod script;
#[doc(hidden)]
pub mod unchecked;

use crate::coord::checks::refusal;
pub use crate::coord::checks::{FenceError, Refusal};
use crate::coord::quota::{Quota, QuotaUsage};
use crate::coord::term::{Term, mono_ms};
use crate::coord::term_store::{Store, TermStore as _, Wrote};
use crate::store::Conn;
use crate::store::keys::JobKeys;

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
    pub claim: Option<&'a crate::coord::checks::Claim>,
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

/// [`unchecked::invoke`], with `WAIT count timeout` sent right behind the script in one pipeline on one
/// connection, so the replicas it counts are those that acknowledged this very write (a
/// `WAIT` sent on its own could go on a connection that reconnected after the write, where it
/// waits for nothing and answers at once). Returns the write's outcome and, when it was
/// applied, how many replicas acknowledged it.
async fn invoke_replicated(
    conn: &mut Conn,
    keys: &JobKeys,
    (owner, token): (&str, u64),
    write: &TermWrite<'_>,
    r: crate::coord::term::Replicas,
) -> Result<(Written, i64), FenceError> {
    let (script_keys, args) = script_call(keys, (owner, token), write);
    let mut batch = crate::store::Batch::new();
    let w = batch.script(&script::FENCED_WRITE, &script_keys, args);
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
pub(super) fn script_call(
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
    a.push(text(&crate::coord::checks::GROUP));
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
pub(super) fn answer(
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
    /// The store could not be asked (Redis, or etcd).
    #[error("store: {0}")]
    Store(anyhow::Error),
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
/// Says what was written: whether a `create` created its key, and the job's storage after a
/// write counted against its quota (a guest's `store` writes).
pub async fn term_write(
    store: &Store,
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
        let applied = match store {
            Store::Redis(redis) => {
                term.bound(redis_write(redis.conn(), keys, term, &write))
                    .await
            }
            // (The etcd side's future is boxed inside `Store`.)
            Store::Etcd(_) => term.bound(store_write(store, keys, term, &write)).await,
        };
        match applied {
            Some(Err(TermWriteError::Refused(refusal))) => {
                tracing::warn!(
                    token,
                    key = first_key,
                    "write refused: {refusal}; stepping down"
                );
                term.end();
                crate::metrics::get().fence_refused(keys.job());
                Err(TermWriteError::Refused(refusal))
            }
            Some(outcome) => outcome,
            None => Err(TermWriteError::Ended),
        }
    };
    let result = match &outcome {
        Ok(w) if w.created => "accepted",
        Ok(_) => "exists",
        Err(TermWriteError::Ended) => "ended",
        Err(TermWriteError::Refused(_)) => "refused",
        Err(TermWriteError::Store(_)) => "unavailable",
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

/// `write` as `term` on Redis: the fenced-write script over the host's connection, with `WAIT`
/// behind it when the term requires replicas.
async fn redis_write(
    conn: &Conn,
    keys: &JobKeys,
    term: &Term,
    write: &TermWrite<'_>,
) -> Result<Written, TermWriteError> {
    let term_id = (term.owner(), term.token());
    let mut conn = conn.clone();
    let replicated = match term.replicas() {
        None => unchecked::invoke(&mut conn, keys, term_id, write)
            .await
            .map(|w| (w, None)),
        Some(r) => invoke_replicated(&mut conn, keys, term_id, write, r)
            .await
            .map(|(w, acked)| (w, Some((r, acked)))),
    };
    match replicated {
        Ok((_, Some((r, acked)))) if acked < i64::from(r.count) => {
            Err(TermWriteError::NotReplicated {
                acked: acked.max(0) as u32,
                wanted: r.count,
                timeout: r.timeout,
            })
        }
        Ok((applied, _)) => Ok(applied),
        Err(FenceError::Refused(refusal)) => Err(TermWriteError::Refused(refusal)),
        Err(FenceError::Quota(usage)) => Err(TermWriteError::QuotaExceeded(usage)),
        Err(FenceError::Redis(e)) => Err(TermWriteError::Store(e.into())),
    }
}

/// `write` as `term` through the store's seam
/// ([`crate::coord::term_store::TermStore::write_all`]; etcd): a refusal names the job's holder
/// as the store's answer found it.
async fn store_write(
    store: &Store,
    keys: &JobKeys,
    term: &Term,
    write: &TermWrite<'_>,
) -> Result<Written, TermWriteError> {
    let on = term.in_store(keys.job());
    match store.write_all(&on, write).await {
        Ok(Wrote::Applied(w)) => Ok(w),
        Ok(Wrote::Refused(refusal)) => Err(TermWriteError::Refused(refusal)),
        Ok(Wrote::Quota(keys_kept, bytes_kept)) => {
            let q = write.quota.unwrap_or(Quota {
                keys: u64::MAX,
                bytes: u64::MAX,
            });
            Err(TermWriteError::QuotaExceeded(QuotaUsage {
                keys: keys_kept,
                bytes: bytes_kept,
                max_keys: q.keys,
                max_bytes: q.bytes,
            }))
        }
        Err(e) => Err(TermWriteError::Store(e)),
    }
}
