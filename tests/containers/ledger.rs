//! The compose file's PostgreSQL: `billing-pg` (the billing component granted the `ledger`
//! database) books its charges in `billing_charges` through the fenced `sql` import while its
//! leader's container is killed, then paused past the lease. Judged from PostgreSQL's own
//! record: one row per customer and period, and in commit order no row of an older term after
//! a row of a newer one (the paused leader, woken, committed nothing more).

use std::time::Duration;

use leasehold_harness::deadline;

use crate::compose::{CUSTOMERS, Compose, Deploy};
use crate::{done, leader, mid_run, pause_the_holder, trigger};

const JOB: &str = "billing-pg";

/// The ledger's rows in commit order: (period, customer, token).
async fn ledger(c: &Compose) -> Vec<(String, String, i64)> {
    c.postgres()
        .await
        .query(
            "SELECT period, customer, token FROM billing_charges \
             ORDER BY pg_xact_commit_timestamp(xmin), period, customer",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test]
#[ignore = "container tier: needs Docker and ./dev images (./dev test runs it)"]
async fn the_ledger_in_postgresql_books_each_charge_once_across_a_kill_and_a_pause() {
    deadline(Duration::from_secs(360), async {
        let c = Compose::up("ledger", Deploy::new("ledger").with_billing_pg(10)).await;
        // A kill mid-run: the successor carries the run on from its checkpoint.
        let killed = leader(&c, JOB, None).await;
        trigger(&c, &killed, JOB, "2026-11-07").await;
        let before_kill = mid_run(&c, JOB, "2026-11-07").await;
        c.docker(&["kill", &c.container(&killed)]);
        let after_kill = done(&c, JOB, "2026-11-07", Duration::from_secs(120)).await;
        assert!(
            after_kill["token"].as_u64() > before_kill["token"].as_u64(),
            "finished under the killed leader's term: {after_kill}"
        );
        // A pause past the lease: the woken leader steps down and books nothing more.
        let asked = leader(&c, JOB, Some(&killed)).await;
        trigger(&c, &asked, JOB, "2026-11-08").await;
        let before_pause = mid_run(&c, JOB, "2026-11-08").await;
        let paused = pause_the_holder(&c, JOB).await;
        let after_pause = done(&c, JOB, "2026-11-08", Duration::from_secs(120)).await;
        c.docker(&["unpause", &c.container(&paused)]);
        leasehold_harness::wait_for(
            "the woken leader to step down",
            Duration::from_secs(60),
            || async { c.logs(&paused).contains("stopped leading").then_some(()) },
        )
        .await;
        assert!(
            after_pause["token"].as_u64() > before_pause["token"].as_u64(),
            "finished under the paused leader's term: {after_pause}"
        );
        let rows = ledger(&c).await;
        for (period, record) in [("2026-11-07", &after_kill), ("2026-11-08", &after_pause)] {
            let mut customers: Vec<&str> = rows
                .iter()
                .filter(|(p, _, _)| p == period)
                .map(|(_, c, _)| c.as_str())
                .collect();
            assert_eq!(customers.len(), CUSTOMERS, "{period}: {record}");
            customers.dedup();
            assert_eq!(
                customers.len(),
                CUSTOMERS,
                "{period}: a customer booked twice"
            );
            // Both terms booked part of the period: the one that was stopped and its successor.
            let tokens: Vec<i64> = rows
                .iter()
                .filter(|(p, _, _)| p == period)
                .map(|r| r.2)
                .collect();
            assert!(
                tokens.iter().any(|&t| t < tokens[tokens.len() - 1]),
                "{period}: one term booked everything ({tokens:?})"
            );
        }
        if let Some(w) = rows.windows(2).find(|w| w[1].2 < w[0].2) {
            panic!(
                "PostgreSQL committed {:?} after {:?}: a token went back",
                w[1], w[0]
            );
        }
    })
    .await;
}
