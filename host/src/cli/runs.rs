//! `leasehold runs JOB`: a job's run history, newest first, one line per period, with the
//! period's earlier attempts (retried failures, re-run final records) and, while a run waits for
//! its fan-out tasks, their states, attempts and workers. `--json`: one record per line, with a
//! `tasks` list added to a run that has tasks. `--terms`: the job's term history instead
//! ([`leasehold::coord::terms`]), newest first.

use leasehold::coord::term_store::{Store, TermHistory, TermStore as _};
use leasehold::exec::runs::{self, RunRecord};
use leasehold::exec::spec::validate_job_name;
use leasehold::exec::tasks::{self, TaskView};
use leasehold::store::keys::JobKeys;

use super::args::RunsArgs;
use super::open_store;

/// Tasks listed one per line under a run in the table (the rest are counted).
const TASKS_SHOWN: usize = 10;

pub(super) async fn list(args: RunsArgs) -> anyhow::Result<()> {
    let job = &args.job.job;
    validate_job_name(job)?;
    let store = open_store(&args.job.redis_url).await?;
    let keys = JobKeys::new(job);
    if args.terms {
        return list_terms(&store, &keys, &args).await;
    }
    let records = runs::history(&store, &keys, args.limit.max(1)).await?;
    let mut with_tasks = Vec::with_capacity(records.len());
    for r in records {
        // Only an open run has task records (they go with the run's end); tasks are on Redis
        // only (no fan-out job runs on etcd yet).
        let tasks = match &store {
            Store::Redis(redis) if !r.status.is_final() => {
                tasks::tasks_of(&mut redis.conn().clone(), &keys, &r.period).await?
            }
            _ => Vec::new(),
        };
        with_tasks.push((r, tasks));
    }
    if args.json {
        for (r, tasks) in &with_tasks {
            let mut v = serde_json::to_value(r)?;
            if !tasks.is_empty() {
                v["tasks"] = serde_json::to_value(tasks)?;
            }
            println!("{v}");
        }
        return Ok(());
    }
    if with_tasks.is_empty() {
        println!("{job} has no runs");
        return Ok(());
    }
    println!(
        "{:<20} {:<8} {:>4} {:>7} {:<12} {:<24} {:<24} ERROR",
        "PERIOD", "STATUS", "STEP", "ATTEMPT", "NODE", "STARTED", "FINISHED"
    );
    for (r, tasks) in with_tasks {
        print_record(&r);
        for a in &r.attempts {
            let failure = a.failure.map(|k| format!(" ({k})")).unwrap_or_default();
            println!(
                "  attempt {} {} at step {}{failure}, {}: {}",
                a.attempt,
                a.status.as_str(),
                a.step,
                a.at,
                one_line(&a.error, 100)
            );
        }
        print_tasks(&tasks);
    }
    Ok(())
}

/// `--terms`: the job's terms, newest first.
async fn list_terms(store: &Store, keys: &JobKeys, args: &RunsArgs) -> anyhow::Result<()> {
    let TermHistory { terms, unparsed } = store.history(keys.job(), args.limit).await?;
    if args.json {
        for t in &terms {
            println!("{}", serde_json::to_value(t)?);
        }
    } else if terms.is_empty() {
        println!("{} has no terms recorded", keys.job());
    } else {
        println!(
            "{:<18} {:<12} {:<24} {:<24} ENDED",
            "TOKEN", "NODE", "BEGAN", "UNTIL"
        );
        let at = |ms: u64| {
            chrono::DateTime::from_timestamp_millis(ms as i64).map_or_else(
                || ms.to_string(),
                |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            )
        };
        for t in &terms {
            println!(
                "{:<18} {:<12} {:<24} {:<24} {}",
                t.token,
                t.node,
                at(t.started_ms),
                t.ended_ms.map_or_else(|| "-".into(), at),
                t.end.map_or("leading", |e| e.as_str())
            );
        }
    }
    if unparsed > 0 {
        eprintln!("{unparsed} entries of the history could not be read");
    }
    Ok(())
}

fn print_record(r: &RunRecord) {
    let error = match (&r.failure, &r.error) {
        (Some(kind), Some(e)) => format!("{kind}: {e}"),
        (None, Some(e)) => e.clone(),
        _ => String::new(),
    };
    let mut error = one_line(&error, 120);
    if let Some(at) = &r.retry_at {
        error = format!("retry at {at}; {error}");
    }
    if r.earlier_schedule.is_some() {
        error = format!("earlier schedule; {error}");
    }
    println!(
        "{:<20} {:<8} {:>4} {:>7} {:<12} {:<24} {:<24} {}",
        r.period,
        r.status.as_str(),
        r.step,
        r.attempt,
        r.node,
        r.started_at,
        r.finished_at.as_deref().unwrap_or("-"),
        error
    );
}

/// A run's tasks: their count by state, then the first few (running and failed ones first).
fn print_tasks(tasks: &[TaskView]) {
    if tasks.is_empty() {
        return;
    }
    println!("  {}", tasks::tasks_summary(tasks));
    let rank = |t: &TaskView| match t.state {
        "running" => 0,
        "failed" => 1,
        "queued" => 2,
        _ => 3,
    };
    let mut shown: Vec<&TaskView> = tasks.iter().collect();
    shown.sort_by_key(|t| rank(t));
    for t in shown.iter().take(TASKS_SHOWN) {
        let worker = t.worker.as_deref().unwrap_or("-");
        let error = t
            .error
            .as_deref()
            .map(|e| format!(", last error: {}", one_line(e, 80)))
            .unwrap_or_default();
        println!(
            "    task {:<24} {:<8} attempt {} worker {worker}{error}",
            t.id, t.state, t.attempt
        );
    }
    if tasks.len() > TASKS_SHOWN {
        println!(
            "    … and {} more (--json lists them all)",
            tasks.len() - TASKS_SHOWN
        );
    }
}

/// An error on one line: a multi-line one (a traceback) shows its first line and its last,
/// where the exception is; `--json` has all of it.
fn one_line(error: &str, most: usize) -> String {
    match (error.lines().next(), error.lines().last()) {
        (Some(first), Some(last)) if first != last => {
            let first: String = first.chars().take(40).collect();
            format!("{first}… {last}").chars().take(most).collect()
        }
        _ => error.chars().take(most * 2 / 3).collect(),
    }
}
