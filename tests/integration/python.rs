//! A job written in Python (`guest-jobs/settlement-py`, built by componentize-py with default
//! options) in real hosts: it passes `check` with the default limits, it survives a SIGKILL of
//! its leader mid-run and settles every merchant exactly once, an uncaught Python exception
//! leaves its traceback in the failed run's record, and while it compiles (seconds) its host
//! already serves HTTP and runs its other jobs. A Python job that calls HTTP
//! (`guest-jobs/notify-py`, world `http-job`: `job` and `wasi:http`) reaches a granted fenced
//! receiver with the term's token, and a destination not granted fails its run, naming the
//! error code.
//!
//! The component is about 18 MB and takes seconds to compile in a debug host, so the tests first
//! compile it once into the default compiled-code cache with `leasehold check` (which reads and
//! fills the cache, as `leasehold run` does); the hosts then load it from there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use redis::AsyncCommands;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, http, run_leasehold_within,
    run_records, wait_for,
};
use crate::history::Recorder;

/// Payments per test day: five steps of 25, then the payouts.
const PAYMENTS: usize = 120;
const MERCHANTS: [&str; 4] = ["acme", "birch", "cobalt", "delta"];

/// The built Python component `name`, checked once with the default limits (which compiles it
/// into the default cache, so hosts then load it from there); panics with `check`'s output if
/// it is refused.
fn checked(name: &str, once: &'static OnceLock<PathBuf>) -> PathBuf {
    once.get_or_init(|| {
        let wasm = guests().wasm(name);
        let out = run_leasehold_within(&[Path::new("check"), &wasm], Duration::from_secs(180));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "a componentize-py component with default options is refused with the default limits:\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("name:") && stdout.contains(name), "{stdout}");
        wasm
    })
    .clone()
}

/// The settlement component, checked once.
fn settlement() -> PathBuf {
    static CHECKED: OnceLock<PathBuf> = OnceLock::new();
    checked("settlement", &CHECKED)
}

/// A day of payments: `p0000` … with merchants in turn and amounts 1000 + 7i cents; the
/// per-merchant totals it should settle to.
fn payments_csv() -> (String, BTreeMap<&'static str, u64>) {
    let mut csv = String::from("payment_id,merchant,amount_cents\n");
    let mut totals = BTreeMap::new();
    for i in 0..PAYMENTS {
        let merchant = MERCHANTS[i % MERCHANTS.len()];
        let amount = 1000 + 7 * i as u64;
        csv.push_str(&format!("p{i:04},{merchant},{amount}\n"));
        *totals.entry(merchant).or_insert(0) += amount;
    }
    (csv, totals)
}

/// Deploys the settlement job under `dir` with `csv` as its payments and `delay_ms` per
/// payment; returns the jobs and data directories.
fn deploy(dir: &Path, csv: &str, delay_ms: u64) -> (PathBuf, PathBuf) {
    let (jobs, data) = (dir.join("jobs"), dir.join("data"));
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::create_dir_all(data.join("settlement")).unwrap();
    std::fs::copy(settlement(), jobs.join("settlement.wasm")).unwrap();
    std::fs::write(data.join("settlement/payments.csv"), csv).unwrap();
    std::fs::write(data.join("settlement/delay-ms"), delay_ms.to_string()).unwrap();
    (jobs, data)
}

fn start(redis: &RedisServer, jobs: &Path, data: &Path, node: &str, extra: &[&str]) -> HostProcess {
    let mut args = vec!["--data-dir", data.to_str().unwrap()];
    args.extend(extra);
    HostProcess::start_node(LEASEHOLD, &redis.url(), jobs, node, ("2s", "500ms"), &args)
}

#[tokio::test]
async fn a_python_job_survives_a_kill_of_its_leader_and_settles_once() {
    killed_leader("python-kill", false).await;
}

#[tokio::test]
async fn a_python_job_books_its_payouts_in_postgresql_once_through_a_kill_of_its_leader() {
    killed_leader("python-pg-kill", true).await;
}

/// Two replicas settle the day; the leader is SIGKILLed past the first step; the successor
/// resumes from the checkpoint and pays each merchant once: in the store, or (`ledger`) in a
/// PostgreSQL ledger, in one transaction under the successor's token.
async fn killed_leader(name: &str, ledger: bool) {
    deadline(Duration::from_secs(300), async {
        settlement();
        let redis = RedisServer::start().await;
        let dir = TempDir::new(name);
        let (csv, totals) = payments_csv();
        // 20 ms a payment: a step of 25 takes about half a second.
        let (jobs, data) = deploy(dir.path(), &csv, 20);
        let mut extra = Vec::new();
        let pg = if ledger {
            let pg = crate::sql::initialised(&["settlement"]).await;
            pg.exec(include_str!("../../guest-jobs/settlement-py/ledger.sql"))
                .await;
            pg.exec(&format!(
                "GRANT SELECT, INSERT ON settlement_payouts TO {}",
                crate::sql::ROLE
            ))
            .await;
            std::fs::write(
                jobs.join("settlement.toml"),
                "[sql.databases]\nledger = \"ledger\"\n",
            )
            .unwrap();
            extra = vec!["--database".to_string(), format!("ledger={}", pg.url(crate::sql::ROLE))];
            Some(pg)
        } else {
            None
        };
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let recorder = Recorder::start(&redis).await;
        let mut hosts = [
            start(&redis, &jobs, &data, "py-a", &extra),
            start(&redis, &jobs, &data, "py-b", &extra),
        ];
        // The run is in its second step or later: a checkpoint exists and work remains.
        // Its record names the node running it (the log line may not have been read yet).
        let (period, node) = wait_for(
            "the settlement run to be past its first step",
            Duration::from_secs(120),
            || async {
                run_records(&redis, "settlement")
                    .await
                    .into_iter()
                    .find(|r| r["status"] == "running" && r["step"].as_u64() >= Some(1))
                    .map(|r| {
                        (
                            r["period"].as_str().unwrap().to_string(),
                            r["node"].as_str().unwrap().to_string(),
                        )
                    })
            },
        )
        .await;
        let leader = ["py-a", "py-b"]
            .iter()
            .position(|n| *n == node)
            .unwrap_or_else(|| panic!("the run is on an unknown node {node}"));
        hosts[leader].kill();
        let survivor = 1 - leader;
        let done = wait_for(
            "the successor to finish the run",
            Duration::from_secs(120),
            || async {
                run_records(&redis, "settlement")
                    .await
                    .into_iter()
                    .find(|r| r["period"] == period.as_str() && r["status"] == "done")
            },
        )
        .await;
        assert_eq!(done["node"], ["py-a", "py-b"][survivor], "{done}");
        assert_eq!(
            crate::harness::settled(&1, || hosts[survivor]
                .log_lines_with("resuming run from its checkpoint")
                .len())
            .await,
            1,
            "the successor resumed from the checkpoint instead of starting over"
        );

        // What Redis applied: every write fenced, one `done`.
        let history = recorder.check().unwrap_or_else(|v| panic!("{v}"));
        assert_eq!(history.done_records("settlement", &period).len(), 1);
        let prefix = format!("lh:{{settlement}}:data:payout/{period}/");
        if let Some(pg) = &pg {
            // The ledger holds one payout per merchant, all under the successor's token (the
            // database's fence), and the store none.
            let admin = pg.admin().await.unwrap();
            let rows: Vec<(String, i64, i64)> = admin
                .query(
                    "SELECT merchant, amount_cents, token FROM settlement_payouts WHERE period = $1 ORDER BY merchant",
                    &[&period],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
            let fence: i64 = admin
                .query_one("SELECT token FROM leasehold.fence WHERE job = 'settlement'", &[])
                .await
                .unwrap()
                .get(0);
            let expected: Vec<(String, i64, i64)> = totals
                .iter()
                .map(|(m, t)| (m.to_string(), *t as i64, fence))
                .collect();
            assert_eq!(rows, expected);
            assert!(
                !history.applied.iter().any(|a| a.key.starts_with(&prefix)),
                "a payout went to the store"
            );
            return;
        }
        // One payout per merchant in the store.
        let mut payouts: Vec<&str> = history
            .applied
            .iter()
            .filter(|a| a.key.starts_with(&prefix) && !a.value.is_empty())
            .map(|a| a.key.as_str())
            .collect();
        payouts.sort();
        assert_eq!(
            payouts.len(),
            MERCHANTS.len(),
            "one payout per merchant: {payouts:?}"
        );
        payouts.dedup();
        assert_eq!(payouts.len(), MERCHANTS.len(), "no merchant paid twice");

        let mut conn = redis.conn().await;
        for (merchant, total) in &totals {
            let payout: String = conn.get(format!("{prefix}{merchant}")).await.unwrap();
            assert!(
                payout.starts_with(&format!("{total} ")),
                "{merchant}: {payout}"
            );
        }
        let export: String = conn
            .get(format!("lh:{{settlement}}:data:export/{period}"))
            .await
            .unwrap();
        let mut expected = format!(
            "settlement {period}: {PAYMENTS} payments, {} merchants\n",
            MERCHANTS.len()
        );
        for (merchant, total) in &totals {
            expected.push_str(&format!("{merchant} {total}\n"));
        }
        expected.push_str(&format!("total {}\n", totals.values().sum::<u64>()));
        assert_eq!(export, expected);
    })
    .await;
}

#[tokio::test]
async fn a_python_exception_is_in_the_failed_runs_record() {
    deadline(Duration::from_secs(240), async {
        settlement();
        let redis = RedisServer::start().await;
        let dir = TempDir::new("python-exception");
        let csv = "payment_id,merchant,amount_cents\np0001,acme,100\np0002,birch,12x\n";
        let (jobs, data) = deploy(dir.path(), csv, 0);
        let _host = start(&redis, &jobs, &data, "py-a", &[]);
        let failed = wait_for(
            "the run to fail on the bad amount",
            Duration::from_secs(120),
            || async {
                run_records(&redis, "settlement")
                    .await
                    .into_iter()
                    .find(|r| r["status"] == "failed")
            },
        )
        .await;
        assert_eq!(failed["failure"], "trap", "{failed}");
        let error = failed["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("Traceback (most recent call last)")
                && error.contains("ValueError: invalid literal for int() with base 10: '12x'"),
            "the record does not carry the exception: {error}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_host_serves_http_and_its_other_jobs_while_a_large_job_compiles() {
    deadline(Duration::from_secs(240), async {
        let wasm = settlement();
        let redis = RedisServer::start().await;
        let dir = TempDir::new("python-compiling");
        let jobs = dir.path().join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::copy(&wasm, jobs.join("settlement.wasm")).unwrap();
        // A second version of it under another name: two compiles of seconds each, so the
        // window in which something still compiles outlasts the ticker's first run even on a
        // loaded machine. The host loads two files at a time, smallest first: `ticker` and one
        // settlement version, then the other once the ticker is loaded.
        let bytes = std::fs::read(&wasm).unwrap();
        std::fs::write(
            jobs.join("twin.wasm"),
            crate::harness::new_version(&bytes, "b"),
        )
        .unwrap();
        std::fs::write(jobs.join("twin.toml"), "name = \"settlement-b\"\n").unwrap();
        std::fs::copy(guests().wasm("ticker"), jobs.join("ticker.wasm")).unwrap();
        // An empty cache of its own: the Python component is compiled now, for seconds.
        let cache = dir.path().join("cache");
        let host = HostProcess::start_node(
            LEASEHOLD,
            &redis.url(),
            &jobs,
            "py-a",
            ("2s", "500ms"),
            &[
                "--http",
                "127.0.0.1:0",
                "--cache-dir",
                cache.to_str().unwrap(),
            ],
        );
        let addr = host.http_addr(Duration::from_secs(30)).await;
        // The ticker, small, leads and runs while the settlement jobs still compile.
        host.wait_for_log("\"run done\"", Duration::from_secs(60))
            .await;
        let (code, ready) = http(&addr, "GET", "/readyz", None).await;
        let (health, _) = http(&addr, "GET", "/healthz", None).await;
        let (_, status) = http(&addr, "GET", "/v1/status", None).await;
        let loaded = host
            .log_lines_with("loaded job")
            .iter()
            .filter(|l| l.contains("\"job\":\"settlement"))
            .count();
        assert!(
            loaded < 2,
            "both settlement jobs loaded before the checks: the test proves nothing"
        );
        assert_eq!(code, 503, "{ready}");
        assert_eq!(health, 200);
        let problems = ready["problems"].to_string();
        let names_one = |text: &str| text.contains("settlement.wasm") || text.contains("twin.wasm");
        assert!(
            problems.contains("still compiling") && names_one(&problems),
            "{ready}"
        );
        assert!(names_one(&status["compiling"].to_string()), "{status}");
        assert!(status["jobs"].to_string().contains("ticker"), "{status}");

        // Once loaded they campaign, and the host is ready.
        wait_for(
            "the settlement jobs to load",
            Duration::from_secs(180),
            || async {
                let n = host
                    .log_lines_with("loaded job")
                    .iter()
                    .filter(|l| l.contains("\"job\":\"settlement"))
                    .count();
                (n == 2).then_some(())
            },
        )
        .await;
        wait_for("/readyz to answer 200", Duration::from_secs(30), || async {
            let (code, body) = http(&addr, "GET", "/readyz", None).await;
            (code == 200 && body["compiling"] == serde_json::json!([])).then_some(())
        })
        .await;
        let (_, status) = http(&addr, "GET", "/v1/status", None).await;
        assert!(
            status["jobs"].to_string().contains("settlement"),
            "{status}"
        );
    })
    .await;
}

#[tokio::test]
async fn the_python_job_and_its_rust_twin_export_the_same_bytes() {
    deadline(Duration::from_secs(240), async {
        let wasm = settlement();
        let redis = RedisServer::start().await;
        let dir = TempDir::new("python-twin");
        let (csv, _) = payments_csv();
        let (jobs, data) = deploy(dir.path(), &csv, 0);
        std::fs::copy(
            guests().wasm("settlement_rs"),
            jobs.join("settlement_rs.wasm"),
        )
        .unwrap();
        std::fs::create_dir_all(data.join("settlement-rs")).unwrap();
        std::fs::write(data.join("settlement-rs/payments.csv"), &csv).unwrap();
        // Both daily at 04:00 UTC: pinned to one past day, so that the two first leads, moments
        // apart, never fall on either side of a fire and run different periods.
        for sidecar in ["settlement.toml", "settlement_rs.toml"] {
            std::fs::write(jobs.join(sidecar), "schedule = \"0 0 4 1 1 * 2026\"\n").unwrap();
        }
        assert!(wasm.exists());
        let _host = start(&redis, &jobs, &data, "py-a", &[]);
        let mut exports = Vec::new();
        for job in ["settlement", "settlement-rs"] {
            let done = wait_for(
                &format!("a done run of {job}"),
                Duration::from_secs(120),
                || async {
                    run_records(&redis, job)
                        .await
                        .into_iter()
                        .find(|r| r["status"] == "done")
                },
            )
            .await;
            let period = done["period"].as_str().unwrap().to_string();
            let export: Vec<u8> = redis
                .conn()
                .await
                .get(format!("lh:{{{job}}}:data:export/{period}"))
                .await
                .unwrap();
            exports.push((period, export));
        }
        assert_eq!(exports[0].0, exports[1].0, "the same period");
        assert!(!exports[0].1.is_empty());
        assert_eq!(
            String::from_utf8_lossy(&exports[0].1),
            String::from_utf8_lossy(&exports[1].1)
        );
    })
    .await;
}

/// The notify component (Python, world `http-job`), checked once.
fn notify() -> PathBuf {
    static CHECKED: OnceLock<PathBuf> = OnceLock::new();
    checked("notify", &CHECKED)
}

#[tokio::test]
async fn a_python_job_calls_a_granted_service_with_the_token_and_nothing_else() {
    deadline(Duration::from_secs(240), async {
        let wasm = notify();
        let receiver = leasehold_harness::Receiver::start().await;
        let url = receiver.url();
        let redis = RedisServer::start().await;
        let dir = TempDir::new("python-http");
        let (jobs, data) = (dir.join("jobs"), dir.join("data"));
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::create_dir_all(data.join("notify")).unwrap();
        std::fs::copy(&wasm, jobs.join("notify.wasm")).unwrap();
        // Its schedule only on the two days the test triggers: the job's own daily 04:30 UTC
        // would otherwise run today's period when the test runs within the catch-up hour after
        // it (a second notice to the receiver).
        std::fs::write(
            jobs.join("notify.toml"),
            format!(
                "schedule = \"0 30 4 1,2 3 *\"\n[catch-up]\npolicy = \"skip\"\nwindow = \"1s\"\n[retry]\nattempts = 1\n[http]\nallow = [\"{url}\"]\n"
            ),
        )
        .unwrap();
        std::fs::write(data.join("notify/endpoint"), format!("{url}/charge")).unwrap();
        let host = start(
            &redis,
            &jobs,
            &data,
            "py-http",
            &["--http-allow", &url, "--http-allow-private"],
        );
        host.wait_for_log("loaded job", Duration::from_secs(120))
            .await;
        let ended = |period: &'static str| {
            let redis = &redis;
            async move {
                wait_for(
                    &format!("notify {period} to end"),
                    Duration::from_secs(60),
                    || async {
                        crate::harness::run_record(redis, "notify", period)
                            .await
                            .filter(|r| r["status"] == "done" || r["status"] == "failed")
                    },
                )
                .await
            }
        };
        crate::harness::trigger(&redis, "notify", "2026-03-01");
        let done = ended("2026-03-01").await;
        assert_eq!(done["status"], "done", "{done}");
        let token = done["token"].as_u64().unwrap();
        assert_eq!(
            receiver.applied().get("2026-03-01"),
            Some(&token),
            "the partner applied the notice under the run's token"
        );
        let got = receiver.received();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].header("leasehold-job"), Some("notify"));
        assert_eq!(got[0].header("leasehold-period"), Some("2026-03-01"));
        assert_eq!(got[0].count("leasehold-token"), 1);
        let recorded: String = redis
            .conn()
            .await
            .get("lh:{notify}:data:notified/2026-03-01")
            .await
            .unwrap();
        assert_eq!(recorded, format!("200 token={token}"));

        // A destination its sidecar does not grant: refused before any connection, and the
        // Python code sees the wasi:http error code.
        let other = leasehold_harness::Receiver::start().await;
        std::fs::write(data.join("notify/endpoint"), format!("{}/charge", other.url())).unwrap();
        crate::harness::trigger(&redis, "notify", "2026-03-02");
        let failed = ended("2026-03-02").await;
        assert_eq!(failed["status"], "failed", "{failed}");
        let error = failed["error"].as_str().unwrap_or_default();
        assert!(error.contains("HttpRequestDenied"), "{failed}");
        assert_eq!(other.connections(), 0, "a connection to a destination not granted");
    })
    .await;
}
