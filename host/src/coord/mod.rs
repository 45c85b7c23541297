//! Coordination: who may write, who leads, who should lead. The second layer: it uses
//! [`crate::store`] (connections, keys) and the leaves ([`crate::units`], [`crate::metrics`]),
//! never [`crate::exec`] or [`crate::node`]; what an upper layer needs carried in the heartbeat
//! it registers there ([`heartbeat::Heartbeat::poll`], [`heartbeat::Member::tasks`]).
//!
//! * [`lease`] — the lease scripts (campaign, renew, release, observe); [`term`] — a term and
//!   its local deadline; [`terms`] — the capped history of a job's terms; [`timing`] — the lease timings and their relations (I4).
//! * [`fence`] — the one way a term writes (the fenced-write script, its bookkeeping);
//!   [`checks`] — the term and claim checks every script shares, and their refusals;
//!   [`quota`] — per-job storage quotas, counted by the fenced-write script.
//! * [`elector`] — the per-job election state machine, on the [`lease_thread`]; [`notices`] —
//!   release and work notices over pub/sub; [`campaigns`] — campaigns coalesced
//!   into round trips; [`heartbeat`] — membership, renewals, looks and registered reads in one
//!   round trip per heartbeat.
//! * [`members`] — the membership and its view; `balance` — who should lead which job.
//! * [`term_store`] — the seam between a term and its store (Redis or etcd); the host's term
//!   writes, campaigns, releases, runner reads and listener go through it, its heartbeat and
//!   tasks not yet (issue 30).

pub(crate) mod balance;
pub mod campaigns;
pub mod checks;
pub mod elector;
pub mod fence;
pub mod heartbeat;
pub mod lease;
pub mod lease_thread;
pub mod members;
pub mod notices;
pub mod quota;
pub mod term;
pub mod term_store;
pub mod terms;
pub mod timing;
