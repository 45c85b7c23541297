//! The `stores` rows: Redis and a 3-member etcd cluster side by side at the store seam
//! (`leasehold::coord::term_store`), so a user can choose with figures: a fenced write against
//! the store's plain write, a hand-over (the holder resigns, a waiting follower is woken and
//! wins) and a lapse at each store's smallest practical TTL (the holder stops renewing, as a
//! crashed host does; a waiting follower wins), and what one host's heartbeat costs etcd with
//! 1,000 jobs over three hosts (requests counted by etcd). In process, no `leasehold` host: these are the
//! store's share of a failover, not a host's end to end (the host does not run on etcd yet).

use std::time::{Duration, Instant};

use leasehold::coord::term_store::{Campaign, RedisTerms, StoreTerm, TermStore, Written};
use leasehold::store::etcd::{Campaign as EtcdCampaign, EtcdTerm, EtcdTerms, Registration};
use leasehold_harness::{EtcdCluster, RedisServer};
use redis::AsyncCommands;

use super::{Row, row, summary};

pub(super) async fn stores(rows: &mut Vec<Row>) {
    eprintln!("Redis and etcd at the store seam");
    let redis = RedisServer::start().await;
    let cluster = EtcdCluster::start(3).await;
    let endpoints = cluster.endpoints();
    let etcd = || async {
        EtcdTerms::connect(&endpoints, Duration::from_secs(5))
            .await
            .unwrap()
    };
    let rterms = || async {
        RedisTerms::open(&redis.url(), Duration::from_secs(5))
            .await
            .unwrap()
    };

    // Fenced writes against the store's plain write, interleaved in rounds of 100.
    let n = 3000;
    let value = vec![b'x'; 100];
    let a = etcd().await;
    let term = won(&a, "bench-write", "a", Duration::from_secs(600)).await;
    let mut plain_client = etcd_client::Client::connect(&endpoints, None)
        .await
        .unwrap();
    let (mut plain, mut fenced) = (Vec::new(), Vec::new());
    for _ in 0..n / 100 {
        for _ in 0..100 {
            let t = Instant::now();
            plain_client
                .put("bench/plain", value.clone(), None)
                .await
                .unwrap();
            plain.push(t.elapsed().as_secs_f64() * 1e6);
        }
        for _ in 0..100 {
            let t = Instant::now();
            assert_eq!(
                TermStore::write(&a, &term, "k", &value).await.unwrap(),
                Written::Applied
            );
            fenced.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let (_, p_med, p_p99) = summary(&mut plain);
    let (_, f_med, f_p99) = summary(&mut fenced);
    let mut set_conn = redis.conn().await;
    let r = rterms().await;
    let rterm = won(&r, "bench-write", "a", Duration::from_secs(600)).await;
    let (mut set, mut rfenced) = (Vec::new(), Vec::new());
    for _ in 0..n / 100 {
        for _ in 0..100 {
            let t = Instant::now();
            let _: () = set_conn.set("bench:plain", &value).await.unwrap();
            set.push(t.elapsed().as_secs_f64() * 1e6);
        }
        for _ in 0..100 {
            let t = Instant::now();
            assert_eq!(
                r.write(&rterm, "k", &value).await.unwrap(),
                Written::Applied
            );
            rfenced.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let (_, s_med, _) = summary(&mut set);
    let (_, rf_med, _) = summary(&mut rfenced);
    rows.push(row(
        "etcd: fenced write (100 B, one at a time) against a plain put",
        format!(
            "median {f_med:.0} / p99 {f_p99:.0} µs ({:.2}× put)",
            f_med / p_med
        ),
        &format!(
            "plain put median {p_med:.0} / p99 {p_p99:.0} µs; Redis in the same run: fenced {rf_med:.0} µs, SET {s_med:.0} µs"
        ),
        "stated (beside the Redis row)",
        None,
    ));

    // Hand-over: the follower waits, the holder resigns; from the resignation's start to the
    // follower's won campaign.
    let trials = 30;
    let (a, b) = (etcd().await, etcd().await);
    let mut e_hand = hand_overs(&a, &b, trials).await;
    let (ra, rb) = (rterms().await, rterms().await);
    let mut r_hand = hand_overs(&ra, &rb, trials).await;
    let (_, e_med, e_p99) = summary(&mut e_hand);
    let (_, r_med, r_p99) = summary(&mut r_hand);
    rows.push(row(
        "hand-over at the store: resign → a waiting follower's won campaign",
        format!("etcd: median {e_med:.1} / p99 {e_p99:.1} ms"),
        &format!("Redis: median {r_med:.1} / p99 {r_p99:.1} ms"),
        "stated",
        None,
    ));

    // A lapse: each trial a fresh client (a fresh etcd lease), one renewal, then silence.
    let trials = 10;
    let ttl = Duration::from_secs(1);
    let mut e_lapse = Vec::new();
    let mut e_ttl = Duration::ZERO;
    for i in 0..trials {
        let (a, b) = (etcd().await, etcd().await);
        let (ms, granted) = lapse(&a, &b, &format!("lapse-{i}"), ttl).await;
        e_lapse.push(ms);
        e_ttl = granted;
    }
    let mut r_lapse = Vec::new();
    for i in 0..trials {
        let (a, b) = (rterms().await, rterms().await);
        r_lapse.push(lapse(&a, &b, &format!("lapse-{i}"), ttl).await.0);
    }
    let (_, e_med, e_p99) = summary(&mut e_lapse);
    let (_, r_med, r_p99) = summary(&mut r_lapse);
    rows.push(row(
        "lapse at the store, smallest practical TTL: last renewal → a waiting follower's won campaign",
        format!(
            "etcd (TTL {} s as granted; members at --election-timeout 500): median {e_med:.0} / p99 {e_p99:.0} ms",
            e_ttl.as_secs_f64()
        ),
        &format!("Redis (TTL 1 s): median {r_med:.0} / p99 {r_p99:.0} ms"),
        "stated",
        None,
    ));

    // 1,000 jobs over three hosts: what one host's heartbeat (its registration and its ≈333
    // terms) costs etcd, counted by etcd's own metrics.
    let hosts = [etcd().await, etcd().await, etcd().await];
    let ttl = Duration::from_secs(60);
    let mut led: Vec<Vec<EtcdTerm>> = vec![Vec::new(), Vec::new(), Vec::new()];
    for i in 0..1000 {
        let k = i % 3;
        match hosts[k]
            .campaign(&format!("job-{i}"), &format!("h{k}:{i}"), ttl)
            .await
            .unwrap()
        {
            EtcdCampaign::Won(t) => led[k].push(t),
            held => panic!("h{k} expected to win job-{i}, found {held:?}"),
        }
    }
    let info = vec![b'x'; 300];
    let beats = 20;
    let before = cluster.requests_served().await;
    let mut beat_ms = Vec::new();
    for _ in 0..beats {
        for (k, host) in hosts.iter().enumerate() {
            let node = format!("h{k}");
            let registration = Registration {
                node: &node,
                info: &info,
                ttl,
            };
            let t = Instant::now();
            let beaten = host.beat(Some(registration), &led[k]).await.unwrap();
            beat_ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(beaten.held.iter().all(|h| *h), "h{k} lost a term");
        }
    }
    let served = cluster.requests_served().await - before;
    let per_beat = served as f64 / (beats * hosts.len()) as f64;
    let (_, b_med, b_p99) = summary(&mut beat_ms);
    rows.push(row(
        "etcd, 1,000 jobs × 3 hosts at the store: requests per host per heartbeat (its registration and ≈333 terms)",
        format!("{per_beat:.2} (counted by etcd); a beat median {b_med:.1} / p99 {b_p99:.1} ms"),
        "one keep-alive and ⌈(2 + terms) / 128⌉ transactions (etcd's --max-txn-ops); Redis: 1.00 round trip per host per heartbeat, the host's own (2026-12-02); balance is the host's, not measured on etcd",
        "stated",
        None,
    ));
}

async fn won<S: TermStore>(store: &S, job: &str, owner: &str, ttl: Duration) -> StoreTerm {
    match store.campaign(job, owner, ttl).await.unwrap() {
        Campaign::Won(t) => t,
        held => panic!("{owner} expected to win {job}, found {held:?}"),
    }
}

/// `trials` hand-overs of one job between `a` and `b`, in milliseconds.
async fn hand_overs<S: TermStore>(a: &S, b: &S, trials: usize) -> Vec<f64> {
    let ttl = Duration::from_secs(30);
    let (mut holder, mut follower) = (a, b);
    let mut term = won(holder, "bench-hand", "h0", ttl).await;
    let mut out = Vec::new();
    for i in 1..=trials {
        let owner = format!("h{i}");
        let follow = async {
            // Let the follower's wait start before the resignation (it is what is timed).
            assert!(
                follower
                    .await_vacancy("bench-hand", Duration::from_secs(10))
                    .await
                    .unwrap()
            );
            let t = won(follower, "bench-hand", &owner, ttl).await;
            (t, Instant::now())
        };
        let resign = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let start = Instant::now();
            assert!(holder.resign(&term).await.unwrap());
            start
        };
        let ((next, done), start) = tokio::join!(follow, resign);
        out.push(done.duration_since(start).as_secs_f64() * 1e3);
        term = next;
        std::mem::swap(&mut holder, &mut follower);
    }
    out
}

/// `a` wins `job` with `ttl`, renews once and goes silent; `b`, waiting, wins it: the time from
/// `a`'s renewal (answered) to `b`'s win in milliseconds, and the TTL the store granted.
async fn lapse<S: TermStore>(a: &S, b: &S, job: &str, ttl: Duration) -> (f64, Duration) {
    let term = won(a, job, "a", ttl).await;
    assert!(a.renew(&term).await.unwrap());
    let renewed = Instant::now();
    loop {
        if b.await_vacancy(job, Duration::from_secs(30)).await.unwrap()
            && let Campaign::Won(_) = b.campaign(job, "b", ttl).await.unwrap()
        {
            break;
        }
    }
    (renewed.elapsed().as_secs_f64() * 1e3, term.ttl)
}
