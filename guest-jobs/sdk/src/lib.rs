//! The Rust guest SDK for Leasehold jobs.
//!
//! A job is a `cdylib` built with `--target wasm32-wasip2` whose component implements the
//! `leasehold:job/job` world, version 0.3.0 (`wit/job.wit`). This crate generates that world's
//! bindings once, so a job depends on `leasehold-guest` alone (not on `wit-bindgen`), and adds:
//!
//! - [`spec`]: a [`JobSpec`] builder in which everything left unset is the host's default;
//! - `From<`[`store::WriteError`]`>` and `From<`[`store::ReadError`]`>` for [`JobError`], so
//!   that `?` on a store call ends the step the way the WIT asks (a lost term as
//!   `lost-leadership`, an unreachable store as `not-ready`, the rest as `failed`), and
//!   [`WriteResultExt`] for a job that words its own errors;
//! - [`state`]: the step's state as JSON; [`json`]: store values as JSON.
//!
//! A complete job (add `serde` with its `derive` feature to use `#[derive(Serialize)]`):
//!
//! ```
//! use leasehold_guest::prelude::*;
//! use leasehold_guest::{state, store};
//!
//! #[derive(Default, serde::Serialize, serde::Deserialize)]
//! struct Progress { next: u32 }
//!
//! struct Nightly;
//!
//! impl Guest for Nightly {
//!     fn describe() -> JobSpec {
//!         spec("nightly").schedule("0 0 2 * * *").time_zone("Europe/London").retry(3, 60_000).build()
//!     }
//!
//!     fn run_step(term: &Term, run: RunInfo, _step: u32, state: Option<Vec<u8>>) -> Result<StepOutcome, JobError> {
//!         let mut progress: Progress = state::load(state)?;
//!         if !term.still_leader() { return Err(JobError::LostLeadership); }
//!         store::write(&format!("part/{}/{}", run.period, progress.next), b"done")?;
//!         progress.next += 1;
//!         if progress.next == 10 { Ok(StepOutcome::Done) } else { state::save(&progress) }
//!     }
//! }
//!
//! leasehold_guest::export!(Nightly);
//! ```
//!
//! `export!(Nightly)` is short for `export!(Nightly with_types_in leasehold_guest)`: it emits the
//! component's `describe` and `run-step` exports (and the world's type information) in the
//! job's own crate. A crate calls it once.
//!
//! The import functions ([`store`], [`log`], [`Term`]'s methods) exist only in a component run
//! by the host: in a native build (unit tests) they panic when called. Everything else here is
//! plain Rust and runs natively.

#![warn(missing_docs)]

mod error;
pub mod json;
mod spec;
pub mod state;

/// The generated bindings of the `job` world (wit-bindgen 0.63). Use the re-exports at the crate
/// root instead.
#[doc(hidden)]
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "job",
        path: "../../wit",
        // The export macro is called in the job's crate, and finds the types here.
        pub_export_macro: true,
        default_bindings_module: "leasehold_guest",
        additional_derives: [PartialEq, Eq],
    });
}

pub use bindings::leasehold::job::{leadership, log, store, types};
pub use bindings::{Guest, JobError, JobSpec, RunInfo, StepOutcome, Term, export};
pub use error::WriteResultExt;
pub use spec::{DEFAULT_SCHEDULE, DEFAULT_TIME_ZONE, SpecBuilder, spec};
pub use types::{CatchUp, Limits, Overlap, Policies};

// What `export!` expands to in the job's crate refers to these by the path `leasehold_guest::`.
#[doc(hidden)]
pub use bindings::{
    __post_return_describe, __post_return_run_step, _export_describe_cabi, _export_run_step_cabi,
};

/// What most jobs need, for `use leasehold_guest::prelude::*`: the [`Guest`] trait, the
/// world's types, [`spec`] and [`WriteResultExt`]. The modules ([`store`], [`log`], [`state`],
/// [`json`]) are left out, to be named as `leasehold_guest::store` and so on.
pub mod prelude {
    pub use crate::{
        CatchUp, Guest, JobError, JobSpec, Overlap, RunInfo, StepOutcome, Term, WriteResultExt,
        spec,
    };
}
