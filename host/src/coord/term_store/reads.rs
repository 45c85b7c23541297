//! What operators read of a job: its status ([`super::TermStore::job_status`], which HTTP
//! `GET /jobs/<job>` and the console's job page show) and its term history
//! ([`super::TermStore::history`]: `GET /jobs/<job>/terms`, `leasehold runs --terms`).

use std::time::Duration;

use crate::coord::terms::TermRecord;

/// A job's status, read at one moment (the lease's time left on etcd a moment later).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobStatus {
    /// Who holds the job (`node:uuid`), while a term does.
    pub owner: Option<String>,
    /// The holder's lease time left (Redis: milliseconds; etcd: whole seconds).
    pub left: Option<Duration>,
    /// The newest term's fencing token (the holder's while one holds the job), if it ever had
    /// a term.
    pub token: Option<u64>,
    /// Whether the job is paused.
    pub paused: bool,
    /// The last run's period, once a run ended.
    pub last_run: Option<String>,
    /// The job's storage count: keys and bytes (0 and 0 before its first write).
    pub usage: (u64, u64),
    /// The periods whose run is open, in text order.
    pub open: Vec<String>,
}

/// A job's term history as read: its terms, newest first, and how many entries did not read
/// (shown as a count, so that one bad entry does not hide the others).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TermHistory {
    /// The terms, newest first.
    pub terms: Vec<TermRecord>,
    /// Entries that did not parse, left out of `terms`.
    pub unparsed: usize,
}
