//! Schedules, periods and runs in a real host: every catch-up policy, both DST transitions,
//! retries, both overlap policies, the maximum run time, pause and resume, and triggers
//! deduplicated with the schedule (CLI and HTTP). Each test seeds what an earlier history would
//! have left (the scheduler's cursor) and reads the run records Redis holds.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{Datelike, NaiveDate, Timelike, Utc};
use redis::AsyncCommands;
use serde_json::Value;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, http, run_leasehold,
    run_record, run_records, wait_for,
};

/// A host serving one fixture job, with an optional sidecar, data files and seeded cursor.
struct Setup {
    redis: RedisServer,
    dir: TempDir,
    host: HostProcess,
    /// `127.0.0.1:port` of the HTTP API.
    http: String,
}

async fn setup(
    guest: &str,
    sidecar: Option<&str>,
    data: &[(&str, &str)],
    cursor: Option<&str>,
) -> Setup {
    let redis = RedisServer::start().await;
    let dir = TempDir::new(&format!("schedule-{guest}"));
    let (jobs, data_dir) = (dir.join("jobs"), dir.join("data"));
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::create_dir_all(data_dir.join(guest)).unwrap();
    for (name, content) in data {
        std::fs::write(data_dir.join(guest).join(name), content).unwrap();
    }
    if let Some(text) = sidecar {
        std::fs::write(jobs.join(format!("{guest}.toml")), text).unwrap();
    }
    std::fs::copy(guests().wasm(guest), jobs.join(format!("{guest}.wasm"))).unwrap();
    if let Some(c) = cursor {
        let _: () = redis
            .conn()
            .await
            .set(format!("lh:{{{guest}}}:cursor"), c)
            .await
            .unwrap();
    }
    // Port 0: the host binds a free port and logs the address it got.
    let host = HostProcess::start_node(
        LEASEHOLD,
        &redis.url(),
        &jobs,
        "n1",
        ("2s", "500ms"),
        &[
            "--data-dir",
            data_dir.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
        ],
    );
    let http = host.http_addr(Duration::from_secs(60)).await;
    Setup {
        redis,
        dir,
        host,
        http,
    }
}

/// Waits until `job` has `n` records and every one is final; returns period → record.
async fn final_records(redis: &RedisServer, job: &str, n: usize) -> BTreeMap<String, Value> {
    wait_for(
        &format!("{n} final records of {job}"),
        Duration::from_secs(60),
        || async {
            let recs = run_records(redis, job).await;
            let done = recs.len() == n
                && recs.iter().all(|r| {
                    ["done", "failed", "missed", "skipped"].contains(&r["status"].as_str().unwrap())
                });
            done.then(|| {
                recs.into_iter()
                    .map(|r| (r["period"].as_str().unwrap().to_string(), r))
                    .collect()
            })
        },
    )
    .await
}

/// The last Sunday of `month` in `year`: the day of Europe's DST changes (March, October).
fn last_sunday(year: i32, month: u32) -> NaiveDate {
    let next = if month == 12 {
        NaiveDate::from_ymd_opt(year + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(year, month + 1, 1)
    }
    .unwrap();
    let mut d = next.pred_opt().unwrap();
    while d.weekday() != chrono::Weekday::Sun {
        d = d.pred_opt().unwrap();
    }
    d
}

fn statuses(records: &BTreeMap<String, Value>) -> Vec<(String, String)> {
    records
        .iter()
        .map(|(p, r)| (p.clone(), r["status"].as_str().unwrap().to_string()))
        .collect()
}

/// A daily schedule that last fired exactly two hours ago (UTC), the five periods since a
/// cursor five days before that, and their ids oldest first.
fn five_late_days() -> (String, String, Vec<String>) {
    let newest = (Utc::now() - chrono::Duration::hours(2)).naive_utc();
    let newest = newest.with_nanosecond(0).unwrap();
    let cron = newest.format("%S %M %H * * *").to_string();
    let cursor = (newest - chrono::Duration::days(5))
        .format("%Y-%m-%dT%H:%M:%S")
        .to_string();
    let ids = (0..5)
        .rev()
        .map(|d| {
            (newest - chrono::Duration::days(d))
                .format("%Y-%m-%d")
                .to_string()
        })
        .collect();
    (cron, cursor, ids)
}

#[tokio::test]
async fn missed_periods_follow_each_catch_up_policy_and_are_recorded() {
    deadline(Duration::from_secs(180), async {
        let (cron, cursor, ids) = five_late_days();
        let cases = [
            // The newest runs however late; the four before it are missed.
            ("latest", "1h", ["missed", "missed", "missed", "missed", "done"]),
            // Nothing within an hour of its fire time: all five are missed.
            ("skip", "1h", ["missed"; 5]),
            // Everything that fired within three days runs, oldest first.
            ("all", "3days", ["missed", "missed", "done", "done", "done"]),
        ];
        for (policy, window, expected) in cases {
            let sidecar = format!(
                "schedule = \"{cron}\"\ntime-zone = \"UTC\"\n[catch-up]\npolicy = \"{policy}\"\nwindow = \"{window}\"\n"
            );
            let s = setup("ticker", Some(&sidecar), &[], Some(&cursor)).await;
            let records = final_records(&s.redis, "ticker", 5).await;
            let want: Vec<(String, String)> = ids
                .iter()
                .cloned()
                .zip(expected.iter().map(|e| e.to_string()))
                .collect();
            assert_eq!(statuses(&records), want, "policy {policy}");
            for r in records.values().filter(|r| r["status"] == "missed") {
                let why = r["error"].as_str().unwrap();
                assert!(why.contains("while no replica ran the job"), "{why}");
            }
            // The cursor moved to the newest period, so nothing is accounted twice.
            let c: String = s.redis.conn().await.get("lh:{ticker}:cursor").await.unwrap();
            assert!(c.starts_with(ids.last().unwrap()), "{c}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_daily_job_at_0230_runs_once_per_local_day_across_both_dst_transitions() {
    deadline(Duration::from_secs(240), async {
        // Europe/Berlin: 02:30 does not exist on the last Sunday of March and happens twice on
        // the last Sunday of October. The test takes the two most recent changes that lie within
        // the catch-up window (at most 400 days) and a week in the past, and a schedule that
        // fires only in their months and years: the days to run are known, whatever the date.
        let berlin = Utc::now().with_timezone(&chrono_tz::Europe::Berlin);
        let today = berlin.date_naive();
        let oldest = today - chrono::Duration::days(390);
        let week = chrono::Duration::days(6);
        let y = today.year();
        let (schedule, march, october, in_schedule): (String, NaiveDate, NaiveDate, Box<dyn Fn(NaiveDate) -> bool>) =
            if today > last_sunday(y, 10) + week && last_sunday(y, 3) > oldest {
                // March to October of this year.
                let (m, o) = (last_sunday(y, 3), last_sunday(y, 10));
                (format!("0 30 2 * 3-10 * {y}"), m, o, Box::new(move |d: NaiveDate| d.year() == y && (3..=10).contains(&d.month())))
            } else if today > last_sunday(y, 3) + week && last_sunday(y - 1, 10) > oldest {
                // Last October to this March (and this year's October, once it has begun).
                let (m, o) = (last_sunday(y, 3), last_sunday(y - 1, 10));
                (format!("0 30 2 * 1-3,10-12 * {},{y}", y - 1), m, o, Box::new(move |d: NaiveDate| (d.year() == y - 1 || d.year() == y) && !(4..=9).contains(&d.month())))
            } else {
                // March to October of last year (early in a year).
                let (m, o) = (last_sunday(y - 1, 3), last_sunday(y - 1, 10));
                (format!("0 30 2 * 3-10 * {}", y - 1), m, o, Box::new(move |d: NaiveDate| d.year() == y - 1 && (3..=10).contains(&d.month())))
            };
        let first = march.min(october) - chrono::Duration::days(1);
        let cursor = format!("{}T02:30:00", first - chrono::Duration::days(1));
        let sidecar = format!(
            "schedule = \"{schedule}\"\ntime-zone = \"Europe/Berlin\"\n[catch-up]\npolicy = \"all\"\nwindow = \"400days\"\n"
        );
        let s = setup("ticker", Some(&sidecar), &[], Some(&cursor)).await;
        // Every local day of the schedule from `first` to the current period.
        let mut last = today;
        if berlin.time() < chrono::NaiveTime::from_hms_opt(2, 30, 0).unwrap() {
            last = last.pred_opt().unwrap();
        }
        let days: Vec<String> = first
            .iter_days()
            .take_while(|d| *d <= last)
            .filter(|d| in_schedule(*d))
            .map(|d| d.to_string())
            .collect();
        let records = final_records(&s.redis, "ticker", days.len()).await;
        assert_eq!(records.keys().cloned().collect::<Vec<_>>(), days);
        for r in records.values() {
            assert_eq!(r["status"], "done", "{r}");
            assert_eq!(r["attempt"], 1, "{r}");
        }
        assert_eq!(
            records[&march.to_string()]["scheduled_at"],
            format!("{march}T03:30:00+02:00")
        );
        assert_eq!(
            records[&october.to_string()]["scheduled_at"],
            format!("{october}T02:30:00+02:00")
        );
        // One run per day, each once: one `run done` line and one output per period.
        let done = crate::harness::settled(&days.len(), || {
            s.host.log_lines_with("\"run done\"").len()
        })
        .await;
        assert_eq!(done, days.len());
        let mut c = s.redis.conn().await;
        let ticks: Vec<String> = c.keys("lh:{ticker}:data:tick/*").await.unwrap();
        assert_eq!(ticks.len(), days.len());
    })
    .await;
}

#[tokio::test]
async fn a_failed_step_is_retried_under_the_retry_policy_and_each_attempt_recorded() {
    deadline(Duration::from_secs(120), async {
        let sidecar = "[retry]\nattempts = 3\nbackoff = \"1s\"\n";
        let s = setup("probe", Some(sidecar), &[("mode", "flaky")], None).await;
        // Waiting for its retry, the record keeps the failed step's stderr.
        let pending = wait_for(
            "the retry to be pending",
            Duration::from_secs(60),
            || async {
                run_records(&s.redis, "probe")
                    .await
                    .into_iter()
                    .find(|r| r["status"] == "pending" && r["attempt"] == 2)
            },
        )
        .await;
        assert_eq!(
            pending["stderr"], "probe: flaky, failing attempt 1",
            "{pending}"
        );
        let records = final_records(&s.redis, "probe", 1).await;
        let r = records.values().next().unwrap();
        assert_eq!(r["status"], "done", "{r}");
        assert_eq!(r["attempt"], 2, "{r}");
        let attempts = r["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{r}");
        assert_eq!(attempts[0]["failure"], "job-error");
        assert_eq!(attempts[0]["error"], "job failed: flaky on attempt 1");
        // The step that then succeeded cleared it.
        assert!(r.get("stderr").is_none(), "{r}");
        drop(s);

        // A trap on every attempt: failed after the last one, every attempt in the record.
        let sidecar = "[retry]\nattempts = 2\nbackoff = \"100ms\"\n";
        let s = setup("probe", Some(sidecar), &[("mode", "unreachable")], None).await;
        let records = final_records(&s.redis, "probe", 1).await;
        let r = records.values().next().unwrap();
        assert_eq!(r["status"], "failed", "{r}");
        assert_eq!(
            (r["attempt"].as_u64(), r["failure"].as_str()),
            (Some(2), Some("trap"))
        );
        assert_eq!(r["attempts"].as_array().unwrap().len(), 1, "{r}");
        assert_eq!(s.host.log_lines_with("attempt failed, retrying").len(), 1);
    })
    .await;
}

/// The stepper fires every second; its first run waits at step 0 until the gates open.
async fn overlapping(policy: &str) -> (Setup, BTreeMap<String, Value>) {
    let sidecar = format!(
        "schedule = \"* * * * * *\"\noverlap = \"{policy}\"\n[catch-up]\npolicy = \"all\"\nwindow = \"1m\"\n"
    );
    let s = setup("stepper", Some(&sidecar), &[], None).await;
    let blocked = wait_for(
        "the first run to start",
        Duration::from_secs(60),
        || async {
            run_records(&s.redis, "stepper")
                .await
                .into_iter()
                .find(|r| r["status"] == "running")
        },
    )
    .await;
    // Two more periods fire while it is open.
    let others = wait_for(
        "two periods to fire during the run",
        Duration::from_secs(30),
        || async {
            let recs = run_records(&s.redis, "stepper").await;
            (recs.len() >= 3).then_some(recs)
        },
    )
    .await;
    let data = s.dir.join("data/stepper");
    for g in ["go-0", "go-1", "go-2"] {
        std::fs::write(data.join(g), "").unwrap();
    }
    let first = blocked["period"].as_str().unwrap().to_string();
    wait_for(
        "the first run to finish",
        Duration::from_secs(30),
        || async {
            run_record(&s.redis, "stepper", &first)
                .await
                .filter(|r| r["status"] == "done")
        },
    )
    .await;
    let during: Vec<String> = others
        .iter()
        .map(|r| r["period"].as_str().unwrap().to_string())
        .filter(|p| *p != first)
        .collect();
    let mut settled = BTreeMap::new();
    for p in during {
        let r = wait_for(
            "the periods that fired during the run to settle",
            Duration::from_secs(30),
            || async {
                run_record(&s.redis, "stepper", &p)
                    .await
                    .filter(|r| ["done", "skipped"].contains(&r["status"].as_str().unwrap()))
            },
        )
        .await;
        settled.insert(p, r);
    }
    (s, settled)
}

#[tokio::test]
async fn periods_firing_during_an_open_run_are_skipped_under_overlap_skip() {
    deadline(Duration::from_secs(120), async {
        let (_s, during) = overlapping("skip").await;
        assert!(during.len() >= 2, "{during:?}");
        for r in during.values() {
            assert_eq!(r["status"], "skipped", "{r}");
            assert!(r["error"].as_str().unwrap().contains("overlap policy skip"));
        }
    })
    .await;
}

#[tokio::test]
async fn periods_firing_during_an_open_run_run_after_it_under_overlap_queue() {
    deadline(Duration::from_secs(120), async {
        let (_s, during) = overlapping("queue").await;
        assert!(during.len() >= 2, "{during:?}");
        for r in during.values() {
            assert_eq!(r["status"], "done", "{r}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_run_past_its_maximum_run_time_fails_between_steps() {
    deadline(Duration::from_secs(120), async {
        let s = setup("stepper", Some("max-run-time = \"1s\"\n"), &[], None).await;
        let r = wait_for("the run to start", Duration::from_secs(60), || async {
            run_records(&s.redis, "stepper")
                .await
                .into_iter()
                .find(|r| r["status"] == "running")
        })
        .await;
        let started =
            chrono::DateTime::parse_from_rfc3339(r["started_at"].as_str().unwrap()).unwrap();
        // Let step 0 finish only once the run is past its maximum.
        wait_for("the run to pass 1 s", Duration::from_secs(10), || async {
            (Utc::now().signed_duration_since(started) > chrono::Duration::milliseconds(1200))
                .then_some(())
        })
        .await;
        std::fs::write(s.dir.join("data/stepper/go-0"), "").unwrap();
        let records = final_records(&s.redis, "stepper", 1).await;
        let r = records.values().next().unwrap();
        assert_eq!(
            (r["status"].as_str(), r["failure"].as_str()),
            (Some("failed"), Some("run-timeout")),
            "{r}"
        );
        assert_eq!(r["step"], 1, "step 0 completed, step 1 never started: {r}");
    })
    .await;
}

#[tokio::test]
async fn a_paused_job_starts_nothing_and_catches_up_when_resumed() {
    deadline(Duration::from_secs(120), async {
        let s = setup("ticker", None, &[], None).await;
        wait_for("a first tick", Duration::from_secs(60), || async {
            run_records(&s.redis, "ticker")
                .await
                .into_iter()
                .find(|r| r["status"] == "done")
        })
        .await;
        let out = run_leasehold(&["pause", "ticker", "--redis-url", &s.redis.url()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        s.host
            .wait_for_log("job paused", Duration::from_secs(10))
            .await;
        let paused_at = Utc::now();
        let before = run_records(&s.redis, "ticker").await.len();
        wait_for(
            "three seconds of pause",
            Duration::from_secs(10),
            || async { (Utc::now() - paused_at > chrono::Duration::seconds(3)).then_some(()) },
        )
        .await;
        // Paused: nothing accounted, nothing run.
        assert_eq!(run_records(&s.redis, "ticker").await.len(), before);

        let (status, body) = http(&s.http, "POST", "/v1/jobs/ticker/resume", None).await;
        assert_eq!(
            (status, &body["paused"]),
            (200, &Value::Bool(false)),
            "{body}"
        );
        // The ticker's policy (all, within a minute) runs every period that fired meanwhile.
        let missed_seconds: Vec<String> = (1..=3)
            .map(|s| {
                (paused_at + chrono::Duration::seconds(s))
                    .format("%Y-%m-%dT%H:%M:%S")
                    .to_string()
            })
            .collect();
        for p in &missed_seconds {
            wait_for(
                &format!("period {p} to run after the resume"),
                Duration::from_secs(30),
                || async {
                    run_record(&s.redis, "ticker", p)
                        .await
                        .filter(|r| r["status"] == "done")
                },
            )
            .await;
        }
        s.host
            .wait_for_log("job resumed", Duration::from_secs(10))
            .await;
    })
    .await;
}

#[tokio::test]
async fn triggers_are_deduplicated_with_the_schedule_over_the_cli_and_http() {
    deadline(Duration::from_secs(120), async {
        let gates: [(&str, &str); 3] = [("go-0", ""), ("go-1", ""), ("go-2", "")];
        let s = setup("stepper", None, &gates, None).await;
        // The yearly schedule's current period runs at once.
        let current = Utc::now().format("%Y-01-01").to_string();
        let records = final_records(&s.redis, "stepper", 1).await;
        assert_eq!(records[&current]["status"], "done");

        let (status, body) = http(&s.http, "POST", "/v1/jobs/stepper/runs", None).await;
        assert_eq!(
            (status, body["result"].as_str()),
            (200, Some("already-done")),
            "{body}"
        );
        let out = run_leasehold(&[
            "trigger",
            "stepper",
            "--period",
            &current,
            "--redis-url",
            &s.redis.url(),
        ]);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("is already done"),
            "{out:?}"
        );
        // A misspelt name is refused once the host has published the jobs it serves (it does
        // after its first scan, long before this), and nothing is requested.
        let out = run_leasehold(&[
            "trigger",
            "steper",
            "--period",
            &current,
            "--redis-url",
            &s.redis.url(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{out:?}");
        assert!(
            err.contains("no live host serves a job named steper") && err.contains("stepper"),
            "{err}"
        );
        let mut c = s.redis.conn().await;
        let requested: bool = redis::cmd("EXISTS")
            .arg("lh:{steper}:requested")
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(!requested, "a request was written for the misspelt job");

        let (status, body) = http(
            &s.http,
            "POST",
            "/v1/jobs/stepper/runs",
            Some(r#"{"period":"2025-01-01"}"#),
        )
        .await;
        assert_eq!(
            (status, body["result"].as_str()),
            (202, Some("requested")),
            "{body}"
        );
        let records = final_records(&s.redis, "stepper", 2).await;
        assert_eq!(records["2025-01-01"]["status"], "done");
        let (_, body) = http(
            &s.http,
            "POST",
            "/v1/jobs/stepper/runs",
            Some(r#"{"period":"2025-01-01"}"#),
        )
        .await;
        assert_eq!(body["result"], "already-done", "{body}");
        assert_eq!(
            crate::harness::settled(&2, || s.host.log_lines_with("\"run done\"").len()).await,
            2,
            "each period ran once"
        );

        // History over HTTP and the CLI.
        let (status, body) = http(&s.http, "GET", "/v1/jobs/stepper/runs", None).await;
        assert_eq!(status, 200);
        let periods: Vec<&str> = body["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["period"].as_str().unwrap())
            .collect();
        assert_eq!(periods, vec![current.as_str(), "2025-01-01"]);
        let out = run_leasehold(&["runs", "stepper", "--redis-url", &s.redis.url()]);
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(
            table.starts_with("PERIOD") && table.contains("2025-01-01") && table.contains("done"),
            "{table}"
        );

        // Bad input gets a 4xx with a reason.
        for (method, path, body, code, needle) in [
            ("POST", "/v1/jobs/Bad_Name/runs", None, 400, "name must be"),
            (
                "POST",
                "/v1/jobs/nosuchjob/runs",
                None,
                404,
                "is not served by node n1",
            ),
            (
                "POST",
                "/v1/jobs/stepper/runs",
                Some("{not json"),
                400,
                "bad body",
            ),
            (
                "POST",
                "/v1/jobs/stepper/runs",
                Some(r#"{"period":"2025-02-30"}"#),
                400,
                "is not a period",
            ),
            (
                "POST",
                "/v1/jobs/stepper/runs",
                Some(r#"{"when":"now"}"#),
                400,
                "unknown field",
            ),
            (
                "GET",
                "/v1/jobs/stepper/runs?limit=lots",
                None,
                400,
                "limit",
            ),
            ("GET", "/v2/nothing", None, 404, "no such endpoint"),
        ] {
            let (status, answer) = http(&s.http, method, path, body).await;
            assert_eq!(status, code, "{method} {path}: {answer}");
            assert!(
                answer["error"].as_str().unwrap_or("").contains(needle),
                "{method} {path}: {answer}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_trigger_wakes_an_idle_leader_at_once_not_at_its_safety_poll() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("schedule-notice");
        let (jobs, data) = crate::harness::deploy_billing(dir.path(), 3);
        // Heartbeat 2 s: an idle runner's safety poll is ten heartbeats, 20 s.
        let host = HostProcess::start_node(
            LEASEHOLD,
            &redis.url(),
            &jobs,
            "n1",
            ("10s", "2s"),
            &["--data-dir", data.to_str().unwrap()],
        );
        // The current period runs at start (catch-up); then the leader is idle until tomorrow.
        wait_for(
            "the current period's run",
            Duration::from_secs(60),
            || async {
                run_records(&redis, "billing")
                    .await
                    .into_iter()
                    .find(|r| r["status"] == "done")
            },
        )
        .await;
        host.wait_for_log("became leader", Duration::from_secs(5))
            .await;
        let earlier = (Utc::now() - chrono::Duration::days(3))
            .format("%Y-%m-%d")
            .to_string();
        crate::harness::trigger(&redis, "billing", &earlier);
        // Well inside the 20 s poll: the trigger's notice woke the runner.
        wait_for(
            "the triggered run, woken by its notice",
            Duration::from_secs(10),
            || async {
                run_record(&redis, "billing", &earlier)
                    .await
                    .filter(|r| r["status"] == "done")
            },
        )
        .await;
    })
    .await;
}

/// Issue 23, defect 3: a schedule changed (its sidecar) while a run of a period of the old
/// schedule was open dropped that period from the open set, its record stranded `waiting` and
/// `trigger` refusing it as "not a period". Now the run goes on under the period it fired for,
/// its record says it belongs to an earlier schedule (`runs`), a trigger of it is accepted, and
/// it finishes; the new schedule's periods run as usual.
#[tokio::test]
async fn a_run_open_when_the_schedule_changes_finishes_under_its_period() {
    deadline(Duration::from_secs(180), async {
        // The stepper fires every 1 January; step 1 waits for its input (`defer`).
        let s = setup("stepper", None, &[("defer", ""), ("go-0", "")], None).await;
        let year = Utc::now().format("%Y").to_string();
        let old = format!("{year}-01-01");
        wait_for(
            "the run to wait after its first step",
            Duration::from_secs(60),
            || async {
                run_record(&s.redis, "stepper", &old)
                    .await
                    .filter(|r| r["status"] == "waiting" && r["step"] == 1)
            },
        )
        .await;
        // Now every 1 July: the open period of 1 January is no period of the new schedule.
        let sidecar = s.dir.join("jobs/stepper.toml");
        std::fs::write(
            s.dir.join("jobs/.stepper.toml.tmp"),
            "schedule = \"0 0 0 1 7 *\"\n",
        )
        .unwrap();
        std::fs::rename(s.dir.join("jobs/.stepper.toml.tmp"), &sidecar).unwrap();
        let carried = wait_for(
            "the open run to go on under its period, marked",
            Duration::from_secs(90),
            || async {
                // Written `running` as the step starts, then `waiting` again after it.
                run_record(&s.redis, "stepper", &old)
                    .await
                    .filter(|r| r["earlier_schedule"].is_string() && r["status"] == "waiting")
            },
        )
        .await;
        assert!(
            carried["earlier_schedule"]
                .as_str()
                .unwrap()
                .contains("0 0 0 1 7 *"),
            "{carried}"
        );
        let url = s.redis.url();
        let out = run_leasehold(&["runs", "stepper", "--redis-url", &url]);
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{table}");
        let row = table
            .lines()
            .find(|l| l.starts_with(&old))
            .unwrap_or_default();
        assert!(row.contains("earlier schedule"), "{table}");
        // A trigger of it is accepted (the run carries on), over the CLI and HTTP.
        let out = run_leasehold(&["trigger", "stepper", "--period", &old, "--redis-url", &url]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("already waiting"), "{said}");
        let (code, body) = http(
            &s.http,
            "POST",
            "/v1/jobs/stepper/runs",
            Some(&serde_json::json!({ "period": old }).to_string()),
        )
        .await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["result"], "already-open", "{body}");
        // A period of neither schedule, without a record, is still refused.
        let out = run_leasehold(&[
            "trigger",
            "stepper",
            "--period",
            "2020-03-03",
            "--redis-url",
            &url,
        ]);
        assert!(!out.status.success());
        // The inputs arrive: the old period's run finishes, and so does the new schedule's.
        std::fs::remove_file(s.dir.join("data/stepper/defer")).unwrap();
        for g in ["go-1", "go-2"] {
            std::fs::write(s.dir.join("data/stepper").join(g), "").unwrap();
        }
        let done = wait_for(
            "the old period's run to be done",
            Duration::from_secs(90),
            || async {
                run_record(&s.redis, "stepper", &old)
                    .await
                    .filter(|r| r["status"] == "done")
            },
        )
        .await;
        assert!(done["earlier_schedule"].is_string(), "{done}");
        let new = format!("{year}-07-01");
        if Utc::now().format("%m").to_string().as_str() >= "07" {
            wait_for(
                "the new schedule's period to be done",
                Duration::from_secs(90),
                || async {
                    run_record(&s.redis, "stepper", &new)
                        .await
                        .filter(|r| r["status"] == "done")
                },
            )
            .await;
        }
    })
    .await;
}

/// Issue 23, items 5 and 8: a trigger of a period still to come was run at once (using the
/// period up before it fired), and a trigger that could not be checked (no schedule published
/// yet) of a period that is none was dropped with only a log line. Now a leader refuses both
/// and records each refusal in the run history (`runs`, HTTP), clearing the request; once the
/// schedule is published, the CLI and HTTP refuse a future period at once.
#[tokio::test]
async fn future_periods_and_non_periods_are_refused_where_the_operator_looks() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let url = redis.url();
        let dir = TempDir::new("schedule-refused");
        let (jobs, data) = (dir.join("jobs"), dir.join("data"));
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::create_dir_all(data.join("stepper")).unwrap();
        for g in ["go-0", "go-1", "go-2"] {
            std::fs::write(data.join("stepper").join(g), "").unwrap();
        }
        std::fs::copy(guests().wasm("stepper"), jobs.join("stepper.wasm")).unwrap();
        let next: i32 = Utc::now().format("%Y").to_string().parse().unwrap();
        let future = format!("{}-01-01", next + 1);
        // No leader yet: no current period to default to, so --period is required.
        let out = run_leasehold(&["trigger", "stepper", "--redis-url", &url]);
        assert!(!out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("give --period"), "{err}");
        // Nor anything to check a period against, so both are written (with a note).
        for period in ["2020-03-03", future.as_str()] {
            let out = run_leasehold(&[
                "trigger",
                "stepper",
                "--period",
                period,
                "--redis-url",
                &url,
            ]);
            assert!(out.status.success(), "{out:?}");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("is not checked"),
                "{out:?}"
            );
        }
        let host = HostProcess::start_node(
            LEASEHOLD,
            &url,
            &jobs,
            "n1",
            ("2s", "500ms"),
            &[
                "--data-dir",
                data.to_str().unwrap(),
                "--http",
                "127.0.0.1:0",
            ],
        );
        let refused = wait_for(
            "both refusals in the run history",
            Duration::from_secs(60),
            || async {
                let out = run_leasehold(&["runs", "stepper", "--json", "--redis-url", &url]);
                let records: Vec<Value> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .filter(|r: &Value| r["status"] == "refused")
                    .collect();
                (records.len() == 2).then_some(records)
            },
        )
        .await;
        let why = |period: &str| {
            refused
                .iter()
                .find(|r| r["period"] == period)
                .and_then(|r| r["error"].as_str())
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            why("2020-03-03").contains("is not a period of schedule"),
            "{refused:?}"
        );
        assert!(why(&future).contains("in the future"), "{refused:?}");
        let requested: BTreeMap<String, String> = redis
            .conn()
            .await
            .hgetall("lh:{stepper}:requested")
            .await
            .unwrap();
        assert!(requested.is_empty(), "requests left: {requested:?}");
        assert!(run_record(&redis, "stepper", &future).await.is_none());
        let table = run_leasehold(&["runs", "stepper", "--redis-url", &url]);
        let table = String::from_utf8_lossy(&table.stdout);
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("2020-03-03") && l.contains("refused")),
            "{table}"
        );
        let addr = host.http_addr(Duration::from_secs(30)).await;
        let (code, runs) = http(&addr, "GET", "/v1/jobs/stepper/runs", None).await;
        assert_eq!(code, 200);
        assert!(runs.to_string().contains("\"refused\""), "{runs}");
        // Published now: a future period is refused at once, naming its fire time.
        wait_for(
            "the schedule to be published",
            Duration::from_secs(30),
            || async {
                let s: Option<String> = redis
                    .conn()
                    .await
                    .get("lh:{stepper}:schedule")
                    .await
                    .unwrap();
                s
            },
        )
        .await;
        let out = run_leasehold(&[
            "trigger",
            "stepper",
            "--period",
            &future,
            "--redis-url",
            &url,
        ]);
        assert!(!out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("in the future") && err.contains(&future),
            "{err}"
        );
        // And without --period, the current one (this year's, run already or running).
        let out = run_leasehold(&["trigger", "stepper", "--redis-url", &url]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(said.contains(&format!("period {next}-01-01")), "{said}");
        let body = serde_json::json!({ "period": future }).to_string();
        let (code, answer) = http(&addr, "POST", "/v1/jobs/stepper/runs", Some(&body)).await;
        assert_eq!(code, 400, "{answer}");
        assert!(answer.to_string().contains("in the future"), "{answer}");
    })
    .await;
}
