//! The live jobs directory: a running host picks up a dropped-in job, serves a replacement from
//! the next run (a run in progress finishes with its version), releases a removed job's lease at
//! once, never loads a file that is still being written, and keeps serving the old version when
//! a replacement is refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::AsyncCommands;
use sha2::{Digest, Sha256};

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, new_version, run_record,
    trigger, wait_for,
};

/// How operators should deploy: write a hidden temporary file in the same directory, then
/// rename it into place (atomic).
fn deploy(bytes: &[u8], jobs: &Path, name: &str) -> PathBuf {
    let tmp = jobs.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).unwrap();
    let dest = jobs.join(name);
    std::fs::rename(&tmp, &dest).unwrap();
    dest
}

/// `sha256:` of `bytes`, as run records name a component.
fn hash(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The owner of `job`'s lease, if any.
async fn lease_owner(redis: &RedisServer, job: &str) -> Option<String> {
    redis
        .conn()
        .await
        .get(format!("lh:{{{job}}}:lease"))
        .await
        .unwrap()
}

/// Waits for a `done` record of some period of the ticker written after `after` (in ms since
/// the epoch, Redis time); returns the period.
async fn a_tick_after(redis: &RedisServer, after_ms: i64) -> String {
    wait_for(
        "a ticker run done after the mark",
        Duration::from_secs(30),
        || async {
            let mut c = redis.conn().await;
            let keys: Vec<String> = c.keys("lh:{ticker}:run:*").await.unwrap();
            for k in keys {
                let raw: Option<String> = c.get(&k).await.unwrap();
                let Some(rec) =
                    raw.and_then(|r| serde_json::from_str::<serde_json::Value>(&r).ok())
                else {
                    continue;
                };
                let finished = rec["finished_at"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                if rec["status"] == "done"
                    && finished.is_some_and(|f| f.timestamp_millis() > after_ms)
                {
                    return Some(rec["period"].as_str().unwrap().to_string());
                }
            }
            None
        },
    )
    .await
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn start(redis: &RedisServer, jobs: &Path, data: Option<&Path>) -> HostProcess {
    let mut extra = vec![];
    if let Some(d) = data {
        extra = vec!["--data-dir", d.to_str().unwrap()];
    }
    // A long lease: a lease that disappears quickly was released, not expired.
    HostProcess::start_node(LEASEHOLD, &redis.url(), jobs, "n1", ("60s", "2s"), &extra)
}

#[tokio::test]
async fn jobs_are_added_replaced_refused_and_removed_while_the_host_runs() {
    deadline(Duration::from_secs(180), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("live-dir");
        let jobs = dir.join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        let host = start(&redis, &jobs, None);
        host.wait_for_log("node started", Duration::from_secs(60))
            .await;

        // Added: loaded, campaigned for, run.
        let ticker = std::fs::read(guests().wasm("ticker")).unwrap();
        let path = deploy(&ticker, &jobs, "ticker.wasm");
        host.wait_for_log("loaded job", Duration::from_secs(60))
            .await;
        wait_for("n1 to lead the ticker", Duration::from_secs(30), || async {
            lease_owner(&redis, "ticker")
                .await
                .filter(|o| o.starts_with("n1:"))
        })
        .await;
        a_tick_after(&redis, 0).await;

        // A second file describing the same job is refused; the first keeps it.
        deploy(&ticker, &jobs, "ticker-copy.wasm");
        let dup = host
            .wait_for_log("is already served from", Duration::from_secs(30))
            .await;
        assert!(
            dup.contains("ticker-copy.wasm") && dup.contains("ticker.wasm"),
            "{dup}"
        );

        // A bad replacement is refused and the old version keeps running.
        deploy(b"\0asm\x0d\0\x01\0garbage", &jobs, "ticker.wasm");
        let refused = host
            .wait_for_log("keeps running", Duration::from_secs(30))
            .await;
        assert!(
            refused.contains(&hash(&ticker)) && refused.contains("not a valid component"),
            "{refused}"
        );
        a_tick_after(&redis, now_ms()).await;

        // A good replacement is served from the next run.
        let v2 = new_version(&ticker, "v2");
        deploy(&v2, &jobs, "ticker.wasm");
        host.wait_for_log("job replaced", Duration::from_secs(30))
            .await;
        let period = a_tick_after(&redis, now_ms()).await;
        let rec = run_record(&redis, "ticker", &period).await.unwrap();
        assert_eq!(rec["component"], hash(&v2));

        // Removed (both files): campaigning stops and the lease is released, long before the
        // 60 s lease could expire.
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(jobs.join("ticker-copy.wasm")).unwrap();
        host.wait_for_log(
            "job removed from the jobs directory",
            Duration::from_secs(30),
        )
        .await;
        wait_for(
            "the ticker's lease to be released",
            Duration::from_secs(15),
            || async { lease_owner(&redis, "ticker").await.is_none().then_some(()) },
        )
        .await;
        // The host keeps serving: a job dropped in later is led, and the ticker stays unled.
        let stepper = std::fs::read(guests().wasm("stepper")).unwrap();
        deploy(&stepper, &jobs, "stepper.wasm");
        wait_for(
            "n1 to lead the stepper",
            Duration::from_secs(60),
            || async {
                lease_owner(&redis, "stepper")
                    .await
                    .filter(|o| o.starts_with("n1:"))
            },
        )
        .await;
        assert_eq!(lease_owner(&redis, "ticker").await, None);
    })
    .await;
}

#[tokio::test]
async fn a_run_in_progress_finishes_with_the_version_it_started_with() {
    deadline(Duration::from_secs(180), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("pinned");
        let (jobs, data) = (dir.join("jobs"), dir.join("data"));
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::create_dir_all(data.join("stepper")).unwrap();
        let v1 = std::fs::read(guests().wasm("stepper")).unwrap();
        deploy(&v1, &jobs, "stepper.wasm");
        let host = start(&redis, &jobs, Some(&data));
        // The stepper runs the current period of its yearly schedule at once.
        let period = chrono::Utc::now().format("%Y-01-01").to_string();
        host.wait_for_log("starting run", Duration::from_secs(60))
            .await;
        std::fs::write(data.join("stepper/go-0"), "").unwrap();
        wait_for("step 0 to be saved", Duration::from_secs(30), || async {
            run_record(&redis, "stepper", &period)
                .await
                .filter(|r| r["step"] == 1)
        })
        .await;

        // Step 1 is running (waiting for its gate) when version 2 arrives.
        let v2 = new_version(&v1, "v2");
        deploy(&v2, &jobs, "stepper.wasm");
        host.wait_for_log("job replaced", Duration::from_secs(30))
            .await;
        std::fs::write(data.join("stepper/go-1"), "").unwrap();
        std::fs::write(data.join("stepper/go-2"), "").unwrap();
        let done = wait_for("the run to finish", Duration::from_secs(30), || async {
            run_record(&redis, "stepper", &period)
                .await
                .filter(|r| r["status"] == "done")
        })
        .await;
        assert_eq!(done["component"], hash(&v1), "{done}");
        assert_eq!(done["step"], 3);

        // The next run uses version 2.
        trigger(&redis, "stepper", "2025-01-01");
        let next = wait_for(
            "the triggered run to finish",
            Duration::from_secs(30),
            || async {
                run_record(&redis, "stepper", "2025-01-01")
                    .await
                    .filter(|r| r["status"] == "done")
            },
        )
        .await;
        assert_eq!(next["component"], hash(&v2), "{next}");
    })
    .await;
}

#[tokio::test]
async fn a_run_started_by_a_version_this_host_lacks_fails_loudly_instead_of_mixing() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("unknown-version");
        let (jobs, data) = (dir.join("jobs"), dir.join("data"));
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::create_dir_all(data.join("stepper")).unwrap();
        for gate in ["go-0", "go-1", "go-2"] {
            std::fs::write(data.join("stepper").join(gate), "").unwrap();
        }
        deploy(
            &std::fs::read(guests().wasm("stepper")).unwrap(),
            &jobs,
            "stepper.wasm",
        );
        // Another replica ran step 0 of this period with a version this host never had.
        let period = chrono::Utc::now().format("%Y-01-01").to_string();
        let other = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
        let record = serde_json::json!({
            "period": period, "scheduled_at": "", "status": "running", "step": 1, "attempt": 1,
            "token": 1, "node": "n0", "component": other,
            "started_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:01Z",
        });
        let mut c = redis.conn().await;
        let _: () = c
            .set(format!("lh:{{stepper}}:run:{period}"), record.to_string())
            .await
            .unwrap();
        let _: () = c.sadd("lh:{stepper}:open", &period).await.unwrap();

        let _host = start(&redis, &jobs, Some(&data));
        let failed = wait_for("the run to fail", Duration::from_secs(60), || async {
            run_record(&redis, "stepper", &period)
                .await
                .filter(|r| r["status"] == "failed")
        })
        .await;
        assert_eq!(failed["failure"], "version-changed", "{failed}");
        let why = failed["error"].as_str().unwrap();
        assert!(
            why.contains(other) && why.contains("never mixes versions"),
            "{why}"
        );
        assert_eq!(
            failed["step"], 1,
            "no step ran with the other version: {failed}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_file_still_being_written_is_not_loaded_half_written() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("partial");
        let jobs = dir.join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        let host = start(&redis, &jobs, None);
        host.wait_for_log("node started", Duration::from_secs(60))
            .await;

        // Copied in place, slowly: 4 KiB every 50 ms (over a second in all), each chunk a
        // change the host is told about.
        let ticker = std::fs::read(guests().wasm("ticker")).unwrap();
        let path = jobs.join("ticker.wasm");
        let mut file = std::fs::File::create(&path).unwrap();
        for chunk in ticker.chunks(4096) {
            std::io::Write::write_all(&mut file, chunk).unwrap();
            file.sync_data().unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(file);

        let loaded = host
            .wait_for_log("loaded job", Duration::from_secs(60))
            .await;
        assert!(loaded.contains(&hash(&ticker)), "{loaded}");
        assert_eq!(host.log_lines_with("refused"), Vec::<String>::new());
        assert_eq!(host.log_lines_with("loaded job").len(), 1);
    })
    .await;
}

#[tokio::test]
async fn one_component_serves_several_jobs_named_by_their_sidecars() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("named");
        let jobs = dir.join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        let ticker = std::fs::read(guests().wasm("ticker")).unwrap();
        for name in ["tick-eu", "tick-us"] {
            std::fs::write(
                jobs.join(format!("{name}.toml")),
                format!("name = \"{name}\"\n"),
            )
            .unwrap();
            deploy(&ticker, &jobs, &format!("{name}.wasm"));
        }
        let host = start(&redis, &jobs, None);
        for name in ["tick-eu", "tick-us"] {
            wait_for(
                &format!("a run of {name}"),
                Duration::from_secs(60),
                || async {
                    let recs = crate::harness::run_records(&redis, name).await;
                    recs.into_iter().find(|r| r["status"] == "done")
                },
            )
            .await;
        }
        // One compile: the second job shares the first one's code.
        let loaded = host.log_lines_with("loaded job");
        assert_eq!(loaded.len(), 2, "{loaded:?}");
        assert!(
            loaded.iter().any(|l| l.contains("\"compiled\":\"shared\"")),
            "{loaded:?}"
        );
        // Each job writes in its own namespace.
        let mut c = redis.conn().await;
        for name in ["tick-eu", "tick-us"] {
            let ticks: Vec<String> = c.keys(format!("lh:{{{name}}}:data:tick/*")).await.unwrap();
            assert!(!ticks.is_empty(), "{name}");
        }
    })
    .await;
}

/// Three replicas sharing one jobs directory each load a component renamed into it from the
/// directory's change events, not from the 10 s rescan: every one of eight deployments in a row
/// is loaded by all three within 5 s of its rename (a missed event would wait for the rescan).
#[tokio::test]
async fn a_rename_into_a_shared_directory_is_loaded_by_every_replica_from_its_watch() {
    deadline(Duration::from_secs(240), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("shared-dir");
        let jobs = dir.join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        let hosts: Vec<HostProcess> = (1..=3)
            .map(|i| {
                HostProcess::start_node(
                    LEASEHOLD,
                    &redis.url(),
                    &jobs,
                    &format!("n{i}"),
                    ("60s", "2s"),
                    &[],
                )
            })
            .collect();
        for h in &hosts {
            h.wait_for_log("node started", Duration::from_secs(60))
                .await;
        }
        let ticker = std::fs::read(guests().wasm("ticker")).unwrap();
        // Compiled once per host first (a compile can take seconds on a loaded machine); the
        // eight below share that code, so their loads take no compile.
        deploy(&ticker, &jobs, "ticker.wasm");
        for h in &hosts {
            h.wait_for_log("loaded job", Duration::from_secs(60)).await;
        }
        for i in 0..8 {
            let name = format!("tick-{i}");
            // The sidecar first (its own event), then the component, renamed in.
            std::fs::write(
                jobs.join(format!("{name}.toml")),
                format!("name = \"{name}\"\n"),
            )
            .unwrap();
            deploy(&ticker, &jobs, &format!("{name}.wasm"));
            let field = format!("\"job\":\"{name}\"");
            for h in &hosts {
                h.wait_for_log_matching(
                    &format!("{name} loaded (from the watch, within 5 s)"),
                    Duration::from_secs(5),
                    |l| l.contains("loaded job") && l.contains(&field),
                )
                .await;
            }
        }
    })
    .await;
}
