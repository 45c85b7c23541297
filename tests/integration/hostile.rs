//! Hostile guests in a real host (I6): each misbehaviour of the `probe` fixture, chosen by its
//! `/data/mode` file, fails only the probe's run, with a typed failure in its run record, while
//! the `ticker` job on the same host keeps its lease (same owner, same token) and its
//! once-a-second schedule, and the host keeps running. Afterwards a scan of Redis finds no key
//! outside the two jobs' namespaces, and nothing in the ticker's namespace the ticker did not
//! write.

use std::time::Duration;

use chrono::DateTime;
use redis::AsyncCommands;
use serde_json::Value;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, http, run_record, wait_for,
};

/// What a hostile run left behind.
struct Aftermath {
    /// The probe's run record.
    record: Value,
    host: HostProcess,
    _redis: RedisServer,
    _dir: TempDir,
}

/// The probe's period: the current period of its yearly schedule, run at once.
fn probe_period() -> String {
    chrono::Utc::now().format("%Y-01-01").to_string()
}

/// The ticker's `done` records: (period, finished at in ms since the epoch).
async fn ticks(c: &mut redis::aio::MultiplexedConnection) -> Vec<(String, i64)> {
    let keys: Vec<String> = c.keys("lh:{ticker}:run:*").await.unwrap();
    let mut out = Vec::new();
    for k in keys {
        let raw: String = c.get(&k).await.unwrap();
        let rec: Value = serde_json::from_str(&raw).unwrap();
        if rec["status"] == "done" {
            let at = DateTime::parse_from_rfc3339(rec["finished_at"].as_str().unwrap()).unwrap();
            out.push((
                rec["period"].as_str().unwrap().to_string(),
                at.timestamp_millis(),
            ));
        }
    }
    out.sort();
    out
}

fn millis(rfc3339: &Value) -> i64 {
    DateTime::parse_from_rfc3339(rfc3339.as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

/// Runs the probe in `mode` beside the ticker and checks everything a hostile guest must not
/// disturb. Returns the probe's final record (`failed`, or `done` for `end_status == "done"`).
async fn hostile(mode: &str, end_status: &str) -> Aftermath {
    hostile_with(mode, end_status, None).await
}

/// [`hostile`], with a sidecar for the probe.
async fn hostile_with(mode: &str, end_status: &str, sidecar: Option<&str>) -> Aftermath {
    let redis = RedisServer::start().await;
    let dir = TempDir::new(&format!("hostile-{mode}"));
    let (jobs, data) = (dir.join("jobs"), dir.join("data"));
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::create_dir_all(data.join("probe")).unwrap();
    std::fs::write(data.join("probe/mode"), mode).unwrap();
    std::fs::copy(guests().wasm("ticker"), jobs.join("ticker.wasm")).unwrap();
    // The probe arrives once the ticker is running: the ticker's lease is then observed from
    // before the probe's first step to after its last.
    let mut host = HostProcess::start_node(
        LEASEHOLD,
        &redis.url(),
        &jobs,
        "n1",
        ("3s", "500ms"),
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
        ],
    );
    let mut c = redis.conn().await;
    let owner: String = wait_for("n1 to lead the ticker", Duration::from_secs(60), || async {
        redis.conn().await.get("lh:{ticker}:lease").await.unwrap()
    })
    .await;
    let fence_before: Option<String> = c.hget("lh:{ticker}:fence", "token").await.unwrap();
    if let Some(text) = sidecar {
        std::fs::write(jobs.join("probe.toml"), text).unwrap();
    }
    std::fs::copy(guests().wasm("probe"), jobs.join("probe.wasm")).unwrap();

    let period = probe_period();
    let record = wait_for(
        "the probe's run to end",
        Duration::from_secs(60),
        || async {
            run_record(&redis, "probe", &period)
                .await
                .filter(|r| r["status"] == end_status)
        },
    )
    .await;
    // The ticker runs on after the probe's run ended.
    let ended = millis(&record["finished_at"]);
    wait_for(
        "a ticker run after the probe's",
        Duration::from_secs(30),
        || async {
            let mut c = redis.conn().await;
            ticks(&mut c)
                .await
                .into_iter()
                .find(|(_, at)| *at > ended + 1000)
        },
    )
    .await;

    // Same term throughout: same owner, same fence token, no renewal missed.
    let owner_after: Option<String> = c.get("lh:{ticker}:lease").await.unwrap();
    assert_eq!(
        owner_after.as_deref(),
        Some(owner.as_str()),
        "the ticker changed leader"
    );
    let fence_after: Option<String> = c.hget("lh:{ticker}:fence", "token").await.unwrap();
    assert_eq!(fence_after, fence_before, "the ticker's term changed");
    for bad in ["run failed", "interrupted", "became follower", "lost"] {
        let lines: Vec<String> = host
            .log_lines_with(bad)
            .into_iter()
            .filter(|l| l.contains("\"job\":\"ticker\""))
            .collect();
        assert!(lines.is_empty(), "ticker: {lines:?}");
    }
    assert!(host.is_running(), "the host exited");

    // Nothing outside the two namespaces; nothing in the ticker's the ticker did not write.
    let all: Vec<String> = c.keys("*").await.unwrap();
    for k in &all {
        // The probe's, and the host's own membership.
        if k.starts_with("lh:{probe}:") || k.starts_with("lh:{members}:") {
            continue;
        }
        let rest = k
            .strip_prefix("lh:{ticker}:")
            .unwrap_or_else(|| panic!("key {k:?} is outside both namespaces"));
        let ticker_key = [
            "lease",
            "token",
            "fence",
            "open",
            "requested",
            "cursor",
            "last",
            "usage",
            "schedule",
            "runs",
            "terms",
        ]
        .contains(&rest)
            || rest.starts_with("run:")
            || rest.starts_with("ckpt:")
            || rest.starts_with("data:tick/");
        assert!(ticker_key, "key {k:?} is not one the ticker writes");
        if rest.starts_with("data:") {
            let v: String = c.get(k).await.unwrap();
            assert_eq!(v, "tick", "{k} was overwritten");
        }
    }
    Aftermath {
        record,
        host,
        _redis: redis,
        _dir: dir,
    }
}

/// Checks a failed record's typed failure and that its error contains `needle`.
fn failed_with(a: &Aftermath, failure: &str, needle: &str) {
    assert_eq!(a.record["failure"], failure, "{}", a.record);
    let error = a.record["error"].as_str().unwrap();
    assert!(error.contains(needle), "{needle:?} not in {error:?}");
}

#[tokio::test]
async fn an_unreachable_trap_fails_only_its_run() {
    deadline(Duration::from_secs(150), async {
        let a = hostile("unreachable", "failed").await;
        failed_with(&a, "trap", "wasm `unreachable` instruction executed");
    })
    .await;
}

#[tokio::test]
async fn a_panic_fails_only_its_run_and_its_message_reaches_the_record_and_the_log() {
    deadline(Duration::from_secs(150), async {
        let a = hostile("panic", "failed").await;
        failed_with(&a, "trap", "wasm `unreachable` instruction executed");
        // The record carries the guest's last stderr lines: the panic's own message.
        failed_with(
            &a,
            "trap",
            "the job's last stderr lines:\nthread '<unnamed>'",
        );
        failed_with(&a, "trap", "probe panics on purpose in step 0");
        // And in a field of its own, for the console and `runs`.
        let stderr = a.record["stderr"].as_str().unwrap_or_default();
        assert!(
            stderr.contains("probe panics on purpose in step 0"),
            "{}",
            a.record
        );
        let said = a.host.log_lines_with("probe panics on purpose");
        assert!(
            said.iter().any(|l| l.contains("\"job\":\"probe\"")),
            "{said:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn an_endless_loop_is_stopped_at_the_step_time_limit() {
    deadline(Duration::from_secs(150), async {
        let a = hostile("spin", "failed").await;
        failed_with(&a, "timeout", "step exceeded its time limit of 3s");
        // The loop ran for its whole 3 s; the ticker ran meanwhile.
        let (from, to) = (
            millis(&a.record["started_at"]),
            millis(&a.record["finished_at"]),
        );
        assert!(to - from >= 3000, "{}", a.record);
        let mut c = a._redis.conn().await;
        let during: Vec<_> = ticks(&mut c)
            .await
            .into_iter()
            .filter(|(_, at)| *at > from && *at < to)
            .collect();
        assert!(
            !during.is_empty(),
            "no ticker run during the probe's endless loop"
        );
    })
    .await;
}

#[tokio::test]
async fn unbounded_memory_fails_at_the_memory_limit() {
    deadline(Duration::from_secs(150), async {
        let a = hostile("oom", "failed").await;
        failed_with(
            &a,
            "memory-limit",
            "the job's memory limit is 67108864 bytes in total",
        );
    })
    .await;
}

#[tokio::test]
async fn deep_recursion_fails_with_stack_exhausted() {
    deadline(Duration::from_secs(150), async {
        let a = hostile("recurse", "failed").await;
        failed_with(&a, "trap", "call stack exhausted");
    })
    .await;
}

#[tokio::test]
async fn an_oversized_write_is_refused_with_the_limit() {
    deadline(Duration::from_secs(150), async {
        let a = hostile("big-write", "failed").await;
        failed_with(
            &a,
            "job-error",
            "store.write(\"big\"): too-large(max 1024 bytes)",
        );
        let mut c = a._redis.conn().await;
        let big: Option<Vec<u8>> = c.get("lh:{probe}:data:big").await.unwrap();
        assert_eq!(big, None);
    })
    .await;
}

#[tokio::test]
async fn an_oversized_checkpoint_fails_the_run() {
    deadline(Duration::from_secs(150), async {
        let a = hostile("big-state", "failed").await;
        failed_with(
            &a,
            "state-too-large",
            "returned a state of 65536 bytes, more than the job's write limit of 1024 bytes",
        );
        let mut c = a._redis.conn().await;
        let ckpt: Option<Vec<u8>> = c
            .get(format!("lh:{{probe}}:ckpt:{}", probe_period()))
            .await
            .unwrap();
        assert_eq!(ckpt, None);
    })
    .await;
}

#[tokio::test]
async fn keys_outside_the_namespace_are_refused_each_with_its_reason() {
    deadline(Duration::from_secs(150), async {
        let a = hostile("keys", "failed").await;
        for needle in [
            "\"../x\": invalid-key(key contains a '..' segment)",
            "../../ti… (22 bytes): invalid-key(key contains a '..' segment)",
            "\"\": invalid-key(key is empty)",
            "\"nul\\0byte\": invalid-key(key contains byte 0x00",
            "\"/abs\": invalid-key(key starts with '/')",
            "kkkkkkkk… (10000 bytes): invalid-key(key is 10000 bytes, more than 256)",
            // Another job's key *name* is only a name inside the probe's own namespace.
            "\"lh:{ticker}:fence\": ok",
        ] {
            failed_with(&a, "job-error", needle);
        }
        let mut c = a._redis.conn().await;
        let inside: Option<String> = c.get("lh:{probe}:data:lh:{ticker}:fence").await.unwrap();
        assert_eq!(inside.as_deref(), Some("escaped?"));
    })
    .await;
}

#[tokio::test]
async fn a_log_flood_is_cut_to_the_per_step_limit() {
    deadline(Duration::from_secs(150), async {
        let a = hostile("log-flood", "done").await;
        let kept = a.host.log_lines_with("flood line");
        assert_eq!(kept.len(), 200, "guest lines kept");
        assert!(
            kept.iter()
                .all(|l| l.contains("\"job\":\"probe\"") && l.contains("\"guest\":true"))
        );
        let dropped = a.host.log_lines_with("guest log lines dropped");
        assert!(
            dropped.iter().any(|l| l.contains("\"dropped\":99800")),
            "{dropped:?}"
        );
        let cut = a.host.log_lines_with("guest stderr cut");
        assert_eq!(cut.len(), 1, "{cut:?}");
        let stderr_lines = a.host.log_lines_with("\"stderr\":true").len();
        assert!(
            stderr_lines <= 65,
            "{stderr_lines} stderr lines kept (64 KiB of 1 KiB lines)"
        );
    })
    .await;
}

#[tokio::test]
async fn a_job_writing_without_bound_stops_at_its_quota_while_the_other_runs_on() {
    deadline(Duration::from_secs(150), async {
        let a = hostile_with("fill", "failed", Some("[quota]\nkeys = 50\n")).await;
        // The step failed on its own refused write, recorded with the figures.
        failed_with(
            &a,
            "quota-exceeded",
            "storage quota exceeded: the write would keep 51 keys",
        );
        failed_with(&a, "quota-exceeded", "(the quota is 50 keys and 256 MiB)");
        failed_with(
            &a,
            "quota-exceeded",
            "store.write refused after 50 keys: quota-exceeded(51 keys",
        );
        let mut c = a._redis.conn().await;
        let kept: Vec<String> = c.keys("lh:{probe}:data:fill/*").await.unwrap();
        assert_eq!(kept.len(), 50, "keys written up to the quota, none beyond");
        // The usage is served per job, and in the metrics.
        let addr = a.host.http_addr(Duration::from_secs(30)).await;
        let (code, job) = http(&addr, "GET", "/v1/jobs/probe", None).await;
        assert_eq!(code, 200, "{job}");
        assert_eq!(job["limits"]["stored_keys"], 50, "{job}");
        let storage = &job["status"]["storage"];
        assert_eq!(storage["keys"], 50, "{job}");
        assert_eq!(storage["max_keys"], 50, "{job}");
        assert!(storage["bytes"].as_u64().unwrap() > 50 * 100, "{job}");
        let (_, metrics) = http(&addr, "GET", "/metrics", None).await;
        let metrics = metrics.as_str().unwrap();
        for series in [
            "leasehold_job_stored_keys{job=\"probe\"} 50",
            "leasehold_quota_refusals_total{job=\"probe\"} 1",
        ] {
            assert!(metrics.contains(series), "{series} missing:\n{metrics}");
        }
    })
    .await;
}
