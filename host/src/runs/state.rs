//! What a leader reads every round ([`JobState`], one round trip), and the pause flag
//! operators set.

use std::collections::BTreeMap;

use redis::aio::ConnectionLike;

use super::requests::Request;
use crate::keys::JobKeys;

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
    /// The member that asks for the job (its preferred member, following it), if one does.
    pub wanted: Option<String>,
}

/// Reads the job's [`JobState`] in one round trip.
pub async fn state<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &JobKeys,
) -> redis::RedisResult<JobState> {
    crate::metrics::get().round_trip("job-state");
    let (requested, open, paused, cursor, wanted): (BTreeMap<String, String>, _, _, _, _) =
        redis::pipe()
            .hgetall(keys.requests())
            .smembers(keys.open_runs())
            .get(keys.paused())
            .get(keys.cursor())
            .get(keys.wanted())
            .query_async(conn)
            .await?;
    Ok(JobState {
        requested: requested
            .into_iter()
            .map(|(period, v)| (period, Request::decode(&v)))
            .collect(),
        open,
        paused,
        cursor,
        wanted,
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
