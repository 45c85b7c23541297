//! The store contract for terms (`leasehold::coord::term_store`, `docs/store-contract.md`),
//! tested against both stores by the same tests: a real `redis-server` and a real 3-member etcd
//! cluster. One term at a time, growing tokens, writes fenced by the term in the store itself,
//! resign only one's own, a term not renewed lapsing and its late write refused.

use std::time::Duration;

use leasehold::coord::term_store::{Campaign, RedisTerms, StoreTerm, TermStore, Written};
use leasehold::store::etcd::EtcdTerms;
use leasehold_harness::{EtcdCluster, poll_until};

use crate::harness::*;

async fn won<S: TermStore>(store: &S, job: &str, owner: &str, ttl: Duration) -> StoreTerm {
    match answered("a campaign", || store.campaign(job, owner, ttl)).await {
        Campaign::Won(t) => t,
        held => panic!("{owner} expected to win {job}, found {held:?}"),
    }
}

/// Two clients `a` and `b` of one store.
async fn one_term_at_a_time<S: TermStore>(a: &S, b: &S) {
    let ttl = Duration::from_secs(5);
    let ta = won(a, "billing", "a", ttl).await;
    assert_eq!(
        answered("b's campaign", || b.campaign("billing", "b", ttl)).await,
        Campaign::Held { owner: "a".into() }
    );
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

async fn redis_pair(redis: &RedisServer) -> (RedisTerms, RedisTerms) {
    (
        RedisTerms::new(redis.conn().await),
        RedisTerms::new(redis.conn().await),
    )
}

async fn etcd_pair(cluster: &EtcdCluster) -> (EtcdTerms, EtcdTerms) {
    let endpoints = cluster.endpoints();
    let connect = || EtcdTerms::connect(&endpoints, Duration::from_secs(5));
    (connect().await.unwrap(), connect().await.unwrap())
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
