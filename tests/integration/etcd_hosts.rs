//! The reference scenario on etcd (issue 30): three `leasehold run` processes on a real 3-member
//! etcd cluster (`--store etcd://…`), the reconciliation on a generated day long enough to be
//! interrupted, and a fault mid-run: the leader crashed, frozen past its lease, stopped
//! gracefully; etcd's leader killed; the member the leader's host talks to left alone, without
//! a leader. Every scenario ends with the report's totals as generated and the history etcd
//! applied checked ([`crate::etcd_history`]): no write of a term while another holds the job,
//! every run record written by the term holding the job, the period done once.
//!
//! The hosts run with a 2 s lease (etcd grants whole seconds, and every etcd leader change
//! gives every lease its whole TTL again) and a 400 ms heartbeat. etcd ignores asks (no
//! preferred member takes the job over), so the first host to lead keeps it until the fault.

use std::time::Duration;

use leasehold::coord::term_store::{Store, TermStore};
use leasehold::coord::terms::TermEnd;
use leasehold_harness::EtcdCluster;
use leasehold_harness::fixtures::write_generated_day;
use serde_json::Value;

use crate::etcd_history::{self, Checked};
use crate::harness::{
    HostProcess, LEASEHOLD, TempDir, answered, deadline, guests, new_leader, terms_logged, wait_for,
};

const JOB: &str = "reconciliation";
const PERIOD: &str = "2026-11-27";
const TIMING: (&str, &str) = ("2s", "400ms");

struct Cluster {
    dir: TempDir,
    etcd: EtcdCluster,
    hosts: Vec<HostProcess>,
    store: Store,
    expected: recon_core::Totals,
    /// How long after sending an acquire or renewal a host may act: ttl − margin (ttl / 10).
    window_ms: u64,
}

impl Cluster {
    /// etcd's three members and the job's files; no host yet.
    async fn prepare(name: &str) -> (TempDir, EtcdCluster, recon_core::Totals) {
        let dir = TempDir::new(name);
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::copy(guests().wasm(JOB), dir.join("jobs/reconciliation.wasm")).unwrap();
        let generated = write_generated_day(&dir.join("data"), JOB, PERIOD, 30_000, 7).unwrap();
        (dir, EtcdCluster::start(3).await, generated.expected)
    }

    /// Three hosts, each given every member.
    async fn start(name: &str, timing: (&str, &str)) -> Self {
        let (dir, etcd, expected) = Self::prepare(name).await;
        let url = etcd.url();
        let mut cluster = Self::with(dir, etcd, expected, timing).await;
        for _ in 0..3 {
            cluster.add_host(&url, timing);
        }
        cluster
    }

    /// The cluster around `etcd`, before any host; `timing` the hosts' lease TTL and heartbeat.
    async fn with(
        dir: TempDir,
        etcd: EtcdCluster,
        expected: recon_core::Totals,
        timing: (&str, &str),
    ) -> Self {
        let url = etcd.url();
        let store = answered("the store", || Store::open(&url, Duration::from_secs(5))).await;
        Cluster {
            dir,
            etcd,
            hosts: Vec::new(),
            store,
            expected,
            window_ms: humantime::parse_duration(timing.0).unwrap().as_millis() as u64 * 9 / 10,
        }
    }

    /// Starts the next host, `n<i>`: `leasehold run --store URL` with the etcd URL `url`.
    fn add_host(&mut self, url: &str, (ttl, heartbeat): (&str, &str)) {
        let (jobs, data) = (self.dir.join("jobs"), self.dir.join("data"));
        let node = format!("n{}", self.hosts.len());
        let args = [
            "run",
            "--store",
            url,
            "--jobs-dir",
            jobs.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--node-id",
            &node,
            "--lease-ttl",
            ttl,
            "--heartbeat",
            heartbeat,
        ];
        self.hosts.push(HostProcess::start(LEASEHOLD, &args, &[]));
    }

    /// The host whose term holds the job, once one does, and its term's token (waits up to
    /// 60 s): the term key's owner, found in a host's "became leader" line.
    async fn first_leader(&self) -> (usize, i64) {
        wait_for("a leader", Duration::from_secs(60), || async {
            let owner = self.store.holder(JOB).await.ok()??;
            let needle = format!("\"owner\":\"{owner}\"");
            self.hosts.iter().enumerate().find_map(|(i, h)| {
                let lines = h.log_lines_with("became leader");
                let line = lines.into_iter().find(|l| l.contains(&needle))?;
                Some((i, token_of(&line)))
            })
        })
        .await
    }

    /// Triggers the run (`leasehold trigger … --store etcd://…`) and waits until host `i` has
    /// finished `steps` steps of it (up to 120 s).
    async fn trigger_and_wait(&self, i: usize, steps: usize) {
        leasehold_harness::process::trigger(LEASEHOLD, &self.etcd.url(), JOB, PERIOD);
        wait_for(
            &format!("n{i} to finish {steps} steps"),
            Duration::from_secs(120),
            || {
                let n = self.hosts[i].log_lines_with("\"step done\"").len();
                async move { (n >= steps).then_some(()) }
            },
        )
        .await;
    }

    async fn read(&self, rest: &str) -> Option<Value> {
        let got = answered("a read", || self.store.read_key(JOB, rest)).await;
        got.map(|v| serde_json::from_slice(&v).expect("a JSON value"))
    }

    /// The run record once it is `done` (waits up to `limit`).
    async fn wait_done(&self, limit: Duration) -> Value {
        wait_for("the run to be done", limit, || async {
            let record = self.read(&format!("run:{PERIOD}")).await;
            record.filter(|r| r["status"] == "done")
        })
        .await
    }

    /// Host `i` resumed the run from a checkpoint of at least `step` steps, written by `n{from}`.
    async fn assert_resumed(&self, i: usize, from: usize, step: u64) {
        let line = self.hosts[i]
            .wait_for_log("resuming run from its checkpoint", Duration::from_secs(10))
            .await;
        let resumed: Value = serde_json::from_str(&line).unwrap();
        assert!(resumed["step"].as_u64().unwrap() >= step, "{resumed}");
        assert_eq!(resumed["previous_node"], format!("n{from}"), "{resumed}");
    }

    /// The report's totals equal the generator's, etcd's history passes the checker, and every
    /// host's own events keep to its term ([`crate::harness::check_host_events`]).
    async fn assert_one_correct_result(&self) -> Checked {
        let report = self.read(&format!("data:report/{PERIOD}")).await;
        let report = report.expect("the report");
        let totals: recon_core::Totals = serde_json::from_value(report["totals"].clone()).unwrap();
        assert_eq!(totals, self.expected, "report totals");
        let events = etcd_history::read(&self.etcd.endpoints()).await;
        let checked = etcd_history::check(&events, JOB, PERIOD)
            .unwrap_or_else(|v| panic!("fencing violated on etcd: {v}"));
        crate::harness::check_host_events(&self.hosts, self.window_ms);
        checked
    }

    /// Waits (up to 30 s) until the job's term history says the term with `token`, host
    /// `n{i}`'s, ended in one of the ways `how`.
    async fn term_ended(&self, token: i64, i: usize, how: &[TermEnd]) {
        let want = format!("term {token} to end as {how:?}");
        let term = wait_for(&want, Duration::from_secs(30), || async {
            let history = self.store.history(JOB, 32).await.ok()?;
            assert_eq!(history.unparsed, 0, "{:?}", history.terms);
            let t = history
                .terms
                .into_iter()
                .find(|t| t.token == token as u64)?;
            t.end.filter(|e| how.contains(e))?;
            Some(t)
        })
        .await;
        assert_eq!(term.node, format!("n{i}"), "{term:?}");
        assert!(term.ended_ms.unwrap() >= term.started_ms, "{term:?}");
    }
}

fn token_of(line: &str) -> i64 {
    let v: Value = serde_json::from_str(line).unwrap();
    v["token"].as_i64().unwrap()
}

#[tokio::test]
async fn a_crashed_leader_on_etcd_is_replaced_and_the_run_finishes_from_its_checkpoint() {
    deadline(Duration::from_secs(300), async {
        let mut cluster = Cluster::start("etcd-crash", TIMING).await;
        let (first, first_token) = cluster.first_leader().await;
        cluster.trigger_and_wait(first, 3).await;
        let before = terms_logged(&cluster.hosts);
        cluster.hosts[first].kill();

        let (second, took_over) =
            new_leader(&cluster.hosts, &before, first, Duration::from_secs(30)).await;
        let second_token = token_of(&took_over);
        assert!(second_token > first_token, "{second_token} > {first_token}");
        let record = cluster.wait_done(Duration::from_secs(120)).await;
        assert_eq!(record["node"], format!("n{second}"), "{record}");
        assert_eq!(record["token"].as_i64(), Some(second_token), "{record}");
        cluster.assert_resumed(second, first, 3).await;
        let checked = cluster.assert_one_correct_result().await;
        // Both terms wrote: the first its three steps, the second the rest.
        assert!(checked.writes.get(&first_token).is_some_and(|n| *n >= 3));
        assert!(checked.writes.get(&second_token).is_some_and(|n| *n >= 1));
        // The killed term never said how it ended: its history entry reads `crashed`.
        cluster
            .term_ended(first_token, first, &[TermEnd::Crashed])
            .await;
    })
    .await;
}

/// The store URL of `members` of `etcd` only: a host given it talks to them alone.
fn url_of(etcd: &EtcdCluster, members: &[usize]) -> String {
    let hosts: Vec<String> = members
        .iter()
        .map(|i| etcd.endpoint(*i).replace("http://", ""))
        .collect();
    format!("etcd://{}", hosts.join(","))
}

#[tokio::test]
async fn a_frozen_leader_on_etcd_wakes_as_a_zombie_and_changes_nothing() {
    deadline(Duration::from_secs(300), async {
        let cluster = Cluster::start("etcd-zombie", TIMING).await;
        let (first, first_token) = cluster.first_leader().await;
        cluster.trigger_and_wait(first, 2).await;
        let before = terms_logged(&cluster.hosts);
        cluster.hosts[first].pause();

        // Its lease lapses on etcd (no keep-alive) and another host takes the job.
        let (second, took_over) =
            new_leader(&cluster.hosts, &before, first, Duration::from_secs(30)).await;
        let second_token = token_of(&took_over);
        assert!(second_token > first_token, "{second_token} > {first_token}");
        cluster.assert_resumed(second, first, 2).await;
        // Woken while its successor runs: it finds its term gone and writes nothing more.
        cluster.hosts[first].resume();
        cluster.hosts[first]
            .wait_for_log("stopped leading", Duration::from_secs(30))
            .await;
        let record = cluster.wait_done(Duration::from_secs(120)).await;
        assert_eq!(record["token"].as_i64(), Some(second_token), "{record}");
        let checked = cluster.assert_one_correct_result().await;
        // The successor's term is the next after the zombie's.
        let tokens: Vec<i64> = checked.terms.iter().map(|t| t.token).collect();
        assert!(
            tokens.windows(2).any(|w| w == [first_token, second_token]),
            "{tokens:?}"
        );
        // Back, the zombie says how its term ended in place of the successor's `crashed`.
        cluster
            .term_ended(first_token, first, &[TermEnd::Expired, TermEnd::Fenced])
            .await;
    })
    .await;
}

#[tokio::test]
async fn a_leader_on_etcd_stopped_with_sigterm_hands_over_without_waiting_for_its_lease() {
    // A 60 s lease and a 45 s budget for the hand-over: only the release can do it.
    deadline(Duration::from_secs(300), async {
        let mut cluster = Cluster::start("etcd-graceful", ("60s", "5s")).await;
        let (first, first_token) = cluster.first_leader().await;
        cluster.trigger_and_wait(first, 2).await;
        let before = terms_logged(&cluster.hosts);
        assert!(
            cluster.hosts[first]
                .terminate(Duration::from_secs(20))
                .await,
            "exit status"
        );
        cluster.hosts[first]
            .wait_for_log("released lease", Duration::from_secs(5))
            .await;
        let (second, _) = new_leader(&cluster.hosts, &before, first, Duration::from_secs(45)).await;
        let record = cluster.wait_done(Duration::from_secs(120)).await;
        assert_eq!(record["node"], format!("n{second}"), "{record}");
        cluster.assert_resumed(second, first, 2).await;
        cluster.assert_one_correct_result().await;
        cluster
            .term_ended(first_token, first, &[TermEnd::Released])
            .await;
    })
    .await;
}

#[tokio::test]
async fn etcds_leader_killed_mid_run_ends_nothing_and_the_run_finishes_once() {
    deadline(Duration::from_secs(300), async {
        let mut cluster = Cluster::start("etcd-leader-killed", TIMING).await;
        let (first, _) = cluster.first_leader().await;
        cluster.trigger_and_wait(first, 2).await;
        // Every host talks to every member: etcd's leader is one the leader's host talks to.
        let leader = wait_for("etcd's leader", Duration::from_secs(15), || {
            cluster.etcd.leader()
        })
        .await;
        cluster.etcd.kill(leader);
        cluster.wait_done(Duration::from_secs(120)).await;
        // Whoever finished it held the job when it wrote each record (the checker); a term may
        // have lapsed while the two left elected a leader, and each is in the history.
        cluster.assert_one_correct_result().await;
    })
    .await;
}

#[tokio::test]
async fn a_leader_whose_member_is_left_alone_stops_leading_and_the_run_finishes_once() {
    deadline(Duration::from_secs(300), async {
        let (dir, etcd, expected) = Cluster::prepare("etcd-minority").await;
        // n0 talks only to member 2, and leads before the others start; n1 and n2 talk to
        // members 0 and 1.
        let mut cluster = Cluster::with(dir, etcd, expected, TIMING).await;
        cluster.add_host(&url_of(&cluster.etcd, &[2]), TIMING);
        let (first, _) = cluster.first_leader().await;
        assert_eq!(first, 0);
        for _ in 1..3 {
            cluster.add_host(&url_of(&cluster.etcd, &[0, 1]), TIMING);
        }
        cluster.trigger_and_wait(0, 2).await;
        // Members 0 and 1 frozen: member 2 is a minority, alive but without a leader. n0's
        // renewals are refused there, and it stops leading by its own deadline.
        cluster.etcd.pause(0);
        cluster.etcd.pause(1);
        cluster.hosts[0]
            .wait_for_log("stopped leading", Duration::from_secs(20))
            .await;
        cluster.etcd.resume(0);
        cluster.etcd.resume(1);
        cluster.wait_done(Duration::from_secs(120)).await;
        let checked = cluster.assert_one_correct_result().await;
        assert!(
            checked.terms.len() >= 2,
            "a new term after the cut: {checked:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_host_on_etcd_accounts_for_more_periods_than_one_transaction_holds() {
    // The ticker fires every second; its cursor put 150 s back (as after an outage) leaves 150
    // periods to record, over three times what one etcd transaction holds at its default
    // --max-txn-ops (128 operations, three a record).
    deadline(Duration::from_secs(120), async {
        let etcd = EtcdCluster::start(3).await;
        let dir = TempDir::new("etcd-account");
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::copy(guests().wasm("ticker"), dir.join("jobs/ticker.wasm")).unwrap();
        let back = chrono::Utc::now() - chrono::Duration::seconds(150);
        let cursor = back.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut raw = etcd_client::Client::connect(etcd.endpoints(), None)
            .await
            .unwrap();
        raw.put("lh/ticker/cursor", cursor.as_str(), None)
            .await
            .unwrap();
        let url = etcd.url();
        let host = HostProcess::start(
            LEASEHOLD,
            &[
                "run",
                "--store",
                &url,
                "--jobs-dir",
                dir.join("jobs").to_str().unwrap(),
                "--node-id",
                "n0",
                "--lease-ttl",
                "2s",
                "--heartbeat",
                "400ms",
            ],
            &[],
        );
        let store = answered("the store", || Store::open(&url, Duration::from_secs(5))).await;
        // Every period since the cursor has a record, and the cursor moved past them.
        let periods = wait_for("150 periods recorded", Duration::from_secs(60), || async {
            let runs = store.newest_runs("ticker", 1000).await.ok()?;
            (runs.len() >= 150).then_some(runs)
        })
        .await;
        let moved = wait_for("the cursor moved", Duration::from_secs(30), || async {
            let now = store.read_key("ticker", "cursor").await.ok()??;
            (now != cursor.as_bytes()).then_some(now)
        })
        .await;
        assert!(
            String::from_utf8(moved).unwrap() > cursor,
            "the cursor went back"
        );
        assert!(periods.len() >= 150, "{}", periods.len());
        assert!(
            host.log_lines_with("etcd allows in one transaction")
                .is_empty(),
            "a write over etcd's limit"
        );
    })
    .await;
}
