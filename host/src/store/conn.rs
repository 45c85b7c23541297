//! [`Conn`]: one connection type over a node, a Sentinel service's primary or a cluster.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use redis::AsyncConnectionConfig;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::cluster::Cluster;
use super::*;

/// A connection to Redis, one node or a cluster (cheap to clone: clones share the
/// connection). It reconnects by itself; every command is bounded by the timeouts it was opened
/// with.
#[derive(Clone)]
pub struct Conn(Inner);

#[derive(Clone)]
enum Inner {
    Node(ConnectionManager),
    Sentinel(sentinel::Sentinel),
    Cluster(Cluster),
}

impl Conn {
    /// Opens a connection to what `url` names: connecting fails after `timeout`, and each
    /// command after `response_timeout` when one is given. Callers still bound calls where
    /// correctness needs it: lease calls by the Redis timeout (I3), a term's writes by the term.
    pub async fn connect(
        url: &str,
        timeout: Duration,
        response_timeout: Option<Duration>,
    ) -> anyhow::Result<Conn> {
        let target = target(url).map_err(anyhow::Error::msg)?;
        let open = async {
            match target {
                Target::Node(url) => {
                    let client = redis::Client::open(url.as_str())
                        .with_context(|| format!("invalid redis url {}", redact(&url)))?;
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(response_timeout)
                        .set_number_of_retries(2)
                        .set_max_delay(Duration::from_millis(500));
                    let conn = ConnectionManager::new_with_config(client, config).await?;
                    Ok::<_, anyhow::Error>(Conn(Inner::Node(conn)))
                }
                Target::Sentinel(target) => {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(response_timeout)
                        .set_number_of_retries(2)
                        .set_max_delay(Duration::from_millis(500));
                    let s = sentinel::Sentinel::connect(target, config, timeout).await?;
                    Ok(Conn(Inner::Sentinel(s)))
                }
                Target::Cluster(seeds) => {
                    let node_url: Arc<str> = seeds[0]
                        .rsplit_once('@')
                        .map(|(u, _)| format!("{u}@"))
                        .unwrap_or_else(|| {
                            let scheme = seeds[0].split("://").next().unwrap_or("redis");
                            format!("{scheme}://")
                        })
                        .into();
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(response_timeout);
                    let mut builder = redis::cluster::ClusterClientBuilder::new(seeds)
                        .connection_timeout(timeout)
                        .retries(3)
                        .min_retry_wait(10)
                        .max_retry_wait(200);
                    if let Some(t) = response_timeout {
                        builder = builder.response_timeout(t);
                    }
                    let client = builder.build()?;
                    let conn = client.get_async_connection().await?;
                    let cluster = Cluster {
                        conn,
                        slots: Arc::default(),
                        nodes: Arc::default(),
                        node_url,
                        config,
                    };
                    cluster.refresh_slots().await?;
                    Ok(Conn(Inner::Cluster(cluster)))
                }
            }
        };
        tokio::time::timeout(timeout * 4, open)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "cannot reach redis at {}: no answer within {}",
                    redact(url),
                    crate::units::show(timeout * 4)
                )
            })?
            .with_context(|| format!("cannot reach redis at {}", redact(url)))
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.0, Inner::Cluster(_))
    }

    /// For a Sentinel service: asks the sentinels which node is the primary now and moves to it
    /// if it changed (true). Nothing to do, false, for a node or a cluster.
    pub async fn follow_primary(&self) -> RedisResult<bool> {
        match &self.0 {
            Inner::Sentinel(s) => s.follow().await,
            _ => Ok(false),
        }
    }

    /// Sends `batch` in one round trip per node: one pipeline on a single node, one per primary
    /// (all at once) on a cluster. Each command answers for itself, in the order added; a
    /// command whose node could not be asked gets that node's error. Counts the pipelines as
    /// round trips of `kind` ([`crate::metrics`]).
    pub async fn batch(&mut self, kind: &str, batch: &Batch) -> Vec<RedisResult<Value>> {
        if batch.cmds.is_empty() {
            return Vec::new();
        }
        let (mut conn, sentinel) = match &mut self.0 {
            Inner::Node(conn) => (conn.clone(), None),
            Inner::Sentinel(s) => (s.conn(), Some(s.clone())),
            Inner::Cluster(cluster) => return cluster.batch(kind, batch).await,
        };
        crate::metrics::get().round_trip(kind);
        let pipe = batch.pipeline(0..batch.cmds.len());
        let loads = batch.scripts.len();
        match conn
            .req_packed_commands(&pipe, loads, batch.cmds.len())
            .await
        {
            Ok(values) => {
                let values: Vec<RedisResult<Value>> =
                    values.into_iter().map(Value::extract_error).collect();
                if let (Some(s), Some(Err(e))) = (&sentinel, values.iter().find(|v| v.is_err())) {
                    s.after_error(e).await;
                }
                values
            }
            Err(e) => {
                if let Some(s) = &sentinel {
                    s.after_error(&e).await;
                }
                batch.cmds.iter().map(|_| Err(e.clone())).collect()
            }
        }
    }

    /// Sends `cmd` to every primary (the one node, or each primary of the cluster) and returns
    /// each one's address and answer: how the host checks its Redis's settings everywhere.
    pub async fn on_every_primary(&mut self, cmd: &Cmd) -> RedisResult<Vec<(String, Value)>> {
        match &mut self.0 {
            Inner::Node(conn) => Ok(vec![(String::new(), conn.req_packed_command(cmd).await?)]),
            Inner::Sentinel(s) => Ok(vec![(
                s.primary_addr(),
                s.conn().req_packed_command(cmd).await?,
            )]),
            Inner::Cluster(cluster) => {
                let mut out = Vec::new();
                for addr in cluster.primaries() {
                    // On the host's own connection to each primary: a primary that does not
                    // answer (a failover under way) fails this call alone, instead of making
                    // the cluster client rebuild every connection (the periodic settings check
                    // would do that every ten heartbeats until the slot map moved on).
                    let answer = async { cluster.node(&addr).await?.req_packed_command(cmd).await };
                    match answer.await {
                        Ok(v) => out.push((addr, v)),
                        Err(e) => {
                            cluster.nodes.lock().await.remove(&addr);
                            let _ = cluster.refresh_slots().await;
                            return Err(e);
                        }
                    }
                }
                Ok(out)
            }
        }
    }

    /// Every key matching `pattern` on the node that holds `key`'s slot (`SCAN`): a job's own
    /// keys only, since its keys share one slot. Used once per job to index records written
    /// before the run index existed.
    pub async fn scan_slot(&mut self, key: &str, pattern: &str) -> RedisResult<Vec<String>> {
        let mut names = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            let v = match &mut self.0 {
                Inner::Node(conn) => conn.req_packed_command(&scan).await?,
                Inner::Sentinel(s) => s.conn().req_packed_command(&scan).await?,
                Inner::Cluster(cluster) => {
                    let addr = cluster.owner(slot_of(key)).ok_or_else(|| {
                        RedisError::from((redis::ErrorKind::Client, "no primary owns the slot"))
                    })?;
                    cluster
                        .conn
                        .route_command(scan, RoutingInfo::SingleNode(by_address(&addr)?))
                        .await?
                }
            };
            let (next, batch): (u64, Vec<String>) = redis::from_redis_value(v)?;
            names.extend(batch);
            if next == 0 {
                return Ok(names);
            }
            cursor = next;
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Inner::Node(c) => c.req_packed_command(cmd),
            Inner::Sentinel(s) => Box::pin(async move {
                let r = s.conn().req_packed_command(cmd).await;
                if let Err(e) = &r {
                    s.after_error(e).await;
                }
                r
            }),
            Inner::Cluster(c) => c.conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Inner::Node(c) => c.req_packed_commands(cmd, offset, count),
            Inner::Sentinel(s) => Box::pin(async move {
                let r = s.conn().req_packed_commands(cmd, offset, count).await;
                if let Err(e) = &r {
                    s.after_error(e).await;
                }
                r
            }),
            Inner::Cluster(c) => c.conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Inner::Node(c) => c.get_db(),
            Inner::Sentinel(s) => s.conn().get_db(),
            Inner::Cluster(_) => 0,
        }
    }
}

pub(super) fn by_address(addr: &str) -> RedisResult<SingleNodeRoutingInfo> {
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?)))
        .ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::Client,
                "bad node address",
                addr.to_string(),
            ))
        })?;
    Ok(SingleNodeRoutingInfo::ByAddress { host, port })
}
