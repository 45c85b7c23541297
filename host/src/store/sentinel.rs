//! Redis Sentinel: the primary is found through the sentinels, and followed when they fail it
//! over (`redis+sentinel://[user:password@]host:port,host:port/service`).
//!
//! A [`Sentinel`] keeps one connection to the primary the sentinels name (a
//! [`ConnectionManager`], which reconnects to that address by itself). After any error of a
//! command on it, and at least every time the host checks its Redis's settings
//! ([`crate::store::deployment`], every ten heartbeats), it asks the sentinels again which node is the
//! primary of the service (`SENTINEL MASTERS`, then `ROLE` on the node they name: the redis
//! crate's sentinel client) and, when that is another node, moves every later command to it.
//! The failed command itself is not sent again: like any write after a lost reply it may have
//! been applied, and the caller treats it so.
//!
//! **What this guarantees**, with the fence: a term's writes are checked against the lease and
//! the fence *in the Redis that applies them*, so a write that reaches the new primary after a
//! failover is judged by what that primary holds. **What it does not**: Sentinel's replication
//! is asynchronous, so a failover may promote a replica that lost acknowledged writes; with
//! `--min-replicas N` a write counts only once N replicas acknowledged it (README, "Replicas and
//! failover"). A host cut off from the sentinels but not from the old primary keeps writing to
//! it until the old primary is demoted; those writes are lost with it, which `--min-replicas`
//! (an old primary cut off from its replicas acknowledges nothing) turns into failed writes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{Sentinel as Sentinels, SentinelNodeConnectionInfo};
use redis::{RedisError, RedisResult};

/// The sentinels are asked again at most this often after errors.
const FOLLOW_AT_MOST_EVERY: Duration = Duration::from_millis(250);

/// What a `redis+sentinel://` URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelTarget {
    /// The sentinels, as single-node URLs (no credentials: those are the data nodes').
    pub sentinels: Vec<String>,
    /// The monitored service (`sentinel monitor <name> …`).
    pub service: String,
    /// Username for the data nodes, if any.
    pub username: Option<String>,
    /// Password for the data nodes, if any.
    pub password: Option<String>,
    /// Whether the data nodes speak TLS (`rediss+sentinel://`).
    pub tls: bool,
}

impl SentinelTarget {
    /// The redis crate's sentinel client for these sentinels, and how it connects to the nodes.
    fn client(&self) -> RedisResult<(Sentinels, SentinelNodeConnectionInfo)> {
        let sentinels = Sentinels::build(self.sentinels.clone())?;
        let mut info = redis::RedisConnectionInfo::default();
        if let Some(u) = &self.username {
            info = info.set_username(u);
        }
        if let Some(p) = &self.password {
            info = info.set_password(p);
        }
        let mut node = SentinelNodeConnectionInfo::default().set_redis_connection_info(info);
        if self.tls {
            node = node.set_tls_mode(redis::TlsMode::Secure);
        }
        Ok((sentinels, node))
    }

    /// A client of the primary the sentinels name now (checked with `ROLE`), within `timeout`.
    pub(super) async fn primary(&self, timeout: Duration) -> RedisResult<redis::Client> {
        let (mut sentinels, node) = self.client()?;
        bounded(
            timeout,
            sentinels.async_master_for(&self.service, Some(&node)),
        )
        .await
    }
}

/// A connection that follows the primary of a Sentinel service (module doc). Cheap to clone.
#[derive(Clone)]
pub(super) struct Sentinel(Arc<State>);

struct State {
    target: SentinelTarget,
    sentinels: tokio::sync::Mutex<(Sentinels, SentinelNodeConnectionInfo)>,
    config: ConnectionManagerConfig,
    timeout: Duration,
    /// The primary's address and the connection to it.
    current: Mutex<(String, ConnectionManager)>,
    /// When the sentinels were last asked.
    asked: Mutex<Option<Instant>>,
}

impl Sentinel {
    /// Finds the primary of `target` and connects to it; `timeout` bounds each question to the
    /// sentinels and each connection.
    pub(super) async fn connect(
        target: SentinelTarget,
        config: ConnectionManagerConfig,
        timeout: Duration,
    ) -> RedisResult<Self> {
        let mut sentinels = target.client()?;
        let client = bounded(
            timeout,
            sentinels
                .0
                .async_master_for(&target.service, Some(&sentinels.1)),
        )
        .await?;
        let addr = client.get_connection_info().addr().to_string();
        let conn = ConnectionManager::new_with_config(client, config.clone()).await?;
        tracing::info!(service = %target.service, primary = %addr, "redis primary found through the sentinels");
        Ok(Sentinel(Arc::new(State {
            target,
            sentinels: tokio::sync::Mutex::new(sentinels),
            config,
            timeout,
            current: Mutex::new((addr, conn)),
            asked: Mutex::new(None),
        })))
    }

    /// The connection to the primary as last found.
    pub(super) fn conn(&self) -> ConnectionManager {
        self.0.current.lock().expect("sentinel primary").1.clone()
    }

    /// The primary's address as last found.
    pub(super) fn primary_addr(&self) -> String {
        self.0.current.lock().expect("sentinel primary").0.clone()
    }

    /// After an error of a command: asks the sentinels again (at most every
    /// [`FOLLOW_AT_MOST_EVERY`]), in case the primary moved.
    pub(super) async fn after_error(&self, _e: &RedisError) {
        {
            let mut asked = self.0.asked.lock().expect("sentinel asked");
            if asked.is_some_and(|t| t.elapsed() < FOLLOW_AT_MOST_EVERY) {
                return;
            }
            *asked = Some(Instant::now());
        }
        if let Err(e) = self.follow().await {
            tracing::debug!(service = %self.0.target.service, "cannot ask the sentinels for the primary: {e}");
        }
    }

    /// Asks the sentinels which node is the primary and moves to it if it is another one;
    /// true when it moved.
    pub(super) async fn follow(&self) -> RedisResult<bool> {
        let client = {
            let mut s = self.0.sentinels.lock().await;
            let (sentinels, node) = &mut *s;
            bounded(
                self.0.timeout,
                sentinels.async_master_for(&self.0.target.service, Some(node)),
            )
            .await?
        };
        let addr = client.get_connection_info().addr().to_string();
        if addr == self.primary_addr() {
            return Ok(false);
        }
        let conn = bounded(
            self.0.timeout,
            ConnectionManager::new_with_config(client, self.0.config.clone()),
        )
        .await?;
        let was = std::mem::replace(
            &mut *self.0.current.lock().expect("sentinel primary"),
            (addr.clone(), conn),
        );
        tracing::warn!(service = %self.0.target.service, from = %was.0, to = %addr, "redis primary moved (a Sentinel failover): commands go to the new primary");
        Ok(true)
    }
}

/// `call` within `timeout`, a timeout being an I/O error.
async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer from the sentinels or the primary they name",
            )))
        })
}
