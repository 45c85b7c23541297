//! The lease scripts, as a table: each case sets the lease up, runs one operation, and states
//! the operation's result and who holds the lease afterwards.

use std::time::Duration;

use leasehold::coord::lease::{self, Acquired};
use leasehold::coord::terms::TermEnd;
use leasehold::store::keys::JobKeys;
use redis::AsyncCommands;

use crate::harness::{RedisServer, deadline};

#[derive(Clone, Copy, Debug)]
enum Setup {
    Free,
    HeldBy(&'static str),
    ExpiredFrom(&'static str),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire(&'static str),
    Renew(&'static str),
    Release(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    Granted,
    HeldBy(&'static str),
    Renewed(bool),
    Released(bool),
}

struct Case {
    name: &'static str,
    setup: Setup,
    op: Op,
    expect: Expect,
    holder_after: Option<&'static str>,
}

const TTL: Duration = Duration::from_secs(30);

const CASES: &[Case] = &[
    Case {
        name: "acquiring a free lease grants a new term",
        setup: Setup::Free,
        op: Op::Acquire("a:1"),
        expect: Expect::Granted,
        holder_after: Some("a:1"),
    },
    Case {
        name: "acquiring a held lease reports its holder and changes nothing",
        setup: Setup::HeldBy("b:1"),
        op: Op::Acquire("a:1"),
        expect: Expect::HeldBy("b:1"),
        holder_after: Some("b:1"),
    },
    Case {
        name: "acquiring an expired lease grants a new term",
        setup: Setup::ExpiredFrom("b:1"),
        op: Op::Acquire("a:1"),
        expect: Expect::Granted,
        holder_after: Some("a:1"),
    },
    Case {
        name: "the owner renews its lease",
        setup: Setup::HeldBy("a:1"),
        op: Op::Renew("a:1"),
        expect: Expect::Renewed(true),
        holder_after: Some("a:1"),
    },
    Case {
        name: "a non-owner cannot renew someone else's lease",
        setup: Setup::HeldBy("b:1"),
        op: Op::Renew("a:1"),
        expect: Expect::Renewed(false),
        holder_after: Some("b:1"),
    },
    Case {
        name: "an expired lease cannot be renewed, even by its last owner",
        setup: Setup::ExpiredFrom("a:1"),
        op: Op::Renew("a:1"),
        expect: Expect::Renewed(false),
        holder_after: None,
    },
    Case {
        name: "the same node with a new candidacy id is not the owner",
        setup: Setup::HeldBy("a:1"),
        op: Op::Renew("a:2"),
        expect: Expect::Renewed(false),
        holder_after: Some("a:1"),
    },
    Case {
        name: "the owner releases its lease",
        setup: Setup::HeldBy("a:1"),
        op: Op::Release("a:1"),
        expect: Expect::Released(true),
        holder_after: None,
    },
    Case {
        name: "a non-owner cannot release someone else's lease",
        setup: Setup::HeldBy("b:1"),
        op: Op::Release("a:1"),
        expect: Expect::Released(false),
        holder_after: Some("b:1"),
    },
];

#[tokio::test]
async fn lease_cases() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let mut conn = redis.conn().await;
        for (i, case) in CASES.iter().enumerate() {
            let keys = JobKeys::new(&format!("job-{i}"));
            match case.setup {
                Setup::Free => {}
                Setup::HeldBy(owner) => {
                    let got = lease::acquire(&mut conn, &keys, owner, TTL).await.unwrap();
                    assert!(
                        matches!(got, Acquired::Granted { .. }),
                        "{}: setup",
                        case.name
                    );
                }
                Setup::ExpiredFrom(owner) => {
                    lease::acquire(&mut conn, &keys, owner, TTL).await.unwrap();
                    // Expire it the way Redis would: the key is gone.
                    let _: () = conn.pexpire(keys.lease(), 1).await.unwrap();
                    crate::harness::wait_for("the lease to expire", Duration::from_secs(5), || {
                        let mut c = conn.clone();
                        let k = keys.lease();
                        async move { (!c.exists::<_, bool>(k).await.unwrap()).then_some(()) }
                    })
                    .await;
                }
            }
            let token_before: Option<u64> = conn.hget(keys.fence(), "token").await.unwrap();
            let got = match case.op {
                Op::Acquire(owner) => {
                    match lease::acquire(&mut conn, &keys, owner, TTL).await.unwrap() {
                        Acquired::Granted { token } => {
                            if let Some(before) = token_before {
                                assert!(
                                    token > before,
                                    "{}: token {token} not above {before}",
                                    case.name
                                );
                            }
                            let fence: (u64, String) = redis::cmd("HMGET")
                                .arg(keys.fence())
                                .arg("token")
                                .arg("holder")
                                .query_async(&mut conn)
                                .await
                                .unwrap();
                            assert_eq!(
                                fence,
                                (token, owner.to_string()),
                                "{}: the fence is raised at term start",
                                case.name
                            );
                            Expect::Granted
                        }
                        Acquired::Held { holder, ttl } => {
                            assert!(
                                ttl.is_some_and(|t| t > Duration::ZERO && t <= TTL),
                                "{}: ttl {ttl:?}",
                                case.name
                            );
                            assert_eq!(
                                Some(holder.as_str()),
                                Some(match case.expect {
                                    Expect::HeldBy(h) => h,
                                    _ => "?",
                                }),
                                "{}",
                                case.name
                            );
                            Expect::HeldBy(match case.expect {
                                Expect::HeldBy(h) => h,
                                _ => "?",
                            })
                        }
                    }
                }
                Op::Renew(owner) => {
                    Expect::Renewed(lease::renew(&mut conn, &keys, owner, TTL).await.unwrap())
                }
                Op::Release(owner) => Expect::Released(
                    lease::release(&mut conn, &keys, owner, TermEnd::Released)
                        .await
                        .unwrap(),
                ),
            };
            assert_eq!(got, case.expect, "case: {}", case.name);
            let holder: Option<String> = conn.get(keys.lease()).await.unwrap();
            assert_eq!(
                holder.as_deref(),
                case.holder_after,
                "case: {}: holder afterwards",
                case.name
            );
            if let (Some(_), Op::Renew(_)) = (case.holder_after, case.op) {
                let pttl: i64 = conn.pttl(keys.lease()).await.unwrap();
                assert!(
                    pttl > 0 && pttl as u128 <= TTL.as_millis(),
                    "case: {}: pttl {pttl}",
                    case.name
                );
            }
        }
    })
    .await;
}

/// A corrupt counter or fence makes the acquire script fail; it must fail before writing
/// anything, so no lease is left that nobody holds (it used to set the lease first).
#[tokio::test]
async fn a_failed_acquire_leaves_no_lease_behind() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let keys = JobKeys::new("corrupt");
        // (what is corrupted, how) — each must fail the acquire and leave no lease.
        type Corrupt = fn(&JobKeys) -> redis::Cmd;
        let cases: [(&str, Corrupt); 4] = [
            ("a counter that is not a number", |k| {
                redis::cmd("SET").arg(k.token()).arg("not-a-number").clone()
            }),
            ("a counter of the wrong type", |k| {
                redis::cmd("LPUSH").arg(k.token()).arg("x").clone()
            }),
            ("a fence token that is not a number", |k| {
                redis::cmd("HSET")
                    .arg(k.fence())
                    .arg("token")
                    .arg("x")
                    .clone()
            }),
            ("a fence of the wrong type", |k| {
                redis::cmd("SET").arg(k.fence()).arg("x").clone()
            }),
        ];
        for (what, corrupt) in cases {
            let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
            let _: () = corrupt(&keys).query_async(&mut c).await.unwrap();
            let got = lease::acquire(&mut c, &keys, "a:1", TTL).await;
            assert!(got.is_err(), "{what}: acquire should fail, got {got:?}");
            let lease: Option<String> = c.get(keys.lease()).await.unwrap();
            assert_eq!(
                lease, None,
                "{what}: the failed acquire left a lease behind"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn pipelined_campaigns_and_renewals_each_answer_for_themselves() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let ttl = Duration::from_secs(10);
        let (free, held, broken) = (
            JobKeys::new("p-free"),
            JobKeys::new("p-held"),
            JobKeys::new("p-broken"),
        );
        let _: () = c.set(held.lease(), "other:1").await.unwrap();
        // A counter that is not a number makes that one acquire fail.
        let _: () = c.set(broken.token(), "x").await.unwrap();
        let campaign = |keys: &JobKeys, ask: Option<&str>| lease::Campaign {
            keys: keys.clone(),
            owner: "n1:a".into(),
            ttl,
            ask: ask.map(str::to_string),
        };
        let mut lc = crate::harness::conn(&redis).await;
        let answers = lease::acquire_many(
            &mut lc,
            &[
                campaign(&free, None),
                campaign(&held, Some("n1")),
                campaign(&broken, None),
            ],
        )
        .await;
        assert!(
            matches!(answers[0], Ok(Acquired::Granted { .. })),
            "{:?}",
            answers[0]
        );
        assert!(
            matches!(&answers[1], Ok(Acquired::Held { holder, .. }) if holder == "other:1"),
            "{:?}",
            answers[1]
        );
        assert!(answers[2].is_err(), "{:?}", answers[2]);
        // The ask was recorded where the lease was held, and nothing was left where it failed.
        let wanted: Option<String> = c.get(held.wanted()).await.unwrap();
        assert_eq!(wanted.as_deref(), Some("n1"));
        let left: Option<String> = c.get(broken.lease()).await.unwrap();
        assert_eq!(left, None);
        // Renewals: ours renewed, another owner's refused, in one pipeline.
        let renewed = lease::renew_many(&mut lc, [(&free, "n1:a"), (&held, "n1:a")], ttl).await;
        assert!(matches!(renewed[0], Ok(true)), "{:?}", renewed[0]);
        assert!(matches!(renewed[1], Ok(false)), "{:?}", renewed[1]);
    })
    .await;
}

#[tokio::test]
async fn campaigns_sent_at_the_same_moment_are_all_answered() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let store = leasehold::coord::term_store::Store::open(&redis.url(), Duration::from_secs(5))
            .await
            .expect("the store");
        let campaigns = leasehold::coord::campaigns::Campaigns::start(
            &tokio::runtime::Handle::current(),
            store,
            tokio_util::sync::CancellationToken::new(),
        );
        // Fifty electors campaigning at once, for twenty-five jobs: each job granted once.
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let campaigns = campaigns.clone();
                tokio::spawn(async move {
                    campaigns
                        .acquire(leasehold::coord::term_store::Candidacy {
                            job: format!("c-{}", i % 25),
                            owner: format!("n{i}:x"),
                            ttl: Duration::from_secs(10),
                            ask: None,
                        })
                        .await
                })
            })
            .collect();
        let mut granted = 0;
        for t in tasks {
            match t.await.unwrap().unwrap() {
                leasehold::coord::term_store::Campaign::Won(_) => granted += 1,
                leasehold::coord::term_store::Campaign::Held { .. } => {}
            }
        }
        assert_eq!(granted, 25);
    })
    .await;
}

/// The term history, script by script: the acquire adds the term (and closes an open
/// predecessor as `crashed`), a release closes only its own entry, a holder back after its
/// successor began may only say why it went quiet, and the list keeps at most `KEPT` terms.
#[tokio::test]
async fn the_term_history_is_written_by_the_lease_scripts_alone() {
    use leasehold::coord::terms::{KEPT, history};
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let keys = JobKeys::new("terms");
        let ends =
            |terms: &[leasehold::coord::terms::TermRecord]| -> Vec<(String, Option<TermEnd>)> {
                terms.iter().map(|t| (t.owner.clone(), t.end)).collect()
            };
        let granted = |a: Acquired| matches!(a, Acquired::Granted { .. });
        assert!(granted(
            lease::acquire(&mut c, &keys, "a:1", TTL).await.unwrap()
        ));
        let (terms, bad) = history(&mut c, &keys, 10).await.unwrap();
        assert_eq!((ends(&terms), bad), (vec![("a:1".into(), None)], 0));
        assert_eq!(terms[0].node, "a");
        // a's lease runs out unreleased; b's acquire closes a's entry as crashed.
        let _: () = c.del(keys.lease()).await.unwrap();
        assert!(granted(
            lease::acquire(&mut c, &keys, "b:1", TTL).await.unwrap()
        ));
        let (terms, _) = history(&mut c, &keys, 10).await.unwrap();
        assert_eq!(
            ends(&terms),
            vec![("b:1".into(), None), ("a:1".into(), Some(TermEnd::Crashed))]
        );
        assert!(terms[0].token > terms[1].token);
        // a, back, says it was fenced; saying so again, or "released", changes nothing more.
        assert!(
            !lease::release(&mut c, &keys, "a:1", TermEnd::Fenced)
                .await
                .unwrap()
        );
        assert!(
            !lease::release(&mut c, &keys, "a:1", TermEnd::Expired)
                .await
                .unwrap()
        );
        // An owner that never held a term adds nothing.
        assert!(
            !lease::release(&mut c, &keys, "z:9", TermEnd::Released)
                .await
                .unwrap()
        );
        let (terms, _) = history(&mut c, &keys, 10).await.unwrap();
        assert_eq!(
            ends(&terms),
            vec![("b:1".into(), None), ("a:1".into(), Some(TermEnd::Fenced))]
        );
        // b, still the fence's, releases: its own entry only; nothing can reopen it.
        assert!(
            lease::release(&mut c, &keys, "b:1", TermEnd::Released)
                .await
                .unwrap()
        );
        assert!(
            !lease::release(&mut c, &keys, "b:1", TermEnd::Fenced)
                .await
                .unwrap()
        );
        let (terms, _) = history(&mut c, &keys, 10).await.unwrap();
        assert_eq!(terms[0].end, Some(TermEnd::Released));
        assert!(terms[0].ended_ms.unwrap() >= terms[0].started_ms);
        // A release asked for a lease that ran out before it, with no later term: expired.
        assert!(granted(
            lease::acquire(&mut c, &keys, "c:1", TTL).await.unwrap()
        ));
        let _: () = c.del(keys.lease()).await.unwrap();
        assert!(
            !lease::release(&mut c, &keys, "c:1", TermEnd::Released)
                .await
                .unwrap()
        );
        let (terms, _) = history(&mut c, &keys, 1).await.unwrap();
        assert_eq!(ends(&terms), vec![("c:1".into(), Some(TermEnd::Expired))]);
        // Capped: the newest KEPT terms stay.
        for i in 0..KEPT + 5 {
            let owner = format!("n:{i}");
            assert!(granted(
                lease::acquire(&mut c, &keys, &owner, TTL).await.unwrap()
            ));
            assert!(
                lease::release(&mut c, &keys, &owner, TermEnd::Released)
                    .await
                    .unwrap()
            );
        }
        let len: usize = c.llen(keys.terms()).await.unwrap();
        assert_eq!(len, KEPT);
        let (terms, _) = history(&mut c, &keys, 100).await.unwrap();
        assert_eq!(terms[0].owner, format!("n:{}", KEPT + 4));
        // A history key of another type is left alone: the job still gets a leader.
        let _: () = c.del(&[keys.terms(), keys.lease()]).await.unwrap();
        let _: () = c.set(keys.terms(), "x").await.unwrap();
        assert!(granted(
            lease::acquire(&mut c, &keys, "d:1", TTL).await.unwrap()
        ));
        assert!(
            lease::release(&mut c, &keys, "d:1", TermEnd::Released)
                .await
                .unwrap()
        );
    })
    .await;
}
