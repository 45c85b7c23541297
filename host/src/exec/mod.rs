//! Execution: what a leader does with its term. The third layer: it uses [`crate::coord`] (the
//! term, the fenced write, the heartbeat) and [`crate::store`], never [`crate::node`].
//!
//! * [`runtime`] — the wasmtime wrapper and the host side of the `job` world (`wit/job.wit`):
//!   engine, loading, host imports, steps, the sandbox and the compiled-code cache.
//! * [`spec`] — job specs: limits, policies, sidecars, schedules and periods.
//! * `runner` — drives a job's runs while leading (its rules are pure functions in
//!   `runner::decide`); [`runs`] — run records, checkpoints, requests.
//! * [`tasks`] — fan-out tasks in a Redis stream, claimed and fenced; [`workers`] — the task
//!   workers every host runs.

pub(crate) mod runner;
pub mod runs;
pub mod runtime;
pub mod spec;
pub mod tasks;
pub mod workers;
