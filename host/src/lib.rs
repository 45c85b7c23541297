//! Leasehold: singleton jobs across a cluster of identical replicas.
//!
//! Each job is a WebAssembly component. For each job the replicas campaign for a lease in
//! Redis; the winner runs the job's steps for one *term*, and every write it makes is fenced by
//! the term's token, so a leader that wakes from a pause cannot overwrite its successor's work.
//!
//! The code is in four layers, each using only those below it (the unit test in `layers.rs`
//! reads every `crate::` path and fails on one that points up, or on a file over 450 lines of
//! code whose doc does not say why):
//!
//! | layer | folder | what it holds |
//! |---|---|---|
//! | 4 | [`node`] | one replica: the jobs directory, configuration, HTTP API, what it serves |
//! | 3 | [`exec`] | what a leader does: the wasm runtime, specs, the runner, runs, fan-out |
//! | 2 | [`coord`] | who may write, who leads, who should lead: lease, term, fence, heartbeat |
//! | 1 | [`store`] | Redis: URLs, connections, cluster batches, every key, deployment checks |
//! | 0 | [`units`], [`setting`], [`metrics`], [`logging`] | leaves every layer may use |
//!
//! The command line and `leasehold demo` are modules of the binary (`src/main.rs`, layer 5),
//! not of this library. See `ARCHITECTURE.md` for how the pieces meet the design's invariants.

pub mod coord;
pub mod exec;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod setting;
pub mod store;
pub mod units;

#[cfg(test)]
mod layers;
