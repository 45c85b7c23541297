//! What a leader reads every round ([`JobState`], one round trip), and the pause flag
//! operators set.

use std::collections::BTreeMap;

use redis::aio::ConnectionLike;

use super::requests::Request;
use crate::store::keys::JobKeys;

/// What a leader reads every round, in one round trip.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobState {
    /// Operator requests not yet cleared, by period.
    pub requested: BTreeMap<String, Request>,
    /// Periods whose run is open (`pending`, `running` or `waiting`).
    pub open: Vec<String>,
    /// Why the job is paused (who and when), if it is.
    pub paused: Option<String>,
    /// The start instant of the newest period accounted for (RFC 3339; older versions wrote a
    /// wall-clock time).
    pub cursor: Option<String>,
    /// The member that asks for the job (its preferred member, following it), if one does:
    /// its node id and the version it serves (see [`crate::coord::balance`]).
    pub wanted: Option<String>,
    /// Whether the job's run index is built (its marker is in it: records written before the
    /// index existed were indexed by a leader).
    pub indexed: bool,
}

/// Reads the job's [`JobState`] in one round trip (one pipeline of the job's keys).
pub async fn state<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
) -> redis::RedisResult<JobState> {
    crate::metrics::get().round_trip("job-state");
    let mut pipe = redis::pipe();
    for c in state_cmds(keys) {
        pipe.add_command(c);
    }
    let replies: Vec<redis::Value> = pipe.query_async(conn).await?;
    state_from(replies.into_iter().map(Ok).collect())
}

/// The commands that read a job's [`JobState`] (all of the job's slot), for a pipeline or a
/// [`crate::store::Batch`]; their replies, in order, read with [`state_from`].
pub fn state_cmds(keys: &JobKeys) -> [redis::Cmd; STATE_CMDS] {
    [
        redis::cmd("HGETALL").arg(keys.requests()).clone(),
        redis::cmd("SMEMBERS").arg(keys.open_runs()).clone(),
        redis::cmd("GET").arg(keys.paused()).clone(),
        redis::cmd("GET").arg(keys.cursor()).clone(),
        redis::cmd("GET").arg(keys.wanted()).clone(),
        redis::cmd("ZSCORE")
            .arg(keys.runs())
            .arg(super::INDEXED)
            .clone(),
    ]
}

/// The job's state as a read the heartbeat carries ([`crate::coord::heartbeat::Heartbeat::poll`]).
pub fn state_read(keys: &JobKeys) -> crate::coord::heartbeat::Read<JobState> {
    crate::coord::heartbeat::Read {
        slot_key: keys.lease(),
        cmds: state_cmds(keys).into(),
        decode: state_from,
    }
}

/// How many commands [`state_cmds`] makes.
pub const STATE_CMDS: usize = 6;

/// The [`JobState`] from the replies to [`state_cmds`], in order.
pub fn state_from(replies: Vec<redis::RedisResult<redis::Value>>) -> redis::RedisResult<JobState> {
    let mut it = replies.into_iter();
    let mut next = || {
        it.next().unwrap_or_else(|| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "missing reply",
            )))
        })
    };
    let requested: BTreeMap<String, String> = redis::from_redis_value(next()?)?;
    let open: Vec<String> = redis::from_redis_value(next()?)?;
    let paused: Option<String> = redis::from_redis_value(next()?)?;
    let cursor: Option<String> = redis::from_redis_value(next()?)?;
    let wanted: Option<String> = redis::from_redis_value(next()?)?;
    let indexed: Option<f64> = redis::from_redis_value(next()?)?;
    let indexed = indexed.is_some();
    Ok(JobState {
        requested: requested
            .into_iter()
            .map(|(period, v)| (period, Request::decode(&v)))
            .collect(),
        open,
        paused,
        cursor,
        wanted,
        indexed,
    })
}

/// Pauses the job (`reason` says who and when) or resumes it (`None`). Operator actions, like
/// requests, are not fenced: they are inputs to the leader, not results, and no leader writes
/// the flag.
pub async fn set_paused<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
    reason: Option<&str>,
) -> redis::RedisResult<()> {
    // The notice wakes the leader's runner (see `requests::put`).
    let mut pipe = redis::pipe();
    match reason {
        Some(r) => pipe.set(keys.paused(), r),
        None => pipe.del(keys.paused()),
    };
    pipe.ignore()
        .publish(keys.notice_channel(), "paused")
        .ignore()
        .query_async(conn)
        .await
}
