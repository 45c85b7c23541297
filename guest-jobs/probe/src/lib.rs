//! Test fixture: a job that tries every way to change the world, and reports the outcome of
//! each attempt as its step state (one `name: result` line each), so a host test can assert
//! that only the fenced write can succeed.
//!
//! (Network access is not among the attempts: a component that imports `wasi:sockets` is
//! refused at load, see the `netjob` fixture.) A misbehaviour may be chosen instead, by the
//! file `/data/mode` (when the job runs in a host) or else by `run.period` (in-process tests):
//! - `unreachable`: execute wasm's `unreachable`;
//! - `flaky`: fail on the first attempt (a line on stderr, then `failed`), succeed on the next;
//! - `panic`: panic with a message;
//! - `spin`: compute forever without ever asking `still-leader`;
//! - `oom`: allocate without bound;
//! - `recurse`: recurse without bound;
//! - `big-write`: write a value larger than the job's write limit (and fail with the error);
//! - `big-state`: return a checkpoint larger than the job's write limit;
//! - `keys`: write keys outside the namespace and odd keys (and fail listing each error);
//! - `log-flood`: write 100,000 log lines and 1 MiB of stderr, then finish;
//! - `fill`: write new keys in a loop, without bound, until a write is refused (and fail with
//!   the error): a job that would fill Redis, stopped by its storage quota;
//! - `batch`: `store.write-many` three keys, then batches with an invalid key, a value over the
//!   write limit, and a key written twice, and report each outcome as a line of its state;
//! - `hostile`: write markup to stderr (`<script>`, an attribute breakout, then a 1,500-character
//!   unbroken line) and fail with the markup and a 3,000-character unbroken word, for the
//!   console's escaping tests;
//! - `delete`: write `d/1`..`d/3`, `store.delete` `d/2`, `d/3`, `d/404` (never written) and
//!   `../escape`, and report each outcome as a line of its state.

use std::time::Duration;

use leasehold_guest::prelude::*;
use leasehold_guest::{log, store};

struct Probe;

impl Guest for Probe {
    fn describe() -> JobSpec {
        spec("probe")
            .schedule("0 0 0 1 1 *")
            .max_step_time(Duration::from_secs(3))
            .max_write_bytes(1024)
            .build()
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
            .unwrap_or_else(|_| run.period.clone());
        match mode.as_str() {
            "unreachable" => core::arch::wasm32::unreachable(),
            "flaky" if run.attempt < 2 => {
                eprintln!("probe: flaky, failing attempt {}", run.attempt);
                return Err(JobError::Failed(format!(
                    "flaky on attempt {}",
                    run.attempt
                )));
            }
            "flaky" => return Ok(StepOutcome::Done),
            "big-write" => {
                return match store::write("big", &vec![7u8; 64 * 1024]) {
                    Ok(()) => Ok(StepOutcome::Done),
                    Err(e) => Err(JobError::Failed(format!(
                        "store.write(\"big\"): {}",
                        describe(&e)
                    ))),
                };
            }
            "big-state" => return Ok(StepOutcome::Continue(vec![7u8; 64 * 1024])),
            "batch" => {
                let entry = |k: &str, v: &[u8]| store::Entry {
                    key: k.to_string(),
                    value: v.to_vec(),
                };
                let show = |r: Result<(), store::BatchError>| match r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => format!(
                        "refused at {} {}",
                        e.index.map_or("-".to_string(), |i| i.to_string()),
                        describe(&e.error)
                    ),
                };
                let lines = [
                    format!(
                        "three: {}",
                        show(store::write_many(&[
                            entry("b/1", b"one"),
                            entry("b/2", b"two"),
                            entry("b/3", b"three"),
                        ]))
                    ),
                    format!(
                        "invalid: {}",
                        show(store::write_many(&[
                            entry("b/4", b"four"),
                            entry("../escape", b"x"),
                        ]))
                    ),
                    format!(
                        "too-large: {}",
                        show(store::write_many(&[entry("b/5", &[0u8; 2048])]))
                    ),
                    format!(
                        "twice: {}",
                        show(store::write_many(&[
                            entry("b/6", b"first"),
                            entry("b/6", b"second"),
                        ]))
                    ),
                ];
                return Ok(StepOutcome::Continue(lines.join("\n").into_bytes()));
            }
            "delete" => {
                let show = |r: Result<bool, store::WriteError>| match r {
                    Ok(existed) => format!("ok {existed}"),
                    Err(e) => format!("refused {}", describe(&e)),
                };
                for k in ["d/1", "d/2", "d/3"] {
                    store::write(k, &[5u8; 100]).map_err(|e| JobError::Failed(describe(&e)))?;
                }
                let lines: Vec<String> = ["d/2", "d/3", "d/404", "../escape"]
                    .iter()
                    .map(|k| format!("{k}: {}", show(store::delete(k))))
                    .collect();
                return Ok(StepOutcome::Continue(lines.join("\n").into_bytes()));
            }
            "fill" => {
                let mut n: u64 = 0;
                loop {
                    store::write(&format!("fill/{}/{n}", run.attempt), &[1u8; 100])
                        .lost_leadership_or_else(|e| {
                            JobError::Failed(format!(
                                "store.write refused after {n} keys: {}",
                                describe(&e)
                            ))
                        })?;
                    n += 1;
                }
            }
            "keys" => {
                let long = "k".repeat(10_000);
                let keys = [
                    "../x",
                    "../../ticker/data/tick",
                    "lh:{ticker}:fence",
                    "",
                    "nul\0byte",
                    "/abs",
                    long.as_str(),
                ];
                let results: Vec<String> = keys
                    .iter()
                    .map(|k| {
                        let shown = if k.len() > 20 {
                            format!("{}… ({} bytes)", &k[..8], k.len())
                        } else {
                            format!("{k:?}")
                        };
                        match store::write(k, b"escaped?") {
                            Ok(()) => format!("{shown}: ok"),
                            Err(e) => format!("{shown}: {}", describe(&e)),
                        }
                    })
                    .collect();
                return Err(JobError::Failed(results.join("; ")));
            }
            "log-flood" => {
                for i in 0..100_000 {
                    log::write(log::Level::Info, &format!("flood line {i}"));
                }
                let line = "e".repeat(1023);
                for _ in 0..1024 {
                    eprintln!("{line}");
                }
                return Ok(StepOutcome::Done);
            }
            "spin" => {
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            "panic" => panic!("probe panics on purpose in step {step}"),
            "hostile" => {
                let markup = "<script>document.title='pwned'</script>\"><img src=x onerror=\"document.title='pwned'\">";
                eprintln!("{markup}");
                eprintln!("{}", "V".repeat(1500));
                return Err(JobError::Failed(format!("{markup} {}", "W".repeat(3000))));
            }
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

/// The typed write error, in words.
fn describe(e: &store::WriteError) -> String {
    match e {
        store::WriteError::InvalidKey(m) => format!("invalid-key({m})"),
        store::WriteError::TooLarge(max) => format!("too-large(max {max} bytes)"),
        store::WriteError::NotLeader => "not-leader".into(),
        store::WriteError::Fenced(m) => format!("fenced({m})"),
        store::WriteError::Unavailable(m) => format!("unavailable({m})"),
        store::WriteError::QuotaExceeded(u) => format!(
            "quota-exceeded({} keys and {} bytes, quota {} keys and {} bytes)",
            u.keys, u.bytes, u.max_keys, u.max_bytes
        ),
    }
}

leasehold_guest::export!(Probe);
