//! Test fixture: a job that tries to reach the network itself (so its component imports
//! `wasi:sockets`, as every componentize-py component does). The host loads it and refuses the
//! connection: its step fails with the refusal, and no socket is made.

use leasehold_guest::prelude::*;

struct NetJob;

impl Guest for NetJob {
    fn describe() -> JobSpec {
        // Every day at midnight, UTC: the spec's defaults.
        spec("netjob").build()
    }

    fn databases() -> Vec<String> {
        Vec::new()
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

leasehold_guest::export!(NetJob);
