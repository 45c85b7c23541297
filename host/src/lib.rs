//! Leasehold: singleton jobs across a cluster of identical replicas.
//!
//! Each job is a WebAssembly component. For each job the replicas campaign for a lease in
//! Redis; the winner runs the job's steps for one *term*, and every write it makes is fenced by
//! the term's token, so a leader that wakes from a pause cannot overwrite its successor's work.
//!
//! Where to start reading (see also `ARCHITECTURE.md`):
//!
//! * [`node`] — one replica: start and stop electors and runners, shut down in order;
//!   [`jobs_dir`] — the watched jobs directory (add, replace, remove, partial writes).
//! * [`elector`] — the per-job election state machine; [`term`] — a term and its local deadline.
//! * [`lease`] and [`fence`] — the Redis scripts that make election and fencing atomic.
//! * [`runner`] — drives a job's runs while leading; [`runs`] — run records and checkpoints.
//! * [`runtime`] — the wasmtime wrapper and the host side of the `job` world (`wit/job.wit`);
//!   [`sandbox`] — the memory budget and the guest's stderr; [`cache`] — compiled code kept.
//! * [`spec`] — job specs, schedules and periods; [`config`] — validated timings (I4).
//! * [`metrics`] — Prometheus metrics; [`http`] — the HTTP API (`--http`): trigger, pause, resume, run history.
//! * [`keys`] — the Redis key layout; [`demo`] — `leasehold demo`, the narrated reference scenario.

pub mod cache;
pub mod cli;
pub mod config;
pub mod demo;
pub mod elector;
pub mod fence;
pub mod http;
pub mod jobs_dir;
pub mod keys;
pub mod lease;
pub mod metrics;
pub mod node;
pub mod redis_conn;
pub mod runner;
pub mod runs;
pub mod runtime;
pub mod sandbox;
pub mod spec;
pub mod term;
