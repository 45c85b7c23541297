//! Test fixture: CPU-bound job `spinner-b` (see `../spinner/job.rs`).

const NAME: &str = "spinner-b";

include!("../../spinner/job.rs");
