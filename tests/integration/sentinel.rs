//! Redis Sentinel with real `redis-sentinel` processes: three sentinels watch a primary with two
//! replicas; the primary is killed in the middle of a billing run; the sentinels promote a
//! replica; the hosts (given only the sentinels' URL) follow the new primary, and with
//! `--min-replicas 1` the run finishes there with every customer charged exactly once.

use std::time::Duration;

use redis::AsyncCommands;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, deploy_billing, wait_for,
};
use crate::replicas::replica_of;
use leasehold_harness::sentinel::Sentinels;

const CUSTOMERS: usize = 200;
const PERIOD: &str = "2026-11-02";

/// The run record of `PERIOD` on `redis`, if it answers.
async fn record(redis: &RedisServer) -> Option<serde_json::Value> {
    let client = redis::Client::open(redis.url()).ok()?;
    let mut c = client.get_multiplexed_async_connection().await.ok()?;
    let raw: Option<String> = c.get(format!("lh:{{billing}}:run:{PERIOD}")).await.ok()?;
    raw.and_then(|r| serde_json::from_str(&r).ok())
}

#[tokio::test]
async fn hosts_follow_a_sentinel_failover_mid_run_and_lose_nothing_acknowledged() {
    deadline(Duration::from_secs(240), async {
        let mut primary = RedisServer::start().await;
        let replicas = [
            replica_of(primary.port).await,
            replica_of(primary.port).await,
        ];
        let sentinels =
            Sentinels::start(primary.port, "ledger", 3, Duration::from_millis(1000)).await;
        let url = sentinels.url();
        let dir = TempDir::new("sentinel");
        let (jobs, data) = deploy_billing(dir.path(), CUSTOMERS);
        // 20 ms per customer: four steps of about a second each. Retries come quickly, so a
        // step that fails while the primary is away (its writes unavailable) is tried again soon.
        std::fs::write(data.join("billing/delay-ms"), "20").unwrap();
        std::fs::write(
            jobs.join("billing.toml"),
            "[retry]\nattempts = 10\nbackoff = \"500ms\"\nmax-backoff = \"2s\"\n",
        )
        .unwrap();
        let hosts: Vec<HostProcess> = (0..2)
            .map(|i| {
                HostProcess::start_node(
                    LEASEHOLD,
                    &url,
                    &jobs,
                    &format!("s{i}"),
                    ("2s", "500ms"),
                    &[
                        "--data-dir",
                        data.to_str().unwrap(),
                        "--min-replicas",
                        "1",
                        "--replica-timeout",
                        "1s",
                    ],
                )
            })
            .collect();
        for h in &hosts {
            h.wait_for_log(
                "redis primary found through the sentinels",
                Duration::from_secs(30),
            )
            .await;
        }
        // The CLI reaches the primary through the sentinels too.
        leasehold_harness::process::trigger(LEASEHOLD, &url, "billing", PERIOD);
        wait_for(
            "the run to complete a step",
            Duration::from_secs(60),
            || async {
                record(&primary)
                    .await
                    .filter(|r| r["step"].as_u64() >= Some(1))
            },
        )
        .await;
        // The primary dies mid-run; the sentinels promote one of its replicas.
        let old = primary.port;
        primary.kill();
        let promoted = wait_for(
            "the sentinels to promote a replica",
            Duration::from_secs(60),
            || async { sentinels.primary_port().await.filter(|p| *p != old) },
        )
        .await;
        let new = replicas
            .iter()
            .find(|r| r.port == promoted)
            .expect("a replica was promoted");
        let done = wait_for(
            "the run to be done on the new primary",
            Duration::from_secs(120),
            || async { record(new).await.filter(|r| r["status"] == "done") },
        )
        .await;
        // Every customer charged once, on the new primary: nothing a host was told was written
        // is missing, and nothing was charged twice (one key per customer, each created once).
        let mut c = new.conn().await;
        let charges: Vec<String> = c
            .keys(format!("lh:{{billing}}:data:charge/{PERIOD}/*"))
            .await
            .unwrap();
        assert_eq!(charges.len(), CUSTOMERS, "{done}");
        let summary: Option<String> = c
            .get(format!("lh:{{billing}}:data:summary/{PERIOD}"))
            .await
            .unwrap();
        assert!(
            summary.is_some_and(|s| s.contains(&CUSTOMERS.to_string())),
            "{done}"
        );
        let fence: u64 = c.hget("lh:{billing}:fence", "token").await.unwrap();
        assert!(fence >= done["token"].as_u64().unwrap());
        // The hosts said where they went.
        let moved: usize = hosts
            .iter()
            .map(|h| h.log_lines_with("redis primary moved").len())
            .sum();
        assert!(
            moved >= 1,
            "no host logged the move; sentinels:\n{}",
            sentinels.logs()
        );
    })
    .await;
}
