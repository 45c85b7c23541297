//! The run bookkeeping under the fence, with real hosts: a late write of an ended term (or of
//! a term that served an older request) cannot drop an operator's request or a newer term's
//! open run, writes held inside Redis by a write pause are not applied once their term has
//! ended, and a corrupt run record blocks nothing.
//!
//! "Late writes" are reproduced exactly: the history recorder captures every command a host
//! sent, and the test sends that host's writes again at the point where they would do harm (as
//! a host paused between two commands would). Each scenario failed before the bookkeeping
//! moved into the fenced-write script: the replayed `SREM`s were applied.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, run_leasehold, run_record,
    trigger, wait_for,
};
use crate::history::{Recorder, split_line};

const PERIOD: &str = "2026-01-01";

/// A jobs directory with the `probe` fixture misbehaving as `mode` (`unreachable`: every
/// attempt traps at once; `spin`: every attempt runs into its 3 s step limit).
fn probe_dirs(mode: &str) -> TempDir {
    let dir = TempDir::new("bookkeeping");
    std::fs::create_dir_all(dir.join("jobs")).unwrap();
    std::fs::create_dir_all(dir.join("data/probe")).unwrap();
    std::fs::write(dir.join("data/probe/mode"), mode).unwrap();
    std::fs::copy(guests().wasm("probe"), dir.join("jobs/probe.wasm")).unwrap();
    std::fs::write(dir.join("jobs/probe.toml"), crate::harness::PINNED_TO_2026).unwrap();
    dir
}

/// The probe fires once, on 1 January 2026 (its schedule pinned by its sidecar): a cursor after
/// that fire time keeps the scheduler from running [`PERIOD`] by itself, so only the test's
/// requests run it.
async fn seed_cursor(redis: &RedisServer) {
    let _: () = redis
        .conn()
        .await
        .set("lh:{probe}:cursor", "2026-06-01T00:00:00Z")
        .await
        .unwrap();
}

fn start(dir: &TempDir, redis: &RedisServer, node: &str, timing: (&str, &str)) -> HostProcess {
    start_with(dir, redis, node, timing, &[])
}

/// [`start`] with the flags `extra` as well.
fn start_with(
    dir: &TempDir,
    redis: &RedisServer,
    node: &str,
    timing: (&str, &str),
    extra: &[&str],
) -> HostProcess {
    let data = dir.join("data");
    let mut args = vec!["--data-dir", data.to_str().unwrap()];
    args.extend_from_slice(extra);
    HostProcess::start_node(
        LEASEHOLD,
        &redis.url(),
        &dir.join("jobs"),
        node,
        timing,
        &args,
    )
}

/// Waits (up to `limit`) for the probe's record of [`PERIOD`] to satisfy `ok`.
async fn wait_record(
    redis: &RedisServer,
    what: &str,
    limit: Duration,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    wait_for(what, limit, || async {
        run_record(redis, "probe", PERIOD).await.filter(|r| ok(r))
    })
    .await
}

/// Waits until the leader has cleared the request it served (its last bookkeeping of the run).
async fn wait_request_cleared(redis: &RedisServer) {
    wait_for(
        "the served request to be cleared",
        Duration::from_secs(30),
        || async {
            let mut c = redis.conn().await;
            let there: bool = c.hexists("lh:{probe}:requested", PERIOD).await.unwrap();
            (!there).then_some(())
        },
    )
    .await;
}

/// Every write command the client at `source` sent from line `from` on, as recorded: what a
/// host paused just before sending them would send late.
fn writes_of(lines: &[String], source: &str, from: usize) -> Vec<Vec<String>> {
    const WRITES: [&str; 7] = ["EVALSHA", "EVAL", "SET", "DEL", "SADD", "SREM", "HDEL"];
    lines[from..]
        .iter()
        .filter_map(|l| split_line(l))
        .filter(|(s, args)| {
            s == source
                && args
                    .first()
                    .is_some_and(|c| WRITES.contains(&c.to_ascii_uppercase().as_str()))
        })
        .map(|(_, args)| args)
        .collect()
}

/// Where (line index) and from which client a host's script wrote the probe's record as
/// `failed` with attempt `attempt`.
fn failed_save(lines: &[String], attempt: u64) -> (usize, String) {
    let key = format!("lh:{{probe}}:run:{PERIOD}");
    let applied = lines
        .iter()
        .position(|l| {
            split_line(l).is_some_and(|(s, args)| {
                s == "lua"
                    && args.first().is_some_and(|c| c == "SET")
                    && args.get(1) == Some(&key)
                    && args.get(2).is_some_and(|v| {
                        serde_json::from_str::<Value>(v)
                            .is_ok_and(|r| r["status"] == "failed" && r["attempt"] == attempt)
                    })
            })
        })
        .expect("the failed record's write in the history");
    // The script call that made it is the last client line before it.
    (0..applied)
        .rev()
        .find_map(|i| {
            split_line(&lines[i])
                .filter(|(s, _)| s != "lua")
                .map(|(s, _)| (i, s))
        })
        .expect("the script call before the failed record")
}

/// Sends recorded commands again; their replies (refusals included) are not errors here.
async fn replay(redis: &RedisServer, commands: &[Vec<String>]) {
    let mut c = redis.conn().await;
    for args in commands {
        let mut cmd = redis::cmd(&args[0]);
        for a in &args[1..] {
            cmd.arg(a);
        }
        let _: redis::RedisResult<redis::Value> = cmd.query_async(&mut c).await;
    }
}

#[tokio::test]
async fn a_leaders_late_clearing_does_not_drop_an_operators_new_request() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        seed_cursor(&redis).await;
        let recorder = Recorder::start(&redis).await;
        let dir = probe_dirs("unreachable");
        let host = start(&dir, &redis, "n1", ("2s", "500ms"));
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        trigger(&redis, "probe", PERIOD);
        wait_record(&redis, "attempt 1 to fail", Duration::from_secs(30), |r| {
            r["status"] == "failed" && r["attempt"] == 1
        })
        .await;
        wait_request_cleared(&redis).await;
        // Everything the leader wrote from its failed record on: the record itself and the
        // clearing of the request it served.
        let lines = recorder.lines();
        let (at, source) = failed_save(&lines, 1);
        let late = writes_of(&lines, &source, at);
        assert!(
            late.iter()
                .any(|c| c.iter().any(|a| a.ends_with(":requested"))),
            "the clearing is among the late writes: {late:?}"
        );
        // The operator asks again, and then the leader's clearing arrives (late).
        host.pause();
        let said = trigger(&redis, "probe", PERIOD);
        assert!(said.contains("requested a new run"), "{said}");
        replay(&redis, &late).await;
        host.resume();
        let r = wait_record(
            &redis,
            "the operator's re-run (attempt 2)",
            Duration::from_secs(30),
            |r| r["status"] == "failed" && r["attempt"] == 2,
        )
        .await;
        // The re-run keeps the attempt it replaced in the period's history.
        let earlier = r["attempts"].as_array().cloned().unwrap_or_default();
        assert_eq!(earlier.len(), 1, "{r}");
        assert_eq!(
            (
                earlier[0]["attempt"].as_u64(),
                earlier[0]["status"].as_str(),
                earlier[0]["failure"].as_str()
            ),
            (Some(1), Some("failed"), Some("trap")),
            "{r}"
        );
        recorder.check().unwrap_or_else(|v| panic!("{v}"));
    })
    .await;
}

#[tokio::test]
async fn a_zombies_late_bookkeeping_does_not_strand_its_successors_run() {
    deadline(Duration::from_secs(180), async {
        let redis = RedisServer::start().await;
        seed_cursor(&redis).await;
        let recorder = Recorder::start(&redis).await;
        let dir = probe_dirs("spin");
        let timing = ("1s", "200ms");
        let n1 = start(&dir, &redis, "n1", timing);
        n1.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        let mut n2 = start(&dir, &redis, "n2", timing);
        n2.wait_for_log("following", Duration::from_secs(60)).await;
        trigger(&redis, "probe", PERIOD);
        wait_record(&redis, "attempt 1 to fail", Duration::from_secs(30), |r| {
            r["status"] == "failed" && r["attempt"] == 1
        })
        .await;
        wait_request_cleared(&redis).await;
        let lines = recorder.lines();
        let (at, source) = failed_save(&lines, 1);
        let late = writes_of(&lines, &source, at);
        // n1 freezes; n2 takes over; the operator asks for the period again and n2 runs it.
        n1.pause();
        n2.wait_for_log("became leader", Duration::from_secs(30))
            .await;
        trigger(&redis, "probe", PERIOD);
        wait_record(
            &redis,
            "n2 to run attempt 2",
            Duration::from_secs(30),
            |r| r["status"] == "running" && r["attempt"] == 2 && r["node"] == "n2",
        )
        .await;
        // n1's late writes arrive, then n2 dies mid-run.
        replay(&redis, &late).await;
        n2.kill();
        let open: Vec<String> = redis
            .conn()
            .await
            .smembers("lh:{probe}:open")
            .await
            .unwrap();
        assert_eq!(open, vec![PERIOD.to_string()], "the run must stay open");
        // n1 wakes, finds the open run and finishes it: nothing is left `running`.
        n1.resume();
        let record = wait_record(
            &redis,
            "attempt 2 to be finished by the next leader",
            Duration::from_secs(60),
            |r| r["status"] == "failed",
        )
        .await;
        assert_eq!(record["attempt"], 2, "{record}");
        recorder.check().unwrap_or_else(|v| panic!("{v}"));
    })
    .await;
}

#[tokio::test]
async fn a_corrupt_run_record_is_moved_aside_and_blocks_nothing() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("corrupt");
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::copy(guests().wasm("ticker"), dir.join("jobs/ticker.wasm")).unwrap();
        // Every second, and a period that fires during an open run is skipped: an open run
        // that never closes would skip every later period.
        std::fs::write(dir.join("jobs/ticker.toml"), "overlap = \"skip\"\n").unwrap();
        let bad = "2026-11-30T00:00:00";
        let mut c = redis.conn().await;
        let _: () = c
            .set(format!("lh:{{ticker}}:run:{bad}"), "{not json")
            .await
            .unwrap();
        let _: i64 = c.sadd("lh:{ticker}:open", bad).await.unwrap();
        let _host = HostProcess::start_node(
            LEASEHOLD,
            &redis.url(),
            &dir.join("jobs"),
            "n1",
            ("2s", "500ms"),
            &[],
        );
        // Later periods run to `done`.
        wait_for("a later period done", Duration::from_secs(60), || async {
            let mut c = redis.conn().await;
            let keys: Vec<String> = c.keys("lh:{ticker}:run:*").await.unwrap();
            for k in keys {
                let raw: Option<String> = c.get(&k).await.unwrap();
                let record = raw.and_then(|r| serde_json::from_str::<Value>(&r).ok());
                if record.is_some_and(|r| r["status"] == "done") {
                    return Some(());
                }
            }
            None
        })
        .await;
        let kept: Option<String> = c.get(format!("lh:{{ticker}}:corrupt:{bad}")).await.unwrap();
        assert_eq!(kept.as_deref(), Some("{not json"), "kept for the operator");
        let open: Vec<String> = c.smembers("lh:{ticker}:open").await.unwrap();
        assert!(!open.contains(&bad.to_string()), "{open:?}");
        // The run history lists it as corrupt, with its size.
        let out = run_leasehold(&[
            "runs",
            "ticker",
            "--json",
            "--limit",
            "100000",
            "--redis-url",
            &redis.url(),
        ]);
        assert!(out.status.success());
        let listed: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let entry = listed
            .iter()
            .find(|r| r["period"] == bad)
            .expect("the corrupt record in the history");
        assert_eq!(entry["status"], "corrupt");
        assert!(
            entry["error"].as_str().unwrap().contains("9 bytes"),
            "{entry}"
        );
    })
    .await;
}

/// Redis paused for writes (`CLIENT PAUSE … WRITE`) past the lease: the leader's renewals and
/// bookkeeping are held inside Redis while its term runs out on its own clock. When the pause
/// ends they are executed — after the host has stopped leading — and every one is refused by
/// the fenced-write script. (Before the bookkeeping moved into that script, the held `SADD` to
/// the open-runs index was applied 0.7 s after "stopped leading"; the checker flags such a
/// plain write.)
#[tokio::test]
async fn writes_held_by_a_write_pause_are_not_applied_after_the_term_ended() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("write-pause");
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::copy(guests().wasm("ticker"), dir.join("jobs/ticker.wasm")).unwrap();
        let recorder = Recorder::start(&redis).await;
        let host = HostProcess::start_node(
            LEASEHOLD,
            &redis.url(),
            &dir.join("jobs"),
            "n1",
            ("1s", "200ms"),
            &[],
        );
        // The ticker runs once a second: a run's bookkeeping is always near.
        let first = wait_for("a first tick", Duration::from_secs(60), || async {
            crate::harness::run_records(&redis, "ticker")
                .await
                .into_iter()
                .find(|r| r["status"] == "done")
        })
        .await;
        let token = first["token"].as_u64().unwrap();
        let owner: String = redis.conn().await.get("lh:{ticker}:lease").await.unwrap();
        let mut op = recorder.operator_conn(&redis).await;
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(60_000)
            .arg("WRITE")
            .query_async(&mut op)
            .await
            .unwrap();
        host.wait_for_log("stopped leading", Duration::from_secs(20))
            .await;
        // Past the lease on Redis's clock too, then let the held commands through.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // A marker in the history (MONITOR does not show CLIENT commands): every write applied
        // after it was held by the pause, or sent after it.
        let _: String = redis::cmd("ECHO")
            .arg("pause-ends")
            .query_async(&mut op)
            .await
            .unwrap();
        let _: () = redis::cmd("CLIENT")
            .arg("UNPAUSE")
            .query_async(&mut op)
            .await
            .unwrap();
        // The job goes on in a newer term.
        wait_for(
            "a tick by a newer term",
            Duration::from_secs(30),
            || async {
                crate::harness::run_records(&redis, "ticker")
                    .await
                    .into_iter()
                    .find(|r| r["status"] == "done" && r["token"].as_u64() > Some(token))
            },
        )
        .await;

        let lines = recorder.lines();
        let unpause = lines
            .iter()
            .position(|l| l.contains("\"pause-ends\""))
            .expect("the marker is in the history");
        // The paused term's commands did reach Redis after the pause…
        let held = lines[unpause..]
            .iter()
            .filter(|l| !l.contains("[0 lua]") && l.contains(&owner))
            .count();
        assert!(
            held >= 1,
            "no command of term {owner} was held by the pause"
        );
        // …and none of its writes was applied after it.
        let history = recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated:\n{v}"));
        let late: Vec<_> = history
            .applied
            .iter()
            .filter(|a| a.owner == owner && a.at > unpause)
            .collect();
        assert!(
            late.is_empty(),
            "writes of the ended term applied: {late:?}"
        );
    })
    .await;
}

/// Issue 12, item 9: `leasehold trigger` refuses a period that is not one of the job's, as
/// the HTTP API does, checked against the schedule the leader publishes; before any leader
/// has, it says it cannot check.
#[tokio::test]
async fn trigger_refuses_a_period_that_is_not_in_the_schedule() {
    deadline(Duration::from_secs(90), async {
        let redis = RedisServer::start().await;
        let trigger_of = |period: &str| {
            run_leasehold(&[
                "trigger",
                "ticker",
                "--period",
                period,
                "--redis-url",
                &redis.url(),
            ])
        };
        let before = trigger_of("2026-11-02");
        assert!(before.status.success());
        let err = String::from_utf8_lossy(&before.stderr);
        assert!(err.contains("is not checked against it"), "{err}");

        let dir = TempDir::new("trigger-check");
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::copy(guests().wasm("ticker"), dir.join("jobs/ticker.wasm")).unwrap();
        let _host = HostProcess::start_node(
            LEASEHOLD,
            &redis.url(),
            &dir.join("jobs"),
            "n1",
            ("2s", "500ms"),
            &[],
        );
        wait_for(
            "the ticker's schedule to be published",
            Duration::from_secs(60),
            || async {
                let s: Option<String> = redis
                    .conn()
                    .await
                    .get("lh:{ticker}:schedule")
                    .await
                    .unwrap();
                s
            },
        )
        .await;
        // The ticker fires every second: its periods are date-times, not dates.
        let refused = trigger_of("2026-11-03");
        assert_eq!(refused.status.code(), Some(1));
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(
            err.contains(
                "2026-11-03 is not a period of ticker: its schedule is \"* * * * * *\" in UTC"
            ),
            "{err}"
        );
        let requests: Vec<String> = redis
            .conn()
            .await
            .hkeys("lh:{ticker}:requested")
            .await
            .unwrap();
        assert!(
            !requests.contains(&"2026-11-03".to_string()),
            "{requests:?}"
        );
        let accepted = trigger_of("2026-11-03T10:00:00");
        assert!(
            accepted.status.success(),
            "{}",
            String::from_utf8_lossy(&accepted.stderr)
        );
        assert!(String::from_utf8_lossy(&accepted.stderr).is_empty());
    })
    .await;
}

#[tokio::test]
async fn an_operator_cancels_a_running_step_and_the_run_is_recorded_cancelled() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        seed_cursor(&redis).await;
        let recorder = Recorder::start(&redis).await;
        let dir = probe_dirs("spin");
        let host = start_with(
            &dir,
            &redis,
            "n1",
            ("2s", "500ms"),
            &["--http", "127.0.0.1:0"],
        );
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        let url = redis.url();
        let cancel = |period: &str| {
            run_leasehold(&["cancel", "probe", "--period", period, "--redis-url", &url])
        };
        // Nothing to cancel yet: an error, and nothing is asked.
        let out = cancel(PERIOD);
        assert!(!out.status.success(), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("has no run of period"),
            "{out:?}"
        );
        trigger(&redis, "probe", PERIOD);
        // The step spins (up to its 3 s limit); the cancel stops it mid-step.
        host.wait_for_log("\"starting run\"", Duration::from_secs(30))
            .await;
        let out = cancel(PERIOD);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(said.contains("asked the leader to cancel"), "{said}");
        let r = wait_record(
            &redis,
            "the run to be cancelled",
            Duration::from_secs(30),
            |r| r["status"] == "cancelled",
        )
        .await;
        assert!(
            r["error"]
                .as_str()
                .is_some_and(|e| e.contains("cancelled by an operator")),
            "{r}"
        );
        assert!(r["finished_at"].is_string(), "{r}");
        assert_eq!(
            crate::harness::settled(&1, || host.log_lines_with("stopped the run's step").len())
                .await,
            1,
            "the cancel did not stop the running step"
        );
        // No step timed out: the step was stopped, not failed.
        assert!(host.log_lines_with("attempt failed").is_empty());
        assert!(host.log_lines_with("run failed").is_empty());
        wait_request_cleared(&redis).await;
        // Cancelling again says so; over HTTP too; a period with no open run is a conflict.
        let out = cancel(PERIOD);
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("already cancelled"));
        let addr = host.http_addr(Duration::from_secs(30)).await;
        let path = format!("/v1/jobs/probe/runs/{PERIOD}/cancel");
        let (code, body) = crate::harness::http(&addr, "POST", &path, None).await;
        assert_eq!(
            (code, body["result"].as_str()),
            (200, Some("already-cancelled")),
            "{body}"
        );
        let (code, body) =
            crate::harness::http(&addr, "POST", "/v1/jobs/probe/runs/2020-01-01/cancel", None)
                .await;
        assert_eq!(
            (code, body["result"].as_str()),
            (409, Some("no-run")),
            "{body}"
        );
        // A trigger runs it again as the next attempt, the cancelled one kept in its history.
        let said = trigger(&redis, "probe", PERIOD);
        assert!(said.contains("requested a new run"), "{said}");
        let r = wait_record(
            &redis,
            "the re-run to start",
            Duration::from_secs(30),
            |r| r["attempt"] == 2,
        )
        .await;
        assert_eq!(r["attempts"][0]["status"], "cancelled", "{r}");
        let out = run_leasehold(&["runs", "probe", "--redis-url", &url]);
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(table.contains("attempt 1 cancelled at step 0"), "{table}");
        recorder.check().unwrap_or_else(|v| panic!("{v}"));
    })
    .await;
}

#[tokio::test]
async fn a_paused_jobs_waiting_run_is_cancelled_too() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        seed_cursor(&redis).await;
        let dir = probe_dirs("unreachable");
        // The first attempt traps; the retry waits 30 s: the run is open, running nothing.
        std::fs::write(
            dir.join("jobs/probe.toml"),
            format!(
                "{}[retry]\nattempts = 3\nbackoff = \"30s\"\n",
                crate::harness::PINNED_TO_2026
            ),
        )
        .unwrap();
        let host = start(&dir, &redis, "n1", ("2s", "500ms"));
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        trigger(&redis, "probe", PERIOD);
        wait_record(
            &redis,
            "attempt 1 to fail and wait",
            Duration::from_secs(30),
            |r| r["status"] == "pending" && r["attempt"] == 2,
        )
        .await;
        let url = redis.url();
        let out = run_leasehold(&["pause", "probe", "--redis-url", &url]);
        assert!(out.status.success(), "{out:?}");
        host.wait_for_log("job paused", Duration::from_secs(30))
            .await;
        let out = run_leasehold(&["cancel", "probe", "--period", PERIOD, "--redis-url", &url]);
        assert!(out.status.success(), "{out:?}");
        let r = wait_record(
            &redis,
            "the paused job's run cancelled",
            Duration::from_secs(30),
            |r| r["status"] == "cancelled",
        )
        .await;
        // Its failed attempt is kept; nothing ran after the pause.
        assert_eq!(r["attempts"][0]["failure"], "trap", "{r}");
        assert_eq!(host.log_lines_with("\"starting run\"").len(), 1);
        wait_request_cleared(&redis).await;
    })
    .await;
}
