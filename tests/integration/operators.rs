//! Operators' writes through the store seam (`TermStore::request`, `set_paused`,
//! `publish_jobs`, `served_jobs`), the same tests against a real Redis and a real 3-member etcd:
//! a request written only where none is (or replacing one), the pause flag set and cleared,
//! each waking the job's runner on another host's listener; the jobs the live members serve; a
//! job's run history, newest first, and its status (holder, time left, token, pause, last run,
//! storage, open runs), as operators read them; the same on a 3-primary Redis Cluster. And the
//! CLI's trigger, cancel, pause, resume and runs on etcd, named by `--store`.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold::coord::fence::{self, Bookkeeping, TermWrite};
use leasehold::coord::members::MemberInfo;
use leasehold::coord::notices::{Notice, NoticeFor, ReleaseNotices};
use leasehold::coord::quota::Quota;
use leasehold::coord::term::Term;
use leasehold::coord::term_store::{JobStatus, Store, TermStore};
use leasehold::exec::runs::{self, Request, RunRecord, RunStatus, Seen};
use leasehold::store::keys::{INDEXED, JobKeys};
use leasehold_harness::EtcdCluster;

use crate::contract::{etcd_pair, forget, heard, listening, redis_pair, store_client, won};
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
        listening(b, "ledger", &runner, "hello").await;
        let period = "2026-12-01";
        assert!(
            answered("a first request", || b
                .request("ledger", period, "r1 none", false))
            .await,
            "a first request is written"
        );
        assert!(
            heard(&runner, "request", Duration::from_secs(10)).await,
            "a request wakes the runner"
        );
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

        // The pause and the resume, each heard as a new notice.
        forget(&runner);
        answered("a pause", || {
            b.set_paused("ledger", Some("paused by the test"))
        })
        .await;
        assert!(
            heard(&runner, "paused", Duration::from_secs(10)).await,
            "a pause wakes the runner"
        );
        let state = answered("the job's state", || a.job_state("ledger")).await;
        assert_eq!(state.paused.as_deref(), Some("paused by the test"));
        forget(&runner);
        answered("a resume", || b.set_paused("ledger", None)).await;
        assert!(
            heard(&runner, "paused", Duration::from_secs(10)).await,
            "a resume wakes the runner"
        );
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
        // A crashed host's list, written long ago, is swept by a read; a live member's list,
        // however old, counts, and a fresh list of a node not yet a member stays.
        let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .expect("a raw etcd client");
        raw.put("lh/{served}/node-gone", "0\nold", None)
            .await
            .expect("an old list");
        raw.put("lh/{served}/node-b", "0\nledger", None)
            .await
            .expect("an old list of a live member");
        let lists = answered("the lists", || a.served_jobs()).await;
        assert_eq!(lists.get("node-b"), Some(&vec!["ledger".to_string()]));
        assert!(!lists.contains_key("node-gone"));
        let left = |key: &'static str| {
            let mut raw = raw.clone();
            async move { raw.get(key, None).await.expect("a raw read").count() }
        };
        assert_eq!(
            left("lh/{served}/node-gone").await,
            0,
            "the old list is swept"
        );
        assert_eq!(
            left("lh/{served}/node-b").await,
            1,
            "a live member's list stays"
        );
        assert_eq!(left("lh/{served}/node-x").await, 1, "a fresh list stays");
    })
    .await;
}

/// Writes, as a term of `job` on `store`, a run record for each of `records` (period, what is
/// stored), a refused request's record for `refused`, and the run index naming them all.
async fn recorded(store: &Store, job: &str, records: &[(&str, Vec<u8>)], refused: &str) {
    let ttl = Duration::from_secs(30);
    let held = won(store, job, &format!("{job}:writer"), ttl).await;
    let term = Term::granted(&held, std::time::Instant::now() + ttl, None);
    let keys = JobKeys::new(job);
    let refusal =
        serde_json::to_vec(&RunRecord::refused(refused, "2026-01-05T00:00:00.000Z")).unwrap();
    let mut sets: Vec<(String, &[u8])> = records
        .iter()
        .map(|(p, raw)| (keys.run(p), raw.as_slice()))
        .collect();
    sets.push((keys.refused(refused), &refusal));
    let mut indexed: Vec<String> = records.iter().map(|(p, _)| p.to_string()).collect();
    indexed.extend([refused.to_string(), INDEXED.to_string()]);
    let write = TermWrite::new(&sets, &[]).with(Bookkeeping {
        runs_add: &indexed,
        ..Bookkeeping::default()
    });
    fence::term_write(store, &keys, &term, write)
        .await
        .expect("the run records");
}

/// A record as the runner stores it.
fn record(period: &str) -> Vec<u8> {
    serde_json::to_vec(&RunRecord::refused(period, "2026-01-05T00:00:00.000Z")).unwrap()
}

/// A job's run history as `leasehold runs` and `GET …/runs` read it: newest period first, the
/// index's marker not a period, a record that does not parse listed as corrupt, a refused
/// request's record listed, at most the limit.
async fn run_history(a: &Store, b: &Store) {
    let records = [
        ("2026-01-01", record("2026-01-01")),
        ("2026-01-03", record("2026-01-03")),
        ("2026-01-02", b"{not a record".to_vec()),
    ];
    recorded(a, "hist", &records, "2026-01-04").await;
    assert_eq!(
        answered("the newest runs", || b.newest_runs("hist", 10)).await,
        ["2026-01-04", "2026-01-03", "2026-01-02", "2026-01-01"]
    );
    assert_eq!(
        answered("the newest runs", || b.newest_runs("hist", 2)).await,
        ["2026-01-04", "2026-01-03"]
    );
    assert_eq!(
        answered("no runs", || b.newest_runs("never", 5)).await,
        Vec::<String>::new()
    );
    let keys = JobKeys::new("hist");
    let read = runs::history(b, &keys, 10).await.expect("the history");
    let shown: Vec<(&str, RunStatus)> =
        read.iter().map(|r| (r.period.as_str(), r.status)).collect();
    assert_eq!(
        shown,
        [
            ("2026-01-04", RunStatus::Refused),
            ("2026-01-03", RunStatus::Refused),
            ("2026-01-02", RunStatus::Corrupt),
            ("2026-01-01", RunStatus::Refused),
        ]
    );
    let newest = runs::history(b, &keys, 1).await.expect("the history");
    assert_eq!(newest.len(), 1);
    assert_eq!(newest[0].period, "2026-01-04");
}

#[tokio::test]
async fn redis_reads_a_jobs_run_history_newest_first() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        Box::pin(run_history(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_reads_a_jobs_run_history_newest_first() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        Box::pin(run_history(&a, &b)).await;
    })
    .await;
}

/// A job's status as `GET /jobs/<job>` and the console read it: nothing before its first term;
/// then the holder, its lease's time left and its token, the pause flag, the last run's period,
/// the storage count a quota write left and the open runs (in text order); once the term is
/// given back, no holder and no time left, the last term's token kept.
async fn status(a: &Store, b: &Store) {
    let job = "stat";
    assert_eq!(
        answered("a new job's status", || b.job_status(job)).await,
        JobStatus::default()
    );
    let ttl = Duration::from_secs(30);
    let held = won(a, job, "node-a:1", ttl).await;
    let term = Term::granted(&held, std::time::Instant::now() + ttl, None);
    let keys = JobKeys::new(job);
    let record = record("2026-02-01");
    let sets = [
        (keys.data("balance"), b"100".as_slice()),
        (keys.run("2026-02-01"), record.as_slice()),
        (keys.last_run(), b"2026-02-01".as_slice()),
    ];
    let open = ["2026-02-03".to_string(), "2026-02-02".to_string()];
    let mut write = TermWrite::new(&sets, &[]).with(Bookkeeping {
        open_add: &open,
        ..Bookkeeping::default()
    });
    write.quota = Some(Quota {
        keys: 100,
        bytes: 1 << 20,
    });
    let written = fence::term_write(a, &keys, &term, write)
        .await
        .expect("the job's writes");
    let usage = written.usage.expect("a quota write counts the job's keys");
    assert!(usage.0 >= 3, "{usage:?}");
    answered("a pause", || b.set_paused(job, Some("paused by the test"))).await;
    let read = answered("the status", || b.job_status(job)).await;
    assert_eq!(read.owner.as_deref(), Some("node-a:1"));
    assert!(
        read.left.is_some_and(|l| !l.is_zero() && l <= ttl),
        "{:?} left of {ttl:?}",
        read.left
    );
    assert_eq!(read.token, Some(held.token));
    assert!(read.paused);
    assert_eq!(read.last_run.as_deref(), Some("2026-02-01"));
    assert_eq!(read.usage, usage);
    assert_eq!(read.open, ["2026-02-02", "2026-02-03"]);

    answered("a resume", || b.set_paused(job, None)).await;
    answered("the term given back", || a.resign(&held)).await;
    let read = answered("the status", || b.job_status(job)).await;
    assert_eq!((read.owner, read.left), (None, None));
    assert_eq!(read.token, Some(held.token), "the last term's token");
    assert!(!read.paused);
}

#[tokio::test]
async fn redis_reads_a_jobs_status_for_operators() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        Box::pin(status(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_reads_a_jobs_status_for_operators() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        Box::pin(status(&a, &b)).await;
    })
    .await;
}

/// An operator's purge and recount: keys a quota write stored under a prefix are deleted and
/// come off the storage count, others stay; a count that went wrong (`miscount` sets it, raw)
/// is set right by a recount; purging every key leaves nothing counted.
async fn purges_and_recounts<F: std::future::Future<Output = ()>>(
    store: &Store,
    miscount: impl FnOnce() -> F,
) {
    let job = "purged";
    let ttl = Duration::from_secs(30);
    let held = won(store, job, "node-a:1", ttl).await;
    let term = Term::granted(&held, std::time::Instant::now() + ttl, None);
    let keys = JobKeys::new(job);
    let sets = [
        (keys.data("day/1"), b"one".as_slice()),
        (keys.data("day/2"), b"two two".as_slice()),
        (keys.data("keep"), b"kept".as_slice()),
    ];
    let mut write = TermWrite::new(&sets, &[]);
    write.quota = Some(Quota {
        keys: 100,
        bytes: 1 << 20,
    });
    let written = fence::term_write(store, &keys, &term, write)
        .await
        .expect("the job's data");
    let (k0, b0) = written.usage.expect("a quota write counts");
    assert_eq!(k0, 3);
    let (k, b) = answered("a purge", || store.purge(job, "day/")).await;
    assert_eq!(k, 2);
    let left = answered("the status", || store.job_status(job)).await.usage;
    assert_eq!(left, (1, b0 - b), "the purged keys come off the count");
    assert_eq!(
        answered("a read", || store.read_key(job, "data:keep")).await,
        Some(b"kept".to_vec())
    );
    assert_eq!(
        answered("a read", || store.read_key(job, "data:day/1")).await,
        None
    );
    miscount().await;
    assert_ne!(
        answered("the status", || store.job_status(job)).await.usage,
        left
    );
    assert_eq!(answered("a recount", || store.recount(job)).await, left);
    assert_eq!(
        answered("the status", || store.job_status(job)).await.usage,
        left
    );
    assert_eq!(
        answered("a purge of all", || store.purge(job, "")).await,
        left
    );
    assert_eq!(answered("a recount", || store.recount(job)).await, (0, 0));
}

#[tokio::test]
async fn both_stores_purge_a_jobs_keys_and_recount_its_storage() {
    deadline(Duration::from_secs(150), async {
        let redis = RedisServer::start().await;
        let (a, _) = redis_pair(&redis).await;
        let mut conn = redis.conn().await;
        purges_and_recounts(&a, || async move {
            let _: () = ::redis::cmd("HSET")
                .arg(JobKeys::new("purged").usage())
                .arg("keys")
                .arg(99)
                .query_async(&mut conn)
                .await
                .expect("a wrong count");
        })
        .await;
        let cluster = EtcdCluster::start(3).await;
        let (e, _) = etcd_pair(&cluster).await;
        let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .expect("a raw etcd client");
        purges_and_recounts(&e, || async move {
            raw.put("lh/purged/usage", "99 99", None)
                .await
                .expect("a wrong count");
        })
        .await;
    })
    .await;
}

/// One term of `job` on `store` and an entry that does not parse beside it (`garble` writes
/// it, raw): the history returns the term and counts the other.
async fn counts_unparsed<F: std::future::Future<Output = ()>>(
    store: &Store,
    job: &str,
    garble: impl FnOnce() -> F,
) {
    let held = won(store, job, "node-a:1", Duration::from_secs(30)).await;
    garble().await;
    let read = answered("the terms", || store.history(job, 10)).await;
    assert_eq!(read.unparsed, 1, "{read:?}");
    assert_eq!(read.terms.len(), 1, "{read:?}");
    assert_eq!(read.terms[0].token, held.token);
}

#[tokio::test]
async fn both_stores_count_the_term_history_entries_that_do_not_parse() {
    deadline(Duration::from_secs(150), async {
        let redis = RedisServer::start().await;
        let (a, _) = redis_pair(&redis).await;
        let mut conn = redis.conn().await;
        counts_unparsed(&a, "garbled", || async move {
            let _: () = ::redis::cmd("RPUSH")
                .arg(JobKeys::new("garbled").terms())
                .arg("{not an entry")
                .query_async(&mut conn)
                .await
                .expect("a raw entry");
        })
        .await;
        let cluster = EtcdCluster::start(3).await;
        let (e, _) = etcd_pair(&cluster).await;
        let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .expect("a raw etcd client");
        counts_unparsed(&e, "garbled", || async move {
            raw.put("lh/garbled/history/node-z:9", "{not an entry", None)
                .await
                .expect("a raw entry");
        })
        .await;
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

#[tokio::test]
async fn a_redis_cluster_takes_operators_writes_and_reads_the_run_history() {
    // Each job's keys live in its slot; the members' lists and the notices cross primaries.
    deadline(Duration::from_secs(120), async {
        let cluster = leasehold_harness::RedisCluster::start(3, 0).await;
        let url = cluster.url();
        let (a, b) = (store_client(&url).await, store_client(&url).await);
        Box::pin(requests_and_pauses(&a, &b)).await;
        Box::pin(served(&a, &b)).await;
        Box::pin(run_history(&a, &b)).await;
        Box::pin(status(&a, &b)).await;
    })
    .await;
}

/// The CLI on etcd: `trigger` checks the job against the jobs the live members published and
/// writes its request, `pause` and `resume` set and clear the flag, `cancel` finds no run to
/// cancel, each read back through the store; `runs` lists the records a term wrote and
/// `--terms` the term; `purge` deletes and counts again.
#[tokio::test]
async fn the_cli_triggers_pauses_cancels_and_lists_runs_on_etcd() {
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

        let (out, err, ok) = cli(&["runs", "ledger"], &url);
        assert!(ok, "{err}");
        assert!(out.contains("ledger has no runs"), "{out}");
        recorded(
            &store,
            "ledger",
            &[("2026-11-30", record("2026-11-30"))],
            "2026-11-29",
        )
        .await;
        let (out, err, ok) = cli(&["runs", "ledger"], &url);
        assert!(ok, "{err}");
        let periods: Vec<&str> = out
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(periods, ["2026-11-30", "2026-11-29"], "{out}");
        let (out, err, ok) = cli(&["runs", "ledger", "--terms"], &url);
        assert!(ok, "{err}");
        let term = answered("the terms", || store.history("ledger", 1)).await;
        assert!(
            out.contains(&term.terms[0].token.to_string()) && out.contains("leading"),
            "{out}"
        );

        let (out, err, ok) = cli(&["purge", "ledger", "--prefix", ""], &url);
        assert!(ok, "{err}");
        assert!(
            out.contains("deleted 0 keys of ledger") && out.contains("ledger keeps 0 keys"),
            "{out}"
        );
    })
    .await;
}
