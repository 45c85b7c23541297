//! Test and benchmark fixture: a fan-out job (the `fan-out-job` world).
//!
//! Step 0 submits `tasks` tasks (`t-0`, `t-1`, …) and awaits them; step 1 reads every output,
//! checks it, and writes the sum to `sum/<period>`. Task `t-i` writes `out/<period>/t-i` (a
//! fenced write of the task's term and claim) and returns `i²`. What a task does first comes
//! from `/data/tasker.json` (all optional):
//!
//! - `tasks`: how many (default 8);
//! - `spin_ms`: spin this long, asking `still-leader` every millisecond (a long task a test can
//!   freeze or kill its worker in);
//! - `write_every_ms`: while spinning, write `tick/<period>/<id>` this often (a task that is
//!   mid-write whenever its run ends); a refused write ends the task with the refusal;
//! - `cpu`: rounds of a CPU-bound loop (benchmarks);
//! - `fail`: task ids that trap (panic with `task <id> exploded`) on every attempt;
//! - `not_ready_once`: task ids that answer `not-ready` the first time they run (they mark
//!   `waited/<period>/<id>` in the store), then run as usual.

use std::time::Duration;

use leasehold_guest::fan_out::{Guest, Task};
use leasehold_guest::prelude::*;
use leasehold_guest::{state, store, tasks};
use serde::{Deserialize, Serialize};

#[derive(Default, Deserialize)]
#[serde(default)]
struct Config {
    tasks: Option<u32>,
    spin_ms: u64,
    write_every_ms: u64,
    cpu: u64,
    fail: Vec<String>,
    not_ready_once: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct Work {
    i: u64,
    spin_ms: u64,
    #[serde(default)]
    write_every_ms: u64,
    cpu: u64,
    fail: bool,
    #[serde(default)]
    not_ready_once: bool,
}

fn config() -> Result<Config, JobError> {
    match std::fs::read_to_string("/data/tasker.json") {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| JobError::Failed(format!("/data/tasker.json: {e}"))),
        Err(_) => Ok(Config::default()),
    }
}

struct Tasker;

impl Guest for Tasker {
    fn describe() -> JobSpec {
        spec("tasker")
            .schedule("0 0 0 1 1 *")
            .max_step_time(Duration::from_secs(60))
            .build()
    }

    fn databases() -> Vec<String> {
        Vec::new()
    }

    fn run_step(
        term: &Term,
        run: RunInfo,
        step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        term.ensure_leader()?;
        let config = config()?;
        let n = config.tasks.unwrap_or(8);
        if step == 0 {
            let work: Vec<Task> = (0..n)
                .map(|i| Task {
                    id: format!("t-{i}"),
                    payload: serde_json::to_vec(&Work {
                        i: u64::from(i),
                        spin_ms: config.spin_ms,
                        write_every_ms: config.write_every_ms,
                        cpu: config.cpu,
                        fail: config.fail.contains(&format!("t-{i}")),
                        not_ready_once: config.not_ready_once.contains(&format!("t-{i}")),
                    })
                    .expect("work serializes"),
                })
                .collect();
            tasks::submit(&work)?;
            return state::await_tasks(&());
        }
        let progress = tasks::progress()?;
        if progress.finished != n || progress.failed != 0 {
            return Err(JobError::Failed(format!(
                "called with {} of {n} tasks finished ({} failed)",
                progress.finished, progress.failed
            )));
        }
        let mut sum = 0u64;
        for i in 0..u64::from(n) {
            let out = tasks::output(&format!("t-{i}"))?
                .ok_or_else(|| JobError::Failed(format!("t-{i} has no output")))?;
            let v: u64 = String::from_utf8_lossy(&out)
                .parse()
                .map_err(|_| JobError::Failed(format!("t-{i}'s output is not a number")))?;
            if v != i * i {
                return Err(JobError::Failed(format!(
                    "t-{i} returned {v}, not {}",
                    i * i
                )));
            }
            sum += v;
        }
        store::write(&format!("sum/{}", run.period), sum.to_string().as_bytes())?;
        Ok(StepOutcome::Done)
    }

    fn run_task(term: &Term, run: RunInfo, task: Task) -> Result<Vec<u8>, JobError> {
        let work: Work = serde_json::from_slice(&task.payload)
            .map_err(|e| JobError::Failed(format!("payload of {}: {e}", task.id)))?;
        if work.fail {
            panic!("task {} exploded", task.id);
        }
        let waited = format!("waited/{}/{}", run.period, task.id);
        if work.not_ready_once && store::read(&waited)?.is_none() {
            store::write(&waited, b"1")?;
            return Err(JobError::NotReady(format!(
                "task {}'s input is not there yet",
                task.id
            )));
        }
        let start = std::time::Instant::now();
        let mut ticks = 0u64;
        while start.elapsed().as_millis() < u128::from(work.spin_ms) {
            term.ensure_leader()?;
            if work.write_every_ms > 0
                && start.elapsed().as_millis() >= u128::from(ticks * work.write_every_ms)
            {
                ticks += 1;
                let key = format!("tick/{}/{}", run.period, task.id);
                store::write(&key, ticks.to_string().as_bytes())?;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut x = work.i;
        for round in 0..work.cpu {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(round));
        }
        std::hint::black_box(x);
        let out = (work.i * work.i).to_string();
        store::write(&format!("out/{}/{}", run.period, task.id), out.as_bytes())?;
        Ok(out.into_bytes())
    }
}

leasehold_guest::export_fan_out!(Tasker);
