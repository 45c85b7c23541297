//! Terms on etcd (`leasehold::store::etcd`, the first part of the etcd store, issue 30) under
//! faults, against a real 3-member cluster of Debian's etcd: a holder whose member is cut off
//! cannot renew while the majority moves on, and its late write is refused; a member left
//! without a leader refuses every request (`require-leader`); a member killed under a live term
//! does not end it, etcd's leader among them. And with etcd's authentication on, a host's user whose role may read and
//! write only the prefix `lh/` runs every store operation, named by an `etcd://` URL; over TLS
//! (`etcds://`) a cluster requiring client certificates is served, and refused without them, an
//! untrusted cluster refused. The host's one watch goes on through each member killed in turn,
//! missing no notice; cut off past a compaction, it wakes everyone to look again. What every store must do without faults is in `contract.rs`.

use std::time::Duration;

use leasehold::coord::notices::{Notice, NoticeFor, ReleaseNotices};
use leasehold::store::etcd::{Campaign, EtcdTerm, EtcdTerms, Fenced, Registration};
use leasehold::store::keys::JobKeys;
use leasehold_harness::{EtcdCluster, TestCa, poll_until};

use crate::harness::*;
use crate::proxy::{Fault, FaultProxy};

/// Requests answer within this, or fail.
const REQUEST: Duration = Duration::from_secs(5);

async fn client(endpoints: &[String]) -> EtcdTerms {
    EtcdTerms::connect(endpoints, REQUEST)
        .await
        .expect("connecting to the etcd cluster")
}

async fn won(terms: &EtcdTerms, job: &str, owner: &str, ttl: Duration) -> EtcdTerm {
    match answered("a campaign", || terms.campaign(job, owner, ttl)).await {
        Campaign::Won(t) => t,
        held => panic!("{owner} expected to win {job}, found {held:?}"),
    }
}

/// Campaigns until `owner` wins `job` (the previous term lapsing), within `within`.
async fn wins_within(
    terms: &EtcdTerms,
    job: &str,
    owner: &str,
    ttl: Duration,
    within: Duration,
) -> EtcdTerm {
    // A campaign every 250 ms (each is a few writes the cluster agrees on).
    poll_until(
        &format!("{owner} to win {job}"),
        within,
        Duration::from_millis(250),
        || async {
            match terms.campaign(job, owner, ttl).await {
                Ok(Campaign::Won(t)) => Some(t),
                _ => None,
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A listener's registrations with one notice, for `job`'s runner (it keeps the payload).
fn runner_notices(job: &str) -> (ReleaseNotices, Notice) {
    let notices: ReleaseNotices = Default::default();
    let runner = Notice::with_payload();
    notices.lock().unwrap().insert(
        NoticeFor::Runner.channel(&JobKeys::new(job)),
        runner.clone(),
    );
    (notices, runner)
}

/// Waits until a listener's watch is open: a notice `up` for `job`'s runner, sent by `sender`
/// after the listener started, wakes `runner` (one sent before the watch opened is not heard).
async fn watch_open(sender: &EtcdTerms, runner: &Notice, job: &str) {
    poll_until(
        "the watch open",
        Duration::from_secs(30),
        Duration::ZERO,
        || async move {
            answered("a notice", || sender.notify(job, NoticeFor::Runner, "up")).await;
            tokio::time::timeout(Duration::from_millis(200), runner.wake.notified())
                .await
                .ok()
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_holder_cut_off_with_a_minority_member_cannot_renew_and_the_majority_moves_on() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        // `a` talks only to member 2; `b` to members 0 and 1.
        let a = client(&[cluster.endpoint(2)]).await;
        let b = client(&[cluster.endpoint(0), cluster.endpoint(1)]).await;
        let ttl = Duration::from_secs(2);
        let ta = won(&a, "billing", "a", ttl).await;
        assert!(answered("a.renew", || a.renew(&ta)).await);
        // Member 2 cut off (frozen): `a` cannot renew there, whatever it retries.
        cluster.pause(2);
        assert!(
            !matches!(a.renew(&ta).await, Ok(true)),
            "a renewal through a member cut off from the others"
        );
        // The majority goes on: the term lapses there and `b` takes the job.
        let tb = wins_within(&b, "billing", "b", ttl, Duration::from_secs(20)).await;
        assert!(tb.token > ta.token);
        assert!(matches!(
            answered("b.write", || b.write(&tb, "charge/alice", b"100")).await,
            Fenced::Applied { .. }
        ));
        // Member 2 back: `a`'s late write through it is refused, nothing overwritten.
        cluster.resume(2);
        let late = wait_for(
            "a's late write to be answered",
            Duration::from_secs(20),
            || async { a.write(&ta, "charge/alice", b"late").await.ok() },
        )
        .await;
        assert!(matches!(late, Fenced::Refused { .. }), "{late:?}");
        assert!(!a.renew(&ta).await.unwrap_or(false));
        assert_eq!(
            answered("b.read", || b.read("billing", "charge/alice")).await,
            Some(b"100".to_vec())
        );
        // Now member 2 is the minority, alive but alone (0 and 1 frozen): it has no leader,
        // and refuses `a`'s requests as such (a gRPC status, not a timeout of the client's).
        wait_for(
            "member 2 to be healthy again",
            Duration::from_secs(20),
            || async { cluster.healthy(2).await.then_some(()) },
        )
        .await;
        cluster.pause(0);
        cluster.pause(1);
        let refused = wait_for(
            "member 2 to refuse for want of a leader",
            Duration::from_secs(20),
            || async {
                match a.holder("billing").await {
                    Err(e @ etcd_client::Error::GRpcStatus(_)) => Some(e),
                    _ => None,
                }
            },
        )
        .await;
        assert!(
            matches!(refused, etcd_client::Error::GRpcStatus(_)),
            "{refused:?}"
        );
        assert!(
            !matches!(a.renew(&tb).await, Ok(true)),
            "a renewal through a member without a leader"
        );
        cluster.resume(0);
        cluster.resume(1);
    })
    .await;
}

#[tokio::test]
async fn the_etcd_leader_killed_under_a_live_term_does_not_end_it() {
    deadline(Duration::from_secs(120), async {
        let mut cluster = EtcdCluster::start(3).await;
        let a = client(&cluster.endpoints()).await;
        let ttl = Duration::from_secs(2);
        let ta = won(&a, "billing", "a", ttl).await;
        // etcd's leader is killed: the two left elect another, which gives every lease a full
        // TTL again.
        let leader = wait_for("etcd's leader", Duration::from_secs(15), || {
            cluster.leader()
        })
        .await;
        cluster.kill(leader);
        // The two left are a majority: the term renews through them, as a host's heartbeat
        // would, for twice its TTL (a request the client still sends to the dead member fails
        // and the next one is tried), and never finds its lease gone.
        let until = std::time::Instant::now() + ttl * 2;
        let mut renewed = 0;
        while std::time::Instant::now() < until {
            match a.renew(&ta).await {
                Ok(true) => renewed += 1,
                Ok(false) => panic!("the term's lease lapsed after a member was killed"),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(renewed > 0, "no renewal went through the two members left");
        let wrote = wait_for(
            "a fenced write after a member was killed",
            Duration::from_secs(15),
            || async { a.write(&ta, "charge/alice", b"100").await.ok() },
        )
        .await;
        assert!(matches!(wrote, Fenced::Applied { .. }), "{wrote:?}");
        let holder = wait_for("the holder's key", Duration::from_secs(15), || async {
            a.holder("billing").await.ok()
        })
        .await;
        assert_eq!(holder, Some(("a".into(), ta.revision)));
        // A leader among the two left (the killed one is not asked).
        wait_for("a new etcd leader", Duration::from_secs(15), || {
            cluster.leader()
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_user_allowed_only_the_lh_prefix_runs_the_store_with_authentication_on() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let endpoints = cluster.endpoints();
        // etcd's authentication, as an operator sets it up: a root user, and a role for the
        // host that may read and write the prefix lh/ and nothing else.
        let mut admin = etcd_client::Client::connect(&endpoints, None)
            .await
            .unwrap();
        let _ = admin.role_add("root").await;
        admin.user_add("root", "root-pw", None).await.unwrap();
        admin.user_grant_role("root", "root").await.unwrap();
        admin.role_add("leasehold").await.unwrap();
        admin
            .role_grant_permission(
                "leasehold",
                etcd_client::Permission::read_write("lh/").with_prefix(),
            )
            .await
            .unwrap();
        let password = "s3cret:@x";
        admin.user_add("lh-host", password, None).await.unwrap();
        admin.user_grant_role("lh-host", "leasehold").await.unwrap();
        admin.auth_enable().await.unwrap();

        let members: Vec<&str> = endpoints
            .iter()
            .map(|e| e.trim_start_matches("http://"))
            .collect();
        let hosts = members.join(",");
        // The password percent-encoded in the URL (`:` and `@`).
        let url = format!("etcd://lh-host:s3cret%3A%40x@{hosts}");
        let a = EtcdTerms::connect_url(&url, REQUEST)
            .await
            .expect("the host's user is let in");
        // What the store does, each allowed by the role: a campaign with its history entry, a
        // fenced write, a beat with the membership, a notice heard by the one watch, a
        // resignation and a follower's wait.
        let ttl = Duration::from_secs(5);
        let t = won(&a, "billing", "n1:1", ttl).await;
        assert!(matches!(
            answered("a fenced write", || a.write(&t, "k", b"v")).await,
            Fenced::Applied { .. }
        ));
        let beaten = answered("a beat", || {
            a.beat(
                Some(Registration {
                    node: "n1",
                    info: b"{}",
                    ttl,
                }),
                std::slice::from_ref(&t),
            )
        })
        .await;
        assert_eq!(beaten.held, vec![true]);
        assert_eq!(beaten.members.unwrap()[0].0, "n1");
        assert_eq!(
            answered("the history", || a.history("billing", 5))
                .await
                .0
                .len(),
            1
        );
        let (notices, runner) = runner_notices("billing");
        let stop = tokio_util::sync::CancellationToken::new();
        let heard = async {
            watch_open(&a, &runner, "billing").await;
            stop.cancel();
        };
        tokio::join!(a.listen(notices.clone(), stop.clone()), heard);
        assert!(answered("the resignation", || a.resign(&t)).await);
        assert!(answered("a wait", || a.await_vacancy("billing", ttl)).await);

        // The role is what lets it in: outside lh/ the same user is refused.
        let mut raw = etcd_client::Client::connect(
            &endpoints,
            Some(etcd_client::ConnectOptions::new().with_user("lh-host", password)),
        )
        .await
        .unwrap();
        assert!(raw.put("elsewhere", "x", None).await.is_err());
        // A wrong password is refused at once, and not shown.
        let wrong = format!("etcd://lh-host:wrong-pw@{hosts}");
        let refused = EtcdTerms::connect_url(&wrong, REQUEST).await;
        let e = refused.err().expect("a wrong password is refused");
        assert!(!format!("{e} {e:?}").contains("wrong-pw"), "{e}");
    })
    .await;
}

#[tokio::test]
async fn etcds_verifies_the_cluster_and_offers_the_client_certificate_it_requires() {
    deadline(Duration::from_secs(120), async {
        // A private CA; members serving TLS with its certificate for 127.0.0.1 and requiring a
        // client certificate it signed.
        let ca = TestCa::make();
        let (cert, key) = ca.client("lh-host");
        let cluster = EtcdCluster::start_tls(3, &ca).await;
        let hosts: Vec<String> = cluster
            .endpoints()
            .iter()
            .map(|e| e.trim_start_matches("https://").to_string())
            .collect();
        let hosts = hosts.join(",");
        let (ca, cert, key) = (ca.ca.display(), cert.display(), key.display());
        let url = format!("etcds://{hosts}?cacert={ca}&cert={cert}&key={key}");
        let a = EtcdTerms::connect_url(&url, REQUEST)
            .await
            .expect("the cluster trusted through cacert, the client through its certificate");
        let ttl = Duration::from_secs(5);
        let t = won(&a, "billing", "n1:1", ttl).await;
        assert!(matches!(
            answered("a fenced write", || a.write(&t, "k", b"v")).await,
            Fenced::Applied { .. }
        ));
        assert_eq!(
            answered("a read", || a.get("billing", "data:k")).await,
            Some(b"v".to_vec())
        );
        assert!(answered("the resignation", || a.resign(&t)).await);

        // Refused at connect, each for its own reason: no client certificate; the cluster's
        // certificate not trusted (the system's CAs do not know the test CA); plain etcd://
        // against TLS ports.
        for (url, why) in [
            (
                format!("etcds://{hosts}?cacert={ca}"),
                "without a client certificate",
            ),
            (
                format!("etcds://{hosts}?cert={cert}&key={key}"),
                "with a CA the system does not trust",
            ),
            (format!("etcd://{hosts}"), "over plain etcd://"),
        ] {
            let refused = EtcdTerms::connect_url(&url, REQUEST).await;
            assert!(refused.is_err(), "connected {why}");
        }
    })
    .await;
}

#[tokio::test]
async fn the_hosts_one_watch_resumes_on_another_member_without_missing_a_notice() {
    deadline(Duration::from_secs(240), async {
        let mut cluster = EtcdCluster::start(3).await;
        let endpoints = cluster.endpoints();
        let (listener, sender) = (client(&endpoints).await, client(&endpoints).await);
        let (notices, runner) = runner_notices("billing");
        let heard = |what: String| {
            let runner = runner.clone();
            async move {
                poll_until(
                    &format!("the notice {what:?} heard"),
                    Duration::from_secs(30),
                    Duration::from_millis(20),
                    || {
                        let heard = crate::contract::payload(&runner) == what;
                        async move { heard.then_some(()) }
                    },
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            }
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let checks = async {
            watch_open(&sender, &runner, "billing").await;
            // Each member killed in turn (and started again): the watch is on one of them, so
            // at least one kill breaks it. A notice sent right after each kill, while a broken
            // watch is being opened again, is heard: the watch resumes from the revision after
            // the last event it delivered, on a member still there.
            for i in 0..3 {
                cluster.kill(i);
                let what = format!("after member {i} was killed");
                answered("a notice", || {
                    sender.notify("billing", NoticeFor::Runner, &what)
                })
                .await;
                heard(what).await;
                cluster.restart(i, Duration::from_secs(60)).await;
            }
            stop.cancel();
        };
        tokio::join!(listener.listen(notices.clone(), stop.clone()), checks);
    })
    .await;
}

#[tokio::test]
async fn the_hosts_one_watch_cut_off_past_a_compaction_wakes_everyone_to_look_again() {
    deadline(Duration::from_secs(120), async {
        let cluster = EtcdCluster::start(3).await;
        let endpoints = cluster.endpoints();
        // The listener reaches member 0 only, through a proxy that can cut it off.
        let port: u16 = endpoints[0].rsplit(':').next().unwrap().parse().unwrap();
        let proxy = FaultProxy::start(port).await;
        let through = vec![format!("http://127.0.0.1:{}", proxy.port)];
        let (listener, sender) = (client(&through).await, client(&endpoints).await);
        let (notices, runner) = runner_notices("billing");
        let woken = |limit: Duration| {
            let runner = runner.clone();
            async move {
                tokio::time::timeout(limit, runner.wake.notified())
                    .await
                    .is_ok()
            }
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let checks = async {
            watch_open(&sender, &runner, "billing").await;
            // Cut off: the watch hears nothing. Meanwhile a notice is sent, and the cluster's
            // history compacted past it, so the watch cannot resume from where it stopped.
            proxy.set(Fault::Blackhole);
            woken(Duration::from_millis(300)).await; // a wake-up left from the polls above
            answered("a notice while cut off", || {
                sender.notify("billing", NoticeFor::Runner, "missed")
            })
            .await;
            let mut raw = etcd_client::Client::connect(&endpoints, None)
                .await
                .unwrap();
            let revision = raw
                .put("compaction-marker", "x", None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            raw.compact(
                revision,
                Some(etcd_client::CompactionOptions::new().with_physical()),
            )
            .await
            .unwrap();
            // Healed (the cut connections reset): the watch, refused its revision, starts from
            // the present and wakes every registered notice once, with no payload of the
            // notice it could not see.
            proxy.set(Fault::None);
            assert!(
                woken(Duration::from_secs(30)).await,
                "a watch resumed past a compaction wakes everyone"
            );
            assert_eq!(crate::contract::payload(&runner), "up");
            // And it hears what comes next.
            answered("a notice after", || {
                sender.notify("billing", NoticeFor::Runner, "after")
            })
            .await;
            poll_until(
                "the notice after heard",
                Duration::from_secs(30),
                Duration::from_millis(20),
                || {
                    let heard = crate::contract::payload(&runner) == "after";
                    async move { heard.then_some(()) }
                },
            )
            .await
            .unwrap();
            stop.cancel();
        };
        tokio::join!(listener.listen(notices.clone(), stop.clone()), checks);
    })
    .await;
}
