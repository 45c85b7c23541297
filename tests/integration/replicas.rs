//! `--min-replicas`: every write of a term waits (`WAIT`) for Redis replicas to acknowledge it,
//! and fails as unavailable when they do not in time.

use std::time::Duration;

use redis::AsyncCommands;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisConfig, RedisServer, TempDir, deadline, guests, wait_for,
};

/// Periods of the ticker that are `done` on `redis`.
async fn done_periods(redis: &RedisServer) -> Vec<String> {
    let mut c = redis.conn().await;
    let keys: Vec<String> = c.keys("lh:{ticker}:run:*").await.unwrap();
    let mut done = Vec::new();
    for k in keys {
        let raw: Option<String> = c.get(&k).await.unwrap();
        if raw.is_some_and(|r| r.contains("\"status\":\"done\"")) {
            done.push(k);
        }
    }
    done
}

#[tokio::test]
async fn writes_wait_for_replicas_and_fail_without_them() {
    deadline(Duration::from_secs(120), async {
        let primary = RedisServer::start().await;
        let replica = RedisServer::start_with(RedisConfig::new().args([
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            primary.port.to_string(),
        ]))
        .await;
        wait_for(
            "the replica to connect",
            Duration::from_secs(30),
            || async {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut primary.conn().await)
                    .await
                    .unwrap();
                info.contains("connected_slaves:1").then_some(())
            },
        )
        .await;
        let dir = TempDir::new("replicas");
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::copy(guests().wasm("ticker"), dir.join("jobs/ticker.wasm")).unwrap();
        let host = HostProcess::start_node(
            LEASEHOLD,
            &primary.url(),
            &dir.join("jobs"),
            "n1",
            ("2s", "500ms"),
            &["--min-replicas", "1", "--replica-timeout", "500ms"],
        );
        // With the replica: runs complete, and what was acknowledged is on the replica.
        let done = wait_for("a done period", Duration::from_secs(30), || async {
            done_periods(&primary).await.into_iter().next()
        })
        .await;
        let on_replica: Option<String> = replica.conn().await.get(&done).await.unwrap();
        assert!(
            on_replica.is_some_and(|r| r.contains("\"status\":\"done\"")),
            "{done} acknowledged but not on the replica"
        );
        // Without it: writes are not acknowledged, and the host says so.
        drop(replica);
        let line = host
            .wait_for_log(
                "acknowledged by 0 of the 1 replicas required",
                Duration::from_secs(30),
            )
            .await;
        assert!(line.contains("\"level\":\"WARN\""), "{line}");
    })
    .await;
}
