//! {{name}}: a Leasehold job in Rust (made by `leasehold new --lang rust {{name}}`).
//!
//! Each run counts the lines of `/data/input.csv` (`<data-dir>/{{name}}/input.csv` on the
//! host), `CHUNK` lines per step: the count so far travels in the checkpoint, so a run resumed
//! on another replica carries on from the last completed step. The result is written, fenced,
//! under `count/<period>`.

use leasehold_guest::prelude::*;
use leasehold_guest::{state, store};

/// Lines per step.
const CHUNK: usize = 1000;
const INPUT: &str = "/data/input.csv";

/// The state between steps.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Progress {
    next: usize,
    count: u64,
}

struct Job;

impl Guest for Job {
    fn describe() -> JobSpec {
        // Every limit and policy left unset is the host's default.
        spec("{{name}}")
            .schedule("0 0 2 * * *")
            .time_zone("UTC")
            .build()
    }

    fn run_step(
        term: &Term,
        run: RunInfo,
        _step: u32,
        state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        // Not there yet: the host calls this step again later.
        let text = std::fs::read_to_string(INPUT)
            .map_err(|e| JobError::NotReady(format!("{INPUT}: {e}")))?;
        let lines: Vec<&str> = text.lines().collect();
        let mut progress: Progress = state::load(state)?;
        if progress.next >= lines.len() {
            store::write(
                &format!("count/{}", run.period),
                progress.count.to_string().as_bytes(),
            )?;
            return Ok(StepOutcome::Done);
        }
        if !term.still_leader() {
            return Err(JobError::LostLeadership);
        }
        let end = (progress.next + CHUNK).min(lines.len());
        progress.count += lines[progress.next..end]
            .iter()
            .filter(|l| !l.trim().is_empty())
            .count() as u64;
        progress.next = end;
        state::save(&progress)
    }
}

leasehold_guest::export!(Job);
