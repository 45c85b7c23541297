//! Test fixture: a three-step job whose step `n` waits (asking `still-leader` as it goes)
//! until the file `/data/go-<n>` exists, so a test decides when each step may finish. Its
//! schedule fires once a year, so a host runs the current period at once.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use leasehold::job::types::{CatchUp, Limits, Overlap, Policies};

struct Stepper;

impl Guest for Stepper {
    fn describe() -> JobSpec {
        JobSpec {
            name: "stepper".into(),
            schedule: "0 0 0 1 1 *".into(),
            time_zone: "UTC".into(),
            limits: Limits {
                max_memory_bytes: 0,
                max_step_millis: 120_000,
                max_write_bytes: 0,
                max_stored_keys: 0,
                max_stored_bytes: 0,
            },
            policies: Policies {
                catch_up: CatchUp::Latest,
                catch_up_window_millis: 0,
                retry_attempts: 0,
                retry_backoff_millis: 0,
                retry_max_backoff_millis: 0,
                overlap: Overlap::Queue,
                max_run_millis: 0,
            },
        }
    }

    fn run_step(
        term: &Term,
        _run: RunInfo,
        step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        let gate = format!("/data/go-{step}");
        while std::fs::metadata(&gate).is_err() {
            if !term.still_leader() {
                return Err(JobError::LostLeadership);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if step == 2 {
            Ok(StepOutcome::Done)
        } else {
            Ok(StepOutcome::Continue(vec![step as u8]))
        }
    }
}

export!(Stepper);
