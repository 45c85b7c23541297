//! Test fixture: a job that tries to reach the network itself (so its component imports
//! `wasi:sockets`, as every componentize-py component does). The host loads it and refuses the
//! connection: its step fails with the refusal, and no socket is made.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use leasehold::job::types::{CatchUp, Limits, Overlap, Policies};

struct NetJob;

impl Guest for NetJob {
    fn describe() -> JobSpec {
        JobSpec {
            name: "netjob".into(),
            schedule: "0 0 0 * * *".into(),
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
        match std::net::TcpStream::connect(run.period.as_str()) {
            Ok(_) => Ok(StepOutcome::Done),
            Err(e) => Err(JobError::Failed(e.to_string())),
        }
    }
}

export!(NetJob);
