//! A guest's only way to change anything is the fenced `store.write` import: no writable
//! filesystem, no key outside its namespace, and no token to pass or forge. The probe
//! guest (`guest-jobs/probe`) tries each way and reports what happened.

use std::time::{Duration, Instant};

use leasehold::coord::lease::{self, Acquired};
use leasehold::coord::term::Term;
use leasehold::exec::runtime::{RunInfo, Runtime, StepContext, StepError, StepOutcome};
use leasehold::exec::spec::HostLimits;
use leasehold::store::keys::JobKeys;
use redis::AsyncCommands;

use crate::harness::{RedisServer, TempDir, deadline, guests};

/// Loads the probe and runs its step 0 in `term`, with `period` as its period (an address to
/// dial, or a misbehaviour) and `data` as its `/data`.
async fn run_probe(
    runtime: &Runtime,
    redis: &RedisServer,
    term: Term,
    period: &str,
    data: Option<&TempDir>,
) -> Result<StepOutcome, StepError> {
    run_guest(runtime, redis, "probe", term, period, data).await
}

/// [`run_probe`] for another guest.
async fn run_guest(
    runtime: &Runtime,
    redis: &RedisServer,
    guest: &str,
    term: Term,
    period: &str,
    data: Option<&TempDir>,
) -> Result<StepOutcome, StepError> {
    let job = runtime
        .load(&guests().wasm(guest))
        .await
        .expect("the guest loads");
    let store = leasehold::coord::term_store::Store::open(&redis.url(), Duration::from_secs(5))
        .await
        .expect("a connection to Redis");
    let ctx = StepContext::for_step(
        JobKeys::new("probe"),
        term,
        store,
        data.map(|d| d.0.clone()),
        period,
    );
    let run = RunInfo {
        period: period.into(),
        scheduled_at: String::new(),
        attempt: 1,
    };
    runtime.run_step(&job, ctx, &run, 0, None).await
}

/// The probe's tour of every way to change the world. (Reaching the network is not among
/// them: a component that imports sockets is refused at load, see `check.rs`.)
async fn probe_step(
    runtime: &Runtime,
    redis: &RedisServer,
    term: Term,
    data: &TempDir,
) -> Result<StepOutcome, StepError> {
    run_probe(runtime, redis, term, "tour", Some(data)).await
}

/// Takes the lease of `keys` as `owner` (30 s) and returns its term, valid for 20 s.
async fn lead(c: &mut redis::aio::MultiplexedConnection, keys: &JobKeys, owner: &str) -> Term {
    let Acquired::Granted { token } = lease::acquire(c, keys, owner, Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("{owner} did not get the lease")
    };
    Term::new(
        token,
        owner.into(),
        Instant::now() + Duration::from_secs(20),
    )
}

fn lines(outcome: Result<StepOutcome, StepError>) -> Vec<String> {
    match outcome {
        Ok(StepOutcome::Continue(report)) => String::from_utf8(report)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect(),
        other => panic!("probe step: {other:?}"),
    }
}

fn line<'a>(report: &'a [String], name: &str) -> &'a str {
    report
        .iter()
        .find(|l| l.starts_with(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("no {name} line in {report:?}"))
}

#[tokio::test]
async fn a_leading_guest_can_only_write_its_own_keys_through_the_fence() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let data = TempDir::new("probe");
        std::fs::write(data.join("input.txt"), "hello").unwrap();
        let runtime = Runtime::new(HostLimits::default()).unwrap();
        let keys = JobKeys::new("probe");
        let term = lead(&mut c, &keys, "test:1").await;
        let report = lines(probe_step(&runtime, &redis, term, &data).await);

        assert_eq!(line(&report, "still-leader"), "still-leader: true");
        assert!(
            line(&report, "fs-write").starts_with("fs-write: error"),
            "{report:?}"
        );
        assert_eq!(line(&report, "fs-read"), "fs-read: ok hello");
        assert_eq!(line(&report, "store"), "store: ok");
        assert!(
            line(&report, "escape").starts_with("escape: invalid-key"),
            "{report:?}"
        );
        assert_eq!(line(&report, "big"), "big: too-large 1024");

        assert!(!data.join("written-by-guest").exists());
        let v: Option<String> = c.get(keys.data("probe/value")).await.unwrap();
        assert_eq!(v.as_deref(), Some("step 0"));
        // Nothing but the lease, the counter, the fence, the term history the acquire wrote, the
        // one value and its count exists in Redis.
        let mut all: Vec<String> = c.keys("*").await.unwrap();
        all.sort();
        assert_eq!(
            all,
            vec![
                keys.data("probe/value"),
                keys.fence(),
                keys.lease(),
                keys.terms(),
                keys.token(),
                keys.usage()
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn a_batch_of_writes_is_one_fenced_write_all_or_nothing() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let runtime = Runtime::new(HostLimits::default()).unwrap();
        let keys = JobKeys::new("probe");
        let term = lead(&mut c, &keys, "test:1").await;
        let recorder = crate::history::Recorder::start(&redis).await;
        let report = lines(run_probe(&runtime, &redis, term, "batch", None).await);
        assert_eq!(line(&report, "three"), "three: ok");
        assert!(
            line(&report, "invalid").starts_with("invalid: refused at 1 invalid-key("),
            "{report:?}"
        );
        assert_eq!(
            line(&report, "too-large"),
            "too-large: refused at 0 too-large(max 1024 bytes)"
        );
        assert_eq!(line(&report, "twice"), "twice: ok");
        let get = |k: &str| keys.data(k);
        let values: Vec<Option<String>> = c
            .mget(&[
                get("b/1"),
                get("b/2"),
                get("b/3"),
                get("b/4"),
                get("b/5"),
                get("b/6"),
            ])
            .await
            .unwrap();
        assert_eq!(
            values,
            vec![
                Some("one".into()),
                Some("two".into()),
                Some("three".into()),
                None,
                None,
                Some("second".into())
            ],
            "a refused batch wrote nothing; a key written twice keeps the later value"
        );
        // Each accepted batch went to Redis as one script call: the three keys were set by one
        // script, with no other command between them.
        let history = recorder.check().unwrap();
        let at: Vec<usize> = history
            .applied
            .iter()
            .filter(|a| a.key.starts_with(&get("b/")))
            .map(|a| a.at)
            .collect();
        assert_eq!(at.len(), 4, "{at:?}");
        let lines = recorder.lines();
        assert!(
            lines[at[0]..=at[2]].iter().all(|l| l.contains(" lua]")),
            "the first batch was more than one call: {:?}",
            &lines[at[0]..=at[2]]
        );
        // The quota counted the batch as a whole: four keys.
        let usage: Option<String> = c.hget(keys.usage(), "keys").await.unwrap();
        assert_eq!(usage.as_deref(), Some("4"));
    })
    .await;
}

/// Issue 23, defect 4 (guest side): `store.delete` (world 0.4.1) deletes fenced like a write
/// and takes the key's bytes off the job's storage count, so a job can free its quota itself.
#[tokio::test]
async fn a_guest_delete_is_fenced_and_frees_its_quota() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let runtime = Runtime::new(HostLimits::default()).unwrap();
        let keys = JobKeys::new("probe");
        let term = lead(&mut c, &keys, "test:1").await;
        let recorder = crate::history::Recorder::start(&redis).await;
        let report = lines(run_probe(&runtime, &redis, term, "delete", None).await);
        assert_eq!(line(&report, "d/2"), "d/2: ok true");
        assert_eq!(line(&report, "d/3"), "d/3: ok true");
        assert_eq!(line(&report, "d/404"), "d/404: ok false");
        assert!(
            line(&report, "../escape").starts_with("../escape: refused invalid-key("),
            "{report:?}"
        );
        let left: Vec<String> = c.keys(keys.data("d/*")).await.unwrap();
        assert_eq!(left, vec![keys.data("d/1")]);
        // Three keys written, two deleted: the count is one key and its bytes.
        let usage = leasehold::coord::quota::usage(&mut c, &keys).await.unwrap();
        assert_eq!(usage, (1, (keys.data("d/1").len() + 100) as u64));
        // Each delete was a fenced script call of the term (the history checker flags any
        // other deletion of a job's data).
        let history = recorder.check().unwrap();
        let deletes = history
            .applied
            .iter()
            .filter(|a| a.key.starts_with(&keys.data("d/")) && a.value.is_empty())
            .count();
        assert_eq!(deletes, 3, "{:?}", history.applied);
    })
    .await;
}

/// A component built to world 0.4.0 (the `older` fixture, before `store.delete`) loads on the
/// 0.4.1 host and runs: the component model links its `…@0.4.0` imports to the host's
/// semver-compatible 0.4.1 ones.
#[tokio::test]
async fn a_component_built_to_world_0_4_0_still_runs() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let runtime = Runtime::new(HostLimits::default()).unwrap();
        let job = runtime.load(&guests().wasm("older")).await.unwrap();
        assert_eq!(job.world(), "0.4.0");
        let keys = JobKeys::new("probe");
        let term = lead(&mut c, &keys, "test:1").await;
        let out = run_guest(&runtime, &redis, "older", term, "2026-01-01", None).await;
        assert!(matches!(out, Ok(StepOutcome::Done)), "{out:?}");
        let v: Option<String> = c.get(keys.data("older/2026-01-01")).await.unwrap();
        assert_eq!(v.as_deref(), Some("0.4.0"));
    })
    .await;
}

#[tokio::test]
async fn a_guest_whose_term_was_overtaken_cannot_write() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let data = TempDir::new("probe-zombie");
        let runtime = Runtime::new(HostLimits::default()).unwrap();
        let keys = JobKeys::new("probe");
        let Acquired::Granted { token } =
            lease::acquire(&mut c, &keys, "old:1", Duration::from_secs(30))
                .await
                .unwrap()
        else {
            panic!()
        };
        // The old leader still believes it leads (its local deadline is far away), but its
        // lease was lost and another node started a newer term.
        let _: i64 = c.del(keys.lease()).await.unwrap();
        let Acquired::Granted { token: newer } =
            lease::acquire(&mut c, &keys, "new:1", Duration::from_secs(30))
                .await
                .unwrap()
        else {
            panic!()
        };
        assert!(newer > token);
        let zombie = Term::new(
            token,
            "old:1".into(),
            Instant::now() + Duration::from_secs(20),
        );
        let refusal = format!("fenced: token {token} is older than token {newer} of new:1");
        match probe_step(&runtime, &redis, zombie.clone(), &data).await {
            // Usually the host stops the step as soon as the refusal ends the term...
            Err(StepError::LostLeadership(Some(why))) => assert_eq!(why, refusal),
            // ...unless the guest returned first; then it saw the refusal itself.
            Ok(StepOutcome::Continue(r)) => {
                let report: Vec<String> = String::from_utf8(r)
                    .unwrap()
                    .lines()
                    .map(str::to_string)
                    .collect();
                assert_eq!(line(&report, "store"), format!("store: fenced {refusal}"));
            }
            other => panic!("expected the write to be fenced, got {other:?}"),
        }
        // The refusal ends the zombie's term at once.
        assert!(!zombie.still_leader());
        let v: Option<String> = c.get(keys.data("probe/value")).await.unwrap();
        assert_eq!(v, None);
    })
    .await;
}

#[tokio::test]
async fn a_step_that_ignores_its_term_is_stopped_when_the_term_ends() {
    // The probe spins forever and never asks still-leader; its step time limit is 30 s. The
    // term ends after 300 ms: the host must stop the step then, not at the time limit.
    deadline(Duration::from_secs(20), async {
        let redis = RedisServer::start().await;
        let runtime = Runtime::new(HostLimits::default()).unwrap();
        let term = Term::new(
            1,
            "test:1".into(),
            Instant::now() + Duration::from_millis(300),
        );
        let outcome = run_probe(&runtime, &redis, term.clone(), "spin", None).await;
        assert!(
            matches!(outcome, Err(StepError::LostLeadership(None))),
            "{outcome:?}"
        );
        assert!(!term.still_leader());
    })
    .await;
}

/// Runs the probe's `mode` step in a term that lasts a minute.
async fn misbehave(
    runtime: &Runtime,
    redis: &RedisServer,
    mode: &str,
) -> Result<StepOutcome, StepError> {
    let term = Term::new(1, "test:1".into(), Instant::now() + Duration::from_secs(60));
    run_probe(runtime, redis, term, mode, None).await
}

#[tokio::test]
async fn a_trap_a_loop_a_memory_bomb_or_a_stack_overflow_fails_only_that_step() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let runtime = Runtime::new(HostLimits::default()).unwrap();
        let cases = [
            (
                "panic",
                "wasm trap: wasm `unreachable` instruction executed",
            ),
            (
                "unreachable",
                "wasm trap: wasm `unreachable` instruction executed",
            ),
            ("recurse", "wasm trap: call stack exhausted"),
        ];
        for (mode, message) in cases {
            match misbehave(&runtime, &redis, mode).await {
                Err(StepError::Trap(m)) => assert!(m.starts_with(message), "{mode}: {m}"),
                other => panic!("{mode}: {other:?}"),
            }
        }
        match misbehave(&runtime, &redis, "oom").await {
            Err(StepError::MemoryLimit(m)) => assert!(
                m.contains("the job's memory limit is 67108864 bytes in total"),
                "{m}"
            ),
            other => panic!("oom: {other:?}"),
        }
        // The probe's step time limit is 3 s; its term lasts a minute.
        match misbehave(&runtime, &redis, "spin").await {
            Err(StepError::Timeout(limit)) => assert_eq!(limit, "3s"),
            other => panic!("spin: {other:?}"),
        }
        // The same runtime still runs a well-behaved step afterwards, in a real term.
        let mut c = redis.conn().await;
        let keys = JobKeys::new("probe");
        let term = lead(&mut c, &keys, "test:2").await;
        let data = TempDir::new("probe-after");
        let report = lines(probe_step(&runtime, &redis, term, &data).await);
        assert_eq!(line(&report, "store"), "store: ok");
    })
    .await;
}

/// A component that imports `wasi:sockets` loads, and its connection is refused before any
/// socket exists: the listener it dials never sees it.
#[tokio::test]
async fn a_guest_importing_sockets_loads_and_cannot_connect() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let runtime = Runtime::new(HostLimits::default()).unwrap();
        let term = Term::new(1, "test:1".into(), Instant::now() + Duration::from_secs(20));
        // netjob dials its period.
        let address = listener.local_addr().unwrap().to_string();
        let outcome = run_guest(&runtime, &redis, "netjob", term, &address, None).await;
        match &outcome {
            Err(StepError::Failed(why)) => eprintln!("the guest was told: {why}"),
            other => panic!("netjob connected or ended otherwise: {other:?}"),
        }
        assert_eq!(
            listener.accept().map_err(|e| e.kind()).err(),
            Some(std::io::ErrorKind::WouldBlock),
            "the listener was reached"
        );
    })
    .await;
}
