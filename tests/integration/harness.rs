//! Test helpers. The shared ones (Redis servers, host processes, waits, temporary directories,
//! guest components, the HTTP client) live in the `leasehold-harness` crate and are re-exported
//! here; this module adds what needs the binary under test (`CARGO_BIN_EXE_leasehold`, known
//! only to this test binary) or the tests' reading of run records. Each helper documents what
//! it waits for and how long.

use std::path::Path;

pub(crate) use leasehold_harness::fixtures::{deploy_billing, new_version};
pub(crate) use leasehold_harness::{
    HostProcess, RedisConfig, RedisServer, TempDir, deadline, guests, http, http_with,
    output_within, repo_root, wait_for,
};

/// A connection to `redis` as a host opens one ([`leasehold::store::Conn`]).
pub(crate) async fn conn(redis: &RedisServer) -> leasehold::store::Conn {
    conn_to(&redis.url()).await
}

/// A connection to the Redis (or Redis Cluster) `url` names, as a host opens one.
pub(crate) async fn conn_to(url: &str) -> leasehold::store::Conn {
    leasehold::store::Conn::connect(
        url,
        std::time::Duration::from_secs(2),
        Some(std::time::Duration::from_secs(5)),
    )
    .await
    .unwrap_or_else(|e| panic!("connecting to {url}: {e:#}"))
}

/// The `leasehold` binary under test.
pub(crate) const LEASEHOLD: &str = env!("CARGO_BIN_EXE_leasehold");

/// Starts `leasehold <args…>` with extra environment variables `env`, logging JSON with
/// leasehold's debug events ([`HostProcess::start`]).
pub(crate) fn start_host_with_env(args: &[&str], env: &[(&str, &str)]) -> HostProcess {
    HostProcess::start(Path::new(LEASEHOLD), args, env)
}

/// Runs `leasehold <args>` to completion (without `LEASEHOLD_REDIS_URL` from the
/// environment); the process must exit within 30 s ([`output_within`]).
pub(crate) fn run_leasehold<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    let mut cmd = std::process::Command::new(LEASEHOLD);
    cmd.args(args).env_remove("LEASEHOLD_REDIS_URL");
    output_within(cmd)
}

/// [`run_leasehold`] with a deadline of `limit`: for a `check` that compiles a large
/// component (a componentize-py job takes tens of seconds in a debug host on a busy machine).
pub(crate) fn run_leasehold_within<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
    limit: std::time::Duration,
) -> std::process::Output {
    let mut cmd = std::process::Command::new(LEASEHOLD);
    cmd.args(args).env_remove("LEASEHOLD_REDIS_URL");
    leasehold_harness::output_in(cmd, limit)
}

/// Runs `leasehold trigger JOB --period PERIOD` against `redis`; panics unless it succeeds, and
/// returns what it printed.
pub(crate) fn trigger(redis: &RedisServer, job: &str, period: &str) -> String {
    leasehold_harness::process::trigger(LEASEHOLD, &redis.url(), job, period)
}

/// A sidecar's first line that pins a yearly fixture (`0 0 0 1 1 *`: `probe`, `sqlprobe`,
/// `oldsql`, `tasker`, `httpprobe`) to 2026: its only period is then `2026-01-01` in any later
/// year too, so that tests naming that period, and the fixture's own catch-up of it, behave the
/// same whatever the date.
pub(crate) const PINNED_TO_2026: &str = "schedule = \"0 0 0 1 1 * 2026\"\n";

/// `value()` once it equals `want` (polled for up to 5 s), else its last value: for counts of
/// log lines, which reach the harness a moment after what they describe (a process's output is
/// read on a thread of its own).
pub(crate) async fn settled<T: PartialEq>(want: &T, mut value: impl FnMut() -> T) -> T {
    let _ = leasehold_harness::poll_until(
        "log lines to arrive",
        std::time::Duration::from_secs(5),
        std::time::Duration::from_millis(20),
        || {
            let ok = value() == *want;
            async move { ok.then_some(()) }
        },
    )
    .await;
    value()
}

/// `op`'s answer, retried while it fails, for up to 30 s: for a store's requests that can fail
/// for a moment (an etcd cluster electing a leader, which a loaded machine can make it do at
/// any time).
pub(crate) async fn answered<T, E, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    wait_for(what, std::time::Duration::from_secs(30), || {
        let fut = op();
        async move { fut.await.ok() }
    })
    .await
}

/// The owner (`node:uuid`) of `job`'s lease, once one holds it (waits up to 30 s: between two
/// terms, during a hand-over, the key is briefly absent).
pub(crate) async fn lease_owner(redis: &RedisServer, job: &str) -> String {
    wait_for(
        &format!("a holder of {job}'s lease"),
        std::time::Duration::from_secs(30),
        || async {
            redis::AsyncCommands::get::<_, Option<String>>(
                &mut redis.conn().await,
                format!("lh:{{{job}}}:lease"),
            )
            .await
            .ok()
            .flatten()
        },
    )
    .await
}

/// The member `job` prefers among the nodes `n0`..`n{hosts - 1}`, all of capacity 1: the one
/// balancing settles the job on.
pub(crate) fn preferred_node(job: &str, hosts: usize) -> String {
    let members: leasehold::coord::members::Members = (0..hosts)
        .map(|i| {
            (
                format!("n{i}"),
                leasehold::coord::members::MemberInfo::with_capacity(1),
            )
        })
        .collect();
    leasehold::coord::members::preferred(job, &members, None)
        .expect("a member")
        .to_string()
}

/// The run record of `job`'s `period`, if there is one.
pub(crate) async fn run_record(
    redis: &RedisServer,
    job: &str,
    period: &str,
) -> Option<serde_json::Value> {
    let raw: Option<String> = redis::AsyncCommands::get(
        &mut redis.conn().await,
        format!("lh:{{{job}}}:run:{period}"),
    )
    .await
    .unwrap();
    raw.map(|r| serde_json::from_str(&r).unwrap())
}

/// Every run record of `job`, sorted by period.
pub(crate) async fn run_records(redis: &RedisServer, job: &str) -> Vec<serde_json::Value> {
    let mut c = redis.conn().await;
    let mut keys: Vec<String> = redis::AsyncCommands::keys(&mut c, format!("lh:{{{job}}}:run:*"))
        .await
        .unwrap();
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        let raw: String = redis::AsyncCommands::get(&mut c, &k).await.unwrap();
        out.push(serde_json::from_str(&raw).unwrap());
    }
    out
}

/// Deploys the reconciliation component into `jobs` and the hand-checked sample day `day`
/// (`guest-jobs/reconciliation/sample/<day>/`) into `data/reconciliation/<day>/`.
pub(crate) fn deploy_sample_reconciliation(jobs: &Path, data: &Path, day: &str) {
    std::fs::create_dir_all(jobs).unwrap();
    std::fs::copy(
        guests().wasm("reconciliation"),
        jobs.join("reconciliation.wasm"),
    )
    .unwrap();
    let dest = data.join(format!("reconciliation/{day}"));
    std::fs::create_dir_all(&dest).unwrap();
    let sample = repo_root().join(format!("guest-jobs/reconciliation/sample/{day}"));
    for f in ["bank.csv", "ledger.csv"] {
        std::fs::copy(sample.join(f), dest.join(f)).unwrap();
    }
}

/// I3 from each host's own events (`hosts`, with JSON logs), on its monotonic clock: every grant
/// or renewal gives at most `window_ms` (ttl − margin) from when it was sent, and every fenced
/// write that the store accepted was sent before the writer's deadline. Panics on the first
/// event that breaks it, or when the logs hold no grant or no accepted write.
pub(crate) fn check_host_events(hosts: &[HostProcess], window_ms: u64) {
    let (mut grants, mut writes) = (0, 0);
    for (i, host) in hosts.iter().enumerate() {
        for line in host.log() {
            let Ok(e) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let (sent, deadline) = (e["sent_ms"].as_u64(), e["deadline_ms"].as_u64());
            match (e["message"].as_str(), sent, deadline) {
                (Some("became leader" | "renewed"), Some(sent), Some(deadline)) => {
                    grants += 1;
                    assert!(
                        deadline <= sent + window_ms + 1,
                        "n{i} granted itself until {deadline} for a call sent at {sent} (window {window_ms} ms): {line}"
                    )
                }
                (Some("fenced write"), Some(sent), Some(deadline)) if e["result"] == "accepted" => {
                    writes += 1;
                    assert!(
                        sent < deadline,
                        "n{i} sent a write at {sent}, after its deadline {deadline}: {line}"
                    )
                }
                _ => {}
            }
        }
    }
    assert!(
        grants > 0 && writes > 0,
        "no grant or write events in the hosts' logs"
    );
}

/// How many terms each of `hosts` has logged so far ("became leader"), for [`new_leader`].
pub(crate) fn terms_logged(hosts: &[HostProcess]) -> Vec<usize> {
    hosts
        .iter()
        .map(|h| h.log_lines_with("became leader").len())
        .collect()
}

/// The first of `hosts` other than `except` to log a term beyond `before` (its count from
/// [`terms_logged`]), and that term's log line; waits up to `limit`.
pub(crate) async fn new_leader(
    hosts: &[HostProcess],
    before: &[usize],
    except: usize,
    limit: std::time::Duration,
) -> (usize, String) {
    wait_for("a new leader", limit, || {
        let found = (0..hosts.len()).filter(|i| *i != except).find_map(|i| {
            let lines = hosts[i].log_lines_with("became leader");
            lines.get(before[i]).map(|l| (i, l.clone()))
        });
        async move { found }
    })
    .await
}
