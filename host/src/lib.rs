//! Leasehold: singleton jobs across a cluster of identical replicas.
//!
//! Each job is a WebAssembly component. For each job the replicas campaign for a lease in
//! Redis; the winner runs the job's steps for one *term*, and every write it makes is fenced by
//! the term's token, so a leader that wakes from a pause cannot overwrite its successor's work.
//!
//! Where to start reading (see also `ARCHITECTURE.md`):
//!
//! * [`node`] — one replica: start and stop electors and runners, shut down in order;
//!   `jobs_dir` — the watched jobs directory (add, replace, remove, partial writes);
//!   `catalog` — what the node serves, as the HTTP API reads it.
//! * [`elector`] — the per-job election state machine; [`term`] — a term and its local deadline.
//! * [`lease`] and [`fence`] — the Redis scripts that make election and fencing atomic;
//!   [`quota`] — per-job storage quotas, counted by the fenced-write script.
//! * `runner` — drives a job's runs while leading (its rules are pure functions in
//!   `runner::decide`); [`runs`] — run records, checkpoints, requests.
//! * [`runtime`] — the wasmtime wrapper and the host side of the `job` world (`wit/job.wit`):
//!   engine, loading, host imports, steps, the sandbox and the compiled-code cache.
//! * [`spec`] — job specs: limits, policies, sidecars, schedules and periods.
//! * [`config`] — host configuration from raw values to validated ones (timings, I4; limits;
//!   node id), every rule in one place.
//! * [`metrics`] — Prometheus metrics; `http` — the HTTP API (`--http`); [`logging`] — human
//!   or JSON logs, with each job's span fields on every line.
//! * [`keys`] — the Redis key layout (its table is in ARCHITECTURE.md); [`redis_conn`] —
//!   connections; [`units`] — durations and sizes as people write them;
//!   [`deployment`] — what the host checks about its Redis at start-up (version, eviction).
//!
//! The command line and `leasehold demo` are modules of the binary (`src/main.rs`), not of this
//! library. Modules without a link above are crate-private.

pub(crate) mod balance;
pub mod campaigns;
mod catalog;
pub mod checks;
pub mod config;
pub(crate) mod deployment;
pub mod elector;
pub mod fence;
pub mod heartbeat;
mod http;
mod jobs_dir;
pub mod keys;
pub mod lease;
pub mod logging;
pub mod members;
pub(crate) mod metrics;
pub mod node;
pub mod quota;
pub mod redis_conn;
mod runner;
pub mod runs;
pub mod runtime;
pub mod spec;
pub mod tasks;
pub mod term;
pub mod units;
pub mod workers;
