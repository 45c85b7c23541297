//! The randomized soak on etcd (issue 30): three real replicas of the `billing` job on a real
//! 3-member etcd cluster (`--store etcd://…`), booking each customer's charge in the store,
//! while faults land at random — hosts killed, frozen past their lease, stopped gracefully and
//! restarted; an etcd member killed and restarted, or frozen and thawed (etcd's leader among
//! them, as chance has it); the job's file replaced while runs are open; operator triggers of
//! new and earlier periods; the job paused and resumed — checked afterwards against the history
//! etcd applied, read back from its revisions ([`crate::etcd_history`]): no run or data write
//! while no term holds the job, every run record and every charge written under the token of
//! the term holding the job at its revision, every triggered period turned `done` once, and
//! every customer charged once per period.
//!
//! A run that a restarted host cannot continue (it started with a component version the host
//! no longer has) fails with `version-changed`, by design, and is triggered again, as in the
//! Redis soak (`soak.rs`).
//!
//! `LEASEHOLD_SOAK_ROUNDS` (default 10, what `./dev test` runs) and `LEASEHOLD_SOAK_SEED`
//! (default: from the clock, printed) choose the run; `./dev soak --store etcd --rounds N` runs
//! more and prints the summary (RELIABILITY.md).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use leasehold::coord::term_store::{Store, TermStore};
use leasehold_harness::EtcdCluster;
use serde_json::Value;

use crate::harness::{
    HostProcess, LEASEHOLD, TempDir, answered, deadline, deploy_billing, guests, new_version,
    run_leasehold, wait_for,
};
// What both soaks share: customers per period, quick retries, the periods and the generator.
use crate::soak::{CUSTOMERS, RETRY, Rng, env_u64, period};

const JOB: &str = "billing";
/// etcd's TTLs are whole seconds, at least its floor (1 s with the harness's members).
const TIMING: (&str, &str) = ("2s", "400ms");

struct Soak {
    etcd: EtcdCluster,
    url: String,
    dir: TempDir,
    hosts: Vec<HostProcess>,
    store: Store,
}

impl Soak {
    fn start_host(&self, i: usize) -> HostProcess {
        let data = self.dir.join("data");
        HostProcess::start_node(
            LEASEHOLD,
            &self.url,
            &self.dir.join("jobs"),
            &format!("n{i}"),
            TIMING,
            &["--data-dir", data.to_str().unwrap()],
        )
    }

    fn restart(&mut self, i: usize) {
        self.hosts[i] = self.start_host(i);
    }

    fn command(&self, args: &[&str]) {
        let mut args = args.to_vec();
        args.extend(["--store", &self.url]);
        let out = run_leasehold(&args);
        assert!(
            out.status.success(),
            "leasehold {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    async fn record(&self, period: &str) -> Option<Value> {
        let key = format!("run:{period}");
        let got = answered("a run record", || self.store.read_key(JOB, &key)).await;
        got.map(|v| serde_json::from_slice(&v).expect("a JSON run record"))
    }
}

#[tokio::test]
async fn random_faults_on_etcd_leave_one_result_per_period_and_one_charge_per_customer() {
    let rounds = env_u64("LEASEHOLD_SOAK_ROUNDS").unwrap_or(10);
    let seed = env_u64("LEASEHOLD_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    eprintln!("etcd soak: {rounds} rounds, seed {seed} (LEASEHOLD_SOAK_SEED={seed} replays it)");
    let limit = Duration::from_secs(180 + rounds * 12);
    deadline(limit, async {
        let etcd = EtcdCluster::start(3).await;
        let url = etcd.url();
        let dir = TempDir::new("etcd-soak");
        let (jobs, data) = deploy_billing(dir.path(), CUSTOMERS);
        std::fs::write(data.join("billing/delay-ms"), "2").unwrap();
        std::fs::write(jobs.join("billing.toml"), RETRY).unwrap();
        let store = answered("the store", || Store::open(&url, Duration::from_secs(5))).await;
        let component = std::fs::read(guests().wasm("billing")).unwrap();
        let mut soak = Soak {
            etcd,
            url,
            dir,
            hosts: Vec::new(),
            store,
        };
        for i in 0..3 {
            let h = soak.start_host(i);
            soak.hosts.push(h);
        }
        soak.hosts[0]
            .wait_for_log("node started", Duration::from_secs(60))
            .await;

        let mut rng = Rng(seed);
        let mut faults: BTreeMap<&str, u64> = BTreeMap::new();
        // One period from the start, so that every soak has a run for its faults to land on.
        leasehold_harness::process::trigger(LEASEHOLD, &soak.url, JOB, &period(0));
        let mut triggered = BTreeSet::from([period(0)]);
        for round in 0..rounds {
            let host = rng.below(3) as usize;
            let member = rng.below(3) as usize;
            let fault = match rng.below(11) {
                0 | 1 => {
                    let p = if triggered.is_empty() || rng.below(10) < 7 {
                        period(triggered.len())
                    } else {
                        period(rng.below(triggered.len() as u64) as usize)
                    };
                    leasehold_harness::process::trigger(LEASEHOLD, &soak.url, JOB, &p);
                    triggered.insert(p);
                    "trigger"
                }
                2 => {
                    soak.hosts[host].kill();
                    soak.restart(host);
                    "kill"
                }
                3 => {
                    // Frozen past its lease (a zombie if it led), then woken.
                    soak.hosts[host].pause();
                    tokio::time::sleep(Duration::from_millis(2500)).await;
                    soak.hosts[host].resume();
                    "pause-host"
                }
                4 => {
                    soak.hosts[host].terminate(Duration::from_secs(20)).await;
                    soak.restart(host);
                    "sigterm"
                }
                5 => {
                    soak.command(&["pause", JOB]);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    soak.command(&["resume", JOB]);
                    "pause-job"
                }
                6 => {
                    soak.etcd.kill(member);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    soak.etcd.restart(member, Duration::from_secs(30)).await;
                    "etcd-kill"
                }
                7 => {
                    // A member frozen: its peers elect around it if it led; its clients' requests
                    // there time out.
                    soak.etcd.pause(member);
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    soak.etcd.resume(member);
                    "etcd-pause"
                }
                8 => {
                    let jobs = soak.dir.join("jobs");
                    let version = new_version(&component, &format!("round {round}"));
                    std::fs::write(jobs.join(".billing.tmp"), &version).unwrap();
                    std::fs::rename(jobs.join(".billing.tmp"), jobs.join("billing.wasm")).unwrap();
                    "replace-job"
                }
                _ => "none",
            };
            *faults.entry(fault).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(rng.below(700))).await;
        }

        // Every period asked for ends `done`; one failed by a version replaced under it is
        // triggered again, as an operator would.
        let mut reruns = 0;
        for period in &triggered {
            for attempt in 0.. {
                let record = wait_for(
                    &format!("period {period} to end (seed {seed})"),
                    Duration::from_secs(120),
                    || async {
                        soak.record(period)
                            .await
                            .filter(|r| r["status"] == "done" || r["status"] == "failed")
                    },
                )
                .await;
                if record["status"] == "done" {
                    break;
                }
                assert!(
                    record["failure"] == "version-changed" && attempt < 5,
                    "period {period} failed (seed {seed}): {record}"
                );
                leasehold_harness::process::trigger(LEASEHOLD, &soak.url, JOB, period);
                reruns += 1;
                wait_for(
                    &format!("period {period} to be taken up again (seed {seed})"),
                    Duration::from_secs(60),
                    || async {
                        soak.record(period)
                            .await
                            .filter(|r| r["status"] != "failed")
                    },
                )
                .await;
            }
        }

        let events = crate::etcd_history::read(&soak.etcd.endpoints()).await;
        let charge_token = |v: &[u8]| {
            let v = std::str::from_utf8(v).ok()?;
            leasehold_harness::fixtures::billing_charge_token(v).map(|t| t as i64)
        };
        let mut terms = 0;
        for period in &triggered {
            let checked = crate::etcd_history::check_with(&events, JOB, period, charge_token)
                .unwrap_or_else(|v| panic!("fencing violated on etcd (seed {seed}): {v}"));
            // The job's terms, the same for every period.
            terms = terms.max(checked.terms.len());
            let prefix = format!("lh/{JOB}/data:charge/{period}/");
            let puts: Vec<&str> = events
                .iter()
                .filter(|e| !e.deleted && e.key.starts_with(&prefix))
                .map(|e| e.key.as_str())
                .collect();
            let distinct: BTreeSet<&str> = puts.iter().copied().collect();
            assert_eq!(distinct.len(), CUSTOMERS, "{period}: every customer charged (seed {seed})");
            assert_eq!(puts.len(), CUSTOMERS, "{period}: no customer charged twice (seed {seed})");
        }
        eprintln!(
            "etcd soak summary: {rounds} rounds, seed {seed}, faults {faults:?}, {} periods done once each ({reruns} re-run after version-changed), {} charges booked once each, {terms} terms, {} events of etcd's history checked, 0 violations",
            triggered.len(),
            CUSTOMERS * triggered.len(),
            events.len(),
        );
    })
    .await;
}
