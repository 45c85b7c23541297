//! Start-up configuration errors (I4), through the real binary: each violated rule is named
//! with its values, and the process exits 1 without touching Redis.

use crate::harness::run_leasehold;

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
    let (code, err) = run(&[
        "run",
        "--redis-url",
        "redis://127.0.0.1:1",
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
    let (code, err) = run(&[
        "run",
        "--redis-url",
        "redis://127.0.0.1:1",
        "--node-id",
        "n1",
        "--lease-ttl",
        "1s",
        "--heartbeat",
        "200ms",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot reach redis at redis://127.0.0.1:1"),
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
