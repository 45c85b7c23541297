//! Operating a host: `/v1/status`, `/v1/jobs`, `/healthz`, `/readyz`, `/metrics` (parsed as
//! OpenMetrics text), `leasehold status`, the bearer token on mutating endpoints, read-only
//! endpoints that write nothing, job fields on every log line, the compose file through the
//! binary's config validation, and Redis ACL users.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisConfig, RedisServer, TempDir, deadline, guests, http, repo_root,
    run_leasehold, run_records, start_host_with_env, wait_for,
};
use crate::history::Recorder;
use leasehold_harness::TestCa;

/// Parses OpenMetrics text strictly: `# HELP`/`# TYPE`/`# UNIT` lines, samples
/// `name{label="value",…} number`, and a final `# EOF`. Returns `series → value`; panics
/// naming the line on anything else.
fn parse_openmetrics(text: &str) -> BTreeMap<String, f64> {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "no # EOF at the end");
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    let mut out = BTreeMap::new();
    for line in &lines[..lines.len() - 1] {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let kind = parts.next().unwrap();
            let name = parts.next().unwrap_or("");
            assert!(
                ["HELP", "TYPE", "UNIT"].contains(&kind) && name_ok(name),
                "bad line {line:?}"
            );
            if kind == "TYPE" {
                let t = parts.next().unwrap_or("");
                assert!(
                    [
                        "counter",
                        "gauge",
                        "histogram",
                        "info",
                        "stateset",
                        "unknown",
                        "summary",
                        "gaugehistogram"
                    ]
                    .contains(&t),
                    "bad type in {line:?}"
                );
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(name_ok(name), "bad metric name in {line:?}");
        let labels = &series[name.len()..];
        if !labels.is_empty() {
            let inner = labels
                .strip_prefix('{')
                .and_then(|l| l.strip_suffix('}'))
                .unwrap_or_else(|| panic!("bad labels in {line:?}"));
            for pair in inner.split("\",").filter(|p| !p.is_empty()) {
                let (k, v) = pair
                    .split_once("=\"")
                    .unwrap_or_else(|| panic!("bad label in {line:?}"));
                assert!(name_ok(k), "bad label name in {line:?}");
                assert!(
                    !v.trim_end_matches('"').contains('"') || v.contains("\\\""),
                    "bad label value in {line:?}"
                );
            }
        }
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        out.insert(series.to_string(), v);
    }
    out
}

fn metric(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    *m.get(series).unwrap_or_else(|| {
        panic!(
            "no series {series}; have:\n{}",
            m.keys().cloned().collect::<Vec<_>>().join("\n")
        )
    })
}

/// One host serving the ticker (cursor 90 s back: a minute of it runs, the rest is missed),
/// the probe (trapping), and a per-second stepper that never gets its gates (each run times
/// out at the host's 1 s step limit; fires during a run are skipped); a bad file; the HTTP API
/// with a token.
struct Operated {
    redis: RedisServer,
    _dir: TempDir,
    host: HostProcess,
    http: String,
}

const TOKEN: &str = "s3cret-token";

async fn operated() -> Operated {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("operate");
    let (jobs, data) = (dir.join("jobs"), dir.join("data"));
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::create_dir_all(data.join("probe")).unwrap();
    std::fs::write(data.join("probe/mode"), "unreachable").unwrap();
    for g in ["ticker", "probe", "stepper"] {
        std::fs::copy(guests().wasm(g), jobs.join(format!("{g}.wasm"))).unwrap();
    }
    std::fs::write(
        jobs.join("stepper.toml"),
        "schedule = \"* * * * * *\"\noverlap = \"skip\"\n",
    )
    .unwrap();
    std::fs::write(jobs.join("broken.wasm"), b"not wasm").unwrap();
    let cursor = (chrono::Utc::now() - chrono::Duration::seconds(90))
        .format("%Y-%m-%dT%H:%M:%S")
        .to_string();
    let _: () = redis
        .conn()
        .await
        .set("lh:{ticker}:cursor", cursor)
        .await
        .unwrap();
    let host = start_host_with_env(
        &[
            "run",
            "--redis-url",
            &redis.url(),
            "--jobs-dir",
            jobs.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--node-id",
            "n1",
            "--lease-ttl",
            "2s",
            "--heartbeat",
            "500ms",
            // Port 0: the host binds a free port and logs the address it got.
            "--http",
            "127.0.0.1:0",
            "--max-step-time",
            "1s",
        ],
        &[("LEASEHOLD_HTTP_TOKEN", TOKEN)],
    );
    let addr = host.http_addr(Duration::from_secs(60)).await;
    wait_for(
        "the HTTP API to be ready",
        Duration::from_secs(60),
        || async {
            let reachable = tokio::net::TcpStream::connect(&addr).await.is_ok();
            if !reachable {
                return None;
            }
            let (code, _) = http(&addr, "GET", "/readyz", None).await;
            (code == 200).then_some(())
        },
    )
    .await;
    Operated {
        redis,
        _dir: dir,
        host,
        http: addr,
    }
}

#[tokio::test]
async fn status_health_metrics_and_logs_describe_a_running_host() {
    deadline(Duration::from_secs(180), async {
        let o = operated().await;
        // Every kind of final run has happened: done, missed (ticker), failed (probe, stepper),
        // skipped (stepper).
        let expected = [
            ("ticker", "done"),
            ("ticker", "missed"),
            ("probe", "failed"),
            ("stepper", "failed"),
            ("stepper", "skipped"),
        ];
        wait_for(
            "runs of every final kind",
            Duration::from_secs(60),
            || async {
                let mut seen = std::collections::BTreeSet::new();
                for job in ["ticker", "probe", "stepper"] {
                    for r in run_records(&o.redis, job).await {
                        seen.insert((job, r["status"].as_str().unwrap().to_string()));
                    }
                }
                expected
                    .iter()
                    .all(|(j, k)| seen.contains(&(*j, k.to_string())))
                    .then_some(())
            },
        )
        .await;

        let (code, status) = http(&o.http, "GET", "/v1/status", None).await;
        assert_eq!(code, 200, "{status}");
        assert_eq!(status["node"], "n1");
        let jobs = status["jobs"].as_array().unwrap();
        let names: Vec<&str> = jobs.iter().map(|j| j["job"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["probe", "stepper", "ticker"]);
        let ticker = &jobs[2];
        let fence: u64 = o
            .redis
            .conn()
            .await
            .hget("lh:{ticker}:fence", "token")
            .await
            .unwrap();
        assert_eq!(
            (ticker["state"].as_str(), ticker["leader"].as_str()),
            (Some("leader"), Some("n1")),
            "{ticker}"
        );
        assert_eq!(ticker["token"], fence);
        let left = ticker["lease_ms_left"].as_u64().unwrap();
        assert!(left > 0 && left <= 2000, "{ticker}");
        assert_eq!(ticker["last_run"]["status"], "done", "{ticker}");
        assert!(ticker["next_run"]["period"].is_string(), "{ticker}");
        assert_eq!(jobs[0]["last_run"]["status"], "failed", "{}", jobs[0]);
        let refused = status["refused"].as_array().unwrap();
        assert_eq!(refused.len(), 1, "{status}");
        assert!(
            refused[0]["file"]
                .as_str()
                .unwrap()
                .ends_with("broken.wasm")
        );
        assert!(
            refused[0]["reason"]
                .as_str()
                .unwrap()
                .contains("not a WebAssembly file")
        );

        let (code, list) = http(&o.http, "GET", "/v1/jobs", None).await;
        assert_eq!(code, 200);
        assert_eq!(
            list["jobs"][1]["schedule"], "* * * * * *",
            "the sidecar applies: {list}"
        );
        assert_eq!(list["jobs"][1]["policies"]["overlap"], "skip");
        let (code, one) = http(&o.http, "GET", "/v1/jobs/ticker", None).await;
        assert_eq!(code, 200);
        assert_eq!(
            (one["job"].as_str(), one["status"]["state"].as_str()),
            (Some("ticker"), Some("leader"))
        );
        assert_eq!(http(&o.http, "GET", "/v1/jobs/nope", None).await.0, 404);
        assert_eq!(http(&o.http, "GET", "/v1/jobs/No_Pe", None).await.0, 400);

        let (code, health) = http(&o.http, "GET", "/healthz", None).await;
        assert_eq!((code, &health["healthy"]), (200, &Value::Bool(true)));
        let out = run_leasehold(&["health", "--http", &o.http]);
        assert!(out.status.success());
        let out = run_leasehold(&["health", "--ready", "--http", &o.http]);
        assert!(out.status.success());

        // `leasehold status` shows the same as a table.
        let out = run_leasehold(&["status", "--http", &o.http]);
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        let row = table
            .lines()
            .find(|l| l.starts_with("ticker"))
            .unwrap_or_else(|| panic!("{table}"));
        assert!(
            row.contains("leader") && row.contains("n1") && row.contains(&fence.to_string()),
            "{row}"
        );
        assert!(
            table.contains("refused files:") && table.contains("broken.wasm"),
            "{table}"
        );

        // Metrics, parsed as OpenMetrics text (once a renewal has happened).
        let m = wait_for(
            "a renewal in the metrics",
            Duration::from_secs(30),
            || async {
                let m = parse_openmetrics(&metrics_text(&o.http).await);
                (m.get("leasehold_renew_latency_seconds_count{job=\"ticker\"}") >= Some(&1.0))
                    .then_some(m)
            },
        )
        .await;
        assert_eq!(metric(&m, "leasehold_leader{job=\"ticker\"}"), 1.0);
        assert_eq!(metric(&m, "leasehold_token{job=\"ticker\"}"), fence as f64);
        assert_eq!(
            metric(
                &m,
                "leasehold_leadership_transitions_total{job=\"ticker\",to=\"leader\"}"
            ),
            1.0
        );
        assert!(metric(&m, "leasehold_renew_latency_seconds_count{job=\"ticker\"}") >= 1.0);
        assert!(m.contains_key("leasehold_without_leader_seconds_total{job=\"ticker\"}"));
        assert!(
            metric(
                &m,
                "leasehold_step_duration_seconds_count{job=\"ticker\",outcome=\"done\"}"
            ) >= 1.0
        );
        assert!(metric(&m, "leasehold_guest_traps_total{job=\"probe\"}") >= 1.0);
        // The ticker's steps' linear memory: whole wasm pages, within its 64 MiB default limit.
        let peak = metric(&m, "leasehold_guest_memory_peak_bytes{job=\"ticker\"}");
        assert!(
            peak > 0.0 && peak <= (64u64 << 20) as f64 && peak % 65536.0 == 0.0,
            "{peak}"
        );
        assert!(
            m.get("leasehold_guest_timeouts_total{job=\"stepper\"}") >= Some(&1.0),
            "{:?}",
            run_records(&o.redis, "stepper").await
        );
        for status in ["done", "missed"] {
            assert!(
                metric(
                    &m,
                    &format!("leasehold_runs_total{{job=\"ticker\",status=\"{status}\"}}")
                ) >= 1.0,
                "{status}"
            );
        }
        assert!(metric(&m, "leasehold_runs_total{job=\"probe\",status=\"failed\"}") >= 1.0);
        assert!(
            metric(
                &m,
                "leasehold_runs_total{job=\"stepper\",status=\"skipped\"}"
            ) >= 1.0
        );
        assert_eq!(metric(&m, "leasehold_jobs"), 3.0);
        for kind in ["heartbeat", "campaigns", "job-state"] {
            assert!(
                metric(
                    &m,
                    &format!("leasehold_redis_round_trips_total{{kind=\"{kind}\"}}")
                ) >= 1.0,
                "no {kind} round trip counted"
            );
        }
        assert_eq!(metric(&m, "leasehold_refused_files"), 1.0);

        // A write refused by the fence: a newer term (by someone else) raised the fence.
        let _: () = o
            .redis
            .conn()
            .await
            .hset_multiple(
                "lh:{ticker}:fence",
                &[
                    ("token", (fence + 1000).to_string()),
                    ("holder", "intruder:1".into()),
                ],
            )
            .await
            .unwrap();
        wait_for(
            "a fence refusal to be counted",
            Duration::from_secs(30),
            || async {
                let m = parse_openmetrics(&metrics_text(&o.http).await);
                (m.get("leasehold_fence_refusals_total{job=\"ticker\"}") >= Some(&1.0)
                    && m.get(
                        "leasehold_leadership_transitions_total{job=\"ticker\",to=\"follower\"}",
                    ) >= Some(&1.0))
                .then_some(())
            },
        )
        .await;
        // The node campaigns again and leads with a token above the intruder's.
        wait_for(
            "a new term above the fence",
            Duration::from_secs(30),
            || async {
                let m = parse_openmetrics(&metrics_text(&o.http).await);
                (m.get("leasehold_token{job=\"ticker\"}") > Some(&((fence + 1000) as f64))
                    && m.get("leasehold_leader{job=\"ticker\"}") == Some(&1.0))
                .then_some(())
            },
        )
        .await;

        // Every log line about a job names the job and the node; every line of a term also
        // its token.
        for line in o.host.log() {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v.get("job").is_none() {
                continue;
            }
            assert!(v.get("node").is_some(), "no node: {line}");
            let msg = v["message"].as_str().unwrap_or("");
            let of_a_term = [
                "became leader",
                "step done",
                "run done",
                "run failed",
                "fenced write",
                "renewed",
                "starting run",
                "period fired",
            ]
            .iter()
            .any(|m| msg.starts_with(m));
            if of_a_term {
                assert!(v.get("token").is_some(), "no token: {line}");
            }
        }
    })
    .await;
}

async fn metrics_text(addr: &str) -> String {
    let (code, body) = http(addr, "GET", "/metrics", None).await;
    assert_eq!(code, 200);
    body.as_str().unwrap().to_string()
}

#[tokio::test]
async fn mutating_endpoints_need_the_token_and_reads_write_nothing() {
    deadline(Duration::from_secs(120), async {
        let o = operated().await;
        let pause = |auth: Option<&'static str>| {
            let http = o.http.clone();
            async move {
                crate::harness::http_with(&http, "POST", "/v1/jobs/ticker/pause", None, auth).await
            }
        };
        let (code, body) = pause(None).await;
        assert_eq!(code, 401, "{body}");
        assert!(body["error"].as_str().unwrap().contains("Bearer"), "{body}");
        assert_eq!(pause(Some("Bearer wrong")).await.0, 401);
        assert_eq!(
            pause(Some("s3cret-token")).await.0,
            401,
            "the scheme is required"
        );
        let paused: bool = o
            .redis
            .conn()
            .await
            .exists("lh:{ticker}:paused")
            .await
            .unwrap();
        assert!(!paused, "a refused request changed state");
        let (code, body) = pause(Some("Bearer s3cret-token")).await;
        assert_eq!((code, &body["paused"]), (200, &Value::Bool(true)), "{body}");
        for job in ["probe", "stepper"] {
            let (code, _) = crate::harness::http_with(
                &o.http,
                "POST",
                &format!("/v1/jobs/{job}/pause"),
                None,
                Some("Bearer s3cret-token"),
            )
            .await;
            assert_eq!(code, 200);
        }
        for job in ["ticker", "probe", "stepper"] {
            o.host
                .wait_for_log(&format!("\"job\":\"{job}\""), Duration::from_secs(10))
                .await;
        }
        wait_for(
            "every job to be paused",
            Duration::from_secs(20),
            || async { (o.host.log_lines_with("job paused").len() >= 3).then_some(()) },
        )
        .await;

        // With every job paused, the only writes left are lease renewals (scripts). Every GET
        // endpoint, called now, must add none.
        let recorder = Recorder::start(&o.redis).await;
        for path in [
            "/v1/status",
            "/v1/jobs",
            "/v1/jobs/ticker",
            "/v1/jobs/ticker/runs",
            "/metrics",
            "/healthz",
            "/readyz",
        ] {
            let (code, _) = http(&o.http, "GET", path, None).await;
            assert_eq!(code, 200, "{path}");
        }
        // A marker write from the test orders the recording: everything before it is in.
        let _: () = o.redis.conn().await.set("test:marker", 1).await.unwrap();
        wait_for(
            "the marker in the recording",
            Duration::from_secs(10),
            || async {
                recorder
                    .lines()
                    .iter()
                    .any(|l| l.contains("test:marker"))
                    .then_some(())
            },
        )
        .await;
        let writes: Vec<String> = recorder
            .lines()
            .into_iter()
            .filter(|l| {
                !l.contains("test:marker")
                    && !l.contains("[lua]")
                    && !l.contains("\"EVALSHA\"")
                    && !l.contains("\"EVAL\"")
            })
            .filter(|l| {
                let cmd = l.split('"').nth(1).unwrap_or("").to_ascii_uppercase();
                [
                    "SET", "DEL", "SADD", "SREM", "HSET", "HDEL", "EXPIRE", "PEXPIRE", "INCR",
                    "ZADD", "RPUSH", "LPUSH", "PUBLISH", "UNLINK",
                ]
                .contains(&cmd.as_str())
            })
            .collect();
        assert!(writes.is_empty(), "GET endpoints wrote: {writes:?}");
    })
    .await;
}

/// Compose interpolation of `${VAR:-default}`: the default, as an unset variable gets.
fn with_defaults(v: &str) -> String {
    let mut out = String::new();
    let mut rest = v;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("an unclosed ${") + start;
        let inner = &rest[start + 2..end];
        let (_, default) = inner
            .split_once(":-")
            .unwrap_or_else(|| panic!("${{{inner}}} has no default"));
        out.push_str(default);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

#[test]
fn the_compose_file_runs_through_the_binarys_config_validation() {
    use yaml_rust2::{Yaml, YamlLoader};
    let text = std::fs::read_to_string(repo_root().join("docker-compose.yml")).unwrap();
    let docs = YamlLoader::load_from_str(&text).expect("docker-compose.yml is YAML");
    let services = &docs[0]["services"];
    let redis = &services["redis"];
    let cmd: Vec<&str> = redis["command"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|y| y.as_str().unwrap())
        .collect();
    assert!(
        cmd.windows(2).any(|w| w == ["--appendonly", "yes"]),
        "{cmd:?}"
    );
    assert!(
        cmd.windows(2).any(|w| w == ["--appendfsync", "always"]),
        "{cmd:?}"
    );
    assert!(
        cmd.windows(2)
            .any(|w| w == ["--maxmemory-policy", "noeviction"]),
        "{cmd:?}"
    );
    let mut node_ids = Vec::new();
    let mut ports = Vec::new();
    let Yaml::Hash(all) = services else {
        panic!("services is not a map")
    };
    let replicas: Vec<_> = all
        .iter()
        .filter(|(name, _)| name.as_str().is_some_and(|n| n.starts_with("node-")))
        .collect();
    assert_eq!(replicas.len(), 3);
    for (name, svc) in replicas {
        let name = name.as_str().unwrap();
        // Jobs and data read-only; a health check that uses the health endpoint.
        let volumes: Vec<&str> = svc["volumes"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(
            volumes.iter().any(|v| v.ends_with(":/jobs:ro")),
            "{name}: {volumes:?}"
        );
        assert!(
            volumes.iter().any(|v| v.ends_with(":/data:ro")),
            "{name}: {volumes:?}"
        );
        let check: Vec<&str> = svc["healthcheck"]["test"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|y| y.as_str().unwrap())
            .collect();
        assert_eq!(check, vec!["CMD", "leasehold", "health"], "{name}");
        ports.push(svc["ports"][0].as_str().unwrap().to_string());
        // The command line and environment, as the container would get them.
        let args: Vec<String> = svc["command"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|y| y.as_str().unwrap().to_string())
            .collect();
        let id = args
            .iter()
            .position(|a| a == "--node-id")
            .map(|i| args[i + 1].clone())
            .unwrap();
        node_ids.push(id);
        let mut cmd = std::process::Command::new(LEASEHOLD);
        cmd.args(&args).arg("--check-config").env_clear();
        let Yaml::Hash(env) = &svc["environment"] else {
            panic!("{name}: environment is not a map")
        };
        for (k, v) in env {
            let v = match v {
                Yaml::String(s) => s.clone(),
                Yaml::Integer(i) => i.to_string(),
                other => panic!("{name}: odd value {other:?}"),
            };
            // Compose interpolation: `${VAR:?message}` must be set by the operator.
            let v = if v.starts_with("${LEASEHOLD_HTTP_TOKEN:?") {
                "token-from-the-operator".to_string()
            } else {
                with_defaults(&v)
            };
            assert!(!v.contains("${"), "{name}: uninterpolated {v}");
            cmd.env(k.as_str().unwrap(), v);
        }
        let out = crate::harness::output_within(cmd);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("configuration ok"), "{stdout}");
        assert!(
            stdout.contains("http:        0.0.0.0:8080 (POST endpoints need the bearer token)"),
            "{stdout}"
        );
        assert!(
            stdout.contains("redis-url:   redis://redis:6379"),
            "{stdout}"
        );
        // The compose file's PostgreSQL, the password hidden.
        assert!(
            stdout.contains("database:    ledger = postgres://leasehold:"),
            "{stdout}"
        );
        assert!(!stdout.contains("leasehold-jobs"), "{stdout}");
    }
    node_ids.sort();
    node_ids.dedup();
    assert_eq!(node_ids.len(), 3, "distinct node ids");
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 3, "distinct status ports");
}

#[tokio::test]
async fn an_acl_user_with_a_password_works_and_a_wrong_password_is_a_clear_error() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let _: () = redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "leasehold",
                "on",
                ">pa55word",
                "~lh:*",
                "&lh:*",
                "+@all",
            ])
            .query_async(&mut c)
            .await
            .unwrap();
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "default", "off"])
            .query_async(&mut c)
            .await
            .unwrap();
        let dir = TempDir::new("acl");
        let jobs = dir.join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::copy(guests().wasm("ticker"), jobs.join("ticker.wasm")).unwrap();
        let good = format!("redis://leasehold:pa55word@127.0.0.1:{}", redis.port);
        let host = HostProcess::start_node(LEASEHOLD, &good, &jobs, "n1", ("2s", "500ms"), &[]);
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        host.wait_for_log("\"run done\"", Duration::from_secs(30))
            .await;

        let bad = format!("redis://leasehold:wrong@127.0.0.1:{}", redis.port);
        let out = run_leasehold(&[
            "run",
            "--redis-url",
            &bad,
            "--jobs-dir",
            jobs.to_str().unwrap(),
            "--node-id",
            "n2",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(!err.contains("wrong"), "the password leaked: {err}");
        assert!(err.contains("leasehold:***@127.0.0.1"), "{err}");
        assert!(
            err.to_lowercase().contains("auth") || err.contains("WRONGPASS"),
            "{err}"
        );
    })
    .await;
}

/// A `redis-server` that speaks only TLS, with a private CA; killed on drop.
struct TlsRedis {
    /// The server (its URL is `rediss://127.0.0.1:<port>`).
    server: RedisServer,
    ca: std::path::PathBuf,
    _ca: TestCa,
}

/// Makes a CA and a server certificate for 127.0.0.1 ([`TestCa`]), and starts the server.
async fn tls_redis() -> TlsRedis {
    let ca = TestCa::make();
    // The harness's own start path: a port of its own, retried if another process takes it.
    let server = RedisServer::start_with(RedisConfig::new().dir(&ca.dir.0).tls().args([
        "--tls-cert-file",
        "server.crt",
        "--tls-key-file",
        "server.key",
        "--tls-ca-cert-file",
        "ca.crt",
        "--tls-auth-clients",
        "no",
    ]))
    .await;
    TlsRedis {
        server,
        ca: ca.ca.clone(),
        _ca: ca,
    }
}

#[tokio::test]
async fn rediss_urls_work_with_a_trusted_ca_and_an_untrusted_server_is_refused() {
    deadline(Duration::from_secs(120), async {
        let redis = tls_redis().await;
        let dir = TempDir::new("tls-jobs");
        let jobs = dir.join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::copy(guests().wasm("ticker"), jobs.join("ticker.wasm")).unwrap();
        let url = redis.server.url();
        let args = [
            "run",
            "--redis-url",
            &url,
            "--jobs-dir",
            jobs.to_str().unwrap(),
            "--node-id",
            "n1",
            "--lease-ttl",
            "2s",
            "--heartbeat",
            "500ms",
        ];
        // The private CA is trusted through SSL_CERT_FILE: the host leads and runs over TLS.
        let host = start_host_with_env(&args, &[("SSL_CERT_FILE", redis.ca.to_str().unwrap())]);
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        host.wait_for_log("\"run done\"", Duration::from_secs(30))
            .await;
        // Without it, the server's certificate is not trusted: a clear start-up error.
        let mut cmd = std::process::Command::new(LEASEHOLD);
        cmd.args(args)
            .env_remove("SSL_CERT_FILE")
            .env_remove("SSL_CERT_DIR");
        let out = crate::harness::output_within(cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("cannot reach redis at {url}")),
            "{err}"
        );
        assert!(err.contains("certificate"), "{err}");
    })
    .await;
}

/// Issue 12, item 9: right after Redis restarts, the first `GET /v1/status` and
/// `GET /v1/jobs/JOB/runs` are answered (the API reads again once its connection has been
/// re-established), not refused with 503.
#[tokio::test]
async fn the_first_reads_after_a_redis_restart_are_answered() {
    deadline(Duration::from_secs(120), async {
        let mut redis = RedisServer::start_with_aof().await;
        let dir = TempDir::new("api-restart");
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::copy(guests().wasm("ticker"), dir.join("jobs/ticker.wasm")).unwrap();
        let host = HostProcess::start_node(
            LEASEHOLD,
            &redis.url(),
            &dir.join("jobs"),
            "n1",
            ("2s", "500ms"),
            &["--http", "127.0.0.1:0"],
        );
        let addr = host.http_addr(Duration::from_secs(60)).await;
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        let (code, body) = http(&addr, "GET", "/v1/status", None).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["jobs"][0]["job"], "ticker", "{body}");
        for _ in 0..2 {
            redis.crash_and_restart().await;
            let (code, body) = http(&addr, "GET", "/v1/status", None).await;
            assert_eq!(code, 200, "first status after the restart: {body}");
            let (code, body) = http(&addr, "GET", "/v1/jobs/ticker/runs", None).await;
            assert_eq!(code, 200, "first history after the restart: {body}");
        }
    })
    .await;
}

/// `leasehold runs | head`: a one-shot command whose output is closed ends as Unix tools do,
/// by SIGPIPE, without a panic message.
#[tokio::test]
async fn a_command_whose_output_is_closed_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        // A pipe whose reading end is closed before the command starts: its first write fails.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(LEASEHOLD)
            .args(["runs", "nightly", "--redis-url", &redis.url()])
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(
            out.status.signal(),
            Some(13),
            "not ended by SIGPIPE: {:?} {stderr}",
            out.status
        );
    })
    .await;
}
