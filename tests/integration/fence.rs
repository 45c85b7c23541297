//! The fence (I1, I2) and token growth (I8), against a real Redis.

use std::time::Duration;

use leasehold::coord::fence::{self, FenceError, Refusal, TermWrite, Written};
use leasehold::coord::lease::{self, Acquired};
use leasehold::coord::quota::{self, Quota, QuotaUsage};
use leasehold::store::keys::JobKeys;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use crate::harness::{RedisServer, deadline};

const TTL: Duration = Duration::from_secs(30);

async fn grant(conn: &mut MultiplexedConnection, keys: &JobKeys, owner: &str) -> u64 {
    match lease::acquire(conn, keys, owner, TTL).await.unwrap() {
        Acquired::Granted { token } => token,
        other => panic!("{owner} expected the lease, got {other:?}"),
    }
}

/// Ends the current lease the way an expiry would (the key disappears).
async fn expire(conn: &mut MultiplexedConnection, keys: &JobKeys) {
    let _: i64 = conn.del(keys.lease()).await.unwrap();
}

async fn put(
    conn: &mut MultiplexedConnection,
    keys: &JobKeys,
    owner: &str,
    token: u64,
    value: &str,
) -> Result<(), FenceError> {
    fence::unchecked::write(
        conn,
        keys,
        owner,
        token,
        &[(keys.data("result"), value.as_bytes())],
    )
    .await
}

async fn result(conn: &mut MultiplexedConnection, keys: &JobKeys) -> Option<String> {
    conn.get(keys.data("result")).await.unwrap()
}

#[tokio::test]
async fn a_stale_token_is_refused_after_a_newer_term_wrote() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let k = JobKeys::new("stale");
        let t1 = grant(&mut c, &k, "a:1").await;
        put(&mut c, &k, "a:1", t1, "from a").await.unwrap();
        expire(&mut c, &k).await;
        let t2 = grant(&mut c, &k, "b:1").await;
        assert!(t2 > t1);
        put(&mut c, &k, "b:1", t2, "from b").await.unwrap();
        let err = put(&mut c, &k, "a:1", t1, "late a").await.unwrap_err();
        assert!(matches!(&err, FenceError::Refused(Refusal::Stale { token, fence_token, fence_holder }) if *token == t1 && *fence_token == t2 && fence_holder == "b:1"), "{err}");
        assert_eq!(result(&mut c, &k).await.as_deref(), Some("from b"));
    })
    .await;
}

#[tokio::test]
async fn the_fence_is_raised_when_a_term_starts_before_it_writes_anything() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let k = JobKeys::new("takeover");
        let t1 = grant(&mut c, &k, "a:1").await;
        put(&mut c, &k, "a:1", t1, "partial from a").await.unwrap();
        expire(&mut c, &k).await;
        let t2 = grant(&mut c, &k, "b:1").await;
        // b has written nothing; a wakes up and tries to finish.
        let err = put(&mut c, &k, "a:1", t1, "final from a").await.unwrap_err();
        assert!(matches!(&err, FenceError::Refused(Refusal::Stale { fence_token, .. }) if *fence_token == t2), "{err}");
        assert_eq!(result(&mut c, &k).await.as_deref(), Some("partial from a"));
    })
    .await;
}

#[tokio::test]
async fn an_equal_token_from_another_holder_is_refused() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let k = JobKeys::new("equal");
        let t = grant(&mut c, &k, "a:1").await;
        put(&mut c, &k, "a:1", t, "from a").await.unwrap();
        // A counter that went backwards hands the same token to b, who also holds the lease.
        let _: () = c.set(k.lease(), "b:1").await.unwrap();
        let err = put(&mut c, &k, "b:1", t, "from b").await.unwrap_err();
        assert!(matches!(&err, FenceError::Refused(Refusal::OtherHolder { token, fence_holder }) if *token == t && fence_holder == "a:1"), "{err}");
        assert_eq!(result(&mut c, &k).await.as_deref(), Some("from a"));
    })
    .await;
}

#[tokio::test]
async fn a_write_is_refused_once_its_term_no_longer_holds_the_lease() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let k = JobKeys::new("lapsed");
        let t = grant(&mut c, &k, "a:1").await;
        expire(&mut c, &k).await;
        // Nobody has taken over: the fence alone would accept t, the lease compare does not.
        let err = put(&mut c, &k, "a:1", t, "from a").await.unwrap_err();
        assert!(matches!(&err, FenceError::Refused(Refusal::NotLeaseholder { lease_holder }) if lease_holder.is_empty()), "{err}");
        assert_eq!(result(&mut c, &k).await, None);
    })
    .await;
}

#[tokio::test]
async fn tokens_keep_growing_when_the_counter_or_everything_is_lost() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let k = JobKeys::new("reseed");
        let mut last = grant(&mut c, &k, "a:1").await;
        assert!(last < 1 << 53, "token {last} must stay below 2^53");
        type Loss = fn(&JobKeys) -> redis::Cmd;
        let losses: &[(&str, Loss)] = &[
            ("counter deleted", |k| {
                redis::cmd("DEL").arg(k.token()).clone()
            }),
            ("counter reset to 0", |k| {
                redis::cmd("SET").arg(k.token()).arg(0).clone()
            }),
            ("fence deleted", |k| {
                redis::cmd("DEL").arg(k.fence()).clone()
            }),
            ("counter and fence deleted", |k| {
                redis::cmd("DEL").arg(k.token()).arg(k.fence()).clone()
            }),
            ("whole database flushed", |_| redis::cmd("FLUSHALL").clone()),
        ];
        for (i, (what, loss)) in losses.iter().enumerate() {
            expire(&mut c, &k).await;
            let _: () = loss(&k).query_async(&mut c).await.unwrap();
            let owner = format!("n:{i}");
            let token = grant(&mut c, &k, &owner).await;
            assert!(
                token > last,
                "after {what}: token {token} is not above the previous {last}"
            );
            assert!(
                token < 1 << 53,
                "after {what}: token {token} must stay below 2^53"
            );
            // and the previous term's writes are fenced
            let err = put(&mut c, &k, "old:1", last, "stale").await.unwrap_err();
            assert!(matches!(err, FenceError::Refused(_)), "after {what}: {err}");
            last = token;
        }
    })
    .await;
}

#[tokio::test]
async fn guest_writes_are_counted_and_refused_past_the_storage_quota() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let k = JobKeys::new("quota");
        let t = grant(&mut c, &k, "a:1").await;
        let quota = Quota {
            keys: 2,
            bytes: 1000,
        };
        // Each data key counts its full key's length and its value's.
        let size = |key: &str, value: usize| (k.data(key).len() + value) as u64;
        let mut write = async |key: &str, value: Vec<u8>, create: bool| {
            let sets = [(k.data(key), value.as_slice())];
            let w = TermWrite {
                create,
                quota: Some(quota),
                ..TermWrite::new(&sets, &[])
            };
            fence::unchecked::invoke(&mut c, &k, ("a:1", t), &w).await
        };
        let first = write("a", vec![1; 10], false).await.unwrap();
        assert_eq!(first.usage, Some((1, size("a", 10))));
        let second = write("b", vec![1; 10], false).await.unwrap();
        let both = size("a", 10) + size("b", 10);
        assert_eq!(second.usage, Some((2, both)));
        // A third key is past the quota of keys: refused, nothing written.
        let err = write("c", vec![1; 10], false).await.unwrap_err();
        assert!(
            matches!(
                err,
                FenceError::Quota(QuotaUsage {
                    keys: 3,
                    max_keys: 2,
                    max_bytes: 1000,
                    ..
                })
            ),
            "{err}"
        );
        assert!(err.to_string().contains("storage quota exceeded"), "{err}");
        // Growing a key past the quota of bytes: refused, the old value stays.
        let err = write("a", vec![2; 990], false).await.unwrap_err();
        assert!(
            matches!(err, FenceError::Quota(QuotaUsage { keys: 2, .. })),
            "{err}"
        );
        // Shrinking is always allowed, and counted.
        let shrunk = write("a", vec![3; 4], false).await.unwrap();
        assert_eq!(shrunk.usage, Some((2, size("a", 4) + size("b", 10))));
        // A create that finds its key writes and counts nothing.
        let existing = write("b", vec![9; 500], true).await.unwrap();
        assert_eq!(
            existing,
            Written {
                created: false,
                deleted: 0,
                usage: None
            }
        );
        let mut c = redis.conn().await;
        let (keys, bytes) = quota::usage(&mut c, &k).await.unwrap();
        assert_eq!((keys, bytes), (2, size("a", 4) + size("b", 10)));
        let c_value: Option<Vec<u8>> = c.get(k.data("c")).await.unwrap();
        assert_eq!(c_value, None);
        let a_value: Vec<u8> = c.get(k.data("a")).await.unwrap();
        assert_eq!(a_value, vec![3; 4]);
        // The host's own records are not counted.
        fence::unchecked::write(
            &mut c,
            &k,
            "a:1",
            t,
            &[(k.run("2026-11-02"), b"{}".as_slice())],
        )
        .await
        .unwrap();
        assert_eq!(quota::usage(&mut c, &k).await.unwrap(), (keys, bytes));
    })
    .await;
}

/// Issue 23, defect 4: the count never went down, so a job over its quota stayed over it after
/// an operator deleted keys by hand. `leasehold purge JOB --prefix P` deletes by prefix and
/// subtracts what it deletes; `--recount` puts a count right that hand deletions left wrong.
/// Both through the real binary.
#[tokio::test]
async fn purge_frees_quota_that_hand_deletions_did_not() {
    deadline(Duration::from_secs(60), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let k = JobKeys::new("purged");
        let t = grant(&mut c, &k, "a:1").await;
        let quota = Quota {
            keys: 10,
            bytes: 1 << 20,
        };
        let write = async |c: &mut MultiplexedConnection, key: String| {
            let sets = [(k.data(&key), b"0123456789".as_slice())];
            let w = TermWrite {
                quota: Some(quota),
                ..TermWrite::new(&sets, &[])
            };
            fence::unchecked::invoke(c, &k, ("a:1", t), &w).await
        };
        for i in 0..10 {
            let prefix = if i < 6 { "old" } else { "keep" };
            write(&mut c, format!("{prefix}/{i}")).await.unwrap();
        }
        assert!(matches!(
            write(&mut c, "new/0".into()).await,
            Err(FenceError::Quota(_))
        ));
        // Deleted by hand: nothing is freed (the defect, as documented).
        let _: i64 = c.del(k.data("old/0")).await.unwrap();
        assert!(matches!(
            write(&mut c, "new/0".into()).await,
            Err(FenceError::Quota(_))
        ));
        // --recount counts what is there: 9 keys.
        let url = redis.url();
        let out =
            crate::harness::run_leasehold(&["purge", "purged", "--recount", "--redis-url", &url]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            said.contains("purged keeps 9 keys") && said.contains("was 10 keys"),
            "{said}"
        );
        let size = |prefix: &str, range: std::ops::Range<u32>| -> u64 {
            range
                .map(|i| (k.data(&format!("{prefix}/{i}")).len() + 10) as u64)
                .sum()
        };
        let kept = size("keep", 6..10);
        assert_eq!(
            quota::usage(&mut c, &k).await.unwrap(),
            (9, size("old", 1..6) + kept)
        );
        // --prefix deletes old/*, subtracting exactly what it deletes; keep/* stays.
        let out = crate::harness::run_leasehold(&[
            "purge",
            "purged",
            "--prefix",
            "old/",
            "--redis-url",
            &url,
        ]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("deleted 5 keys"), "{said}");
        assert!(said.contains("purged keeps 4 keys"), "{said}");
        assert_eq!(quota::usage(&mut c, &k).await.unwrap(), (4, kept));
        let left: Vec<String> = c.keys(k.data("*")).await.unwrap();
        assert_eq!(left.len(), 4, "{left:?}");
        assert!(
            left.iter().all(|key| key.contains(":data:keep/")),
            "{left:?}"
        );
        // The job may write again.
        write(&mut c, "new/0".into()).await.unwrap();
        // A glob character in the prefix is literal; a bad call names what is missing.
        let out = crate::harness::run_leasehold(&[
            "purge",
            "purged",
            "--prefix",
            "*",
            "--redis-url",
            &url,
        ]);
        assert!(String::from_utf8_lossy(&out.stdout).contains("deleted 0 keys"));
        let out = crate::harness::run_leasehold(&["purge", "purged", "--redis-url", &url]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--prefix") && err.contains("--recount"),
            "{err}"
        );
    })
    .await;
}

/// Issue 23, item 7 (suspected, confirmed by reading the client): the redis crate's cluster
/// client sends a request again after a dropped connection (`RetryMethod::Reconnect`), whether
/// or not Redis applied it; a resent `create` then finds its own key and answers "exists", a
/// resent `delete` finds nothing. A guest's create and delete now carry a write id, and a
/// resend of the same call answers as the first did. Shown by sending the same script call
/// twice, as the client's resend does.
#[tokio::test]
async fn a_resent_create_or_delete_answers_as_the_first_call_did() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = redis.conn().await;
        let k = JobKeys::new("resent");
        let t = grant(&mut c, &k, "a:1").await;
        let quota = Some(Quota {
            keys: 100,
            bytes: 1 << 20,
        });
        let sets = [(k.data("charge/1"), b"100".as_slice())];
        let create = |id| TermWrite {
            create: true,
            quota,
            id,
            ..TermWrite::new(&sets, &[])
        };
        let first = fence::unchecked::invoke(&mut c, &k, ("a:1", t), &create(Some("w1")))
            .await
            .unwrap();
        assert!(first.created);
        let resent = fence::unchecked::invoke(&mut c, &k, ("a:1", t), &create(Some("w1")))
            .await
            .unwrap();
        assert_eq!(resent, first, "a resend answers as the first call did");
        // Without an id, the same resend says the key existed: the ambiguity that was reported.
        let blind = fence::unchecked::invoke(&mut c, &k, ("a:1", t), &create(None))
            .await
            .unwrap();
        assert!(!blind.created);
        // A new call (a new id) that finds the key is told so.
        let again = fence::unchecked::invoke(&mut c, &k, ("a:1", t), &create(Some("w2")))
            .await
            .unwrap();
        assert!(!again.created);
        // The same for a delete.
        let deletes = [k.data("charge/1")];
        let delete = |id| TermWrite {
            quota,
            id,
            ..TermWrite::new(&[], &deletes)
        };
        let gone = fence::unchecked::invoke(&mut c, &k, ("a:1", t), &delete(Some("w3")))
            .await
            .unwrap();
        assert_eq!(gone.deleted, 1);
        let resent = fence::unchecked::invoke(&mut c, &k, ("a:1", t), &delete(Some("w3")))
            .await
            .unwrap();
        assert_eq!(resent.deleted, 1);
        assert_eq!(quota::usage(&mut c, &k).await.unwrap(), (0, 0));
        // The kept answer expires within a minute.
        let ttl: i64 = c.pttl(k.applied("w3")).await.unwrap();
        assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
        // A resend after the term ended is refused like any write of it.
        expire(&mut c, &k).await;
        let late = fence::unchecked::invoke(&mut c, &k, ("a:1", t), &create(Some("w1"))).await;
        assert!(matches!(late, Err(FenceError::Refused(_))), "{late:?}");
    })
    .await;
}
