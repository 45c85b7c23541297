//! What the runner reads of a run's tasks: their progress, outputs and first failure. Plain
//! reads: they change nothing, so they need no term.

use redis::aio::ConnectionLike;

use super::*;

/// How far `period`'s tasks are.
pub async fn progress<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> redis::RedisResult<Progress> {
    let (s, f, x): (Option<u32>, Option<u32>, Option<u32>) = redis::cmd("HMGET")
        .arg(keys.task_runs(period))
        .arg("n:submitted")
        .arg("n:finished")
        .arg("n:failed")
        .query_async(conn)
        .await?;
    Ok(Progress {
        submitted: s.unwrap_or(0),
        finished: f.unwrap_or(0),
        failed: x.unwrap_or(0),
    })
}

/// The output of task `id` of `period`'s run, once it is done.
pub async fn output<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
    id: &str,
) -> redis::RedisResult<Option<Vec<u8>>> {
    redis::cmd("HGET")
        .arg(keys.task_data(period))
        .arg(format!("o:{id}"))
        .query_async(conn)
        .await
}

/// The first (by id) task of `period`'s run that failed on every attempt: its id, attempts and
/// last error.
pub async fn first_failure<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> redis::RedisResult<Option<(String, u32, String)>> {
    let all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.task_runs(period))
        .query_async(conn)
        .await?;
    let mut failed: Vec<(String, u32, String)> = all
        .into_iter()
        .filter_map(|(field, raw)| {
            let id = field.strip_prefix("t:")?;
            let rec: serde_json::Value = serde_json::from_str(&raw).ok()?;
            (rec["state"] == "failed").then(|| {
                (
                    id.to_string(),
                    rec["attempt"].as_u64().unwrap_or(0) as u32,
                    rec["error"].as_str().unwrap_or("").to_string(),
                )
            })
        })
        .collect();
    failed.sort();
    Ok(failed.into_iter().next())
}
