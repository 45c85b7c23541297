//! Redis Cluster: a real local cluster of three primaries with a replica each, made by the
//! harness with `redis-cli --cluster create`. The lease, fence and batch scripts across
//! primaries; real hosts reconciling a day and failing over on it; a graceful hand-over that
//! only the release notice can make in time (pub/sub on a cluster); the slot of a running
//! job moved to another primary mid-run, with exactly one `done` and every write fenced in the
//! history of every primary; and the primary holding a running job killed, its replica
//! promoted, the hosts following it to the end of the run.

use std::path::Path;
use std::time::Duration;

use leasehold::coord::fence::{self, FenceError, Refusal, TermWrite};
use leasehold::coord::lease::{self, Acquired, Campaign};
use leasehold::coord::terms::TermEnd;
use leasehold::store::keys::JobKeys;
use leasehold::store::{Conn, slot_of};
use leasehold_harness::RedisCluster;
use leasehold_harness::fixtures::write_generated_day;
use redis::AsyncCommands;
use serde_json::Value;

use crate::harness::{
    HostProcess, LEASEHOLD, TempDir, conn_to, deadline, guests, run_leasehold, wait_for,
};
use crate::history::Recorder;

const PERIOD: &str = "2026-11-27";

/// The value of `key`, wherever its slot lives.
async fn get(conn: &mut Conn, key: &str) -> Option<String> {
    conn.get(key).await.unwrap()
}

/// The run record of the reconciliation's period.
async fn record(conn: &mut Conn) -> Option<Value> {
    get(conn, &format!("lh:{{reconciliation}}:run:{PERIOD}"))
        .await
        .map(|r| serde_json::from_str(&r).unwrap())
}

async fn wait_done(conn: &Conn, limit: Duration) -> Value {
    wait_for("the run to be done", limit, || {
        let mut c = conn.clone();
        async move { record(&mut c).await.filter(|r| r["status"] == "done") }
    })
    .await
}

/// `leasehold trigger reconciliation --period PERIOD` against the cluster.
fn trigger(url: &str) {
    let out = run_leasehold(&[
        "trigger",
        "reconciliation",
        "--period",
        PERIOD,
        "--redis-url",
        url,
    ]);
    assert!(
        out.status.success(),
        "trigger failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A jobs directory with the reconciliation and a generated day of `rows` lines; the day's
/// expected totals.
fn deploy(dir: &TempDir, rows: usize) -> recon_core::Totals {
    std::fs::create_dir_all(dir.join("jobs")).unwrap();
    std::fs::copy(
        guests().wasm("reconciliation"),
        dir.join("jobs/reconciliation.wasm"),
    )
    .unwrap();
    write_generated_day(&dir.join("data"), "reconciliation", PERIOD, rows, 7)
        .unwrap()
        .expected
}

/// Steps done by every host together.
fn steps(hosts: &[HostProcess]) -> usize {
    hosts
        .iter()
        .map(|h| h.log_lines_with("\"step done\"").len())
        .sum()
}

/// Waits until some host leads.
async fn a_leader(hosts: &[HostProcess]) {
    wait_for("a leader", Duration::from_secs(60), || {
        let led = hosts
            .iter()
            .any(|h| !h.log_lines_with("became leader").is_empty());
        async move { led.then_some(()) }
    })
    .await;
}

fn host(url: &str, dir: &Path, node: &str, timing: (&str, &str)) -> HostProcess {
    let data = dir.join("data");
    HostProcess::start_node(
        LEASEHOLD,
        url,
        &dir.join("jobs"),
        node,
        timing,
        &["--data-dir", data.to_str().unwrap()],
    )
}

async fn totals(conn: &mut Conn) -> recon_core::Totals {
    let summary = get(conn, &format!("lh:{{reconciliation}}:data:report/{PERIOD}"))
        .await
        .expect("the report");
    let summary: Value = serde_json::from_str(&summary).unwrap();
    serde_json::from_value(summary["totals"].clone()).unwrap()
}

#[tokio::test]
async fn leases_fences_and_batches_work_across_primaries() {
    deadline(Duration::from_secs(120), async {
        let cluster = RedisCluster::start(3, 1).await;
        let mut conn = conn_to(&cluster.url()).await;
        assert!(conn.is_cluster());
        // Twelve jobs, whose hash tags land on every primary.
        let jobs: Vec<JobKeys> = (0..12).map(|i| JobKeys::new(&format!("c{i}"))).collect();
        let mut owners = std::collections::BTreeSet::new();
        for k in &jobs {
            assert_eq!(slot_of(&k.lease()), cluster.slot_of(&k.lease()).await);
            owners.insert(cluster.owner_of(slot_of(&k.lease())).await);
        }
        assert_eq!(owners.len(), 3, "the jobs do not reach every primary");
        let ttl = Duration::from_secs(10);
        let campaigns: Vec<Campaign> = jobs
            .iter()
            .map(|k| Campaign {
                keys: k.clone(),
                owner: "n1:a".into(),
                ttl,
                ask: None,
            })
            .collect();
        // One batch (a pipeline per primary): every acquire answers for itself.
        let tokens: Vec<u64> = lease::acquire_many(&mut conn, &campaigns)
            .await
            .into_iter()
            .map(|a| match a {
                Ok(Acquired::Granted { token }) => token,
                other => panic!("not granted: {other:?}"),
            })
            .collect();
        let renewed = lease::renew_many(&mut conn, jobs.iter().map(|k| (k, "n1:a")), ttl).await;
        assert!(renewed.iter().all(|r| matches!(r, Ok(true))), "{renewed:?}");
        // Another owner finds every lease held.
        for k in &jobs {
            let held = lease::acquire(&mut conn, k, "n2:b", ttl).await.unwrap();
            assert!(matches!(held, Acquired::Held { ref holder, .. } if holder == "n1:a"));
        }
        // Fenced writes on every primary; a stale token and a released lease are refused.
        for (k, token) in jobs.iter().zip(&tokens) {
            let value = b"v".as_slice();
            fence::unchecked::write(&mut conn, k, "n1:a", *token, &[(k.data("x"), value)])
                .await
                .unwrap();
            let stale =
                fence::unchecked::write(&mut conn, k, "n1:a", token - 1, &[(k.data("x"), value)])
                    .await;
            assert!(matches!(
                stale,
                Err(FenceError::Refused(Refusal::Stale { .. }))
            ));
        }
        let k = &jobs[0];
        assert!(
            lease::release(&mut conn, k, "n1:a", TermEnd::Released)
                .await
                .unwrap()
        );
        let gone = fence::unchecked::invoke(
            &mut conn,
            k,
            ("n1:a", tokens[0]),
            &TermWrite::new(&[(k.data("x"), b"late".as_slice())], &[]),
        )
        .await;
        assert!(matches!(
            gone,
            Err(FenceError::Refused(Refusal::NotLeaseholder { .. }))
        ));
        assert_eq!(get(&mut conn, &k.data("x")).await.as_deref(), Some("v"));
    })
    .await;
}

#[tokio::test]
async fn hosts_reconcile_on_a_cluster_and_a_crashed_leader_is_replaced() {
    deadline(Duration::from_secs(300), async {
        let cluster = RedisCluster::start(3, 1).await;
        let url = cluster.url();
        let dir = TempDir::new("cluster-crash");
        let expected = deploy(&dir, 30_000);
        let recorder = Recorder::start_cluster(&cluster).await;
        let mut hosts: Vec<HostProcess> = (0..3)
            .map(|i| host(&url, dir.path(), &format!("n{i}"), ("1s", "200ms")))
            .collect();
        let conn = conn_to(&url).await;
        a_leader(&hosts).await;
        trigger(&url);
        // The run's leader, two steps in, is killed.
        let leader = wait_for("two steps done", Duration::from_secs(120), || {
            let found = hosts
                .iter()
                .position(|h| h.log_lines_with("\"step done\"").len() >= 2);
            async move { found }
        })
        .await;
        hosts[leader].kill();
        let record = wait_done(&conn, Duration::from_secs(180)).await;
        assert_ne!(record["node"], format!("n{leader}"), "{record}");
        let resumed: usize = hosts
            .iter()
            .map(|h| h.log_lines_with("resuming run from its checkpoint").len())
            .sum();
        assert!(resumed >= 1, "no host resumed the run from its checkpoint");
        assert_eq!(totals(&mut conn.clone()).await, expected);
        let history = recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated:\n{v}"));
        assert_eq!(history.done_records("reconciliation", PERIOD).len(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_graceful_hand_over_on_a_cluster_needs_no_ttl() {
    // The lease lives 60 s; the test's deadline is 60 s in all. Only the release notice,
    // published by a script on the job's primary and heard on another node, makes the
    // follower lead in time.
    deadline(Duration::from_secs(60), async {
        let cluster = RedisCluster::start(3, 0).await;
        let url = cluster.url();
        let dir = TempDir::new("cluster-graceful");
        deploy(&dir, 100);
        let mut a = host(&url, dir.path(), "g-a", ("60s", "10s"));
        a.wait_for_log("became leader", Duration::from_secs(30))
            .await;
        let b = host(&url, dir.path(), "g-b", ("60s", "10s"));
        b.wait_for_log("\"following\"", Duration::from_secs(30))
            .await;
        assert!(a.terminate(Duration::from_secs(10)).await, "a did not stop");
        b.wait_for_log("became leader", Duration::from_secs(20))
            .await;
    })
    .await;
}

/// Two hosts (`{prefix}0`, `{prefix}1`; ttl 2 s, heartbeat 400 ms) on the cluster at `url`
/// serving `dir`, and the day triggered: returns once the run has done a step.
async fn two_hosts_mid_run(url: &str, dir: &TempDir, prefix: &str) -> Vec<HostProcess> {
    let hosts: Vec<HostProcess> = (0..2)
        .map(|i| host(url, dir.path(), &format!("{prefix}{i}"), ("2s", "400ms")))
        .collect();
    a_leader(&hosts).await;
    trigger(url);
    wait_for("a step done", Duration::from_secs(120), || {
        let n = steps(&hosts);
        async move { (n >= 1).then_some(()) }
    })
    .await;
    hosts
}

#[tokio::test]
async fn a_running_jobs_slot_moves_to_another_primary_mid_run() {
    deadline(Duration::from_secs(300), async {
        let cluster = RedisCluster::start(3, 0).await;
        let url = cluster.url();
        let dir = TempDir::new("cluster-reshard");
        let expected = deploy(&dir, 30_000);
        let recorder = Recorder::start_cluster(&cluster).await;
        let hosts = two_hosts_mid_run(&url, &dir, "r").await;
        let conn = conn_to(&url).await;
        // Move the job's slot, one key at a time, while the run goes on.
        let slot = slot_of("lh:{reconciliation}:lease");
        let from = cluster.owner_of(slot).await;
        let to = (0..3).find(|i| *i != from).unwrap();
        let steps_before = steps(&hosts);
        cluster
            .move_slot(slot, to, 1, Duration::from_millis(100))
            .await;
        assert_eq!(cluster.owner_of(slot).await, to);
        let record = wait_done(&conn, Duration::from_secs(180)).await;
        let steps_after = steps(&hosts);
        assert!(
            record["step"].as_u64().unwrap() as usize > steps_before && steps_after > steps_before,
            "the run was not mid-way when its slot moved: {steps_before} steps before, {record}"
        );
        assert_eq!(totals(&mut conn.clone()).await, expected);
        let history = recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated:\n{v}"));
        assert_eq!(history.done_records("reconciliation", PERIOD).len(), 1);
        // The run's records were written on the old primary and, after the move, on the new.
        let primaries = cluster.primaries().await;
        let streams = recorder.streams();
        let run_key = format!("\"SET\" \"lh:{{reconciliation}}:run:{PERIOD}\"");
        for node in [from, to] {
            let addr = format!("127.0.0.1:{}", cluster.nodes[node].port);
            let i = primaries.iter().position(|p| p.addr == addr).unwrap();
            assert!(
                streams[i].iter().any(|l| l.contains(&run_key)),
                "no run record was written on {addr}"
            );
        }
        // The run history reads the job's run index on its new primary.
        let out = run_leasehold(&["runs", "reconciliation", "--redis-url", &url]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains(PERIOD), "{text}");
    })
    .await;
}

#[tokio::test]
async fn the_hosts_follow_a_primary_failover_and_the_run_finishes() {
    deadline(Duration::from_secs(300), async {
        let mut cluster = RedisCluster::start(3, 1).await;
        let url = cluster.url();
        let dir = TempDir::new("cluster-failover");
        let expected = deploy(&dir, 30_000);
        let hosts = two_hosts_mid_run(&url, &dir, "f").await;
        let conn = conn_to(&url).await;
        // The primary holding the job dies; the cluster promotes its replica.
        let slot = slot_of("lh:{reconciliation}:lease");
        let owner = cluster.owner_of(slot).await;
        let witness = (0..cluster.nodes.len()).find(|i| *i != owner).unwrap();
        let promoted = cluster.fail_over(owner, slot, witness).await;
        assert_ne!(promoted, owner);
        // The hosts find the new primary: the job gets a leader again and the run finishes
        // (from what the promoted replica had: replication is asynchronous).
        wait_done(&conn, Duration::from_secs(180)).await;
        assert_eq!(totals(&mut conn.clone()).await, expected);
        // Every job's lease is renewed again: the other primaries' jobs (membership included)
        // never stopped, and this one has a leader whose renewals reach the new primary.
        let before: usize = hosts
            .iter()
            .map(|h| h.log_lines_with("\"renewed\"").len())
            .sum();
        wait_for(
            "renewals after the failover",
            Duration::from_secs(30),
            || {
                let now: usize = hosts
                    .iter()
                    .map(|h| h.log_lines_with("\"renewed\"").len())
                    .sum();
                async move { (now > before + 5).then_some(()) }
            },
        )
        .await;
    })
    .await;
}
