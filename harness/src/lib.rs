//! Support for running Leasehold for real, shared by the integration tests
//! (`tests/integration`), the benchmarks (`host/benches/leasehold.rs`) and `leasehold demo`
//! (`host/src/demo.rs`), so none of them repeats process set-up or teardown.
//!
//! * [`cluster`] — a Redis Cluster of such servers, joined by `redis-cli --cluster create`,
//!   with a slot moved between primaries on demand.
//! * [`redis`] — `redis-server` processes the harness starts on ports it picks, and kills on
//!   drop (plain, with an append-only file, or TLS-only).
//! * [`etcd`] — etcd clusters (Debian's `etcd`, 3.4) on ports it picks, members killed,
//!   paused and resumed on demand, for the etcd store (issue 30).
//! * [`postgres`] — a PostgreSQL server of its own (`initdb` and `postgres` on a port it picks,
//!   plain or also speaking TLS), for the fenced `sql` import.
//! * [`sentinel`] — Redis Sentinel processes monitoring a primary (`redis-sentinel`), for
//!   failovers done by Sentinel.
//! * [`process`] — `leasehold` processes: the binary is a parameter (tests and benches pass
//!   `env!("CARGO_BIN_EXE_leasehold")`, the demo its own executable); logs captured in memory,
//!   signals, the HTTP address a host bound on port 0, teardown on drop.
//! * [`wait`] — whole-test deadlines and polling waits on conditions, never fixed sleeps.
//! * [`temp`] — temporary directories removed on drop.
//! * [`tls`] — a private CA and a server certificate for `127.0.0.1`, made with `openssl`.
//! * [`mod@guests`] — the guest components: located where `./dev guests` built them (tests), or
//!   built once as an explicit first step (benchmarks).
//! * [`history`] — what Redis applied, recorded with `MONITOR`, and the fencing checker.
//! * [`mod@http`] — a tiny HTTP/1.1 client for the host's API.
//! * [`fixtures`] — a generated reconciliation day written to a data directory.
//!
//! Everything here panics on failure unless a `try_` variant or an `io::Result` says
//! otherwise: callers are tests, benchmarks and a demo, where a failed set-up ends the run.

pub mod cluster;
pub mod etcd;
pub mod fixtures;
pub mod guests;
pub mod history;
pub mod http;
pub mod postgres;
pub mod process;
pub mod receiver;
pub mod redis;
pub mod sentinel;
pub mod temp;
pub mod tls;
pub mod wait;

use std::path::{Path, PathBuf};

pub use self::cluster::RedisCluster;
pub use self::etcd::EtcdCluster;
pub use self::guests::{Guests, componentize_py, guests};
pub use self::http::{http, http_with};
pub use self::postgres::PgServer;
pub use self::process::{HostProcess, output_in, output_within};
pub use self::receiver::Receiver;
pub use self::redis::{RedisConfig, RedisServer};
pub use self::temp::TempDir;
pub use self::tls::TestCa;
pub use self::wait::{TimedOut, deadline, poll_until, wait_for};

/// The repository root (the directory holding `harness/`, `host/` and `guest-jobs/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness crate lives in the repository root")
        .to_path_buf()
}
