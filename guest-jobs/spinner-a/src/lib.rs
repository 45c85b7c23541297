//! Test fixture: CPU-bound job `spinner-a` (see `../spinner/job.rs`).

const NAME: &str = "spinner-a";

include!("../../spinner/job.rs");
