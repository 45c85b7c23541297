//! End to end: a real `leasehold run` process with the reconciliation guest on the sample day
//! writes exactly the hand-checked report (`guest-jobs/reconciliation/sample/2026-11-27/
//! EXPECTED.md`), and the same period is never run twice.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;

use crate::harness::{
    self, HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, repo_root, wait_for,
};

const PERIOD: &str = "2026-11-27";
const RUN_KEY: &str = "lh:{reconciliation}:run:2026-11-27";
const REQUESTS: &str = "lh:{reconciliation}:requested";

/// A jobs directory with the reconciliation component and a data directory with the sample.
fn setup() -> TempDir {
    let dir = TempDir::new("e2e");
    harness::deploy_sample_reconciliation(&dir.join("jobs"), &dir.join("data"), PERIOD);
    dir
}

fn start_host(dir: &TempDir, redis: &RedisServer, node: &str) -> HostProcess {
    let jobs = dir.join("jobs");
    let data = dir.join("data");
    let data = ["--data-dir", data.to_str().unwrap()];
    HostProcess::start_node(LEASEHOLD, &redis.url(), &jobs, node, ("1s", "200ms"), &data)
}

fn trigger(redis: &RedisServer) -> String {
    harness::trigger(redis, "reconciliation", PERIOD)
}

/// Waits (up to `limit`) until the sample period's run record has `status`; returns it.
async fn wait_status(redis: &RedisServer, status: &str, what: &str, limit: Duration) -> Value {
    wait_for(what, limit, || async {
        harness::run_record(redis, "reconciliation", PERIOD)
            .await
            .filter(|r| r["status"] == status)
    })
    .await
}

#[tokio::test]
async fn the_sample_day_is_reconciled_exactly_once() {
    deadline(Duration::from_secs(240), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let dir = setup();
        let mut host = start_host(&dir, &redis, "n1");
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;

        assert!(
            trigger(&redis).contains("requested a run of reconciliation for period 2026-11-27")
        );
        let record = wait_status(
            &redis,
            "done",
            "the run to be done",
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(record["period"], PERIOD);
        assert_eq!(record["attempt"], 1);
        assert_eq!(record["node"], "n1");
        // 12 statement lines in chunks of 4 and the report, in one step: a day this small is
        // well within the job's step budget (the parts are still one per chunk).
        assert_eq!(record["step"], 1);
        assert!(record["component"].as_str().unwrap().starts_with("sha256:"));

        // The report, number by number, as computed by hand in EXPECTED.md.
        let summary: String = c
            .get("lh:{reconciliation}:data:report/2026-11-27")
            .await
            .unwrap();
        let summary: Value = serde_json::from_str(&summary).unwrap();
        let t = &summary["totals"];
        let expect = [
            ("bank_lines", 12),
            ("ledger_lines", 13),
            ("matched", 10),
            ("matched_by_reference", 6),
            ("matched_by_amount_date", 4),
            ("amount_mismatches", 1),
            ("missing_in_ledger", 1),
            ("missing_in_bank", 2),
            ("bank_total_cents", 741669),
            ("ledger_total_cents", 868669),
            ("matched_total_cents", 375669),
            ("net_difference_cents", -127000),
        ];
        for (field, value) in expect {
            assert_eq!(t[field], value, "totals.{field} in {summary}");
        }
        assert_eq!(summary["parts"], 3);
        let text: String = c
            .get("lh:{reconciliation}:data:report/2026-11-27/text")
            .await
            .unwrap();
        // Every line of each file is accounted for (13 and 14 lines, each with its line end).
        let read = |label: &str| {
            text.lines()
                .find(|l| l.starts_with(label))
                .and_then(|l| l.split_whitespace().last())
                .map(str::to_string)
        };
        assert_eq!(read("bank.csv lines read").as_deref(), Some("13"), "{text}");
        assert_eq!(
            read("ledger.csv lines read").as_deref(),
            Some("14"),
            "{text}"
        );
        for needle in [
            "-1270.00", "7416.69", "8686.69", "BNK-004", "LED-106", "BNK-008", "LED-109", "LED-113",
        ] {
            assert!(
                text.contains(needle),
                "{needle} missing from the report:\n{text}"
            );
        }
        let missing: String = c
            .get("lh:{reconciliation}:data:report/2026-11-27/missing-in-bank")
            .await
            .unwrap();
        let missing: Value = serde_json::from_str(&missing).unwrap();
        let ids: Vec<&str> = missing
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["LED-109", "LED-113"]);
        // The checkpoint of a finished run is gone; the request was taken up.
        assert!(
            !c.exists::<_, bool>("lh:{reconciliation}:ckpt:2026-11-27")
                .await
                .unwrap()
        );
        assert!(!c.sismember::<_, _, bool>(REQUESTS, PERIOD).await.unwrap());

        // Asking again is answered from the run record.
        assert!(trigger(&redis).contains("already done"));

        // SIGTERM: the host stops and releases its lease.
        assert!(
            host.terminate(Duration::from_secs(20)).await,
            "leasehold exited with an error"
        );
        // Its last lines reach the harness after the exit.
        let released =
            crate::harness::settled(&1, || host.log_lines_with("released lease").len()).await;
        assert!(released == 1, "{}", host.log().join("\n"));
        assert!(
            !c.exists::<_, bool>("lh:{reconciliation}:lease")
                .await
                .unwrap()
        );

        // A new replica, a new term, and a request for the same period slipped in directly:
        // the period is not run again.
        let host2 = start_host(&dir, &redis, "n2");
        host2
            .wait_for_log("became leader", Duration::from_secs(60))
            .await;
        let _: i64 = c.hset(REQUESTS, PERIOD, "by-hand none").await.unwrap();
        wait_for(
            "the request to be taken up",
            Duration::from_secs(30),
            || {
                let mut c = c.clone();
                async move {
                    (!c.hexists::<_, _, bool>(REQUESTS, PERIOD).await.unwrap()).then_some(())
                }
            },
        )
        .await;
        assert_eq!(
            harness::run_record(&redis, "reconciliation", PERIOD)
                .await
                .unwrap(),
            record,
            "the done record must not change"
        );
        assert!(
            host2
                .log_lines_with("starting run")
                .iter()
                .all(|l| !l.contains(PERIOD)),
            "{}",
            host2.log().join("\n")
        );
    })
    .await;
}

/// Writes what a leader that died after step 1 (two chunks of four lines) leaves behind: a
/// `running` record at step 2, its checkpoint, and the report parts of steps 0 and 1. The
/// state is made natively with the same `recon-core` code the guest runs.
async fn leave_a_run_half_done(c: &mut redis::aio::MultiplexedConnection) {
    let sample = repo_root().join(format!("guest-jobs/reconciliation/sample/{PERIOD}"));
    let bank_csv = std::fs::read_to_string(sample.join("bank.csv")).unwrap();
    let ledger_csv = std::fs::read_to_string(sample.join("ledger.csv")).unwrap();
    let bank = recon_core::parse_entries(&bank_csv, "bank.csv").unwrap();
    let ledger = recon_core::parse_entries(&ledger_csv, "ledger.csv").unwrap();
    let mut progress = recon_core::Progress::new(ledger.len());
    progress.fingerprint =
        recon_core::input_fingerprint(&bank_csv, &ledger_csv, recon_core::DEFAULT_TOLERANCE_DAYS);
    let mut matcher = recon_core::Matcher::new(&ledger, recon_core::DEFAULT_TOLERANCE_DAYS);
    for step in 0..2 {
        let chunk = recon_core::reconcile_chunk(&bank, &ledger, &mut matcher, &mut progress, 4);
        let key = format!("lh:{{reconciliation}}:data:report/{PERIOD}/part-{step}");
        let _: () = c
            .set(key, serde_json::to_vec(&chunk).unwrap())
            .await
            .unwrap();
    }
    // The crashed node ran the same component (a run never continues with another version).
    let wasm = std::fs::read(crate::harness::guests().wasm("reconciliation")).unwrap();
    let same_version = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&wasm))
    );
    let record = serde_json::json!({
        "period": PERIOD, "scheduled_at": "2026-11-27T02:30:00+00:00", "status": "running", "step": 2,
        "attempt": 1, "token": 7, "node": "crashed-node", "component": same_version,
        "started_at": "2026-11-27T02:30:00.000Z", "updated_at": "2026-11-27T02:30:01.000Z",
    });
    let _: () = c.set(RUN_KEY, record.to_string()).await.unwrap();
    let _: () = c
        .set(
            format!("lh:{{reconciliation}}:ckpt:{PERIOD}"),
            progress.to_bytes(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_run_left_half_done_resumes_from_its_checkpoint() {
    deadline(Duration::from_secs(240), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        leave_a_run_half_done(&mut c).await;
        let dir = setup();
        let host = start_host(&dir, &redis, "n3");
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        let said = trigger(&redis);
        assert!(said.contains("is already running (step 2"), "{said}");
        let record = wait_status(
            &redis,
            "done",
            "the resumed run to be done",
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(record["node"], "n3");
        assert_eq!(record["attempt"], 1, "a resumed run keeps its attempt");
        assert_eq!(record["started_at"], "2026-11-27T02:30:00.000Z");
        // Resumed at step 2: its last chunk and the report in that step.
        assert_eq!(record["step"], 3);
        let resumed = host
            .wait_for_log("resuming run from its checkpoint", Duration::from_secs(5))
            .await;
        assert!(
            resumed.contains("\"step\":2")
                && resumed.contains("\"previous_node\":\"crashed-node\""),
            "{resumed}"
        );
        // Only the remaining statement lines were processed on this node (its line may reach
        // the harness after the record is done).
        crate::harness::settled(&1, || host.log_lines_with("statement lines").len()).await;
        let chunks = host.log_lines_with("statement lines");
        assert_eq!(chunks.len(), 1, "{chunks:?}");
        assert!(
            chunks[0].contains("statement lines 8..12 of 12"),
            "{chunks:?}"
        );
        // And the report is the same as a run from scratch.
        let summary: String = c
            .get("lh:{reconciliation}:data:report/2026-11-27")
            .await
            .unwrap();
        let summary: Value = serde_json::from_str(&summary).unwrap();
        assert_eq!(summary["totals"]["matched"], 10);
        assert_eq!(summary["totals"]["amount_mismatches"], 1);
        assert_eq!(summary["totals"]["missing_in_ledger"], 1);
        assert_eq!(summary["totals"]["missing_in_bank"], 2);
        assert_eq!(summary["totals"]["net_difference_cents"], -127000);
        let text: String = c
            .get("lh:{reconciliation}:data:report/2026-11-27/text")
            .await
            .unwrap();
        assert!(
            text.contains("BNK-004") && text.contains("BNK-008"),
            "{text}"
        );
    })
    .await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "demo"),
    ignore = "needs the demo feature, which ./dev test turns on"
)]
async fn the_demo_tells_the_reference_scenario_and_ends_with_one_report() {
    deadline(Duration::from_secs(240), async {
        let wasm = guests().wasm("reconciliation");
        let out = tokio::process::Command::new(LEASEHOLD)
            .args(["demo", "--rows", "5000", "--job"])
            .arg(&wasm)
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "demo failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for needle in [
            "won the election",
            "Freezing",
            "took over with token",
            "resumes the run at step",
            "refused — fenced: token",
            "refused by PostgreSQL itself — ",
            "Exactly one report exists for 2026-11-27",
        ] {
            assert!(
                stdout.contains(needle),
                "{needle:?} missing from the narration:\n{stdout}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_waiting_run_is_found_and_finished_by_the_next_leader() {
    deadline(Duration::from_secs(240), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let dir = setup();
        // The statement has not arrived yet.
        let day = dir.join(&format!("data/reconciliation/{PERIOD}"));
        std::fs::rename(day.join("bank.csv"), dir.join("bank.csv.later")).unwrap();
        let mut host = start_host(&dir, &redis, "n1");
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        trigger(&redis);
        wait_status(
            &redis,
            "waiting",
            "the run to wait for its inputs",
            Duration::from_secs(60),
        )
        .await;
        // The request is gone (say an operator cleared it); only the open run remains.
        let _: i64 = c.hdel(REQUESTS, PERIOD).await.unwrap();
        std::fs::rename(dir.join("bank.csv.later"), day.join("bank.csv")).unwrap();
        assert!(host.terminate(Duration::from_secs(20)).await);

        let host2 = start_host(&dir, &redis, "n2");
        let record = wait_status(
            &redis,
            "done",
            "the next leader to finish the waiting run",
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(record["node"], "n2");
        // The open mark is cleared right after the final record is written.
        // (Today's scheduled period may stay open, waiting for its own statement.)
        crate::harness::wait_for(
            "the period's open mark to be cleared",
            Duration::from_secs(10),
            || async {
                let open: Vec<String> = redis
                    .conn()
                    .await
                    .smembers("lh:{reconciliation}:open")
                    .await
                    .unwrap();
                (!open.contains(&PERIOD.to_string())).then_some(())
            },
        )
        .await;
        drop(host2);
    })
    .await;
}

/// Issue 28: a statement with an unclosed quote on line 2 of 5 was read as 2 entries, the quote
/// swallowing the rest of the day. The run now fails, its record naming the file, the line
/// where the quote opened and why; nothing of the day is reported.
#[tokio::test]
async fn a_statement_with_an_unclosed_quote_fails_the_run_naming_the_line() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let dir = setup();
        std::fs::write(
            dir.join(&format!("data/reconciliation/{PERIOD}/bank.csv")),
            "id,date,amount,reference,description\n\
             BNK-001,2026-11-27,1250.00,INV-1042,\"ACME LTD\n\
             BNK-002,2026-11-27,840.50,INV-1043,Beta\n\
             BNK-003,2026-11-27,-1200.00,RENT-NOV,Rent\n\
             BNK-004,2026-11-27,3100.00,INV-1047,Gamma\n",
        )
        .unwrap();
        let _host = start_host(&dir, &redis, "n1");
        trigger(&redis);
        let failed =
            wait_status(&redis, "failed", "the run to fail", Duration::from_secs(90)).await;
        let error = failed["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(
                "bank.csv, line 2: malformed CSV: a quote opened on this line never closes"
            ),
            "{failed}"
        );
        let text: Option<String> = redis
            .conn()
            .await
            .get("lh:{reconciliation}:data:report/2026-11-27/text")
            .await
            .unwrap();
        assert_eq!(text, None, "a report was written from a file read short");
    })
    .await;
}
