//! A history of what Redis actually applied, recorded with `MONITOR`, and a checker for the
//! fencing invariants over it: both live in the harness crate
//! ([`leasehold_harness::history`]); this module re-exports them for the tests and tests the
//! checker itself.

pub(crate) use leasehold_harness::history::{History, Recorder, check, split_line};

#[test]
fn the_checker_catches_a_stale_write() {
    let lines: Vec<String> = [
        r#"1.0 [0 127.0.0.1:1] "EVALSHA" "x" "3" "lh:{j}:lease" "lh:{j}:token" "lh:{j}:fence" "a:1" "1000""#,
        r#"1.1 [0 lua] "HSET" "lh:{j}:fence" "token" "5" "holder" "a:1""#,
        r#"1.2 [0 127.0.0.1:1] "EVALSHA" "y" "3" "lh:{j}:lease" "lh:{j}:fence" "lh:{j}:data:k" "a:1" "5" "1" "v""#,
        r#"1.3 [0 lua] "SET" "lh:{j}:data:k" "v""#,
        r#"1.4 [0 127.0.0.1:2] "EVALSHA" "x" "3" "lh:{j}:lease" "lh:{j}:token" "lh:{j}:fence" "b:1" "1000""#,
        r#"1.5 [0 lua] "HSET" "lh:{j}:fence" "token" "6" "holder" "b:1""#,
        r#"1.6 [0 127.0.0.1:1] "EVALSHA" "y" "3" "lh:{j}:lease" "lh:{j}:fence" "lh:{j}:data:k" "a:1" "5" "1" "late""#,
        r#"1.7 [0 lua] "SET" "lh:{j}:data:k" "late""#,
    ]
    .map(String::from)
    .to_vec();
    let ok = check(&lines[..4]).unwrap();
    assert_eq!(ok.terms, vec![(1, 5, "a:1".to_string())]);
    assert_eq!(ok.applied.len(), 1);
    let err = check(&lines).unwrap_err();
    assert!(
        err.contains("write by a:1 with token 5 applied while the fence held 6 of b:1"),
        "{err}"
    );
}

#[test]
fn the_checker_catches_bookkeeping_outside_the_fence() {
    let term = [
        r#"1.0 [0 127.0.0.1:1] "EVALSHA" "x" "3" "lh:{j}:lease" "lh:{j}:token" "lh:{j}:fence" "a:1" "1000""#,
        r#"1.1 [0 lua] "HSET" "lh:{j}:fence" "token" "5" "holder" "a:1""#,
    ];
    // An open-index removal and a request clearing sent as plain commands, not by a term.
    for plain in [
        r#"1.2 [0 127.0.0.1:1] "SREM" "lh:{j}:open" "2026-11-27""#,
        r#"1.2 [0 127.0.0.1:1] "HDEL" "lh:{j}:requested" "2026-11-27""#,
        r#"1.2 [0 127.0.0.1:1] "SET" "lh:{j}:cursor" "2026-11-27T02:00:00Z""#,
    ] {
        let lines: Vec<String> = term.iter().chain([&plain]).map(|l| l.to_string()).collect();
        let err = check(&lines).unwrap_err();
        assert!(err.contains("write outside a fenced-write script"), "{err}");
    }
    // Operators' writes are not a term's: a request and the pause flag pass.
    let operator: Vec<String> = term
        .iter()
        .chain(&[
            r#"1.2 [0 127.0.0.1:3] "HSETNX" "lh:{j}:requested" "2026-11-27" "r1 none""#,
            r#"1.3 [0 127.0.0.1:3] "SET" "lh:{j}:paused" "by me""#,
        ])
        .map(|l| l.to_string())
        .collect();
    check(&operator).unwrap();
    // The same removal by a term whose token is below the fence: refused as stale.
    let stale: Vec<String> = [
        term[0],
        term[1],
        r#"1.2 [0 127.0.0.1:2] "EVALSHA" "x" "3" "lh:{j}:lease" "lh:{j}:token" "lh:{j}:fence" "b:1" "1000""#,
        r#"1.3 [0 lua] "HSET" "lh:{j}:fence" "token" "6" "holder" "b:1""#,
        r#"1.4 [0 127.0.0.1:1] "EVALSHA" "y" "4" "lh:{j}:lease" "lh:{j}:fence" "lh:{j}:open" "lh:{j}:requested" "a:1" "5" "0" "0" "0" "1" "0" "2026-11-27""#,
        r#"1.5 [0 lua] "SREM" "lh:{j}:open" "2026-11-27""#,
    ]
    .map(String::from)
    .to_vec();
    let err = check(&stale).unwrap_err();
    assert!(
        err.contains("write by a:1 with token 5 applied while the fence held 6 of b:1"),
        "{err}"
    );
}
