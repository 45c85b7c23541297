//! Integration tests: a real `redis-server` (started per test by the `leasehold-harness` crate,
//! on a port of its own) and, where a test says so, real `leasehold` processes (an HTTP API
//! binds port 0 and the test reads the bound address from the host's log). One test binary;
//! the modules below are its index.
//!
//! The guest components are built before the tests, not by them: `./dev guests` (`./dev test`
//! does it), or point `LEASEHOLD_GUESTS_DIR` at a directory of built `.wasm` files.
//!
//! Every test has a whole-test deadline ([`harness::deadline`]) and waits on conditions
//! ([`harness::wait_for`]), never on fixed sleeps.

// Test helpers: the `leasehold-harness` crate re-exported (Redis servers, host processes,
// waits, temporary directories, guest components, HTTP), plus wrappers that pass the binary
// under test, and run-record readers.
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

// A history of applied writes (Redis MONITOR) and the fencing checker, from the harness crate;
// the checker's own test.
mod history;

// The run bookkeeping under the fence with real hosts: a late write of an ended term cannot
// drop an operator's request or strand a successor's run; a corrupt record blocks nothing.
mod bookkeeping;

// PostgreSQL under the fence (the `sql` import, a real `postgres` per test): terms serialised by
// the fence row, every escape from the transaction refused, a frozen, killed or cut-off leader's
// transaction never landing, a database ahead of Redis's tokens, `leasehold db init`.
mod sql;
// The operator console over HTTP with three replicas: the cluster on every node, sign-in and
// CSRF (a refused action changes nothing), hostile guest text escaped, a crash followed.
mod console;
// The console in headless Chromium (chromedriver, WebDriver): a crash followed without a reload,
// sign-in and trigger from the page, hostile text inert, every action reachable by keyboard.
mod browser;
// Outbound HTTP under the token (`wasi:http`, a fenced receiver in the harness): granted
// destinations only, the token headers the guest cannot touch, the limits, and a zombie's late
// request never sent or refused by the receiver.
mod http;

// A randomized soak: random faults and operator actions against three billing replicas, checked
// against the applied history (LEASEHOLD_SOAK_ROUNDS, LEASEHOLD_SOAK_SEED; `./dev soak`).
mod soak;

// The store contract for terms (`coord::term_store`), the same tests against a real Redis and
// a real 3-member etcd: one term at a time, growing tokens, fenced writes, a lapsed term.
mod contract;
// Operators' writes through the seam on both stores (requests, the pause flag, the served jobs'
// lists) and the run history they read, and the CLI's trigger, cancel, pause, resume and runs on
// etcd.
mod operators;
// Terms on etcd under faults (the etcd store's first part, issue 30): a member cut off with its
// holder, a minority without a leader, a member killed under a live term.
mod etcd;
// The history etcd applied, read back from its revisions, and the fencing checker on it (with
// the checker's own tests).
mod etcd_history;
// The reference scenario with real hosts on etcd: the leader crashed, frozen, stopped; etcd's
// leader killed; the leader's member left without a leader. Every history checked.
mod etcd_hosts;
// The randomized soak on etcd: billing replicas under host and etcd-member faults, checked
// against etcd's history (LEASEHOLD_SOAK_ROUNDS, LEASEHOLD_SOAK_SEED; `./dev soak --store etcd`).
mod etcd_soak;

// --min-replicas: writes wait for Redis replicas, and fail without them.
mod replicas;

// Redis Sentinel: real sentinels fail the primary over mid-run; the hosts follow the new
// primary and the run finishes with every acknowledged charge.
mod sentinel;

// Membership and balancing with real hosts: preferred members lead, survivors take over, a
// returning replica gets its jobs back by graceful hand-overs.
mod balance;

// Redis Cluster: scripts across primaries, hosts failing over on a cluster, release notices
// across nodes, a running job's slot moved to another primary mid-run, and a primary that dies
// and is replaced by its replica.
mod cluster;

// Fan-out: tasks on every replica; a worker killed or frozen mid-task, a leader killed while
// tasks run, a task that traps; the task scripts' fencing in process.
mod fanout;

// Election between in-process electors: one leader, takeover with a higher token.
mod election;

// End to end: a `leasehold run` process reconciles the sample day exactly once.
mod end_to_end;

// Three replicas: crash (SIGKILL), zombie (SIGSTOP/SIGCONT) and graceful (SIGTERM) mid-run.
mod failover;

// A job written in Python (componentize-py): check, a leader killed mid-run, an exception's
// traceback in the run record.
mod python;

// `leasehold new`: the Rust and Python scaffolds build and pass `check`.
mod scaffold;

// The billing guest through crash and zombie failovers: one charge per customer per period, in
// the store or in a PostgreSQL ledger.
mod billing;

// Operating a host: status, health, metrics, `leasehold status`, the bearer token, the compose
// file, Redis ACL users.
mod operate;
