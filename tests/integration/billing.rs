//! The billing guest between real replicas: each customer is charged exactly once per period,
//! through a crash of the leader mid-step and through a frozen leader that wakes as a zombie.
//! With charges in the store, the proof is the history Redis applied (see [`crate::history`]):
//! exactly one applied write per charge key, all of them fenced, and one `done` record for the
//! period. With charges booked in PostgreSQL (the sample's `ledger` database), it is the
//! database's own record: one row per customer, and in commit order the rows' tokens never go
//! back. With a payment provider (the harness's fenced [`Receiver`]), it is also the provider's
//! own record: one applied charge per customer, each under a token no newer than its booking,
//! and none applied from a zombie once a successor has charged.

use std::time::Duration;

use redis::AsyncCommands;

use leasehold_harness::{PgServer, Receiver};

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, deploy_billing, run_records, wait_for,
};
use crate::history::Recorder;

/// Where the replicas book the charges.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sink {
    /// `store.create` under an idempotency key.
    Store,
    /// The `billing_charges` table of a `ledger` database (`guest-jobs/billing/ledger.sql`).
    Postgres,
}

/// Customers billed per run (four steps of 50).
const CUSTOMERS: usize = 200;

struct Billing {
    _dir: TempDir,
    redis: RedisServer,
    hosts: Vec<HostProcess>,
    recorder: Recorder,
    /// The ledger database, when charges are booked there.
    pg: Option<PgServer>,
    /// The payment provider, when customers are charged there first.
    provider: Option<Receiver>,
}

impl Billing {
    /// Three replicas billing 200 customers, 10 ms per charge (a step takes about half a
    /// second, long enough to be interrupted).
    /// With `provider`, each customer is charged at a payment provider first (the harness's
    /// fenced receiver).
    async fn start_with(name: &str, sink: Sink, provider: bool) -> Self {
        let redis = RedisServer::start().await;
        let dir = TempDir::new(name);
        let (jobs, data) = deploy_billing(dir.path(), CUSTOMERS);
        std::fs::write(data.join("billing/delay-ms"), "10").unwrap();
        let mut args = vec!["--data-dir".to_string(), data.to_str().unwrap().to_string()];
        let mut sidecar = String::new();
        let pg = match sink {
            Sink::Store => None,
            Sink::Postgres => {
                let pg = crate::sql::initialised(&["billing"]).await;
                pg.exec(include_str!("../../guest-jobs/billing/ledger.sql"))
                    .await;
                pg.exec(&format!(
                    "GRANT SELECT, INSERT ON billing_charges TO {}",
                    crate::sql::ROLE
                ))
                .await;
                sidecar.push_str("[sql.databases]\nledger = \"ledger\"\n");
                args.push("--database".into());
                args.push(format!("ledger={}", pg.url(crate::sql::ROLE)));
                Some(pg)
            }
        };
        let provider = match provider {
            false => None,
            true => {
                let receiver = Receiver::start().await;
                let url = receiver.url();
                std::fs::write(data.join("billing/provider"), format!("{url}/charge")).unwrap();
                sidecar.push_str(&format!("[http]\nallow = [\"{url}\"]\n"));
                args.extend(["--http-allow".into(), url, "--http-allow-private".into()]);
                Some(receiver)
            }
        };
        if !sidecar.is_empty() {
            std::fs::write(jobs.join("billing.toml"), sidecar).unwrap();
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let recorder = Recorder::start(&redis).await;
        let hosts = (0..3)
            .map(|i| {
                HostProcess::start_node(
                    LEASEHOLD,
                    &redis.url(),
                    &jobs,
                    &format!("n{i}"),
                    ("2s", "500ms"),
                    &args,
                )
            })
            .collect();
        Billing {
            _dir: dir,
            redis,
            hosts,
            recorder,
            pg,
            provider,
        }
    }

    /// The token each customer's charge was booked under, from the ledger or the store.
    async fn booked_tokens(&self, period: &str) -> std::collections::BTreeMap<String, u64> {
        if self.pg.is_some() {
            return self
                .ledger_rows(period)
                .await
                .into_iter()
                .map(|(c, t)| (c, t as u64))
                .collect();
        }
        let mut conn = self.redis.conn().await;
        let mut out = std::collections::BTreeMap::new();
        for i in 0..CUSTOMERS {
            let customer = format!("c{i:04}");
            let v: String = conn
                .get(format!("lh:{{billing}}:data:charge/{period}/{customer}"))
                .await
                .unwrap();
            let token = leasehold_harness::fixtures::billing_charge_token(&v)
                .unwrap_or_else(|| panic!("charge of {customer} has no token: {v:?}"));
            out.insert(customer, token);
        }
        out
    }

    /// The provider's record: every customer charged there once, each charge applied under a
    /// token no newer than its booking's (the provider is charged first), every request
    /// carrying the job, the period and one token; and more requests than customers (a step
    /// ran again and its repeated requests were applied once, by the idempotency keys).
    async fn assert_charged_once_at_the_provider(&self, period: &str) {
        let provider = self.provider.as_ref().expect("a payment provider");
        let prefix = format!("{period}/");
        let applied: Vec<(String, u64)> = provider
            .applied()
            .into_iter()
            .filter_map(|(k, t)| k.strip_prefix(&prefix).map(|c| (c.to_string(), t)))
            .collect();
        assert_eq!(
            applied.len(),
            CUSTOMERS,
            "every customer charged at the provider"
        );
        let booked = self.booked_tokens(period).await;
        for (customer, token) in &applied {
            let at = booked[customer];
            assert!(
                *token <= at,
                "{customer} was charged under token {token}, after its booking under {at}"
            );
        }
        let all = provider.received();
        for r in &all {
            assert_eq!(r.header("leasehold-job"), Some("billing"), "{r:?}");
            assert_eq!(r.count("leasehold-period"), 1, "{r:?}");
            assert_eq!(r.count("leasehold-token"), 1, "{r:?}");
        }
        let requests: Vec<_> = all
            .iter()
            .filter(|r| r.header("leasehold-period") == Some(period))
            .collect();
        assert!(
            requests.len() > CUSTOMERS,
            "{} requests for {CUSTOMERS} customers: no step charged again",
            requests.len()
        );
    }

    /// The key whose appearance shows that customer c0060 (in step 1) has been charged.
    async fn charged_c0060(&self, period: &str) -> bool {
        match &self.pg {
            None => {
                let key = format!("lh:{{billing}}:data:charge/{period}/c0060");
                let v: Option<String> = self.redis.conn().await.get(&key).await.unwrap();
                v.is_some()
            }
            Some(pg) => !pg
                .admin()
                .await
                .unwrap()
                .query(
                    "SELECT 1 FROM billing_charges WHERE period = $1 AND customer = 'c0060'",
                    &[&period],
                )
                .await
                .unwrap()
                .is_empty(),
        }
    }

    /// The ledger's rows for `period` in commit order: (customer, token).
    async fn ledger_rows(&self, period: &str) -> Vec<(String, i64)> {
        let pg = self.pg.as_ref().expect("a ledger database");
        pg.admin()
            .await
            .unwrap()
            .query(
                "SELECT customer, token FROM billing_charges WHERE period = $1 \
                 ORDER BY pg_xact_commit_timestamp(xmin), customer",
                &[&period],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// The leader once it is in the middle of step 1 (customer c0060 charged), frozen (SIGSTOP),
    /// and the period. The lease's holder, not the first host that logged a step: balancing may
    /// hand the run to the job's preferred member between steps, so the holder is frozen, the
    /// lease read again, and the holder woken and the look repeated if the lease moved meanwhile.
    async fn leader_paused_mid_step(&self) -> (usize, String) {
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
        wait_for(
            "the leader to be inside step 1",
            Duration::from_secs(60),
            || async { self.charged_c0060(&period).await.then_some(()) },
        )
        .await;
        let holder = || crate::harness::lease_owner(&self.redis, "billing");
        for _ in 0..10 {
            let owner = holder().await;
            let node = owner.split(':').next().unwrap();
            let leader = (0..3)
                .find(|i| format!("n{i}") == node)
                .unwrap_or_else(|| panic!("the lease is held by {owner:?}, not one of the hosts"));
            self.hosts[leader].pause();
            if holder().await == owner {
                return (leader, period);
            }
            self.hosts[leader].resume();
        }
        panic!("the billing lease kept moving between hosts");
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
        if self.pg.is_some() {
            let rows = self.ledger_rows(period).await;
            let mut customers: Vec<&str> = rows.iter().map(|(c, _)| c.as_str()).collect();
            customers.sort();
            customers.dedup();
            assert_eq!(customers.len(), CUSTOMERS, "every customer charged");
            assert_eq!(rows.len(), CUSTOMERS, "no customer charged twice");
            // Commit order is token order: no row of an older term after one of a newer term.
            let tokens: Vec<i64> = rows.iter().map(|(_, t)| *t).collect();
            assert!(
                tokens.windows(2).all(|w| w[0] <= w[1]),
                "a token went back in commit order: {tokens:?}"
            );
            assert!(
                tokens.first() < tokens.last(),
                "one term booked every charge: the fault changed nothing"
            );
        } else {
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
        }
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
    crashed_leader("billing-crash", Sink::Store).await;
}

#[tokio::test]
async fn a_frozen_billing_leader_wakes_as_a_zombie_and_charges_nobody_twice() {
    frozen_leader("billing-zombie", Sink::Store).await;
}

#[tokio::test]
async fn a_crashed_leader_books_every_charge_once_in_the_postgresql_ledger() {
    crashed_leader("billing-pg-crash", Sink::Postgres).await;
}

#[tokio::test]
async fn a_frozen_leader_books_nothing_in_the_postgresql_ledger_after_it_wakes() {
    frozen_leader("billing-pg-zombie", Sink::Postgres).await;
}

#[tokio::test]
async fn a_crashed_leader_charges_the_payment_provider_once_per_customer() {
    crashed_leader_with("billing-http-crash", Sink::Store, true).await;
}

#[tokio::test]
async fn a_frozen_leader_charges_the_payment_provider_nothing_after_it_wakes() {
    frozen_leader_with("billing-http-zombie", Sink::Postgres, true).await;
}

async fn crashed_leader(name: &str, sink: Sink) {
    crashed_leader_with(name, sink, false).await;
}

async fn frozen_leader(name: &str, sink: Sink) {
    frozen_leader_with(name, sink, false).await;
}

/// The leader is SIGKILLed inside step 1; a successor re-executes the step from the checkpoint.
async fn crashed_leader_with(name: &str, sink: Sink, provider: bool) {
    deadline(Duration::from_secs(180), async {
        let mut b = Billing::start_with(name, sink, provider).await;
        let (leader, period) = b.leader_paused_mid_step().await;
        b.hosts[leader].kill();
        b.assert_billed_once(&period).await;
        if provider {
            b.assert_charged_once_at_the_provider(&period).await;
        }
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
        // The record says who ran which steps: the killed leader, then a successor with a
        // higher token that took the run at a later step.
        let rec = run_records(&b.redis, "billing")
            .await
            .into_iter()
            .find(|r| r["period"] == period)
            .unwrap();
        let ran_by = rec["ran_by"].as_array().cloned().unwrap_or_default();
        let killed = format!("n{leader}");
        assert!(ran_by.iter().any(|t| t["node"] == killed), "{rec}");
        let last = ran_by.last().unwrap();
        assert_ne!(last["node"], killed, "{rec}");
        assert!(
            ran_by
                .windows(2)
                .all(|w| w[0]["token"].as_u64() <= w[1]["token"].as_u64()
                    && w[0]["from_step"].as_u64() <= w[1]["from_step"].as_u64()),
            "{rec}"
        );
        assert!(last["from_step"].as_u64() >= Some(1), "{rec}");
    })
    .await;
}

/// The leader is frozen (SIGSTOP) inside step 1 until a successor has finished the run, then
/// woken: whatever it still tries changes nothing. With a provider, the zombie's requests after
/// it wakes are either never sent (the host's deadline) or refused `409` (the token).
async fn frozen_leader_with(name: &str, sink: Sink, provider: bool) {
    deadline(Duration::from_secs(180), async {
        let b = Billing::start_with(name, sink, provider).await;
        let (leader, period) = b.leader_paused_mid_step().await;
        // The zombie's token: the newest request's, sent while it was inside step 1.
        let zombie = b
            .provider
            .as_ref()
            .and_then(|p| p.received().last().and_then(|r| r.token()));
        b.assert_billed_once(&period).await;
        let before = b
            .provider
            .as_ref()
            .map(|p| (p.received().len(), p.applied()));
        let rows = match sink {
            Sink::Postgres => Some(b.ledger_rows(&period).await),
            Sink::Store => None,
        };
        b.hosts[leader].resume();
        b.hosts[leader]
            .wait_for_log("stopped leading", Duration::from_secs(30))
            .await;
        // Whatever the zombie still tried, nothing it sent after waking was applied.
        b.assert_billed_once(&period).await;
        if let (Some(p), Some((seen, applied)), Some(zombie)) = (&b.provider, before, zombie) {
            b.assert_charged_once_at_the_provider(&period).await;
            // This period's charges (the next day's, should its 03:00 London pass meanwhile,
            // are a successor's and none of the zombie's business).
            let of_period = |m: std::collections::BTreeMap<String, u64>| {
                m.into_iter()
                    .filter(|(k, _)| k.starts_with(&format!("{period}/")))
                    .collect::<std::collections::BTreeMap<_, _>>()
            };
            assert_eq!(
                of_period(p.applied()),
                of_period(applied),
                "the provider applied a charge after the zombie woke"
            );
            for r in &p.received()[seen..] {
                if r.token() <= Some(zombie) {
                    assert_eq!(
                        r.status, 409,
                        "the zombie's late request was not refused: {r:?}"
                    );
                }
            }
            let successor = p.highest("billing").unwrap();
            assert!(
                successor > zombie,
                "the provider saw no newer term than {zombie}"
            );
        }
        if let Some(rows) = rows {
            assert_eq!(
                b.ledger_rows(&period).await,
                rows,
                "the ledger changed after the zombie woke"
            );
        }
    })
    .await;
}
