//! The host's store, opened at start-up: Redis or etcd, as `--redis-url` (alias `--store`)
//! names it, behind the seam ([`crate::coord::term_store::Store`]) the rest of the host uses.
//!
//! **Redis**: two connections (the main one for runners, guests and the HTTP API, bounded by a
//! lease TTL per command; one on the lease runtime for the electors, campaigns and heartbeat),
//! the deployment checked at start-up ([`crate::store::deployment`]: version, eviction policy)
//! and again every [`DEPLOYMENT_RECHECK_HEARTBEATS`] heartbeats, a Sentinel service's primary
//! looked up again at the same pace.
//!
//! **etcd**: one client, opened on the lease runtime (its connection tasks live there, beside
//! the heartbeat that must not be starved) and shared by both halves; it must answer a
//! linearizable read at start-up. etcd has no eviction and no settings the host depends on
//! that it can read (`--max-txn-ops` is not visible to clients: a write over it is refused
//! before it is sent, naming the flag), so there is no recheck.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::config::NodeConfig;
use crate::coord::lease_thread::LeaseRuntime;
use crate::coord::term_store::{RedisTerms, Store};
use crate::store::deployment::DeploymentError;
use crate::store::{self, Conn};

/// How often (in heartbeats, at least once a second) the host reads its Redis's settings again
/// ([`crate::store::deployment`]): an eviction policy set after start-up stops the host.
pub(super) const DEPLOYMENT_RECHECK_HEARTBEATS: u32 = 10;

/// The host's store, both halves, and what stops the host when the store becomes unsafe.
pub(super) struct Stores {
    /// For runners, guests, the listener and the HTTP API.
    pub seam: Store,
    /// The same store for the electors, the campaigns and the heartbeat (on the lease runtime).
    pub lease_seam: Store,
    /// Cancelled when the store was found unsafe while the host runs (Redis set to evict).
    pub unsafe_: CancellationToken,
    /// Why, once `unsafe_` is cancelled.
    pub refusal: Arc<Mutex<Option<DeploymentError>>>,
}

/// Opens the store `cfg` names for node `node`, checking what the host depends on in it.
pub(super) async fn open(
    cfg: &NodeConfig,
    node: &str,
    leases: &LeaseRuntime,
) -> anyhow::Result<Stores> {
    if crate::coord::term_store::names_etcd(&cfg.redis_url) {
        open_etcd(cfg, node, leases).await
    } else {
        open_redis(cfg, node, leases).await
    }
}

async fn open_etcd(cfg: &NodeConfig, node: &str, leases: &LeaseRuntime) -> anyhow::Result<Stores> {
    let url = cfg.redis_url.clone();
    let timeout = cfg.timing.redis_timeout;
    let store = leases
        .handle()
        .spawn(async move {
            let store = Store::open(&url, timeout).await?;
            store.ping().await.map_err(|e| {
                anyhow::anyhow!(
                    "etcd at {} does not answer a read: {e:#}",
                    store::redact(&url)
                )
            })?;
            anyhow::Ok(store)
        })
        .await??;
    info!(node = %node, store = %store::redact(&cfg.redis_url), "etcd checked: it answers a linearizable read");
    Ok(Stores {
        seam: store.clone(),
        lease_seam: store,
        unsafe_: CancellationToken::new(),
        refusal: Arc::new(Mutex::new(None)),
    })
}

async fn open_redis(cfg: &NodeConfig, node: &str, leases: &LeaseRuntime) -> anyhow::Result<Stores> {
    let node = node.to_string();
    // Run records, checkpoints and guest writes: bounded by the term they belong to (and by one
    // lease TTL per command), not by the Redis timeout: a large write over a slow link may take
    // longer than a renewal may.
    let conn = Conn::connect(
        &cfg.redis_url,
        cfg.timing.redis_timeout,
        Some(cfg.timing.lease_ttl),
    )
    .await?;
    // What the host depends on in Redis is checked, not assumed.
    match crate::store::deployment::check(&mut conn.clone(), cfg.allow_evicting_redis).await? {
        d if d.maxmemory_policy != "noeviction" => {
            warn!(node = %node, version = %d.version, policy = %d.maxmemory_policy, "redis maxmemory-policy is {}: Redis may evict leases, fences and run records, and a period could run twice (allowed by --allow-evicting-redis)", d.maxmemory_policy);
        }
        d => {
            info!(node = %node, version = %d.version, policy = %d.maxmemory_policy, "redis checked")
        }
    }
    // ... and checked again while the host runs (a `CONFIG SET` after start-up): a Redis that
    // may now evict stops the host as the start-up check would have, after a clean shutdown.
    // (A Sentinel service's primary is looked up again at the same pace.)
    let store_unsafe = CancellationToken::new();
    let store_refusal = Arc::new(Mutex::new(None));
    {
        let allow_evicting = cfg.allow_evicting_redis;
        let (conn, stop, refusal) = (conn.clone(), store_unsafe.clone(), store_refusal.clone());
        let every =
            (cfg.timing.heartbeat * DEPLOYMENT_RECHECK_HEARTBEATS).max(Duration::from_secs(1));
        let node = node.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.cancelled() => return,
                }
                // A Sentinel service's primary is looked up again here too, not only after
                // errors (a no-op for a node or a cluster).
                if let Err(e) = conn.follow_primary().await {
                    warn!(node = %node, "cannot ask the sentinels for the primary: {e}");
                }
                if allow_evicting {
                    continue;
                }
                match crate::store::deployment::check(&mut conn.clone(), false).await {
                    Ok(_) => {}
                    // INFO unanswered (Redis restarting, a cut): the leases decide meanwhile.
                    Err(crate::store::deployment::DeploymentError::Unknown(_)) => {}
                    Err(e) => {
                        error!(node = %node, "{e}; stopping: releasing every lease and exiting");
                        *refusal.lock().expect("store refusal") = Some(e);
                        stop.cancel();
                        return;
                    }
                }
            }
        });
    }
    let lease_conn = {
        let url = cfg.redis_url.clone();
        let timeout = cfg.timing.redis_timeout;
        leases
            .handle()
            .spawn(async move { Conn::connect(&url, timeout, Some(timeout)).await })
            .await??
    };
    let clients = store::pubsub_clients(&cfg.redis_url)?;
    // The store behind the seam: term writes, guest reads, token raises, the runners' reads,
    // the one listener and the HTTP API go through it; tasks still take the connection above.
    let seam = Store::redis(RedisTerms::new(
        conn.clone(),
        clients.clone(),
        cfg.timing.redis_timeout,
    ));
    // The same store over the lease connection, for the electors, the campaigns and the
    // heartbeat (on the lease runtime).
    let lease_seam = Store::redis(RedisTerms::new(
        lease_conn,
        clients,
        cfg.timing.redis_timeout,
    ));
    Ok(Stores {
        seam,
        lease_seam,
        unsafe_: store_unsafe,
        refusal: store_refusal,
    })
}
