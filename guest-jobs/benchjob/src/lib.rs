//! Benchmark fixture (`host/benches`). Its mode comes from `/data/mode` when present, otherwise
//! from the period:
//! - `still-leader`: call `term.still-leader()` 1,000,000 times, then finish;
//! - `pulse`: a run that never ends: every step pauses 5 ms and continues (failover benchmarks
//!   measure when the new leader's first step starts);
//! - anything else (an ordinary period): finish at once (an empty step).
//!
//! Its schedule fires once a year, so a host runs the current period at start and then idles.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use leasehold::job::types::{CatchUp, Limits, Overlap, Policies};

struct Bench;

impl Guest for Bench {
    fn describe() -> JobSpec {
        JobSpec {
            name: "benchjob".into(),
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
        term: &Term,
        run: RunInfo,
        step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        let mode = std::fs::read_to_string("/data/mode")
            .map(|m| m.trim().to_string())
            .unwrap_or(run.period);
        match mode.as_str() {
            "still-leader" => {
                let mut leading = 0u32;
                for _ in 0..1_000_000 {
                    leading += u32::from(term.still_leader());
                }
                std::hint::black_box(leading);
                Ok(StepOutcome::Done)
            }
            "pulse" => {
                if !term.still_leader() {
                    return Err(JobError::LostLeadership);
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
                Ok(StepOutcome::Continue(step.to_le_bytes().to_vec()))
            }
            _ => Ok(StepOutcome::Done),
        }
    }
}

export!(Bench);
