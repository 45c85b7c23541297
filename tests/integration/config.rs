//! Start-up configuration errors (I4), through the real binary: each violated rule is named
//! with its values, and the process exits 1 without touching Redis; and what the host checks
//! about its Redis when it starts (the eviction policy).

use crate::harness::run_leasehold;

/// A TCP port this test owns and on which nothing answers: a listener that never accepts, held
/// for as long as the returned value lives. A Redis URL with it reaches no Redis.
fn silent_port() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", l.local_addr().unwrap());
    (l, url)
}

/// Runs `leasehold <args>` (30 s deadline): exit code and stderr.
fn run(args: &[&str]) -> (i32, String) {
    let out = run_leasehold(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn each_timing_violation_is_reported_with_its_values() {
    // Redis URL points nowhere: validation must fail before any connection attempt.
    let (_held, url) = silent_port();
    let (code, err) = run(&[
        "run",
        "--redis-url",
        &url,
        "--node-id",
        "n1",
        "--lease-ttl",
        "1s",
        "--heartbeat",
        "400ms",
        "--redis-timeout",
        "500ms",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("heartbeat × 3 must be less than lease-ttl (heartbeat 400ms × 3 = 1s 200ms, lease-ttl 1s)"), "{err}");
    assert!(err.contains("redis-timeout must be greater than zero and less than heartbeat (redis-timeout 500ms, heartbeat 400ms)"), "{err}");
    assert!(err.contains("heartbeat + redis-timeout must be less than lease-ttl − lease-margin (heartbeat 400ms + redis-timeout 500ms = 900ms, lease-ttl 1s − lease-margin 100ms = 900ms)"), "{err}");
    assert!(!err.contains("cannot reach redis"), "{err}");
}

#[test]
fn a_bad_duration_or_node_id_is_a_clear_error() {
    let (code, err) = run(&["run", "--lease-ttl", "ten seconds"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--lease-ttl") && err.contains("use e.g. 500ms, 3s, 1m"),
        "{err}"
    );
    let (code, err) = run(&["run", "--node-id", "a b"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("node-id must be 1 to 64 characters"), "{err}");
}

#[test]
fn an_unreachable_redis_is_named() {
    let (_held, url) = silent_port();
    let (code, err) = run(&[
        "run",
        "--redis-url",
        &url,
        "--node-id",
        "n1",
        "--lease-ttl",
        "1s",
        "--heartbeat",
        "200ms",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("cannot reach redis at {url}")),
        "{err}"
    );
}

#[test]
fn a_cache_inside_the_jobs_directory_is_refused() {
    let (code, err) = run(&[
        "run",
        "--jobs-dir",
        "/srv/jobs",
        "--cache-dir",
        "/srv/jobs/.cache",
        "--node-id",
        "n1",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cache-dir /srv/jobs/.cache must not be inside jobs-dir /srv/jobs"),
        "{err}"
    );
}

/// A Redis that may evict keys (here `allkeys-lru`) is refused at start-up with the setting and
/// the fix named; `--allow-evicting-redis` starts anyway, with a warning naming the policy.
#[tokio::test]
async fn an_evicting_redis_is_refused_unless_allowed() {
    use std::time::Duration;

    use crate::harness::{HostProcess, LEASEHOLD, RedisConfig, RedisServer, TempDir, deadline};

    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start_with(RedisConfig::new().args([
            "--maxmemory",
            "64mb",
            "--maxmemory-policy",
            "allkeys-lru",
        ]))
        .await;
        let jobs = TempDir::new("evicting");
        let args = [
            "run",
            "--redis-url",
            &redis.url(),
            "--jobs-dir",
            jobs.0.to_str().unwrap(),
            "--node-id",
            "n1",
            "--lease-ttl",
            "1s",
            "--heartbeat",
            "200ms",
        ];
        let (code, err) = run(&args);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("redis maxmemory-policy is allkeys-lru")
                && err.contains("maxmemory-policy noeviction")
                && err.contains("--allow-evicting-redis"),
            "{err}"
        );
        let mut allowed = args.to_vec();
        allowed.push("--allow-evicting-redis");
        let host = HostProcess::start(LEASEHOLD, &allowed, &[]);
        let warning = host
            .wait_for_log(
                "redis maxmemory-policy is allkeys-lru",
                Duration::from_secs(30),
            )
            .await;
        assert!(warning.contains("\"level\":\"WARN\""), "{warning}");
        host.wait_for_log("node started", Duration::from_secs(30))
            .await;
    })
    .await;
}

/// Issue 23, item 9: a `CONFIG SET maxmemory-policy allkeys-lru` after start-up went unnoticed.
/// The host reads its Redis's settings again while it runs: it shuts down the clean way (its
/// lease released, not left to expire), says why as an error, and exits non-zero.
#[tokio::test]
async fn a_redis_set_to_evict_after_start_up_stops_the_host_loudly() {
    use std::time::Duration;

    use redis::AsyncCommands;

    use crate::harness::{
        HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, wait_for,
    };

    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let jobs = TempDir::new("evicting-later");
        std::fs::copy(guests().wasm("ticker"), jobs.join("ticker.wasm")).unwrap();
        let mut host =
            HostProcess::start_node(LEASEHOLD, &redis.url(), &jobs.0, "n1", ("2s", "100ms"), &[]);
        wait_for("n1 to lead the ticker", Duration::from_secs(30), || async {
            let owner: Option<String> = redis.conn().await.get("lh:{ticker}:lease").await.unwrap();
            owner.filter(|o| o.starts_with("n1:"))
        })
        .await;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg("allkeys-lru")
            .query_async(&mut redis.conn().await)
            .await
            .unwrap();
        let status = host
            .wait_exit("the host to stop", Duration::from_secs(20))
            .await;
        assert_eq!(status.code(), Some(1), "{status:?}");
        // Its last lines reach the harness after the exit.
        crate::harness::settled(&true, || {
            !host
                .log_lines_with("steps stopped and leases released")
                .is_empty()
        })
        .await;
        let said = host.log_lines_with("redis maxmemory-policy is allkeys-lru");
        assert!(
            said.iter()
                .any(|l| l.contains("\"level\":\"ERROR\"") && l.contains("releasing every lease")),
            "{said:?}"
        );
        assert!(
            !host
                .log_lines_with("steps stopped and leases released")
                .is_empty()
        );
        let owner: Option<String> = redis.conn().await.get("lh:{ticker}:lease").await.unwrap();
        assert_eq!(owner, None, "the lease was left to expire");
    })
    .await;
}

#[test]
fn unknown_redis_urls_are_refused_and_cluster_and_sentinel_urls_accepted_by_check_config() {
    let check = |url: &str| {
        run(&[
            "run",
            "--redis-url",
            url,
            "--node-id",
            "n1",
            "--check-config",
        ])
    };
    let (code, err) = check("http://127.0.0.1:6379");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("is not supported")
            && err.contains("redis+cluster://")
            && err.contains("redis+sentinel://"),
        "{err}"
    );
    // A cluster URL without a seed node, or a Sentinel URL without a sentinel or a service, is
    // refused naming the form; complete ones pass.
    let (code, err) = check("redis+cluster://");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("names no seed node"), "{err}");
    let (code, err) = check("redis+sentinel://127.0.0.1:26379");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("names no service"), "{err}");
    let (code, err) = check("redis+sentinel:///mymaster");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("names no sentinel"), "{err}");
    for url in [
        "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
        "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster",
        "redis+sentinel://:pw@127.0.0.1:26379/mymaster",
    ] {
        let (code, err) = check(url);
        assert_eq!(code, 0, "{url}: {err}");
    }
}

/// `run --help` presents the job limits as maxima a job may ask for, beside the defaults a job
/// that asks for nothing gets.
#[test]
fn run_help_says_the_limits_are_maxima_and_names_the_defaults() {
    let out = run_leasehold(&["run", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Job limits (the most a job may ask for"),
        "{help}"
    );
    for default in ["gets 64 MiB", "gets 30 s", "gets 1 MiB"] {
        assert!(help.contains(default), "no {default:?} in:\n{help}");
    }
}
