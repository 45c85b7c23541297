//! Test fixture: a CPU-bound job that fires every second and burns about 300 ms of pure
//! computation per step, three steps per run, checking `still-leader` as it goes. A fire during
//! an open run is recorded as skipped, not queued.
//!
//! It names itself `spinner-a`. Tests that need several CPU-bound jobs run this one component
//! under other names with sidecar files: `spinner_b.wasm` (a copy) beside `spinner_b.toml`
//! holding `name = "spinner-b"`.

use leasehold_guest::prelude::*;

struct Spinner;

impl Guest for Spinner {
    fn describe() -> JobSpec {
        spec("spinner-a")
            .schedule("* * * * * *")
            .overlap(Overlap::Skip)
            .build()
    }

    fn run_step(
        term: &Term,
        _run: RunInfo,
        step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        let mut x: u64 = step as u64;
        // Roughly 300 ms of work in an unoptimised guest; checked against the term often.
        for _ in 0..3_000 {
            if !term.still_leader() {
                return Err(JobError::LostLeadership);
            }
            for _ in 0..20_000 {
                x = std::hint::black_box(
                    x.wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407),
                );
            }
        }
        if step == 2 {
            Ok(StepOutcome::Done)
        } else {
            Ok(StepOutcome::Continue(x.to_le_bytes().to_vec()))
        }
    }
}

leasehold_guest::export!(Spinner);
