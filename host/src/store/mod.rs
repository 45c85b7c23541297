//! Redis connections: one place that sets timeouts, hides passwords in messages, and speaks to
//! one Redis node, the primary of a Sentinel service ([`sentinel`]) or a Redis Cluster behind
//! the same type ([`Conn`]).
//!
//! URLs: `redis://[user:password@]host:port[/db]`, `rediss://…` for TLS, and
//! `unix:///path/to/redis.sock` for a Unix socket (what `./dev sample` uses). A **Redis
//! Cluster** is named by its seed nodes: `redis+cluster://[user:password@]host:port,host:port,…`
//! (`rediss+cluster://…` for TLS); the client learns the rest of the cluster from them and
//! follows it as slots move. A **Sentinel** service is named by its sentinels and the service
//! name: `redis+sentinel://[user:password@]host:port,host:port/service` (`rediss+sentinel://`
//! for TLS to the data nodes; the credentials are the data nodes', the sentinels are asked
//! without). TLS verifies the server against the system's CA store;
//! `SSL_CERT_FILE` (a PEM bundle) or `SSL_CERT_DIR` point at other CAs, e.g. a private one.
//!
//! **Commands on a cluster.** Every script and pipeline of one job touches keys of that job
//! only, which share its hash tag (`{job}`) and so one slot: the cluster client routes them by
//! their first key and follows `MOVED`/`ASK` redirects while a slot moves. What spans many jobs
//! (the host's heartbeat: membership, every renewal, follower checks, idle runners' reads) is a
//! [`Batch`]: one pipeline on a single node, one pipeline *per primary* on a cluster (grouped by
//! the slot map the host reads with `CLUSTER SLOTS`, at least every 30 s), all sent at once
//! over a connection of the host's own to each primary (so that one redirected command is not a
//! resent pipeline); a command a primary redirects (its slot moved), or a primary that does not
//! answer (a failover), has its commands sent again one by one, concurrently, through the
//! cluster client, which follows the redirect or finds the new primary, and the slot map is
//! read again.
//!
//! The files: [`url`] (URLs, TLS, redaction, notice subscriptions), [`conn`] (the connection
//! type), [`cluster`] (slot map and per-primary pipelines), [`batch`] (the heartbeat's
//! round trip), [`sentinel`], [`keys`] (every key the host uses), [`deployment`] (what the
//! host checks about its Redis), [`notice`] (what a host registers to be woken by notices, on
//! either store), and [`etcd`] (terms on an etcd cluster: the first part of the etcd store, not
//! yet used by the host). This is the bottom layer: it uses nothing of the crate but
//! [`crate::units`] and [`crate::metrics`].

mod batch;
mod cluster;
mod conn;
pub mod deployment;
pub mod etcd;
pub mod keys;
pub mod notice;
pub mod sentinel;
mod url;

pub use batch::Batch;
pub use cluster::slot_of;
pub use conn::Conn;
pub use sentinel::SentinelTarget;
pub use url::{PubSubSource, Target, install_tls_provider, pubsub_clients, redact, target};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("rediss://app:s3cret@redis:6380/0"),
            "rediss://app:***@redis:6380/0"
        );
        assert_eq!(redact("redis://:pw@h"), "redis://:***@h");
        assert_eq!(
            redact("redis+cluster://app:pw@a:1,b:2"),
            "redis+cluster://app:***@a:1,b:2"
        );
    }

    #[test]
    fn slots_are_redis_cluster_slots() {
        // From `CLUSTER KEYSLOT`.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("somekey"), 11058);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("lh:{billing}:lease"), slot_of("billing"));
        // An empty tag hashes the whole key.
        assert_eq!(slot_of("a{}b"), slot_of("a{}b"));
        assert_ne!(slot_of("a{}b"), slot_of(""));
    }

    #[test]
    fn cluster_urls_name_their_seeds_with_the_credentials() {
        assert_eq!(
            target("redis+cluster://u:p@10.0.0.1:7000,10.0.0.2:7001"),
            Ok(Target::Cluster(vec![
                "redis://u:p@10.0.0.1:7000".into(),
                "redis://u:p@10.0.0.2:7001".into()
            ]))
        );
        assert_eq!(
            target("rediss+cluster://h:1/"),
            Ok(Target::Cluster(vec!["rediss://h:1".into()]))
        );
        assert_eq!(
            target("redis://h:1"),
            Ok(Target::Node("redis://h:1".into()))
        );
        for bad in ["redis+cluster://", "redis-sentinel://h:1", "h:1"] {
            assert!(target(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn sentinel_urls_name_their_sentinels_service_and_the_nodes_credentials() {
        assert_eq!(
            target("redis+sentinel://app:pw@10.0.0.1:26379,10.0.0.2:26380/ledger"),
            Ok(Target::Sentinel(SentinelTarget {
                sentinels: vec![
                    "redis://10.0.0.1:26379".into(),
                    "redis://10.0.0.2:26380".into()
                ],
                service: "ledger".into(),
                username: Some("app".into()),
                password: Some("pw".into()),
                tls: false,
            }))
        );
        let Ok(Target::Sentinel(t)) = target("rediss+sentinel://:pw@h:1/svc") else {
            panic!("not a sentinel target");
        };
        assert_eq!(
            (t.username, t.password, t.tls),
            (None, Some("pw".into()), true)
        );
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel:///svc",
            "redis+sentinel://h:1/a/b",
        ] {
            assert!(target(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(
            redact("redis+sentinel://app:pw@h:1/svc"),
            "redis+sentinel://app:***@h:1/svc"
        );
    }
}
