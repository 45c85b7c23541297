//! Operators' writes through the store seam (`TermStore::request`, `set_paused`,
//! `publish_jobs`, `served_jobs`), the same tests against a real Redis and a real 3-member etcd:
//! a request written only where none is (or replacing one), the pause flag set and cleared,
//! each waking the job's runner on another host's listener; the jobs the live members serve.
//! And the CLI's trigger, cancel, pause and resume on etcd, named by `--store`.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold::coord::members::MemberInfo;
use leasehold::coord::notices::{Notice, NoticeFor, ReleaseNotices};
use leasehold::coord::term_store::TermStore;
use leasehold::exec::runs::{Request, Seen};
use leasehold::store::keys::JobKeys;
use leasehold_harness::{EtcdCluster, poll_until};

use crate::contract::{etcd_pair, payload, redis_pair, woken};
use crate::harness::*;

/// The request `store` holds for `job`'s `period`, as stored.
async fn request_of<S: TermStore>(store: &S, job: &str, period: &str) -> Option<String> {
    answered("the job's state", || store.job_state(job))
        .await
        .requests
        .into_iter()
        .find(|(p, _)| p == period)
        .map(|(_, v)| String::from_utf8(v).unwrap())
}

/// `node`'s list of `jobs`, published through `store`.
async fn publish<S: TermStore>(store: &S, node: &str, jobs: &[&str]) {
    let jobs: Vec<String> = jobs.iter().map(|j| j.to_string()).collect();
    answered("a list of served jobs", || store.publish_jobs(node, &jobs)).await;
}

/// `b`'s requests and pause flag, written for `a`'s runner: each is read back as written and
/// wakes the runner on `a`'s listener with its notice; a request that finds one is not written
/// unless it replaces it.
async fn requests_and_pauses<S: TermStore + Sync>(a: &S, b: &S) {
    let registered: ReleaseNotices = Default::default();
    let runner = Notice::with_payload();
    registered.lock().unwrap().insert(
        NoticeFor::Runner.channel(&JobKeys::new("ledger")),
        runner.clone(),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let checks = async {
        // The listener is up once a notice sent after its start is heard.
        poll_until(
            "the listener hears a notice",
            Duration::from_secs(30),
            Duration::ZERO,
            || {
                let runner = &runner;
                async move {
                    answered("a notice", || {
                        b.notify("ledger", NoticeFor::Runner, "hello")
                    })
                    .await;
                    woken(runner, Duration::from_millis(200))
                        .await
                        .then_some(())
                }
            },
        )
        .await
        .unwrap();
        let period = "2026-12-01";
        assert!(
            answered("a first request", || b
                .request("ledger", period, "r1 none", false))
            .await,
            "a first request is written"
        );
        assert!(
            woken(&runner, Duration::from_secs(10)).await,
            "a request wakes the runner"
        );
        assert_eq!(payload(&runner), "request");
        assert!(
            !answered("a second request", || b
                .request("ledger", period, "r2 none", false))
            .await,
            "a request that finds one is not written"
        );
        assert_eq!(
            request_of(a, "ledger", period).await.as_deref(),
            Some("r1 none")
        );
        assert!(
            answered("a replacing request", || b.request(
                "ledger",
                period,
                "r3 cancel",
                true
            ))
            .await
        );
        assert_eq!(
            request_of(a, "ledger", period).await.as_deref(),
            Some("r3 cancel")
        );
        // Another period's request stands beside it.
        assert!(
            answered("another period", || b.request(
                "ledger",
                "2026-12-02",
                "r4 open",
                false
            ))
            .await
        );
        assert_eq!(
            request_of(a, "ledger", "2026-12-02").await.as_deref(),
            Some("r4 open")
        );
        assert_eq!(
            request_of(a, "ledger", period).await.as_deref(),
            Some("r3 cancel")
        );

        // Drain what the requests woke, then the pause and the resume.
        let _ = woken(&runner, Duration::from_millis(200)).await;
        answered("a pause", || {
            b.set_paused("ledger", Some("paused by the test"))
        })
        .await;
        assert!(
            woken(&runner, Duration::from_secs(10)).await,
            "a pause wakes the runner"
        );
        assert_eq!(payload(&runner), "paused");
        let state = answered("the job's state", || a.job_state("ledger")).await;
        assert_eq!(state.paused.as_deref(), Some("paused by the test"));
        answered("a resume", || b.set_paused("ledger", None)).await;
        assert!(
            woken(&runner, Duration::from_secs(10)).await,
            "a resume wakes the runner"
        );
        assert_eq!(payload(&runner), "paused");
        let state = answered("the job's state", || a.job_state("ledger")).await;
        assert_eq!(state.paused, None);
        // Resuming a job not paused is no error.
        answered("a second resume", || b.set_paused("ledger", None)).await;
        stop.cancel();
    };
    tokio::join!(a.listen(registered.clone(), stop.clone()), checks);
}

/// The jobs the live members serve: only live members' lists count (a list published for a node
/// that is not a member is not read), a list is replaced by the next, and a member that leaves
/// takes its list with it (back, it counts again only once it publishes).
async fn served<S: TermStore>(a: &S, b: &S) {
    let ttl = Duration::from_secs(30);
    let info = MemberInfo::with_capacity(1);
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let want = |pairs: &[(&str, &[&str])]| -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(n, j)| (n.to_string(), names(j)))
            .collect()
    };
    assert_eq!(answered("no list", || a.served_jobs()).await, want(&[]));
    answered("a's registration", || a.register("node-a", &info, ttl)).await;
    answered("b's registration", || b.register("node-b", &info, ttl)).await;
    publish(a, "node-a", &["billing", "ledger"]).await;
    publish(b, "node-b", &["ledger"]).await;
    publish(b, "node-x", &["ghost"]).await;
    assert_eq!(
        answered("the lists", || b.served_jobs()).await,
        want(&[("node-a", &["billing", "ledger"]), ("node-b", &["ledger"])])
    );
    publish(b, "node-b", &["payroll"]).await;
    answered("b leaving", || b.deregister("node-b")).await;
    assert_eq!(
        answered("the lists", || a.served_jobs()).await,
        want(&[("node-a", &["billing", "ledger"])])
    );
    answered("b's registration", || b.register("node-b", &info, ttl)).await;
    assert_eq!(
        answered("the lists", || a.served_jobs()).await,
        want(&[("node-a", &["billing", "ledger"])]),
        "a member back counts once it publishes"
    );
    publish(b, "node-b", &[]).await;
    assert_eq!(
        answered("the lists", || a.served_jobs()).await,
        want(&[("node-a", &["billing", "ledger"]), ("node-b", &[])])
    );
}

#[tokio::test]
async fn redis_takes_operators_requests_and_pauses_and_wakes_the_runner() {
    deadline(Duration::from_secs(90), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        Box::pin(requests_and_pauses(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_takes_operators_requests_and_pauses_and_wakes_the_runner() {
    deadline(Duration::from_secs(150), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        Box::pin(requests_and_pauses(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn redis_lists_the_jobs_the_live_members_serve() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        Box::pin(served(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_lists_the_jobs_the_live_members_serve() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        Box::pin(served(&a, &b)).await;
    })
    .await;
}

/// `leasehold` with `args`, then `--store url`: what it printed to stdout, stderr, and whether it
/// succeeded.
fn cli(args: &[&str], url: &str) -> (String, String, bool) {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--store", url]);
    let out = run_leasehold(&all);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// The CLI on etcd: `trigger` checks the job against the jobs the live members published and
/// writes its request, `pause` and `resume` set and clear the flag, `cancel` finds no run to
/// cancel, each read back through the store; a command that reads Redis only yet refuses the
/// etcd URL, naming what works.
#[tokio::test]
async fn the_cli_triggers_pauses_and_cancels_on_etcd() {
    deadline(Duration::from_secs(150), async {
        let cluster = EtcdCluster::start(3).await;
        let url = cluster.url();
        let (store, _) = etcd_pair(&cluster).await;
        let info = MemberInfo::with_capacity(1);
        answered("a registration", || {
            store.register("node-a", &info, Duration::from_secs(60))
        })
        .await;
        publish(&store, "node-a", &["ledger"]).await;

        let (_, err, ok) = cli(&["trigger", "nosuch", "--period", "2026-12-01"], &url);
        assert!(!ok, "a job no live member serves is refused");
        assert!(
            err.contains("no live host serves a job named nosuch"),
            "{err}"
        );
        assert_eq!(request_of(&store, "nosuch", "2026-12-01").await, None);

        let (out, err, ok) = cli(&["trigger", "ledger", "--period", "2026-12-01"], &url);
        assert!(ok, "{err}");
        assert!(
            out.contains("requested a run of ledger for period 2026-12-01"),
            "{out}"
        );
        let stored = request_of(&store, "ledger", "2026-12-01")
            .await
            .expect("the trigger's request");
        assert_eq!(Request::decode(&stored).seen, Seen::Nothing);
        let (out, _, ok) = cli(&["trigger", "ledger", "--period", "2026-12-01"], &url);
        assert!(ok);
        assert!(out.contains("was already requested"), "{out}");
        assert_eq!(
            request_of(&store, "ledger", "2026-12-01").await,
            Some(stored)
        );

        let (_, err, ok) = cli(&["pause", "ledger"], &url);
        assert!(ok, "{err}");
        let paused = answered("the job's state", || store.job_state("ledger"))
            .await
            .paused;
        assert!(
            paused
                .as_deref()
                .is_some_and(|p| p.starts_with("paused with the CLI")),
            "{paused:?}"
        );
        let (_, err, ok) = cli(&["resume", "ledger"], &url);
        assert!(ok, "{err}");
        assert_eq!(
            answered("the job's state", || store.job_state("ledger"))
                .await
                .paused,
            None
        );

        let (_, err, ok) = cli(&["cancel", "ledger", "--period", "2026-12-01"], &url);
        assert!(!ok, "no run to cancel");
        assert!(
            err.contains("has no run of period 2026-12-01 to cancel"),
            "{err}"
        );

        let (_, err, ok) = cli(&["runs", "ledger"], &url);
        assert!(!ok);
        assert!(err.contains("reads Redis only yet"), "{err}");
    })
    .await;
}
