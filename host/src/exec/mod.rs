//! Execution: what a leader does with its term. The third layer: it uses [`crate::coord`] (the
//! term, the fenced write, the heartbeat) and [`crate::store`], never [`crate::node`].
//!
//! * [`runtime`] — the wasmtime wrapper and the host side of the `job` world (`wit/job.wit`):
//!   engine, loading, host imports, steps, the sandbox and the compiled-code cache.
//! * [`spec`] — job specs: limits, policies, sidecars, schedules and periods.
//! * `runner` — drives a job's runs while leading (its rules are pure functions in
//!   `runner::decide`); [`runs`] — run records, checkpoints, requests.
//! * [`http`] — outbound HTTP for jobs: granted destinations only, the term's token on every
//!   request, addresses and timeouts checked by the host.
//! * [`sql`] — PostgreSQL for jobs: configured databases, pooled connections, transactions
//!   fenced inside the database, statements refused before they are sent.
//! * [`tasks`] — fan-out tasks in a Redis stream, claimed and fenced; [`workers`] — the task
//!   workers every host runs.

pub mod http;
pub(crate) mod runner;
pub mod runs;
pub mod runtime;
pub mod spec;
pub mod sql;
pub mod tasks;
pub mod workers;
