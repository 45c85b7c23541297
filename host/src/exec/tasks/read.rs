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

/// One task of a run as operators see it ([`tasks_of`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TaskView {
    /// The task's id.
    pub id: String,
    /// `queued` (waiting for a worker), `running` (a worker holds it now), `done` or `failed`
    /// (every attempt failed).
    pub state: &'static str,
    /// Its current attempt (from 1).
    pub attempt: u32,
    /// The worker running it now, or else the one that ran its last finished attempt
    /// (`node:id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// Its last attempt's error, if one failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The tasks of `period`'s run, by id, while the run has them (a run's task records go when
/// it ends). A queued task is `running` when a worker holds its stream entry.
pub async fn tasks_of<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    period: &str,
) -> redis::RedisResult<Vec<TaskView>> {
    let all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.task_runs(period))
        .query_async(conn)
        .await?;
    if all.is_empty() {
        return Ok(Vec::new());
    }
    // Entries held by a worker now: (entry, consumer, idle ms, deliveries). No group yet (or no
    // stream) is nothing held.
    let held: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(keys.tasks())
        .arg(GROUP)
        .arg("-")
        .arg("+")
        .arg(MOST_PER_SUBMIT)
        .query_async(conn)
        .await
        .unwrap_or_default();
    let held: std::collections::HashMap<String, String> =
        held.into_iter().map(|(e, c, _, _)| (e, c)).collect();
    let mut tasks: Vec<TaskView> = all
        .into_iter()
        .filter_map(|(field, raw)| {
            let id = field.strip_prefix("t:")?;
            let rec: serde_json::Value = serde_json::from_str(&raw).ok()?;
            let text = |k: &str| rec[k].as_str().map(str::to_string);
            let holder = text("entry").and_then(|e| held.get(&e).cloned());
            let state = match rec["state"].as_str() {
                Some("done") => "done",
                Some("failed") => "failed",
                _ if holder.is_some() => "running",
                _ => "queued",
            };
            Some(TaskView {
                id: id.to_string(),
                state,
                attempt: rec["attempt"].as_u64().unwrap_or(0) as u32,
                worker: if state == "running" {
                    holder
                } else {
                    text("worker")
                },
                error: text("error"),
            })
        })
        .collect();
    tasks.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(tasks)
}

/// How many of a run's tasks are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TaskCounts {
    /// Every task of the run.
    pub total: usize,
    /// Waiting for a worker.
    pub queued: usize,
    /// Held by a worker now.
    pub running: usize,
    /// Finished with an output.
    pub done: usize,
    /// Failed on every attempt.
    pub failed: usize,
}

/// How many of `tasks` are in each state.
pub fn task_counts(tasks: &[TaskView]) -> TaskCounts {
    let count = |s: &str| tasks.iter().filter(|t| t.state == s).count();
    TaskCounts {
        total: tasks.len(),
        queued: count("queued"),
        running: count("running"),
        done: count("done"),
        failed: count("failed"),
    }
}

/// How many of `tasks` are in each state, as one phrase: `10 tasks: 3 done, 2 running, 5
/// queued`.
pub fn tasks_summary(tasks: &[TaskView]) -> String {
    let c = task_counts(tasks);
    let parts: Vec<String> = [
        (c.done, "done"),
        (c.running, "running"),
        (c.queued, "queued"),
        (c.failed, "failed"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, s)| format!("{n} {s}"))
    .collect();
    format!("{} tasks: {}", c.total, parts.join(", "))
}
