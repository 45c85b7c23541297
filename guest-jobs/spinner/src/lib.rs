//! Test fixture: a CPU-bound job that fires every second and burns about 300 ms of pure
//! computation per step, three steps per run, checking `still-leader` as it goes. A fire during
//! an open run is recorded as skipped, not queued. It is written as typed-state steps
//! ([`leasehold_guest::Job`]), so the tests run that path of the SDK in real hosts.
//!
//! It names itself `spinner-a`. Tests that need several CPU-bound jobs run this one component
//! under other names with sidecar files: `spinner_b.wasm` (a copy) beside `spinner_b.toml`
//! holding `name = "spinner-b"`.

use leasehold_guest::prelude::*;

/// The steps done so far and the number they work on.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Spin {
    step: u32,
    x: u64,
}

struct Spinner;

impl Job for Spinner {
    type State = Spin;

    fn spec() -> JobSpec {
        spec("spinner-a")
            .schedule("* * * * * *")
            .overlap(Overlap::Skip)
            .build()
    }

    fn step(term: &Term, _run: &RunInfo, spin: &mut Spin) -> Result<Next, JobError> {
        spin.x = spin.x.wrapping_add(u64::from(spin.step));
        // Roughly 300 ms of work in an unoptimised guest; checked against the term often.
        for _ in 0..3_000 {
            term.ensure_leader()?;
            for _ in 0..20_000 {
                spin.x = std::hint::black_box(
                    spin.x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407),
                );
            }
        }
        spin.step += 1;
        Ok(if spin.step == 3 {
            Next::Done
        } else {
            Next::Continue
        })
    }
}

leasehold_guest::job!(Spinner);
