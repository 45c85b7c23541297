//! The billing guest between real replicas: each customer is charged exactly once per period,
//! through a crash of the leader mid-step and through a frozen leader that wakes as a zombie.
//! The proof is the history Redis applied (see [`crate::history`]): exactly one applied write per
//! charge key, all of them fenced, and one `done` record for the period.

use std::time::Duration;

use redis::AsyncCommands;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, deploy_billing, run_records, wait_for,
};
use crate::history::Recorder;

/// Customers billed per run (four steps of 50).
const CUSTOMERS: usize = 200;

struct Billing {
    _dir: TempDir,
    redis: RedisServer,
    hosts: Vec<HostProcess>,
    recorder: Recorder,
}

impl Billing {
    /// Three replicas billing 200 customers, 10 ms per charge (a step takes about half a
    /// second, long enough to be interrupted).
    async fn start(name: &str) -> Self {
        let redis = RedisServer::start().await;
        let dir = TempDir::new(name);
        let (jobs, data) = deploy_billing(dir.path(), CUSTOMERS);
        std::fs::write(data.join("billing/delay-ms"), "10").unwrap();
        let recorder = Recorder::start(&redis).await;
        let hosts = (0..3)
            .map(|i| {
                HostProcess::start_node(
                    LEASEHOLD,
                    &redis.url(),
                    &jobs,
                    &format!("n{i}"),
                    ("2s", "500ms"),
                    &["--data-dir", data.to_str().unwrap()],
                )
            })
            .collect();
        Billing {
            _dir: dir,
            redis,
            hosts,
            recorder,
        }
    }

    /// The leader once it is in the middle of step 1 (customer c0060 charged), and the period.
    async fn leader_mid_step(&self) -> (usize, String) {
        let period = wait_for(
            "the billing run to start",
            Duration::from_secs(60),
            || async {
                run_records(&self.redis, "billing")
                    .await
                    .into_iter()
                    .find(|r| r["status"] == "running")
                    .map(|r| r["period"].as_str().unwrap().to_string())
            },
        )
        .await;
        let key = format!("lh:{{billing}}:data:charge/{period}/c0060");
        wait_for(
            "the leader to be inside step 1",
            Duration::from_secs(60),
            || async {
                let v: Option<String> = self.redis.conn().await.get(&key).await.unwrap();
                v.map(|_| ())
            },
        )
        .await;
        let leader = (0..3)
            .find(|i| !self.hosts[*i].log_lines_with("\"step done\"").is_empty())
            .expect("a host finished step 0");
        (leader, period)
    }

    /// Waits for the period's run to be done, then checks the applied history: fences never
    /// lowered, every write fenced, one `done` record, one applied charge per customer, and
    /// the summary.
    async fn assert_billed_once(&self, period: &str) {
        wait_for(
            "the billing run to finish",
            Duration::from_secs(90),
            || async {
                run_records(&self.redis, "billing")
                    .await
                    .into_iter()
                    .find(|r| r["period"] == period && r["status"] == "done")
            },
        )
        .await;
        let history = self.recorder.check().unwrap_or_else(|v| panic!("{v}"));
        assert_eq!(history.done_records("billing", period).len(), 1);
        let prefix = format!("lh:{{billing}}:data:charge/{period}/");
        let mut charges: Vec<&str> = history
            .applied
            .iter()
            .filter(|a| a.key.starts_with(&prefix) && !a.value.is_empty())
            .map(|a| a.key.as_str())
            .collect();
        charges.sort();
        let total = charges.len();
        charges.dedup();
        assert_eq!(charges.len(), CUSTOMERS, "every customer charged");
        assert_eq!(total, CUSTOMERS, "no customer charged twice");
        let summary: String = self
            .redis
            .conn()
            .await
            .get(format!("lh:{{billing}}:data:summary/{period}"))
            .await
            .unwrap();
        let cents: usize = (0..CUSTOMERS).map(|i| 100 + i).sum();
        assert!(
            summary.starts_with(&format!("customers={CUSTOMERS} total_cents={cents} ")),
            "{summary}"
        );
        // The interrupted step ran again and found charges it had already made: the
        // idempotency keys, not luck, kept them single.
        let already: usize = summary
            .rsplit("found_already=")
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(already > 0, "no charge was found already made: {summary}");
    }
}

#[tokio::test]
async fn a_crashed_billing_leader_charges_every_customer_exactly_once() {
    deadline(Duration::from_secs(180), async {
        let mut b = Billing::start("billing-crash").await;
        let (leader, period) = b.leader_mid_step().await;
        b.hosts[leader].kill();
        b.assert_billed_once(&period).await;
        // The successor re-executed the interrupted step and found the charges already made.
        let resumed = b
            .hosts
            .iter()
            .flat_map(|h| h.log_lines_with("resuming run from its checkpoint"))
            .count();
        // Balancing may also hand the run to the job's preferred member between two steps,
        // which resumes it the same way.
        let handed = b
            .hosts
            .iter()
            .flat_map(|h| {
                h.log_lines_with("handing over to the job's preferred member between steps")
            })
            .count();
        assert_eq!(resumed - handed, 1);
    })
    .await;
}

#[tokio::test]
async fn a_frozen_billing_leader_wakes_as_a_zombie_and_charges_nobody_twice() {
    deadline(Duration::from_secs(180), async {
        let b = Billing::start("billing-zombie").await;
        let (leader, period) = b.leader_mid_step().await;
        b.hosts[leader].pause();
        b.assert_billed_once(&period).await;
        b.hosts[leader].resume();
        b.hosts[leader]
            .wait_for_log("stopped leading", Duration::from_secs(30))
            .await;
        // Whatever the zombie still tried, nothing it sent after waking was applied.
        b.assert_billed_once(&period).await;
    })
    .await;
}
