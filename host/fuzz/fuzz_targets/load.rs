//! The whole load path after reading a file (`Runtime::load_bytes`): header checks, compiling,
//! import checks, type-checking against the job world, `describe()` and spec validation. Any
//! input must end in a job or a refusal; a panic or a crash is a bug.

#![no_main]

use std::path::Path;
use std::sync::LazyLock;

use leasehold::exec::runtime::Runtime;
use leasehold::exec::spec::HostLimits;
use libfuzzer_sys::fuzz_target;

static HOST: LazyLock<(tokio::runtime::Runtime, Runtime)> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let wasm = Runtime::new(HostLimits::default()).expect("wasm runtime");
    (rt, wasm)
});

fuzz_target!(|data: &[u8]| {
    let (rt, wasm) = &*HOST;
    match rt.block_on(wasm.load_bytes(Path::new("fuzz.wasm"), data.to_vec())) {
        Ok(job) => assert!(!job.spec.name.is_empty()),
        Err(e) => assert!(!e.reason.is_empty()),
    }
});
