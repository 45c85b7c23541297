//! The Rust guest SDK for Leasehold jobs.
//!
//! A job is a `cdylib` built with `--target wasm32-wasip2` whose component implements the
//! `leasehold:job/job` world, version 0.4.3 (`wit/job.wit`), or the `fan-out-job` world when its
//! runs hand tasks to every replica ([`fan_out`]). This crate generates both worlds' bindings
//! once, so a job depends on `leasehold-guest` alone (not on `wit-bindgen`), and adds:
//!
//! - [`spec`]: a [`JobSpec`] builder in which everything left unset is the host's default;
//! - `From<`[`store::WriteError`]`>` and `From<`[`store::ReadError`]`>` for [`JobError`], so
//!   that `?` on a store call ends the step the way the WIT asks (a lost term as
//!   `lost-leadership`, an unreachable store as `not-ready`, the rest as `failed`), and
//!   [`WriteResultExt`] for a job that words its own errors;
//! - [`state`]: the step's state as JSON; [`json`]: store values as JSON;
//! - [`http`]: one outbound request through the host (`wasi:http`), which adds the term's
//!   token; a fenced receiver's `409` is [`http::Response::is_stale_term`].
//!
//! A complete job, as typed-state steps ([`Job`]; add `serde` with its `derive` feature to use
//! `#[derive(Serialize)]`):
//!
//! ```
//! use std::time::Duration;
//! use leasehold_guest::prelude::*;
//!
//! #[derive(Default, serde::Serialize, serde::Deserialize)]
//! struct Progress { next: u32 }
//!
//! struct Nightly;
//!
//! impl Job for Nightly {
//!     type State = Progress;
//!     fn spec() -> JobSpec {
//!         spec("nightly").schedule("0 0 2 * * *").retry(3, Duration::from_secs(60)).build()
//!     }
//!     fn step(_term: &Term, run: &RunInfo, p: &mut Progress) -> Result<Next, JobError> {
//!         leasehold_guest::store::write(&format!("part/{}/{}", run.period, p.next), b"done")?;
//!         p.next += 1;
//!         Ok(if p.next == 10 { Next::Done } else { Next::Continue })
//!     }
//! }
//!
//! leasehold_guest::job!(Nightly);
//! ```
//!
//! A step of a [`Job`] runs only while its term leads (the SDK checks before calling it).
//! `job!(Nightly)` implements [`Guest`] for it and calls `export!(Nightly)`, short for
//! `export!(Nightly with_types_in leasehold_guest)`, which emits the component's `describe`,
//! `databases` and `run-step` exports (and the world's type information) in the job's own crate.
//! A job whose steps use the `sql` import names its databases in [`Job::databases`] (the
//! world's `databases` export), so a host grants them without a sidecar, or refuses the job
//! naming the one it lacks. A crate calls
//! one of them once. A job that needs the raw world (the step number, its own state encoding)
//! implements [`Guest`] and calls `export!` itself; `term.ensure_leader()?` ([`LeaderCheck`])
//! is its leader check.
//!
//! A job that fans out implements [`fan_out::Guest`] instead (the same `describe`, `databases`
//! and `run_step`, and `run_task`) and exports it with `leasehold_guest::export_fan_out!(MyJob)`; its steps call
//! [`tasks`]. See [`fan_out`].
//!
//! The import functions ([`store`], [`log`], [`tasks`], [`Term`]'s methods) exist only in a
//! component run by the host: in a native build (unit tests) they panic when called.
//! Everything else here is plain Rust and runs natively.

#![warn(missing_docs)]

mod error;
pub mod http;
pub mod job;
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
        path: "wit",
        // The export macro is called in the job's crate, and finds the types here.
        pub_export_macro: true,
        default_bindings_module: "leasehold_guest",
        additional_derives: [PartialEq],
    });
}

/// The generated bindings of the `fan-out-job` world, sharing every interface of `job` with
/// [`bindings`]. Use [`fan_out`] and [`tasks`] instead.
#[doc(hidden)]
#[allow(missing_docs, clippy::all)]
pub mod fan_out_bindings {
    wit_bindgen::generate!({
        world: "fan-out-job",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "export_fan_out",
        default_bindings_module: "leasehold_guest::fan_out_bindings",
        with: {
            "leasehold:job/types@0.4.3": crate::bindings::leasehold::job::types,
            "leasehold:job/leadership@0.4.3": crate::bindings::leasehold::job::leadership,
            "leasehold:job/store@0.4.3": crate::bindings::leasehold::job::store,
            "leasehold:job/log@0.4.3": crate::bindings::leasehold::job::log,
            "leasehold:job/sql@0.4.3": crate::bindings::leasehold::job::sql,
            "leasehold:job/tasks@0.4.3": generate,
        },
        additional_derives: [PartialEq],
    });
}

/// Fan-out: a job whose steps hand tasks to every replica (the `fan-out-job` world).
///
/// A step submits tasks ([`tasks::submit`](crate::tasks::submit)) and returns
/// [`StepOutcome::AwaitTasks`](crate::StepOutcome::AwaitTasks) with its state; the host calls
/// the next step once every task has finished, and that step reads the outputs
/// ([`tasks::output`](crate::tasks::output)). Every replica runs the tasks with the job's
/// [`Guest::run_task`]: a task is a unit of work on its payload that returns an output, with
/// idempotent writes like a step's.
///
/// ```
/// use leasehold_guest::fan_out::{Guest, Task};
/// use leasehold_guest::prelude::*;
/// use leasehold_guest::tasks;
///
/// struct Squares;
///
/// impl Guest for Squares {
///     fn describe() -> JobSpec {
///         spec("squares").build()
///     }
///
///     fn databases() -> Vec<String> {
///         Vec::new() // no `sql`
///     }
///
///     fn run_step(_term: &Term, _run: RunInfo, step: u32, _state: Option<Vec<u8>>) -> Result<StepOutcome, JobError> {
///         if step == 0 {
///             let work: Vec<Task> = (0..4u8)
///                 .map(|i| Task { id: format!("n-{i}"), payload: vec![i] })
///                 .collect();
///             tasks::submit(&work)?;
///             return Ok(StepOutcome::AwaitTasks(Vec::new()));
///         }
///         let mut sum = 0u32;
///         for i in 0..4u8 {
///             let out = tasks::output(&format!("n-{i}"))?;
///             sum += u32::from(out.unwrap_or_default()[0]);
///         }
///         leasehold_guest::store::write("sum", sum.to_string().as_bytes())?;
///         Ok(StepOutcome::Done)
///     }
///
///     fn run_task(_term: &Term, _run: RunInfo, task: Task) -> Result<Vec<u8>, JobError> {
///         Ok(vec![task.payload[0] * task.payload[0]])
///     }
/// }
///
/// leasehold_guest::export_fan_out!(Squares);
/// ```
pub mod fan_out {
    pub use crate::fan_out_bindings::Guest;
    pub use crate::tasks::{Task, TaskProgress, TasksError};
}

pub use bindings::leasehold::job::{leadership, log, sql, store, types};
pub use bindings::{Guest, JobError, JobSpec, RunInfo, StepOutcome, Term, export};
pub use error::WriteResultExt;
pub use fan_out_bindings::export_fan_out;
pub use fan_out_bindings::leasehold::job::tasks;
pub use job::{Job, LeaderCheck, Next};
pub use spec::{DEFAULT_SCHEDULE, DEFAULT_TIME_ZONE, SpecBuilder, spec};
pub use types::{CatchUp, Limits, Overlap, Policies};

// What `export!` expands to in the job's crate refers to these by the path `leasehold_guest::`
// (and `export_fan_out!` to those of `fan_out_bindings`).
#[doc(hidden)]
pub use bindings::{
    __post_return_databases, __post_return_describe, __post_return_run_step,
    _export_databases_cabi, _export_describe_cabi, _export_run_step_cabi,
};

/// What most jobs need, for `use leasehold_guest::prelude::*`: the [`Guest`] and [`Job`]
/// traits, [`Next`], the world's types, [`spec`], [`LeaderCheck`] (`term.ensure_leader()?`)
/// and [`WriteResultExt`]. The modules ([`store`], [`log`], [`state`],
/// [`json`]) are left out, to be named as `leasehold_guest::store` and so on.
pub mod prelude {
    pub use crate::{
        CatchUp, Guest, Job, JobError, JobSpec, LeaderCheck, Next, Overlap, RunInfo, StepOutcome,
        Term, WriteResultExt, spec,
    };
}
