//! Integration tests: a real `redis-server` (started per test on a free port) and, where a
//! test says so, real `leasehold` processes. One test binary; the modules below are its index.
//!
//! Every test has a whole-test deadline ([`harness::deadline`]) and waits on conditions
//! ([`harness::wait_for`]), never on fixed sleeps.

// Shared helpers: Redis server, guest builds, host processes, waiting.
mod harness;

// A fault proxy between a host and Redis: latency, hold-then-release, blackhole.
mod proxy;

// The lease scripts: a table of acquire / renew / release cases.
mod lease;

// The fence: stale tokens, equal tokens from another holder, term-start fencing, token
// re-seeding after the counter or the whole database is lost.
mod fence;

// Start-up configuration errors, through the real binary.
mod config;

// The compiled-code cache across restarts.
mod cache;

// `leasehold check` and refusing bad job files.
mod check;

// Guest containment: the only way a guest changes anything is the fenced import.
mod containment;

// Hostile guests in a real host: each fails only its own run; a neighbour job keeps its lease.
mod hostile;

// Schedules and runs: catch-up policies, DST, retries, overlap, max run time, pause, triggers.
mod schedule;

// The live jobs directory: add, replace (runs keep their version), refuse, remove, partial writes.
mod jobs_dir;

// A history of applied writes (Redis MONITOR) and the fencing checker.
mod history;

// Election between in-process electors: one leader, takeover with a higher token.
mod election;

// End to end: a `leasehold run` process reconciles the sample day exactly once.
mod end_to_end;

// Three replicas: crash (SIGKILL), zombie (SIGSTOP/SIGCONT) and graceful (SIGTERM) mid-run.
mod failover;

// The billing guest through crash and zombie failovers: one charge per customer per period.
mod billing;

// Operating a host: status, health, metrics, `leasehold status`, the bearer token, the compose
// file, Redis ACL users.
mod operate;
