//! Test fixture: CPU-bound job `spinner-c` (see `../spinner/job.rs`).

const NAME: &str = "spinner-c";

include!("../../spinner/job.rs");
