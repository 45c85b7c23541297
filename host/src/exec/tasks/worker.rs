//! What a worker sends about the tasks it takes: [`fetch`] (a new task, or one whose claim
//! lapsed), [`payload`], [`refresh`] (its claim, every heartbeat), [`complete`] (the attempt's
//! outcome) and [`give_back`] (as its host stops). Each is one script of [`super::scripts`].

use redis::Value;
use redis::aio::ConnectionLike;

use super::scripts::{COMPLETE, DROP_STALE, FETCH, GIVE_BACK, REFRESH};
use super::*;

/// Takes up to `count` tasks for `consumer`: new ones first, else ones whose claim lapsed
/// (idle for `lapse`).
pub async fn fetch<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    consumer: &str,
    lapse: Duration,
    count: usize,
) -> redis::RedisResult<Vec<Fetched>> {
    // Entry id, its fields, deliveries, reclaimed (1 or 0), Redis's clock (ms).
    type Row = (String, Vec<(String, String)>, u64, i64, u64);
    let rows: Vec<Row> = FETCH
        .key(keys.tasks())
        .arg(GROUP)
        .arg(consumer)
        .arg(lapse.as_millis() as u64)
        .arg(count)
        .invoke_async(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(entry, fields, deliveries, reclaimed, now)| {
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            Fetched {
                claim: Claim {
                    entry,
                    consumer: consumer.to_string(),
                    deliveries,
                    period: field("period"),
                    id: field("id"),
                    run: field("run").parse().unwrap_or(0),
                },
                period: field("period"),
                id: field("id"),
                attempt: field("attempt").parse().unwrap_or(1),
                token: field("token").parse().unwrap_or(0),
                owner: field("owner"),
                component: field("component"),
                scheduled_at: field("scheduled"),
                reclaimed: reclaimed == 1,
                // Not before its back-off ends (`after`, in Redis's clock).
                wait: Duration::from_millis(
                    field("after")
                        .parse::<u64>()
                        .unwrap_or(0)
                        .saturating_sub(now),
                ),
            }
        })
        .collect())
}

/// The payload of `task`, if the entry is still the task's current attempt (`None`: the entry
/// is stale and was dropped, see [`DROP_STALE`]).
pub async fn payload<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    task: &Fetched,
) -> redis::RedisResult<Option<Vec<u8>>> {
    let dropped: i64 = DROP_STALE
        .key(keys.tasks())
        .key(keys.task_runs(&task.period))
        .arg(GROUP)
        .arg(&task.claim.entry)
        .arg(&task.id)
        .invoke_async(conn)
        .await?;
    if dropped == 1 {
        return Ok(None);
    }
    redis::cmd("HGET")
        .arg(keys.task_data(&task.period))
        .arg(format!("p:{}", task.id))
        .query_async(conn)
        .await
}

/// What [`refresh`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The claim is this worker's: its idle time was reset.
    Yes,
    /// Another worker took the task over, or it was requeued or finished meanwhile.
    TakenOver,
    /// The task's run is over (done, failed or run again): the task may change nothing.
    RunEnded,
}

/// Keeps `claim` fresh (resets its idle time) while it is this worker's and its run is open.
pub async fn refresh<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    claim: &Claim,
) -> redis::RedisResult<Held> {
    let held: i64 = REFRESH
        .key(keys.tasks())
        .key(keys.task_runs(&claim.period))
        .arg(GROUP)
        .arg(&claim.entry)
        .arg(&claim.consumer)
        .arg(claim.deliveries)
        .arg(&claim.id)
        .arg(claim.run)
        .invoke_async(conn)
        .await?;
    Ok(match held {
        1 => Held::Yes,
        2 => Held::RunEnded,
        _ => Held::TakenOver,
    })
}

/// Records `attempt` of `task` as its submitting term and under the worker's claim (see the
/// module doc); `attempts`: how many attempts the task is allowed.
pub async fn complete<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    task: &Fetched,
    attempt: &Attempt,
    attempts: u32,
    delay: Duration,
    quota_bytes: u64,
) -> redis::RedisResult<Completed> {
    let (word, value): (&str, &[u8]) = match attempt {
        Attempt::Output(o) => ("ok", o),
        Attempt::Failed(e) => ("fail", e.as_bytes()),
        Attempt::NotReady(e) => ("not-ready", e.as_bytes()),
    };
    let v: Value = COMPLETE
        .key(keys.lease())
        .key(keys.fence())
        .key(keys.tasks())
        .key(keys.task_runs(&task.period))
        .key(keys.task_data(&task.period))
        .key(keys.usage())
        .arg(&task.owner)
        .arg(task.token)
        .arg(GROUP)
        .arg(&task.claim.entry)
        .arg(&task.claim.consumer)
        .arg(task.claim.deliveries)
        .arg(&task.id)
        .arg(word)
        .arg(value)
        .arg(attempts)
        .arg(&task.period)
        .arg(keys.work_channel())
        .arg(keys.notice_channel())
        .arg(task.claim.run)
        .arg(delay.as_millis() as u64)
        .arg(quota_bytes)
        .invoke_async(conn)
        .await?;
    Ok(match reply(task.token, v) {
        Ok((kind, _)) => match kind.as_str() {
            "done" => Completed::Done,
            "retried" => Completed::Retried,
            "waiting" => Completed::Waiting,
            _ => Completed::Failed,
        },
        Err(FenceError::Refused(r)) => Completed::Refused(r),
        Err(FenceError::Redis(e)) => return Err(e),
        Err(FenceError::Quota(_)) => unreachable!("task results are not counted against a quota"),
    })
}

/// Gives `claim`'s task back (its worker stops): another worker takes it at its next fetch
/// instead of after the claim's lapse ([`GIVE_BACK`]). Returns false when the claim was not
/// this worker's any more.
pub async fn give_back<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    claim: &Claim,
) -> redis::RedisResult<bool> {
    let given: i64 = GIVE_BACK
        .key(keys.tasks())
        .arg(GROUP)
        .arg(&claim.entry)
        .arg(&claim.consumer)
        .arg(claim.deliveries)
        // As if delivered a day ago (an idle time beyond Redis's clock would read as none).
        .arg(86_400_000u64)
        .arg(keys.work_channel())
        .invoke_async(conn)
        .await?;
    Ok(given == 1)
}
