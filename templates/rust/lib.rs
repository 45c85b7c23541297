//! {{name}}: a Leasehold job in Rust (made by `leasehold new --lang rust {{name}}`).
//!
//! Each run counts the lines of `/data/input.csv` (`<data-dir>/{{name}}/input.csv` on the
//! host), `CHUNK` lines per step: the count so far travels in the checkpoint, so a run resumed
//! on another replica carries on from the last completed step. The result is written, fenced,
//! under `count/<period>`. A step runs only while its term leads (the SDK checks first).

use leasehold_guest::prelude::*;

/// Lines per step.
const CHUNK: usize = 1000;
const INPUT: &str = "/data/input.csv";

/// The state between steps.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Progress {
    next: usize,
    count: u64,
}

struct LineCount;

impl Job for LineCount {
    type State = Progress;

    fn spec() -> JobSpec {
        // Every limit and policy left unset is the host's default.
        spec("{{name}}")
            .schedule("0 0 2 * * *")
            .time_zone("UTC")
            .build()
    }

    fn step(_term: &Term, run: &RunInfo, progress: &mut Progress) -> Result<Next, JobError> {
        // Not there yet: the host calls this step again later.
        let text = std::fs::read_to_string(INPUT)
            .map_err(|e| JobError::NotReady(format!("{INPUT}: {e}")))?;
        let lines: Vec<&str> = text.lines().collect();
        if progress.next >= lines.len() {
            let count = progress.count.to_string();
            leasehold_guest::store::write(&format!("count/{}", run.period), count.as_bytes())?;
            return Ok(Next::Done);
        }
        let end = (progress.next + CHUNK).min(lines.len());
        progress.count += lines[progress.next..end]
            .iter()
            .filter(|l| !l.trim().is_empty())
            .count() as u64;
        progress.next = end;
        Ok(Next::Continue)
    }
}

leasehold_guest::job!(LineCount);
