//! Test fixture: a cheap job that fires every second; its one step writes `tick/<period>`
//! through the fence. Tests run it beside a misbehaving job to show it keeps its lease and its
//! schedule.
//!
//! It is built to the previous world, 0.2.0 (`wit/v0.2.0`), on purpose: every test that runs
//! it shows that components built before storage quotas still load and run.

wit_bindgen::generate!({ world: "job", path: "../../wit/v0.2.0" });

use leasehold::job::store;
use leasehold::job::types::{CatchUp, Limits, Overlap, Policies};

struct Ticker;

impl Guest for Ticker {
    fn describe() -> JobSpec {
        JobSpec {
            name: "ticker".into(),
            schedule: "* * * * * *".into(),
            time_zone: "UTC".into(),
            limits: Limits {
                max_memory_bytes: 0,
                max_step_millis: 0,
                max_write_bytes: 0,
            },
            policies: Policies {
                catch_up: CatchUp::All,
                catch_up_window_millis: 60000,
                retry_attempts: 0,
                retry_backoff_millis: 0,
                retry_max_backoff_millis: 0,
                overlap: Overlap::Queue,
                max_run_millis: 0,
            },
        }
    }

    fn run_step(
        _term: &Term,
        run: RunInfo,
        _step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        match store::write(&format!("tick/{}", run.period), b"tick") {
            Ok(()) => Ok(StepOutcome::Done),
            Err(store::WriteError::NotLeader) => Err(JobError::LostLeadership),
            Err(e) => Err(JobError::Failed(format!("{e:?}"))),
        }
    }
}

export!(Ticker);
