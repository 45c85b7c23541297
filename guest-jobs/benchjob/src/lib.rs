//! Benchmark fixture (`host/benches`). Its mode comes from `/data/mode` when present, otherwise
//! from the period:
//! - `still-leader`: call `term.still-leader()` 1,000,000 times, then finish;
//! - `pulse`: a run that never ends: every step pauses 5 ms and continues (failover benchmarks
//!   measure when the new leader's first step starts);
//! - `write-one`: write 10,000 keys of 100 bytes with `store.write`, one call each;
//! - `write-many`: write the same 10,000 keys with one `store.write-many`;
//! - `get URL`: send [`REQUESTS`] `GET`s to URL through `wasi:http` (the SDK's `http::send`),
//!   one after another, each answered 200;
//! - anything else (an ordinary period): finish at once (an empty step).
//!
//! Its schedule fires once a year, so a host runs the current period at start and then idles.

use leasehold_guest::prelude::*;
use leasehold_guest::{http, store};

/// Keys a write benchmark step writes.
const KEYS: usize = 10_000;

/// Requests an HTTP benchmark step sends.
pub const REQUESTS: usize = 200;

struct Bench;

impl Guest for Bench {
    fn describe() -> JobSpec {
        spec("benchjob").schedule("0 0 0 1 1 *").build()
    }

    fn databases() -> Vec<String> {
        Vec::new()
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
        if let Some(url) = mode.strip_prefix("get ") {
            for _ in 0..REQUESTS {
                let got = http::send("GET", url, &[], b"")?;
                if !got.is_success() {
                    return Err(JobError::Failed(format!("{url} answered {}", got.status)));
                }
            }
            return Ok(StepOutcome::Done);
        }
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
                term.ensure_leader()?;
                std::thread::sleep(std::time::Duration::from_millis(5));
                Ok(StepOutcome::Continue(step.to_le_bytes().to_vec()))
            }
            "write-one" => {
                for i in 0..KEYS {
                    store::write(&format!("w/{i}"), &[b'x'; 100])?;
                }
                Ok(StepOutcome::Done)
            }
            "write-many" => {
                let entries: Vec<store::Entry> = (0..KEYS)
                    .map(|i| store::Entry {
                        key: format!("w/{i}"),
                        value: vec![b'x'; 100],
                    })
                    .collect();
                store::write_many(&entries).map_err(|e| {
                    JobError::Failed(format!(
                        "write-many refused at {:?}: {:?}",
                        e.index, e.error
                    ))
                })?;
                Ok(StepOutcome::Done)
            }
            _ => Ok(StepOutcome::Done),
        }
    }
}

leasehold_guest::export!(Bench);
