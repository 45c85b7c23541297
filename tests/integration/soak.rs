//! A randomized soak: three real replicas billing customers while faults land at random —
//! leaders and followers killed, frozen past their lease, stopped gracefully and restarted,
//! operator triggers of new, done and running periods, the job paused and resumed — checked
//! afterwards against the history Redis applied: the fence never lowered and no write below
//! it, no bookkeeping write outside a fenced script, every triggered period ends with exactly
//! one `done` record, and every customer is charged exactly once per period.
//!
//! `LEASEHOLD_SOAK_ROUNDS` (default 20, what `./dev test` runs) and `LEASEHOLD_SOAK_SEED`
//! (default: from the clock, printed) choose the run; `./dev soak --rounds N` runs more and
//! prints the summary (RELIABILITY.md). A failure prints the seed, so the same fault schedule
//! can be run again.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, run_leasehold, run_record,
    trigger, wait_for,
};
use crate::history::Recorder;

/// Customers billed per period.
const CUSTOMERS: usize = 200;
/// The periods operators trigger (billing is daily).
const PERIODS: [&str; 5] = [
    "2026-11-02",
    "2026-11-03",
    "2026-11-04",
    "2026-11-05",
    "2026-11-06",
];
const TIMING: (&str, &str) = ("1s", "200ms");

/// A small deterministic generator (xorshift), so a seed replays the same fault schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Soak {
    redis: RedisServer,
    dir: TempDir,
    hosts: Vec<HostProcess>,
}

impl Soak {
    fn start_host(&self, i: usize) -> HostProcess {
        let data = self.dir.join("data");
        HostProcess::start_node(
            LEASEHOLD,
            &self.redis.url(),
            &self.dir.join("jobs"),
            &format!("n{i}"),
            TIMING,
            &["--data-dir", data.to_str().unwrap()],
        )
    }

    fn restart(&mut self, i: usize) {
        self.hosts[i] = self.start_host(i);
    }

    fn job_command(&self, what: &str) {
        let out = run_leasehold(&[what, "billing", "--redis-url", &self.redis.url()]);
        assert!(out.status.success(), "leasehold {what} failed");
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn random_faults_leave_one_result_per_period_and_one_charge_per_customer() {
    let rounds = env_u64("LEASEHOLD_SOAK_ROUNDS").unwrap_or(20);
    let seed = env_u64("LEASEHOLD_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    eprintln!("soak: {rounds} rounds, seed {seed} (LEASEHOLD_SOAK_SEED={seed} replays it)");
    let limit = Duration::from_secs(120 + rounds * 6);
    deadline(limit, async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("soak");
        let (jobs, data) = (dir.join("jobs"), dir.join("data"));
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::create_dir_all(data.join("billing")).unwrap();
        std::fs::copy(guests().wasm("billing"), jobs.join("billing.wasm")).unwrap();
        // Retries come quickly: a fault must not leave a period waiting out the default backoff.
        std::fs::write(
            jobs.join("billing.toml"),
            "[retry]\nattempts = 5\nbackoff = \"100ms\"\nmax-backoff = \"1s\"\n",
        )
        .unwrap();
        let mut csv = String::from("customer,amount_cents\n");
        for i in 0..CUSTOMERS {
            csv.push_str(&format!("c{i:04},{}\n", 100 + i));
        }
        std::fs::write(data.join("billing/customers.csv"), csv).unwrap();
        std::fs::write(data.join("billing/delay-ms"), "2").unwrap();
        let recorder = Recorder::start(&redis).await;
        let mut soak = Soak {
            redis,
            dir,
            hosts: Vec::new(),
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
        let mut triggered = std::collections::BTreeSet::new();
        for _ in 0..rounds {
            let host = rng.below(3) as usize;
            let fault = match rng.below(7) {
                0 | 1 => {
                    let period = PERIODS[rng.below(PERIODS.len() as u64) as usize];
                    trigger(&soak.redis, "billing", period);
                    triggered.insert(period);
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
                    tokio::time::sleep(Duration::from_millis(1200)).await;
                    soak.hosts[host].resume();
                    "pause-host"
                }
                4 => {
                    soak.hosts[host].terminate(Duration::from_secs(20)).await;
                    soak.restart(host);
                    "sigterm"
                }
                5 => {
                    soak.job_command("pause");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    soak.job_command("resume");
                    "pause-job"
                }
                _ => "none",
            };
            *faults.entry(fault).or_default() += 1;
            // The fault schedule: the next fault lands 0 to 700 ms later.
            tokio::time::sleep(Duration::from_millis(rng.below(700))).await;
        }

        // Every period that was asked for ends `done`.
        for period in &triggered {
            wait_for(
                &format!("period {period} to be done (seed {seed})"),
                Duration::from_secs(120),
                || async {
                    run_record(&soak.redis, "billing", period)
                        .await
                        .filter(|r| r["status"] == "done")
                },
            )
            .await;
        }
        let history = recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated (seed {seed}):\n{v}"));
        let mut charges = 0;
        for period in &triggered {
            assert_eq!(
                history.done_records("billing", period).len(),
                1,
                "period {period}: one done record (seed {seed})"
            );
            let prefix = format!("lh:{{billing}}:data:charge/{period}/");
            let mut keys: Vec<&str> = history
                .applied
                .iter()
                .filter(|a| a.key.starts_with(&prefix) && !a.value.is_empty())
                .map(|a| a.key.as_str())
                .collect();
            let applied = keys.len();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), CUSTOMERS, "{period}: every customer charged (seed {seed})");
            assert_eq!(applied, CUSTOMERS, "{period}: no customer charged twice (seed {seed})");
            charges += applied;
        }
        eprintln!(
            "soak summary: {rounds} rounds, seed {seed}, faults {faults:?}, {} periods done once each, {charges} charges applied once each, {} applied fenced writes checked, 0 violations",
            triggered.len(),
            history.applied.len()
        );
    })
    .await;
}
