//! Rolling upgrades with real containers: a job's new version written into the mounted jobs
//! directory while a run is in progress, and the three replicas restarted one after another
//! while runs are scheduled.

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use leasehold_harness::fixtures::new_version;
use leasehold_harness::history::Recorder;
use leasehold_harness::{deadline, http, wait_for};
use sha2::{Digest, Sha256};

use crate::compose::{Compose, Deploy, NODES};
use crate::{done, leader, mid_run, one_result, trigger};

/// A component's version as run records and `/v1/status` name it.
fn version(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[tokio::test]
#[ignore = "container tier: needs Docker and ./dev images (./dev test runs it)"]
async fn a_job_replaced_mid_run_finishes_with_its_version_and_every_replica_takes_the_new_one() {
    deadline(Duration::from_secs(240), async {
        // 300 customers, 100 ms each: six steps of about 5 s, so that the run is still going
        // when the last replica has loaded the new version (a replica finds it by a directory
        // event or its 10 s rescan, then compiles it while the others compile it too).
        let c = Compose::up("upgrade", Deploy::new("upgrade").with_billing_delay(100)).await;
        let jobs = c.deploy().jobs();
        let v1 = std::fs::read(jobs.join("billing.wasm")).unwrap();
        let v2 = new_version(&v1, "v2");
        let recorder = Recorder::start_at(&c.redis_client()).await;
        let node = leader(&c, "billing", None).await;
        trigger(&c, &node, "billing", "2026-11-07").await;
        let running = mid_run(&c, "billing", "2026-11-07").await;
        assert_eq!(running["component"], version(&v1), "{running}");

        // Deployed as README "Deploying jobs" says: a hidden file renamed into place.
        std::fs::write(jobs.join(".billing.wasm.tmp"), &v2).unwrap();
        std::fs::rename(jobs.join(".billing.wasm.tmp"), jobs.join("billing.wasm")).unwrap();
        for node in NODES {
            wait_for(
                &format!("{node} to serve the new version"),
                Duration::from_secs(60),
                || async {
                    let (_, status) = http(&c.http(node), "GET", "/v1/status", None).await;
                    status["jobs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|j| j["job"] == "billing" && j["component"] == version(&v2))
                        .then_some(())
                },
            )
            .await;
        }

        let meanwhile = crate::record(&mut c.redis().await, "billing", "2026-11-07").await;
        assert_eq!(
            meanwhile.as_ref().map(|r| &r["status"]),
            Some(&serde_json::json!("running")),
            "the run ended before every replica had the new version: {meanwhile:?}"
        );
        // The run in progress finishes with the version it started with...
        let finished = done(&c, "billing", "2026-11-07", Duration::from_secs(120)).await;
        assert_eq!(finished["component"], version(&v1), "{finished}");
        one_result(&recorder, "2026-11-07");
        // ...and the next run is the new version's.
        let node = leader(&c, "billing", None).await;
        trigger(&c, &node, "billing", "2026-11-08").await;
        let next = done(&c, "billing", "2026-11-08", Duration::from_secs(120)).await;
        assert_eq!(next["component"], version(&v2), "{next}");
        one_result(&recorder, "2026-11-08");
    })
    .await;
}

/// A ticker period's id: the second, in UTC.
fn tick_period(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S").to_string()
}

#[tokio::test]
#[ignore = "container tier: needs Docker and ./dev images (./dev test runs it)"]
async fn a_rolling_restart_of_the_three_replicas_loses_and_doubles_no_period() {
    deadline(Duration::from_secs(300), async {
        // The ticker has a period every second (catch-up: every missed one); a billing run of
        // about 15 s is in progress while the first replicas restart.
        let deploy = Deploy::new("rolling").with_ticker().with_billing_delay(50);
        let c = Compose::up("rolling", deploy).await;
        let recorder = Recorder::start_at(&c.redis_client()).await;
        leader(&c, "ticker", None).await;
        let from = Utc::now().trunc_subsecs(0) + chrono::Duration::seconds(2);
        let node = leader(&c, "billing", None).await;
        trigger(&c, &node, "billing", "2026-11-09").await;
        mid_run(&c, "billing", "2026-11-09").await;

        for node in NODES {
            c.compose(&["restart", node]);
            c.healthy(node).await;
        }
        let to = Utc::now().trunc_subsecs(0);

        done(&c, "billing", "2026-11-09", Duration::from_secs(120)).await;
        one_result(&recorder, "2026-11-09");
        // Every second from before the first restart to after the last has run, once.
        let last = tick_period(to);
        wait_for(
            "the ticker to run past the last restart",
            Duration::from_secs(60),
            || async {
                crate::record(&mut c.redis().await, "ticker", &last)
                    .await
                    .filter(|r| r["status"] == "done")
            },
        )
        .await;
        let history = recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated:\n{v}"));
        let mut t = from;
        let mut periods = 0;
        while t <= to {
            let period = tick_period(t);
            let n = history.done_records("ticker", &period).len();
            assert_eq!(n, 1, "ticker period {period} recorded done {n} times");
            t += chrono::Duration::seconds(1);
            periods += 1;
        }
        assert!(periods >= 10, "only {periods} periods checked");
        eprintln!("{periods} ticker periods through the rolling restart, each done once");
    })
    .await;
}
