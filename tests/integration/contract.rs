//! The store contract for terms (`leasehold::coord::term_store`, `docs/store-contract.md`),
//! tested against both stores by the same tests: a real `redis-server` and a real 3-member etcd
//! cluster. One term at a time, growing tokens, writes fenced by the term in the store itself,
//! resign only one's own, a term not renewed lapsing and its late write refused; a term's whole
//! write (a guest's keys counted against its quota, `create`, deletes, a resent write's answer,
//! the run bookkeeping: open runs, the run index, operators' requests cleared only by the id
//! served), all or nothing; membership; a follower's wait for a job to fall free; and one
//! listener per host for every job's releases and notices; tokens raised above a database's
//! fence, and continued from Redis to etcd.

use std::time::{Duration, Instant};

use leasehold::coord::checks::Refusal;
use leasehold::coord::fence::{self, Bookkeeping, TermWrite, TermWriteError, Written as Applied};
use leasehold::coord::members::{MemberInfo, Members};
use leasehold::coord::notices::{Notice, NoticeFor, ReleaseNotices};
use leasehold::coord::quota::Quota;
use leasehold::coord::term::Term;
use leasehold::coord::term_store::{
    Beat, Beaten, Campaign, Candidacy, Collection, JobReads, Lease, LookAt, Store, StoreTerm,
    TermStore, Written, Wrote,
};
use leasehold::coord::terms::{KEPT, TermEnd};
use leasehold::exec::runs::{self, RunRecord};
use leasehold::store::keys::{INDEXED, JobKeys};
use leasehold_harness::{EtcdCluster, poll_until};

use crate::harness::*;

pub(crate) async fn won<S: TermStore>(
    store: &S,
    job: &str,
    owner: &str,
    ttl: Duration,
) -> StoreTerm {
    match answered("a campaign", || store.campaign(job, owner, ttl)).await {
        Campaign::Won(t) => t,
        held => panic!("{owner} expected to win {job}, found {held:?}"),
    }
}

/// Two clients `a` and `b` of one store.
async fn one_term_at_a_time<S: TermStore>(a: &S, b: &S) {
    let ttl = Duration::from_secs(5);
    let ta = won(a, "billing", "a", ttl).await;
    match answered("b's campaign", || b.campaign("billing", "b", ttl)).await {
        Campaign::Held { owner, left } => {
            assert_eq!(owner, "a");
            assert!(left.is_none_or(|l| l <= ttl), "{left:?} left of {ttl:?}");
        }
        won => panic!("b's campaign on a held job: {won:?}"),
    }
    assert_eq!(
        answered("the holder", || b.holder("billing")).await,
        Some("a".into())
    );
    assert_eq!(
        answered("a's write", || a.write(&ta, "charge/alice", b"100")).await,
        Written::Applied
    );
    assert!(answered("a's renewal", || a.renew(&ta)).await);
    // Resigned: the next term's token is higher, and the resigned term writes nothing. (A
    // resignation retried after an answer that was lost finds the hold already gone.)
    let mut retried = false;
    let released = loop {
        match a.resign(&ta).await {
            Ok(r) => break r,
            Err(_) => retried = true,
        }
    };
    assert!(released || retried, "a term resigns its own hold");
    let tb = won(b, "billing", "b", ttl).await;
    assert!(tb.token > ta.token, "{} after {}", tb.token, ta.token);
    assert_eq!(
        answered("a's late write", || a.write(&ta, "charge/alice", b"999")).await,
        Written::Refused
    );
    assert_eq!(
        answered("the value", || b.read("billing", "charge/alice")).await,
        Some(b"100".to_vec())
    );
    assert!(!answered("a's late renewal", || a.renew(&ta)).await);
    assert!(
        !answered("a's late resignation", || a.resign(&ta)).await,
        "a term resigns only its own hold"
    );
    assert_eq!(
        answered("the holder", || a.holder("billing")).await,
        Some("b".into())
    );
    // Another job is held on its own.
    let other = won(a, "settlement", "a", ttl).await;
    assert_eq!(
        answered("b's write", || b.write(&tb, "charge/bob", b"200")).await,
        Written::Applied
    );
    assert_eq!(
        answered("a's write to its own job", || a.write(&other, "x", b"1")).await,
        Written::Applied
    );
}

/// `a` wins and stops renewing (a crashed or frozen holder): its term lapses, `b` takes the job
/// with a higher token, and `a`'s late write is refused.
async fn a_term_not_renewed_lapses<S: TermStore>(a: &S, b: &S) {
    let ttl = Duration::from_secs(1);
    let ta = won(a, "billing", "a", ttl).await;
    // A campaign every 250 ms (each is a few writes the cluster agrees on).
    let tb = poll_until(
        "b to win after a's term lapsed",
        Duration::from_secs(20),
        Duration::from_millis(250),
        || async {
            match b.campaign("billing", "b", ttl).await {
                Ok(Campaign::Won(t)) => Some(t),
                _ => None,
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(tb.token > ta.token);
    assert!(!answered("a's late renewal", || a.renew(&ta)).await);
    assert_eq!(
        answered("a's late write", || a.write(&ta, "charge/alice", b"late")).await,
        Written::Refused
    );
    assert_eq!(
        answered("the value", || b.read("billing", "charge/alice")).await,
        None
    );
}

/// `term`'s `write`, answered.
async fn write_all<S: TermStore>(store: &S, term: &StoreTerm, write: TermWrite<'_>) -> Wrote {
    answered("a whole write", || store.write_all(term, &write)).await
}

fn applied(created: bool, deleted: u32, usage: Option<(u64, u64)>) -> Wrote {
    Wrote::Applied(Applied {
        created,
        deleted,
        usage,
    })
}

/// A term's whole writes: a guest's keys counted against its quota (the full key as the Redis
/// store spells it, and the value), `create`, deletes, a resent write answered as it was first,
/// the run bookkeeping; and nothing of a write that is refused, by the quota or the fence.
async fn whole_writes<S: TermStore>(a: &S, b: &S) {
    let ttl = Duration::from_secs(5);
    let keys = JobKeys::new("ledger");
    let t = won(a, "ledger", "a", ttl).await;
    let quota = Some(Quota {
        keys: 3,
        bytes: 200,
    });
    // `lh:{ledger}:data:x` is 18 bytes.
    let (x, y, z, w) = (
        keys.data("x"),
        keys.data("y"),
        keys.data("z"),
        keys.data("w"),
    );
    let sets = vec![(x.clone(), b"0123456789".as_slice())];
    let write = TermWrite {
        quota,
        ..TermWrite::new(&sets, &[])
    };
    assert_eq!(
        write_all(a, &t, write).await,
        applied(true, 0, Some((1, 28)))
    );
    // Rewritten longer: the same key, more bytes.
    let sets = vec![(x.clone(), [b'x'; 20].as_slice())];
    let write = TermWrite {
        quota,
        ..TermWrite::new(&sets, &[])
    };
    assert_eq!(
        write_all(a, &t, write).await,
        applied(true, 0, Some((1, 38)))
    );
    // `create`: nothing written where a key exists.
    let sets = vec![(x.clone(), b"new".as_slice())];
    let write = TermWrite {
        quota,
        create: true,
        ..TermWrite::new(&sets, &[])
    };
    assert_eq!(write_all(a, &t, write).await, applied(false, 0, None));
    assert_eq!(
        answered("x", || a.read("ledger", "x")).await,
        Some(vec![b'x'; 20])
    );
    let sets = vec![(y.clone(), b"1".as_slice())];
    let write = TermWrite {
        quota,
        create: true,
        id: Some("create-y"),
        ..TermWrite::new(&sets, &[])
    };
    assert_eq!(
        write_all(a, &t, write).await,
        applied(true, 0, Some((2, 57)))
    );
    // Sent again with the same id (a client that lost the answer): answered as the first time.
    assert_eq!(
        write_all(a, &t, write).await,
        applied(true, 0, Some((2, 57)))
    );
    let again = TermWrite {
        id: Some("create-y-2"),
        ..write
    };
    assert_eq!(write_all(a, &t, again).await, applied(false, 0, None));
    // Past the quota of keys: refused, nothing of it written.
    let sets = vec![(z.clone(), b"1".as_slice()), (w.clone(), b"2".as_slice())];
    let write = TermWrite {
        quota,
        ..TermWrite::new(&sets, &[])
    };
    assert_eq!(write_all(a, &t, write).await, Wrote::Quota(4, 95));
    assert_eq!(answered("z", || a.read("ledger", "z")).await, None);
    // Past the quota of bytes: refused too.
    let big = [b'b'; 150];
    let sets = vec![(z.clone(), big.as_slice())];
    let write = TermWrite {
        quota,
        ..TermWrite::new(&sets, &[])
    };
    assert_eq!(write_all(a, &t, write).await, Wrote::Quota(3, 225));
    // A delete comes off the count; a key that was not there is not counted.
    let deletes = vec![x.clone(), keys.data("never")];
    let write = TermWrite {
        quota,
        ..TermWrite::new(&[], &deletes)
    };
    assert_eq!(
        write_all(a, &t, write).await,
        applied(true, 1, Some((1, 19)))
    );
    assert_eq!(answered("x", || a.read("ledger", "x")).await, None);

    // The host's own record with its bookkeeping: periods opened, indexed, a request cleared
    // only while it still carries the id served.
    answered("a request", || {
        a.request("ledger", "2026-01-01", "r1 none", true)
    })
    .await;
    answered("a request", || {
        a.request("ledger", "2026-01-02", "r2 none", true)
    })
    .await;
    let (p1, p2) = ("2026-01-01".to_string(), "2026-01-02".to_string());
    let sets = vec![
        (keys.run(&p1), b"{\"status\":\"running\"}".as_slice()),
        (keys.cursor(), b"2026-01-02T00:00:00Z".as_slice()),
    ];
    let opened = [p1.clone(), p2.clone()];
    let indexed = [p1.clone()];
    let cleared = [
        (p1.clone(), "r1".to_string()),
        (p2.clone(), "r9".to_string()),
    ];
    let write = TermWrite::new(&sets, &[]).with(Bookkeeping {
        open_add: &opened,
        runs_add: &indexed,
        clear_requests: &cleared,
        ..Bookkeeping::default()
    });
    assert_eq!(write_all(a, &t, write).await, applied(true, 0, None));
    let members = |c| answered("a collection", move || a.members("ledger", c));
    assert_eq!(
        members(Collection::Open).await,
        vec![(p1.clone(), vec![]), (p2.clone(), vec![])]
    );
    assert_eq!(members(Collection::Runs).await, vec![(p1.clone(), vec![])]);
    assert_eq!(
        members(Collection::Requests).await,
        vec![(p2.clone(), b"r2 none".to_vec())],
        "only the request whose id was served is cleared"
    );
    assert_eq!(
        answered("the cursor", || a.read_key("ledger", "cursor")).await,
        Some(b"2026-01-02T00:00:00Z".to_vec())
    );
    let closed = [p1.clone()];
    let write = TermWrite::new(&[], &[]).with(Bookkeeping {
        open_remove: &closed,
        ..Bookkeeping::default()
    });
    assert_eq!(write_all(a, &t, write).await, applied(true, 0, None));
    assert_eq!(members(Collection::Open).await, vec![(p2.clone(), vec![])]);

    // Once another term holds the job, none of this term's writes lands.
    let mut retried = false;
    let released = loop {
        match a.resign(&t).await {
            Ok(r) => break r,
            Err(_) => retried = true,
        }
    };
    assert!(released || retried);
    let tb = won(b, "ledger", "b", ttl).await;
    let sets = vec![
        (keys.cursor(), b"late".as_slice()),
        (y.clone(), b"late".as_slice()),
    ];
    let late = [p1.clone()];
    let write = TermWrite::new(&sets, &[]).with(Bookkeeping {
        open_add: &late,
        ..Bookkeeping::default()
    });
    assert!(matches!(write_all(a, &t, write).await, Wrote::Refused(_)));
    assert_eq!(members(Collection::Open).await, vec![(p2.clone(), vec![])]);
    assert_eq!(
        answered("y", || b.read("ledger", "y")).await,
        Some(b"1".to_vec())
    );
    assert_eq!(
        answered("the cursor", || b.read_key("ledger", "cursor")).await,
        Some(b"2026-01-02T00:00:00Z".to_vec())
    );
    let sets = vec![(z.clone(), b"late!".as_slice())];
    let write = TermWrite {
        quota,
        ..TermWrite::new(&sets, &[])
    };
    assert_eq!(
        write_all(b, &tb, write).await,
        applied(true, 0, Some((2, 42)))
    );
}

/// Writes of one term sent at once (a step's and its tasks' workers') are each applied whole,
/// and the usage counts every one of them exactly: on etcd, each contended write is worked out
/// again from a new read.
async fn concurrent_writes_count_exactly<S: TermStore + Sync>(a: &S) {
    let keys = JobKeys::new("ledger");
    let t = won(a, "ledger", "a", Duration::from_secs(5)).await;
    let quota = Some(Quota {
        keys: 1000,
        bytes: 1 << 20,
    });
    let names: Vec<String> = (0..16).map(|i| keys.data(&format!("k{i:02}"))).collect();
    let writes = names.iter().map(|k| {
        let t = &t;
        async move {
            let sets = vec![(k.clone(), b"0123456789".as_slice())];
            let write = TermWrite {
                quota,
                ..TermWrite::new(&sets, &[])
            };
            write_all(a, t, write).await
        }
    });
    for w in futures_util::future::join_all(writes).await {
        assert!(matches!(w, Wrote::Applied(_)), "{w:?}");
    }
    // Sixteen keys of 20 bytes (`lh:{ledger}:data:kNN`) and 10 each.
    let sets = vec![(keys.data("last"), b"".as_slice())];
    let write = TermWrite {
        quota,
        ..TermWrite::new(&sets, &[])
    };
    assert_eq!(
        write_all(a, &t, write).await,
        applied(true, 0, Some((17, 16 * 30 + 21)))
    );
}

/// One host's terms renewed together: each answers for itself, and a term another took over
/// (after a resignation) answers false while the others go on.
async fn many_terms_renewed_together<S: TermStore>(a: &S, b: &S, c: &S) {
    let ttl = Duration::from_secs(5);
    let jobs = ["j1", "j2", "j3"];
    let mut terms = Vec::new();
    for j in jobs {
        terms.push(won(a, j, &format!("a-{j}"), ttl).await);
    }
    assert_eq!(
        answered("the renewals", || a.renew_all(&terms)).await,
        vec![true, true, true]
    );
    let mut retried = false;
    let released = loop {
        match a.resign(&terms[1]).await {
            Ok(r) => break r,
            Err(_) => retried = true,
        }
    };
    assert!(released || retried);
    let tb = won(b, "j2", "b-j2", ttl).await;
    assert_eq!(
        answered("the renewals", || a.renew_all(&terms)).await,
        vec![true, false, true]
    );
    assert!(answered("b's renewal", || b.renew(&tb)).await);
    assert_eq!(
        answered("j3's holder", || b.holder("j3")).await,
        Some("a-j3".into())
    );
    // More terms than one etcd transaction may read (`--max-txn-ops`, 128 by default), won by
    // a third host with a TTL that outlasts its campaigns on a loaded machine.
    let many = win_many(c, "many", 300, Duration::from_secs(60)).await;
    let held = answered("300 renewals", || c.renew_all(&many)).await;
    assert_eq!(held.len(), 300);
    assert!(held.iter().all(|h| *h), "every one of 300 terms renewed");
}

/// `store` wins `n` jobs `<prefix>-<i>` with `ttl`.
async fn win_many<S: TermStore>(
    store: &S,
    prefix: &str,
    n: usize,
    ttl: Duration,
) -> Vec<StoreTerm> {
    let mut terms = Vec::with_capacity(n);
    for i in 0..n {
        let job = format!("{prefix}-{i}");
        terms.push(won(store, &job, &format!("owner-{job}"), ttl).await);
    }
    terms
}

/// Members registered by two hosts see each other; one that leaves, or stops registering for
/// longer than its TTL (a crash), drops out of the other's view.
async fn membership<S: TermStore>(a: &S, b: &S) {
    let ttl = Duration::from_secs(1);
    let capacities = |m: &Members| -> Vec<(String, u32)> {
        m.iter().map(|(n, i)| (n.clone(), i.capacity)).collect()
    };
    let mut info = MemberInfo::with_capacity(2);
    info.version = "test".into();
    let seen = answered("a's registration", || a.register("node-a", &info, ttl)).await;
    assert_eq!(capacities(&seen), vec![("node-a".into(), 2)]);
    assert_eq!(seen["node-a"].version, "test");
    let info_b = MemberInfo::with_capacity(3);
    let seen = answered("b's registration", || b.register("node-b", &info_b, ttl)).await;
    assert_eq!(
        capacities(&seen),
        vec![("node-a".into(), 2), ("node-b".into(), 3)]
    );
    answered("a leaving", || a.deregister("node-a")).await;
    let seen = answered("b's registration", || b.register("node-b", &info_b, ttl)).await;
    assert_eq!(capacities(&seen), vec![("node-b".into(), 3)]);
    // Back, then silent: gone from b's view once its TTL has passed (b keeps registering).
    answered("a's registration", || a.register("node-a", &info, ttl)).await;
    poll_until(
        "node-a to drop out of node-b's view",
        Duration::from_secs(20),
        Duration::from_millis(250),
        || async {
            let seen = b.register("node-b", &info_b, ttl).await.ok()?;
            (!seen.contains_key("node-a") && seen.contains_key("node-b")).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A waiting follower is woken when the job falls free: at once for one never held, when its
/// holder resigns (within a limit far shorter than the holder's TTL: the release woke it, not
/// the lease's expiry), and when a term not renewed lapses; a job held throughout the limit
/// answers false. `a`, `b` and `c` are three hosts' clients.
async fn vacancies<S: TermStore>(a: &S, b: &S, c: &S) {
    assert!(
        answered("a wait for a job never held", || b
            .await_vacancy("idle", Duration::from_secs(5)))
        .await
    );
    let long = Duration::from_secs(60);
    let ta = won(a, "billing", "a", long).await;
    assert!(
        !answered("a wait for a held job", || b
            .await_vacancy("billing", Duration::from_millis(500)))
        .await,
        "a job held throughout the wait answers false"
    );
    // The wait and the resignation concurrently: however they interleave, the wait ends
    // within its limit (a tenth of the TTL) only because the job fell free.
    let (woken, _) = tokio::join!(
        answered("b's wait", || b
            .await_vacancy("billing", Duration::from_secs(6))),
        answered("a's resignation", || a.resign(&ta))
    );
    assert!(woken, "b is woken by a's resignation, not by the TTL");
    let tb = won(b, "billing", "b", Duration::from_secs(60)).await;
    assert!(tb.token > ta.token);
    // A term never renewed: its lapse wakes the follower.
    let tc = won(c, "settlement", "c", Duration::from_secs(1)).await;
    assert!(
        answered("a wait for a term that lapses", || b
            .await_vacancy("settlement", Duration::from_secs(30)))
        .await,
        "b is woken by c's lapse"
    );
    let tb2 = won(b, "settlement", "b", Duration::from_secs(60)).await;
    assert!(tb2.token > tc.token);
    assert!(!answered("c's late renewal", || c.renew(&tc)).await);
}

/// The job's terms as `store` has them: (token, owner, how each ended), newest first.
async fn terms_of<S: TermStore>(store: &S, job: &str) -> Vec<(u64, String, Option<TermEnd>)> {
    answered("the history", || store.history(job, 100))
        .await
        .terms
        .into_iter()
        .map(|t| (t.token, t.owner, t.end))
        .collect()
}

/// The term history: an entry for each term a campaign won, added by it alone; a resignation
/// closes it as released; a term not renewed that a later one followed reads crashed, until
/// its holder, back, says how it went quiet (a late resignation reads expired); at most
/// [`KEPT`] kept, newest first. `c`'s campaigns have a TTL of 1 s.
async fn term_history<S: TermStore>(a: &S, b: &S, c: &S) {
    let long = Duration::from_secs(60);
    let ta = won(a, "billing", "a:1", long).await;
    assert_eq!(
        terms_of(a, "billing").await,
        vec![(ta.token, "a:1".into(), None)]
    );
    let record = &answered("the history", || b.history("billing", 1))
        .await
        .terms[0];
    assert_eq!(record.node, "a");
    assert!(record.started_ms > 0 && record.ended_ms.is_none());
    assert!(answered("a's resignation", || a.resign(&ta)).await);
    let tb = won(b, "billing", "b:1", long).await;
    // A campaign that finds the job held adds nothing.
    assert!(matches!(
        answered("a campaign on a held job", || a
            .campaign("billing", "a:2", long))
        .await,
        Campaign::Held { .. }
    ));
    assert_eq!(
        terms_of(a, "billing").await,
        vec![
            (tb.token, "b:1".into(), None),
            (ta.token, "a:1".into(), Some(TermEnd::Released)),
        ]
    );
    assert!(
        answered("the history", || a.history("billing", 5))
            .await
            .terms[1]
            .ended_ms
            .is_some()
    );
    // A term that lapsed, followed by another: crashed, until its holder says otherwise.
    let tc = won(c, "payroll", "c:1", Duration::from_secs(1)).await;
    let tb2 = poll_until(
        "b wins payroll once c's term lapses",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            match b.campaign("payroll", "b:2", long).await {
                Ok(Campaign::Won(t)) => Some(t),
                _ => None,
            }
        },
    )
    .await
    .unwrap();
    let crashed = vec![
        (tb2.token, "b:2".into(), None),
        (tc.token, "c:1".into(), Some(TermEnd::Crashed)),
    ];
    assert_eq!(terms_of(a, "payroll").await, crashed);
    // c, back: its resignation finds its term gone, which says it expired; once closed, its
    // entry takes no other word.
    let expired = vec![
        (tb2.token, "b:2".into(), None),
        (tc.token, "c:1".into(), Some(TermEnd::Expired)),
    ];
    assert!(!answered("c's late resignation", || c.end(&tc, TermEnd::Released)).await);
    assert_eq!(terms_of(a, "payroll").await, expired);
    assert!(!answered("c's late word", || c.end(&tc, TermEnd::Fenced)).await);
    assert_eq!(terms_of(a, "payroll").await, expired);
    // b's own term is untouched by all of it, and its end closes it.
    assert!(answered("b's end", || b.end(&tb2, TermEnd::Fenced)).await);
    assert_eq!(
        terms_of(a, "payroll").await[0],
        (tb2.token, "b:2".into(), Some(TermEnd::Fenced))
    );
    // Capped: the newest KEPT terms, in token order.
    for i in 0..KEPT + 3 {
        let t = won(a, "cap", &format!("a:cap{i}"), long).await;
        assert!(answered("a resignation", || a.end(&t, TermEnd::Released)).await);
    }
    let kept = terms_of(b, "cap").await;
    assert_eq!(kept.len(), KEPT);
    assert_eq!(kept[0].1, format!("a:cap{}", KEPT + 2));
    assert!(
        kept.windows(2).all(|w| w[0].0 > w[1].0),
        "newest first: {kept:?}"
    );
}

/// `notice` woken within `limit`: true, or false when it was not.
pub(crate) async fn woken(notice: &Notice, limit: Duration) -> bool {
    tokio::time::timeout(limit, notice.wake.notified())
        .await
        .is_ok()
}

/// Waits until a listener hears `job`'s runner notices: `sender` sends one with `payload` until
/// `runner` (registered with the listener) is woken by it. A listener is up once a notice sent
/// after its start is heard (one sent before it subscribed is lost, as a publish is).
pub(crate) async fn listening<S: TermStore>(sender: &S, job: &str, runner: &Notice, payload: &str) {
    poll_until(
        "the listener hears a notice",
        Duration::from_secs(30),
        Duration::ZERO,
        || async move {
            answered("a notice", || {
                sender.notify(job, NoticeFor::Runner, payload)
            })
            .await;
            woken(runner, Duration::from_millis(200))
                .await
                .then_some(())
        },
    )
    .await
    .unwrap();
}

/// Waits until `notice` is woken with `expected` as its last payload, within `limit`: a wake
/// left pending by an earlier notice (a late "hello" of [`listening`]) is passed over, so a
/// check reads the notice it waits for.
pub(crate) async fn heard(notice: &Notice, expected: &str, limit: Duration) -> bool {
    let until = tokio::time::Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if !woken(notice, left).await {
            return false;
        }
        if payload(notice) == expected {
            return true;
        }
    }
}

/// Forgets `notice`'s last payload, so the next [`heard`] needs a new notice even when it
/// carries the same payload.
pub(crate) fn forget(notice: &Notice) {
    kept(notice).clear();
}

/// The last payload `notice` kept.
pub(crate) fn payload(notice: &Notice) -> String {
    kept(notice).clone()
}

/// The payload `notice` keeps, locked.
fn kept(notice: &Notice) -> std::sync::MutexGuard<'_, String> {
    notice
        .payload
        .as_ref()
        .expect("a notice with a payload")
        .lock()
        .unwrap()
}

/// One listener of `a`'s hears every job's releases and notices, `b`'s among them, those of a
/// job registered after it started too, and wakes only what is registered under the notice's
/// channel. With `lapsing` (a third host's client), a term of its that is not renewed wakes the
/// followers too (etcd).
async fn notices_heard<S: TermStore + Sync>(a: &S, b: &S, lapsing: Option<&S>) {
    let registered: ReleaseNotices = Default::default();
    let register = |job: &str| {
        let keys = JobKeys::new(job);
        let (released, runner, workers) = (
            Notice::with_payload(),
            Notice::with_payload(),
            Notice::with_payload(),
        );
        let mut map = registered.lock().unwrap();
        map.insert(keys.released_channel(), released.clone());
        map.insert(NoticeFor::Runner.channel(&keys), runner.clone());
        map.insert(NoticeFor::Workers.channel(&keys), workers.clone());
        (released, runner, workers)
    };
    let (released, runner, workers) = register("billing");
    let (_, other_runner, _) = register("settlement");
    let stop = tokio_util::sync::CancellationToken::new();
    let checks = async {
        listening(b, "billing", &runner, "request").await;
        assert_eq!(payload(&runner), "request");
        // A notice for the workers wakes the workers' channel, with its payload.
        answered("a work notice", || {
            b.notify("billing", NoticeFor::Workers, "tasks")
        })
        .await;
        assert!(
            woken(&workers, Duration::from_secs(10)).await,
            "the workers are woken"
        );
        assert_eq!(payload(&workers), "tasks");
        // A resignation wakes the followers at once (a TTL of a minute: not its expiry), naming
        // the owner that released.
        let tb = won(b, "billing", "b-owner", Duration::from_secs(60)).await;
        assert!(answered("b's resignation", || b.resign(&tb)).await);
        assert!(
            woken(&released, Duration::from_secs(10)).await,
            "a release is heard"
        );
        assert_eq!(payload(&released), "b-owner");
        // A job registered after the listener started is heard too, with no new subscription.
        let (later_released, later_runner, _) = register("payroll");
        answered("a notice", || {
            b.notify("payroll", NoticeFor::Runner, "paused")
        })
        .await;
        assert!(woken(&later_runner, Duration::from_secs(10)).await);
        assert_eq!(payload(&later_runner), "paused");
        // Settlement's runner heard none of billing's or payroll's notices.
        assert!(!woken(&other_runner, Duration::ZERO).await);
        if let Some(c) = lapsing {
            let tc = won(c, "payroll", "c-lapsing", Duration::from_secs(1)).await;
            assert!(
                woken(&later_released, Duration::from_secs(30)).await,
                "a lapse is heard"
            );
            assert_eq!(payload(&later_released), "c-lapsing");
            assert!(!answered("the lapsed term's renewal", || c.renew(&tc)).await);
        }
        stop.cancel();
    };
    tokio::join!(a.listen(registered.clone(), stop.clone()), checks);
}

/// Raised tokens: after `b` raises `job`'s tokens above a figure (a database's fence holding
/// one the store has not reached), `a`'s next won term is above it, though `a` last saw the
/// store before the raise; a raise below changes nothing; a live term's writes go on.
async fn tokens_raised<S: TermStore>(a: &S, b: &S) {
    let ttl = Duration::from_secs(5);
    let ta = won(a, "settle", "a:1", ttl).await;
    assert!(answered("a's resignation", || a.resign(&ta)).await);
    let fence = ta.token + 1_000_000_000;
    assert!(answered("the raise", || b.raise_tokens("settle", fence)).await);
    assert!(
        !answered("a raise below", || b.raise_tokens("settle", fence - 1)).await,
        "a raise never lowers"
    );
    let ta2 = won(a, "settle", "a:2", ttl).await;
    assert!(ta2.token > fence, "{} after a raise to {fence}", ta2.token);
    assert!(
        answered("a raise past a live term", || b
            .raise_tokens("settle", ta2.token + 1_000_000_000))
        .await
    );
    assert_eq!(
        answered("the live term's write", || a.write(&ta2, "k", b"v")).await,
        Written::Applied,
        "a raise leaves the live term's token, and its writes, alone"
    );
    assert!(answered("a's resignation", || a.resign(&ta2)).await);
    let tb = won(b, "settle", "b:1", ttl).await;
    assert!(tb.token > ta2.token + 1_000_000_000);
}

/// What a leader reads of its job every round ([`TermStore::job_state`]): an
/// operator's request, the open runs, the cursor and the run index's marker as the term's
/// writes and the operator left them, and nothing where nothing was written.
async fn job_state_reads<S: TermStore>(a: &S, b: &S) {
    let ttl = Duration::from_secs(10);
    let ta = won(a, "js", "a:1", ttl).await;
    assert_eq!(
        answered("a new job's state", || b.job_state("js")).await,
        JobReads::default()
    );
    answered("an operator's request", || {
        b.request("js", "2026-01-05", "r1", true)
    })
    .await;
    let keys = JobKeys::new("js");
    let sets = [(keys.cursor(), &b"2026-01-05T00:00:00Z"[..])];
    let open = ["2026-01-05".to_string()];
    let runs = [INDEXED.to_string(), "2026-01-05".to_string()];
    let write = TermWrite::new(&sets, &[]).with(Bookkeeping {
        open_add: &open,
        runs_add: &runs,
        ..Bookkeeping::default()
    });
    assert!(matches!(write_all(a, &ta, write).await, Wrote::Applied(_)));
    assert_eq!(
        answered("the job's state", || b.job_state("js")).await,
        JobReads {
            requests: vec![("2026-01-05".into(), b"r1".to_vec())],
            open: vec!["2026-01-05".into()],
            paused: None,
            cursor: Some("2026-01-05T00:00:00Z".into()),
            wanted: None,
            indexed: true,
        }
    );
}

/// `beat` as a host sends it, until every part of it was answered (a beat is idempotent: a
/// registration again, renewals again, looks again, reads again).
async fn beaten<S: TermStore>(store: &S, beat: &Beat<'_>) -> Beaten {
    wait_for("a beat answered whole", Duration::from_secs(30), || async {
        let b = store.beat(beat).await;
        let whole = b.members.is_ok()
            && b.renewed.iter().all(Result::is_ok)
            && b.looked.iter().all(Result::is_ok)
            && b.read.iter().all(Result::is_ok);
        whole.then_some(b)
    })
    .await
}

/// A host's heartbeat in one call ([`TermStore::beat`]), each part answering for itself and in
/// order: its registration (the live members, the other host's too), the renewal of each term
/// it leads (one ended by a later term reads false, the other still holds), a follower's look
/// at a held job (its holder) and at a free one, and the job states its runners asked for. A
/// look's ask is kept where the store keeps asks (`asks_kept`: Redis), read in the job's
/// state.
async fn a_hosts_beat<S: TermStore>(a: &S, b: &S, asks_kept: bool) {
    let ttl = Duration::from_secs(10);
    let info = MemberInfo::with_capacity(2);
    let info_b = MemberInfo::with_capacity(3);
    let seen = answered("b's registration", || b.register("node-b", &info_b, ttl)).await;
    assert!(seen.contains_key("node-b"));
    let ledger = won(a, "ledger", "node-a:1", ttl).await;
    let gone = won(a, "gone", "node-a:2", ttl).await;
    let payroll = won(b, "payroll", "node-b:1", ttl).await;
    answered("an operator's request", || {
        b.request("ledger", "2026-12-07", "r1", true)
    })
    .await;
    // "gone"'s term ends and a later one begins: a's renewal of it must read false.
    assert!(answered("a resigning gone", || a.resign(&gone)).await);
    let later = won(b, "gone", "node-b:2", ttl).await;
    let beat = Beat {
        node: "node-a",
        info: &info,
        ttl,
        renew: vec![&ledger, &gone],
        look: vec![
            LookAt {
                job: "payroll",
                ask: Some("node-a 7"),
            },
            LookAt {
                job: "idle",
                ask: None,
            },
        ],
        read: vec!["ledger", "idle"],
    };
    let got = beaten(a, &beat).await;
    let members = got.members.unwrap();
    assert_eq!(
        members
            .iter()
            .map(|(n, i)| (n.as_str(), i.capacity))
            .collect::<Vec<_>>(),
        vec![("node-a", 2), ("node-b", 3)]
    );
    let renewed: Vec<bool> = got.renewed.into_iter().map(Result::unwrap).collect();
    assert_eq!(renewed, vec![true, false], "ledger still a's, gone b's");
    let looked: Vec<Lease> = got.looked.into_iter().map(Result::unwrap).collect();
    match &looked[0] {
        Lease::Held { holder, ttl: left } => {
            assert_eq!(holder, &payroll.owner);
            assert!(left.is_none_or(|l| l <= ttl), "{left:?} left of {ttl:?}");
        }
        free => panic!("payroll is held: {free:?}"),
    }
    assert_eq!(looked[1], Lease::Free, "idle was never held");
    let read: Vec<JobReads> = got.read.into_iter().map(Result::unwrap).collect();
    assert_eq!(read.len(), 2);
    assert_eq!(
        read[0].requests,
        vec![("2026-12-07".to_string(), b"r1".to_vec())]
    );
    assert_eq!(read[1], JobReads::default());
    let wanted = answered("payroll's state", || b.job_state("payroll"))
        .await
        .wanted;
    assert_eq!(wanted, asks_kept.then(|| "node-a 7".to_string()));
    // The renewed term goes on; the later term of "gone" was not touched by a's beat.
    assert!(answered("a's renewal", || a.renew(&ledger)).await);
    assert!(answered("b's renewal", || b.renew(&later)).await);
    assert_eq!(
        answered("gone's holder", || a.holder("gone")).await,
        Some(later.owner.clone())
    );
    // An empty beat (a host that leads and follows nothing) still registers.
    let alone = Beat {
        node: "node-a",
        info: &info,
        ttl,
        renew: Vec::new(),
        look: Vec::new(),
        read: Vec::new(),
    };
    let got = beaten(a, &alone).await;
    assert!(got.members.unwrap().contains_key("node-a"));
    assert!(got.renewed.is_empty() && got.looked.is_empty() && got.read.is_empty());
}

/// A host's campaigns sent together ([`TermStore::campaign_many`]): two candidacies for each of
/// five jobs, each job won by exactly one, the other told who holds it, each won term holding
/// its job; then what a campaign whose answer was lost took is given back by its owner alone
/// ([`TermStore::give_back`]): another owner's give-back changes nothing.
async fn campaigns_together<S: TermStore>(a: &S, b: &S) {
    let ttl = Duration::from_secs(10);
    let candidacies: Vec<Candidacy> = (0..10)
        .map(|i| Candidacy {
            job: format!("many-{}", i % 5),
            owner: format!("a:{i}"),
            ttl,
            ask: None,
        })
        .collect();
    let answers = a.campaign_many(&candidacies).await;
    assert_eq!(answers.len(), 10);
    let mut winners = std::collections::BTreeMap::new();
    for (c, answer) in candidacies.iter().zip(&answers) {
        if let Ok(Campaign::Won(t)) = answer {
            assert_eq!((&t.job, &t.owner), (&c.job, &c.owner));
            assert!(
                winners.insert(c.job.clone(), t.clone()).is_none(),
                "{} won twice",
                c.job
            );
        }
    }
    assert_eq!(winners.len(), 5, "each job won once: {answers:?}");
    for (c, answer) in candidacies.iter().zip(&answers) {
        match answer {
            Ok(Campaign::Won(_)) => {}
            Ok(Campaign::Held { owner, .. }) => assert_eq!(*owner, winners[&c.job].owner),
            Err(e) => panic!("{}'s campaign: {e:#}", c.owner),
        }
    }
    let terms: Vec<StoreTerm> = winners.values().cloned().collect();
    assert_eq!(
        answered("the winners' renewals", || a.renew_all(&terms)).await,
        vec![true; 5]
    );
    let m0 = &winners["many-0"];
    assert!(!answered("another owner's give-back", || b.give_back("many-0", "b:9")).await);
    assert_eq!(
        answered("many-0's holder", || b.holder("many-0")).await,
        Some(m0.owner.clone())
    );
    assert!(answered("the owner's give-back", || b.give_back("many-0", &m0.owner)).await);
    assert_eq!(
        answered("many-0's holder", || b.holder("many-0")).await,
        None
    );
    won(b, "many-0", "b:1", ttl).await;
}

/// The host's one way a term writes ([`fence::term_write`], what the runner and the guests'
/// imports call) on `a`'s store: applied while the term holds; past the quota refused with the
/// term going on; a run's record and checkpoint read back as the runner reads them
/// ([`runs::read_from`]; one that is not a record reads corrupt; many keys at once in order); once another term holds the
/// job, refused naming its holder, nothing written, and the term ended here at once.
async fn the_hosts_term_writes(a: &Store, b: &Store) {
    let ttl = Duration::from_secs(10);
    let held = won(a, "hw", "a:1", ttl).await;
    let term = Term::granted(&held, Instant::now() + ttl, None);
    let keys = JobKeys::new("hw");
    let sets = [(keys.data("k"), &b"v"[..])];
    fence::term_write(a, &keys, &term, TermWrite::new(&sets, &[]))
        .await
        .expect("the holding term's write");
    assert_eq!(
        answered("k", || b.read("hw", "k")).await,
        Some(b"v".to_vec())
    );
    let big = [(keys.data("big"), &[7u8; 64][..])];
    let over = TermWrite {
        quota: Some(Quota {
            keys: 10,
            bytes: 32,
        }),
        ..TermWrite::new(&big, &[])
    };
    match fence::term_write(a, &keys, &term, over).await {
        Err(TermWriteError::QuotaExceeded(q)) => assert_eq!((q.max_keys, q.max_bytes), (10, 32)),
        other => panic!("a write past the quota: {other:?}"),
    }
    assert!(term.still_leader(), "a quota refusal leaves the term alone");
    // A run's record and checkpoint, written as the runner writes them and read back as it
    // reads them before running or resuming the run; a record that is not one reads corrupt.
    let record = RunRecord::refused("2026-01-02", "2026-01-02T00:00:00.000Z");
    let json = serde_json::to_vec(&record).unwrap();
    let saved = [
        (keys.run("2026-01-02"), &json[..]),
        (keys.checkpoint("2026-01-02"), &b"step 3"[..]),
        (keys.run("2026-01-03"), &b"{not a record"[..]),
    ];
    fence::term_write(a, &keys, &term, TermWrite::new(&saved, &[]))
        .await
        .expect("the run's record and checkpoint");
    let read = runs::read_from(b, &keys, "2026-01-02")
        .await
        .expect("the record");
    assert_eq!(read.as_ref().map(|r| &r.period), Some(&record.period));
    assert_eq!(
        runs::read_checkpoint_from(b, &keys, "2026-01-02")
            .await
            .unwrap(),
        Some(b"step 3".to_vec())
    );
    assert!(
        runs::read_from(b, &keys, "2026-01-04")
            .await
            .unwrap()
            .is_none()
    );
    // Many keys at once, in order (past one etcd transaction's 128 operations), as the runner
    // looks for the records of every period fired since its cursor.
    let mut rests: Vec<String> = (0..300).map(|i| format!("run:2027-{i:03}")).collect();
    rests[150] = "run:2026-01-02".into();
    rests[299] = "ckpt:2026-01-02".into();
    let many = answered("300 keys", || b.read_keys("hw", &rests)).await;
    assert_eq!(many.len(), 300);
    assert_eq!(many[150].as_deref(), Some(&json[..]));
    assert_eq!(many[299].as_deref(), Some(&b"step 3"[..]));
    assert_eq!(many.iter().filter(|v| v.is_some()).count(), 2);
    assert!(matches!(
        runs::read_from(b, &keys, "2026-01-03").await,
        Err(runs::RecordError::Corrupt { .. })
    ));
    assert!(answered("a's resignation", || a.resign(&held)).await);
    won(b, "hw", "b:1", ttl).await;
    let late = [(keys.data("k"), &b"late"[..])];
    match fence::term_write(a, &keys, &term, TermWrite::new(&late, &[])).await {
        Err(TermWriteError::Refused(
            Refusal::NotLeaseholder { lease_holder: h }
            | Refusal::Stale {
                fence_holder: h, ..
            },
        )) => assert_eq!(h, "b:1"),
        other => panic!("the old term's write: {other:?}"),
    }
    assert!(!term.still_leader(), "a refusal ends the term");
    assert_eq!(
        answered("k", || b.read("hw", "k")).await,
        Some(b"v".to_vec())
    );
    assert_eq!(answered("big", || b.read("hw", "big")).await, None);
}

/// A client of the store `url` names, as the host opens one ([`Store::open`]): every test
/// below goes through the same type whichever store it runs on.
pub(crate) async fn store_client(url: &str) -> Store {
    let store = Store::open(url, Duration::from_secs(5))
        .await
        .expect("a connection to the store");
    let redis = !leasehold::coord::term_store::names_etcd(url);
    assert!(
        matches!(
            (&store, redis),
            (Store::Redis(_), true) | (Store::Etcd(_), false)
        ),
        "{url} opened the other store"
    );
    store
}

async fn redis_client(redis: &RedisServer) -> Store {
    store_client(&redis.url()).await
}

pub(crate) async fn redis_pair(redis: &RedisServer) -> (Store, Store) {
    (redis_client(redis).await, redis_client(redis).await)
}

pub(crate) async fn etcd_pair(cluster: &EtcdCluster) -> (Store, Store) {
    let url = cluster.url();
    (store_client(&url).await, store_client(&url).await)
}

#[tokio::test]
async fn redis_keeps_one_term_at_a_time_with_growing_tokens_and_fenced_writes() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        one_term_at_a_time(&a, &b).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_keeps_one_term_at_a_time_with_growing_tokens_and_fenced_writes() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        one_term_at_a_time(&a, &b).await;
    })
    .await;
}

#[tokio::test]
async fn redis_lapses_a_term_not_renewed_and_refuses_its_late_write() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        a_term_not_renewed_lapses(&a, &b).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_lapses_a_term_not_renewed_and_refuses_its_late_write() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        a_term_not_renewed_lapses(&a, &b).await;
    })
    .await;
}

#[tokio::test]
async fn redis_applies_a_terms_whole_write_with_its_quota_and_bookkeeping_or_nothing() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        // Boxed: a long test's future is large for a test thread's stack in a debug build.
        Box::pin(whole_writes(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_applies_a_terms_whole_write_with_its_quota_and_bookkeeping_or_nothing() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        // Boxed: a long test's future is large for a test thread's stack in a debug build.
        Box::pin(whole_writes(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn redis_counts_a_terms_concurrent_writes_exactly() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, _) = redis_pair(&redis).await;
        Box::pin(concurrent_writes_count_exactly(&a)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_counts_a_terms_concurrent_writes_exactly() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, _) = etcd_pair(&cluster).await;
        Box::pin(concurrent_writes_count_exactly(&a)).await;
    })
    .await;
}

#[tokio::test]
async fn redis_reads_a_jobs_state_as_its_writes_and_operators_left_it() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        Box::pin(job_state_reads(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_reads_a_jobs_state_as_its_writes_and_operators_left_it() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        Box::pin(job_state_reads(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn redis_answers_a_hosts_beat_each_part_for_itself() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        Box::pin(a_hosts_beat(&a, &b, true)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_answers_a_hosts_beat_each_part_for_itself() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        Box::pin(a_hosts_beat(&a, &b, false)).await;
    })
    .await;
}

#[tokio::test]
async fn redis_answers_a_hosts_campaigns_sent_together_and_gives_back_an_unheard_one() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        Box::pin(campaigns_together(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_answers_a_hosts_campaigns_sent_together_and_gives_back_an_unheard_one() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        Box::pin(campaigns_together(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn redis_takes_the_hosts_term_writes_and_refuses_an_ended_terms() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        Box::pin(the_hosts_term_writes(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_takes_the_hosts_term_writes_and_refuses_an_ended_terms() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        Box::pin(the_hosts_term_writes(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn a_redis_cluster_keeps_the_contract_across_its_primaries() {
    // The seam's Redis store is the host's connection: on a Cluster each job's scripts go to
    // the primary of its slot, and a host's renewals are one batch per primary.
    deadline(
        Duration::from_secs(90),
        Box::pin(async {
            let cluster = leasehold_harness::RedisCluster::start(3, 0).await;
            let url = cluster.url();
            let (a, b) = (store_client(&url).await, store_client(&url).await);
            Box::pin(one_term_at_a_time(&a, &b)).await;
            Box::pin(whole_writes(&a, &b)).await;
            let c = store_client(&url).await;
            Box::pin(many_terms_renewed_together(&a, &b, &c)).await;
        }),
    )
    .await;
}

#[tokio::test]
async fn redis_renews_a_hosts_terms_together_each_for_itself() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        let c = redis_client(&redis).await;
        Box::pin(many_terms_renewed_together(&a, &b, &c)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_renews_a_hosts_terms_together_each_for_itself() {
    deadline(Duration::from_secs(150), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        let (c, d) = etcd_pair(&cluster).await;
        Box::pin(many_terms_renewed_together(&a, &b, &c)).await;
        // What a beat of 300 terms costs, counted by etcd: one keep-alive of the host's lease and
        // one read per 128 terms, sent at once. Counted once the cluster is quiet (each won
        // campaign trims its job's history in the background: a read).
        let many = win_many(&d, "counted", 300, Duration::from_secs(60)).await;
        let before = quiet(&cluster).await;
        let held = TermStore::renew_all(&d, &many).await.expect("300 renewals");
        let served = cluster.requests_served().await - before;
        assert!(held.iter().all(|h| *h));
        assert_eq!(
            served,
            1 + 300u64.div_ceil(128),
            "requests for a beat of 300 terms"
        );
        // The same terms in a host's whole heartbeat (`beat`: its registration and the
        // members' read join the terms' keys in the transactions): one keep-alive and one
        // transaction per 128 operations, the 300 renewals and the 2 of the registration.
        let info = MemberInfo::with_capacity(1);
        let beat = Beat {
            node: "node-d",
            info: &info,
            ttl: Duration::from_secs(60),
            renew: many.iter().collect(),
            look: Vec::new(),
            read: Vec::new(),
        };
        beaten(&d, &beat).await;
        let before = quiet(&cluster).await;
        let b = TermStore::beat(&d, &beat).await;
        let served = cluster.requests_served().await - before;
        assert!(b.members.expect("the members").contains_key("node-d"));
        assert!(b.renewed.into_iter().all(|h| h.expect("a renewal")));
        assert_eq!(
            served,
            1 + (300u64 + 2).div_ceil(128),
            "requests for a heartbeat of 300 terms"
        );
    })
    .await;
}

/// The requests `cluster` has served, once it is quiet (each won campaign trims its job's
/// history in the background: a read).
async fn quiet(cluster: &EtcdCluster) -> u64 {
    poll_until(
        "the cluster to fall quiet",
        Duration::from_secs(30),
        Duration::ZERO,
        || async {
            let first = cluster.requests_served().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let then = cluster.requests_served().await;
            (first == then).then_some(then)
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn redis_keeps_the_members_that_register_and_drops_those_that_stop() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        Box::pin(membership(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_keeps_the_members_that_register_and_drops_those_that_stop() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        Box::pin(membership(&a, &b)).await;
    })
    .await;
}

#[tokio::test]
async fn redis_wakes_a_follower_when_a_job_falls_free() {
    deadline(Duration::from_secs(90), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        let c = redis_client(&redis).await;
        Box::pin(vacancies(&a, &b, &c)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_wakes_a_follower_when_a_job_falls_free() {
    deadline(Duration::from_secs(150), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        let (c, _) = etcd_pair(&cluster).await;
        Box::pin(vacancies(&a, &b, &c)).await;
    })
    .await;
}

#[tokio::test]
async fn redis_hears_every_jobs_releases_and_notices_on_one_listener() {
    deadline(Duration::from_secs(90), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        Box::pin(notices_heard(&a, &b, None)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_hears_every_jobs_releases_lapses_and_notices_on_one_watch() {
    deadline(Duration::from_secs(150), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        let (c, _) = etcd_pair(&cluster).await;
        Box::pin(notices_heard(&a, &b, Some(&c))).await;
    })
    .await;
}

#[tokio::test]
async fn redis_keeps_each_jobs_term_history() {
    deadline(Duration::from_secs(90), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        let c = redis_client(&redis).await;
        Box::pin(term_history(&a, &b, &c)).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_keeps_each_jobs_term_history() {
    deadline(Duration::from_secs(150), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        let (c, _) = etcd_pair(&cluster).await;
        Box::pin(term_history(&a, &b, &c)).await;
        // What is kept in etcd is bounded too: the won campaigns trimmed the rest.
        let raw = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .unwrap();
        poll_until(
            "the history trimmed",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                let mut raw = raw.clone();
                async move {
                    let got = raw
                        .get(
                            "lh/cap/history/",
                            Some(
                                etcd_client::GetOptions::new()
                                    .with_prefix()
                                    .with_count_only(),
                            ),
                        )
                        .await
                        .ok()?;
                    (got.count() as usize == KEPT).then_some(())
                }
            },
        )
        .await
        .unwrap();
    })
    .await;
}

#[tokio::test]
async fn redis_raises_tokens_above_a_fence_and_never_lowers_them() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let (a, b) = redis_pair(&redis).await;
        tokens_raised(&a, &b).await;
    })
    .await;
}

#[tokio::test]
async fn etcd_raises_tokens_above_a_fence_and_never_lowers_them() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let (a, b) = etcd_pair(&cluster).await;
        tokens_raised(&a, &b).await;
    })
    .await;
}

/// A job moved from Redis to a new etcd cluster: its first term there has a token above its
/// last on Redis (etcd's base is set from a host's clock in microseconds, as Redis's tokens are
/// from Redis's), so the databases it writes to, which keep the highest token they saw, do not
/// refuse it.
#[tokio::test]
async fn tokens_continue_from_redis_to_a_new_etcd_cluster() {
    deadline(Duration::from_secs(120), async {
        let ttl = Duration::from_secs(5);
        let redis = RedisServer::start().await;
        let on_redis = redis_client(&redis).await;
        let last = won(&on_redis, "billing", "a:1", ttl).await;
        let cluster = EtcdCluster::start(3).await;
        let (on_etcd, _) = etcd_pair(&cluster).await;
        let first = won(&on_etcd, "billing", "a:2", ttl).await;
        assert!(
            first.token > last.token,
            "etcd's first token {} after Redis's last {}",
            first.token,
            last.token
        );
        // And within etcd they go on growing from there.
        assert!(answered("the resignation", || TermStore::resign(&on_etcd, &first)).await);
        assert!(won(&on_etcd, "billing", "a:3", ttl).await.token > first.token);
    })
    .await;
}
