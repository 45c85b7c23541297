//! {{name}}: a Leasehold fan-out job in Rust (made by `leasehold new --lang rust --fan-out
//! {{name}}`).
//!
//! Each run counts the non-blank lines of `/data/input.csv` (`<data-dir>/{{name}}/input.csv` on
//! the host) with `PARTS` tasks, which every replica of the cluster runs (the leader too): step
//! 0 submits one task per slice of the file and waits for them (`StepOutcome::AwaitTasks`);
//! `run_task` counts its slice and returns the count; step 1 reads every task's output and
//! writes the total, fenced, under `count/<period>`. A task whose worker dies is run again
//! elsewhere, so it must be idempotent: here it only returns its output.

use leasehold_guest::fan_out::{Guest, Task};
use leasehold_guest::prelude::*;
use leasehold_guest::tasks;

/// Tasks per run.
const PARTS: usize = 10;
const INPUT: &str = "/data/input.csv";

struct Tally;

fn read_lines() -> Result<Vec<String>, JobError> {
    // Not there yet: the host calls this step again later.
    let text =
        std::fs::read_to_string(INPUT).map_err(|e| JobError::NotReady(format!("{INPUT}: {e}")))?;
    Ok(text.lines().map(str::to_string).collect())
}

impl Guest for Tally {
    fn describe() -> JobSpec {
        // Every limit and policy left unset is the host's default.
        spec("{{name}}")
            .schedule("0 0 2 * * *")
            .time_zone("UTC")
            .build()
    }

    fn databases() -> Vec<String> {
        // The databases its steps open with `leasehold_guest::sql::begin` (none here).
        Vec::new()
    }

    fn run_step(
        term: &Term,
        run: RunInfo,
        step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        term.ensure_leader()?;
        if step == 0 {
            let lines = read_lines()?;
            let size = lines.len().div_ceil(PARTS);
            let work: Vec<Task> = (0..PARTS)
                .map(|i| Task {
                    id: format!("part-{i}"),
                    payload: format!("{} {}", i * size, ((i + 1) * size).min(lines.len()))
                        .into_bytes(),
                })
                .collect();
            // Submitting the same ids again (a re-executed step) is safe.
            tasks::submit(&work)?;
            return Ok(StepOutcome::AwaitTasks(Vec::new()));
        }
        let mut total = 0u64;
        for i in 0..PARTS {
            let out = tasks::output(&format!("part-{i}"))?
                .ok_or_else(|| JobError::Failed(format!("part-{i} has no output")))?;
            total += String::from_utf8_lossy(&out)
                .parse::<u64>()
                .map_err(|e| JobError::Failed(format!("part-{i}: {e}")))?;
        }
        leasehold_guest::store::write(
            &format!("count/{}", run.period),
            total.to_string().as_bytes(),
        )?;
        Ok(StepOutcome::Done)
    }

    fn run_task(_term: &Term, _run: RunInfo, task: Task) -> Result<Vec<u8>, JobError> {
        let text = String::from_utf8_lossy(&task.payload).to_string();
        let (first, last) = text
            .split_once(' ')
            .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
            .ok_or_else(|| JobError::Failed(format!("bad payload {text:?}")))?;
        let lines = read_lines()?;
        let count = lines
            .get(first..last.min(lines.len()))
            .unwrap_or_default()
            .iter()
            .filter(|l| !l.trim().is_empty())
            .count();
        Ok(count.to_string().into_bytes())
    }
}

leasehold_guest::export_fan_out!(Tally);
