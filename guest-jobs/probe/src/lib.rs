//! Test fixture: a job that tries every way to change the world, and reports the outcome of
//! each attempt as its step state (one `name: result` line each), so a host test can assert
//! that only the fenced write can succeed.
//!
//! (Network access is not among the attempts: a component that imports `wasi:sockets` is
//! refused at load, see the `netjob` fixture.) `run.period` may name a misbehaviour instead:
//! - `spin`: compute forever without ever asking `still-leader`;
//! - `panic`: panic with a message;
//! - `oom`: allocate without bound;
//! - `recurse`: recurse without bound.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use leasehold::job::store;
use leasehold::job::types::Limits;

struct Probe;

impl Guest for Probe {
    fn describe() -> JobSpec {
        JobSpec {
            name: "probe".into(),
            schedule: "0 0 0 1 1 *".into(),
            time_zone: "UTC".into(),
            limits: Limits {
                max_memory_bytes: 0,
                max_step_millis: 3_000,
                max_write_bytes: 1024,
            },
        }
    }

    fn run_step(
        term: &Term,
        run: RunInfo,
        step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        match run.period.as_str() {
            "spin" => {
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            "panic" => panic!("probe panics on purpose in step {step}"),
            "oom" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 16 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "recurse" => {
                #[allow(unconditional_recursion)]
                fn down(n: u64) -> u64 {
                    std::hint::black_box(down(std::hint::black_box(n + 1))) + 1
                }
                return Ok(StepOutcome::Continue(down(0).to_le_bytes().to_vec()));
            }
            _ => {}
        }
        let mut out = Vec::new();
        out.push(format!("still-leader: {}", term.still_leader()));
        out.push(match std::fs::write("/data/written-by-guest", b"x") {
            Ok(()) => "fs-write: ok".to_string(),
            Err(e) => format!("fs-write: error {e}"),
        });
        out.push(match std::fs::read_to_string("/data/input.txt") {
            Ok(s) => format!("fs-read: ok {}", s.trim()),
            Err(e) => format!("fs-read: error {e}"),
        });
        out.push(
            match store::write("probe/value", format!("step {step}").as_bytes()) {
                Ok(()) => "store: ok".to_string(),
                Err(store::WriteError::Fenced(m)) => format!("store: fenced {m}"),
                Err(store::WriteError::NotLeader) => "store: not-leader".to_string(),
                Err(e) => format!("store: error {e:?}"),
            },
        );
        out.push(match store::write("../escape", b"x") {
            Ok(()) => "escape: ok".to_string(),
            Err(store::WriteError::InvalidKey(m)) => format!("escape: invalid-key {m}"),
            Err(e) => format!("escape: error {e:?}"),
        });
        out.push(match store::write("big", &[0u8; 2048]) {
            Ok(()) => "big: ok".to_string(),
            Err(store::WriteError::TooLarge(max)) => format!("big: too-large {max}"),
            Err(e) => format!("big: error {e:?}"),
        });
        Ok(StepOutcome::Continue(out.join("\n").into_bytes()))
    }
}

export!(Probe);
