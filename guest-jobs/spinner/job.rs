// Shared body of the spinner fixtures (`spinner-a`, `spinner-b`, `spinner-c`): a CPU-bound
// job that fires every second and burns about 300 ms of pure computation per step, three steps
// per run, checking `still-leader` as it goes. The including crate defines `NAME`.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use leasehold::job::types::{CatchUp, Limits, Overlap, Policies};

struct Spinner;

impl Guest for Spinner {
    fn describe() -> JobSpec {
        JobSpec {
            name: NAME.into(),
            schedule: "* * * * * *".into(),
            time_zone: "UTC".into(),
            limits: Limits { max_memory_bytes: 0, max_step_millis: 0, max_write_bytes: 0, max_stored_keys: 0, max_stored_bytes: 0 },
            // Every second; a fire during an open run is recorded as skipped, not queued.
            policies: Policies {
                catch_up: CatchUp::Latest,
                catch_up_window_millis: 0,
                retry_attempts: 0,
                retry_backoff_millis: 0,
                retry_max_backoff_millis: 0,
                overlap: Overlap::Skip,
                max_run_millis: 0,
            },
        }
    }

    fn run_step(term: &Term, _run: RunInfo, step: u32, _state: Option<Vec<u8>>) -> Result<StepOutcome, JobError> {
        let mut x: u64 = step as u64;
        // Roughly 300 ms of work in an unoptimised guest; checked against the term often.
        for _ in 0..3_000 {
            if !term.still_leader() {
                return Err(JobError::LostLeadership);
            }
            for _ in 0..20_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407));
            }
        }
        if step == 2 { Ok(StepOutcome::Done) } else { Ok(StepOutcome::Continue(x.to_le_bytes().to_vec())) }
    }
}

export!(Spinner);
