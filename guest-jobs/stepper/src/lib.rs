//! Test fixture: a three-step job whose step `n` waits (asking `still-leader` as it goes)
//! until the file `/data/go-<n>` exists, so a test decides when each step may finish. While
//! the file `/data/defer` exists, a step whose gate is missing returns `not-ready` instead of
//! waiting (the run waits for its inputs, open, between runs). Its schedule fires once a year,
//! so a host runs the current period at once.

use std::time::Duration;

use leasehold_guest::prelude::*;

struct Stepper;

impl Guest for Stepper {
    fn describe() -> JobSpec {
        spec("stepper")
            .schedule("0 0 0 1 1 *")
            .max_step_time(Duration::from_secs(120))
            .build()
    }

    fn databases() -> Vec<String> {
        Vec::new()
    }

    fn run_step(
        term: &Term,
        _run: RunInfo,
        step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        let gate = format!("/data/go-{step}");
        if std::fs::metadata(&gate).is_err() && std::fs::metadata("/data/defer").is_ok() {
            return Err(JobError::NotReady(format!("{gate} is not there yet")));
        }
        while std::fs::metadata(&gate).is_err() {
            term.ensure_leader()?;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if step == 2 {
            Ok(StepOutcome::Done)
        } else {
            Ok(StepOutcome::Continue(vec![step as u8]))
        }
    }
}

leasehold_guest::export!(Stepper);
