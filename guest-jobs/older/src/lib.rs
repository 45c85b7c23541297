//! Test fixture: a job built to world 0.4.0 (`wit/v0.4.0`), the world before `store.delete`.
//! Its one step writes `older/<period>` with `write-many` (a 0.4.0 import) and finishes: tests
//! show that the host, on world 0.4.1, still loads and runs such a component.

wit_bindgen::generate!({ world: "job", path: "../../wit/v0.4.0" });

use leasehold::job::store;
use leasehold::job::types::{CatchUp, Limits, Overlap, Policies};

struct Older;

impl Guest for Older {
    fn describe() -> JobSpec {
        JobSpec {
            name: "older".into(),
            schedule: "0 0 0 1 1 *".into(),
            time_zone: "UTC".into(),
            limits: Limits {
                max_memory_bytes: 0,
                max_step_millis: 0,
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
        _term: &Term,
        run: RunInfo,
        _step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        let entry = store::Entry {
            key: format!("older/{}", run.period),
            value: b"0.4.0".to_vec(),
        };
        match store::write_many(&[entry]) {
            Ok(()) => Ok(StepOutcome::Done),
            Err(store::BatchError {
                error: store::WriteError::NotLeader | store::WriteError::Fenced(_),
                ..
            }) => Err(JobError::LostLeadership),
            Err(e) => Err(JobError::Failed(format!("{e:?}"))),
        }
    }
}

export!(Older);
