//! Electors as in-process tasks against a real Redis: exactly one leader, and a takeover with
//! a higher token when the leader's lease expires.

use std::collections::HashMap;
use std::time::Duration;

use leasehold::coord::elector::{Elector, Role};
use leasehold::coord::notices::{Notice, listen_for_releases};
use leasehold::coord::term_store::{RedisTerms, Store};
use leasehold::node::config::Timing;
use leasehold::store::Conn;
use leasehold::store::keys::JobKeys;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::harness::{RedisServer, deadline, wait_for};

fn leader_token(role: &watch::Receiver<Role>) -> Option<u64> {
    role.borrow().term().map(|t| t.token())
}

#[tokio::test]
async fn one_of_three_leads_and_a_follower_takes_over_with_a_higher_token() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let timing = Timing::new(Duration::from_millis(600), Duration::from_millis(150), None, None).unwrap();
        let mut nodes = Vec::new();
        for i in 0..3 {
            let conn = connect(&redis).await;
            let (role_tx, role_rx) = watch::channel(Role::Candidate);
            let resign = CancellationToken::new();
            let elector = Elector { job: "recon".into(), node: format!("n{i}"), timing, keys: JobKeys::new("recon"), released: Notice::with_payload(), replicas: None, members: no_members(), hand_over: watch::channel(0).1, version: watch::channel(String::new()).1, heartbeat: heartbeat(&store_of(&redis, &conn), timing, &format!("n{i}")), campaigns: campaigns(&store_of(&redis, &conn)) };
            let task = tokio::spawn(elector.run(store_of(&redis, &conn), role_tx, resign.clone()));
            nodes.push((task, role_rx, resign));
        }
        let (first, token) = wait_for("a leader", Duration::from_secs(10), || {
            let found = nodes.iter().enumerate().find_map(|(i, n)| leader_token(&n.1).map(|t| (i, t)));
            async move { found }
        })
        .await;
        // Followers see the leader; nobody else leads.
        wait_for("two followers", Duration::from_secs(10), || {
            let followers = nodes.iter().filter(|n| matches!(&*n.1.borrow(), Role::Follower { leader } if leader.starts_with(&format!("n{first}:")))).count();
            async move { (followers == 2).then_some(()) }
        })
        .await;
        assert_eq!(nodes.iter().filter(|n| leader_token(&n.1).is_some()).count(), 1);

        // Crash the leader (its task stops renewing, nothing is released).
        let (task, _, _) = &nodes[first];
        task.abort();
        let (second, newer) = wait_for("a new leader", Duration::from_secs(10), || {
            let found = nodes.iter().enumerate().filter(|(i, _)| *i != first).find_map(|(i, n)| leader_token(&n.1).map(|t| (i, t)));
            async move { found }
        })
        .await;
        assert_ne!(second, first);
        assert!(newer > token, "new token {newer} must exceed {token}");

        // A clean resignation releases the lease: the third node takes over.
        nodes[second].2.cancel();
        let third = wait_for("the third node to lead", Duration::from_secs(10), || {
            let found = nodes.iter().enumerate().filter(|(i, _)| *i != first && *i != second).find_map(|(i, n)| leader_token(&n.1).map(|t| (i, t)));
            async move { found }
        })
        .await;
        assert!(third.1 > newer);
        wait_for("the resigned node to stop", Duration::from_secs(5), || {
            let stopped = matches!(&*nodes[second].1.borrow(), Role::Stopped);
            async move { stopped.then_some(()) }
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_resigning_leader_hands_over_without_waiting_for_the_ttl() {
    // The lease lives 60 s; the test's whole deadline is 20 s. Only the release notice can
    // make the follower lead in time.
    deadline(Duration::from_secs(20), async {
        let redis = RedisServer::start().await;
        let timing =
            Timing::new(Duration::from_secs(60), Duration::from_secs(5), None, None).unwrap();
        let keys = JobKeys::new("handover");
        let mut nodes = Vec::new();
        for i in 0..2 {
            let conn = connect(&redis).await;
            let released = Notice::with_payload();
            let stop = CancellationToken::new();
            let channels = HashMap::from([(keys.released_channel(), released.clone())]);
            tokio::spawn(listen_for_releases(
                leasehold::store::PubSubSource::Nodes(vec![redis.client()]),
                std::sync::Arc::new(std::sync::Mutex::new(channels)),
                stop.clone(),
            ));
            let (role_tx, role_rx) = watch::channel(Role::Candidate);
            let resign = CancellationToken::new();
            let elector = Elector {
                job: "handover".into(),
                node: format!("n{i}"),
                timing,
                keys: keys.clone(),
                released,
                replicas: None,
                members: no_members(),
                hand_over: watch::channel(0).1,
                version: watch::channel(String::new()).1,
                heartbeat: heartbeat(&store_of(&redis, &conn), timing, &format!("n{i}")),
                campaigns: campaigns(&store_of(&redis, &conn)),
            };
            tokio::spawn(elector.run(store_of(&redis, &conn), role_tx, resign.clone()));
            // Let n0 win before n1 starts, so that n1 is the follower.
            if i == 0 {
                let mut r = role_rx.clone();
                tokio::time::timeout(Duration::from_secs(5), r.wait_for(|r| r.term().is_some()))
                    .await
                    .expect("n0 leads")
                    .unwrap();
            }
            nodes.push((role_rx, resign, stop));
        }
        wait_for("n1 to follow", Duration::from_secs(5), || {
            let following = matches!(&*nodes[1].0.borrow(), Role::Follower { .. });
            async move { following.then_some(()) }
        })
        .await;
        let first = leader_token(&nodes[0].0).unwrap();
        nodes[0].1.cancel();
        let second = wait_for(
            "n1 to lead after n0 resigned",
            Duration::from_secs(10),
            || {
                let t = leader_token(&nodes[1].0);
                async move { t }
            },
        )
        .await;
        assert!(second > first);
    })
    .await;
}

/// An empty membership: every elector campaigns at once (balancing is tested with real hosts in
/// `balance.rs`).
fn no_members() -> watch::Receiver<leasehold::coord::members::View> {
    watch::channel(leasehold::coord::members::View::default()).1
}

/// A connection to the test's Redis, as a host opens it.
async fn connect(redis: &RedisServer) -> Conn {
    Conn::connect(
        &redis.url(),
        Duration::from_secs(2),
        Some(Duration::from_secs(2)),
    )
    .await
    .unwrap()
}

/// The host's store over `conn` (what an elector campaigns and releases with).
fn store_of(redis: &RedisServer, conn: &Conn) -> Store {
    Store::redis(RedisTerms::new(
        conn.clone(),
        leasehold::store::PubSubSource::Nodes(vec![redis.client()]),
        Duration::from_secs(2),
    ))
}

/// A heartbeat of its own for one elector (node `node`), on the test's runtime.
fn heartbeat(store: &Store, timing: Timing, node: &str) -> leasehold::coord::heartbeat::Heartbeat {
    leasehold::coord::heartbeat::Heartbeat::start(
        &tokio::runtime::Handle::current(),
        store.clone(),
        timing,
        leasehold::coord::heartbeat::Member {
            node: node.to_string(),
            info: leasehold::coord::members::MemberInfo::with_capacity(1),
            view: watch::channel(leasehold::coord::members::View::default()).0,
            tasks: Box::new(leasehold::coord::members::WorkerStats::default),
        },
        CancellationToken::new(),
    )
    .0
}

/// A campaign coalescer of its own for one elector, on the test's runtime.
fn campaigns(store: &Store) -> leasehold::coord::campaigns::Campaigns {
    leasehold::coord::campaigns::Campaigns::start(
        &tokio::runtime::Handle::current(),
        store.clone(),
        CancellationToken::new(),
    )
}
