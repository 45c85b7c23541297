//! A Redis Cluster behind [`super::Conn`]: the slot map, the host's own connection to each
//! primary, and a [`super::Batch`] sent as one pipeline per primary.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::AsyncConnectionConfig;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisError, RedisResult, Value};

use super::*;

#[derive(Clone)]
pub(super) struct Cluster {
    pub(super) conn: ClusterConnection,
    /// Slot ranges → primary address (`host:port`), as `CLUSTER SLOTS` said last, and when.
    pub(super) slots: Arc<RwLock<SlotMap>>,
    /// The host's own connection to each primary, for batches.
    pub(super) nodes:
        Arc<tokio::sync::Mutex<std::collections::HashMap<String, MultiplexedConnection>>>,
    /// `scheme://userinfo@` of the seeds: a primary's URL is this and its address.
    pub(super) node_url: Arc<str>,
    /// Timeouts of those connections.
    pub(super) config: AsyncConnectionConfig,
}

/// Slot ranges (inclusive) → primary address, and when they were read.
pub(super) type SlotMap = (Vec<(u16, u16, String)>, Option<std::time::Instant>);

/// How often a cluster's slot map is read at least.
pub(super) const SLOT_MAP_AGE: Duration = Duration::from_secs(30);

impl Cluster {
    /// Reads the slot map (`CLUSTER SLOTS`).
    pub(super) async fn refresh_slots(&self) -> RedisResult<()> {
        let v = self
            .conn
            .clone()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        let ranges: Vec<Value> = redis::from_redis_value(v)?;
        let mut map = Vec::new();
        for r in ranges {
            let items: Vec<Value> = redis::from_redis_value(r)?;
            let mut it = items.into_iter();
            let (Some(start), Some(end), Some(node)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let node: Vec<Value> = redis::from_redis_value(node)?;
            let mut n = node.into_iter();
            let (Some(host), Some(port)) = (n.next(), n.next()) else {
                continue;
            };
            let host: String = redis::from_redis_value(host)?;
            let port: u16 = redis::from_redis_value(port)?;
            map.push((
                redis::from_redis_value(start)?,
                redis::from_redis_value(end)?,
                format!("{host}:{port}"),
            ));
        }
        map.sort();
        *self.slots.write().expect("slot map") = (map, Some(std::time::Instant::now()));
        Ok(())
    }

    /// The host's connection to primary `addr` (opened on first use).
    pub(super) async fn node(&self, addr: &str) -> RedisResult<MultiplexedConnection> {
        let mut nodes = self.nodes.lock().await;
        if let Some(c) = nodes.get(addr) {
            return Ok(c.clone());
        }
        let client = redis::Client::open(format!("{}{addr}", self.node_url))?;
        let c = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        nodes.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    /// The primary that owns `slot` in the last slot map read.
    pub(super) fn owner(&self, slot: u16) -> Option<String> {
        let map = &self.slots.read().expect("slot map").0;
        let i = map.partition_point(|(_, end, _)| *end < slot);
        map.get(i)
            .filter(|(start, _, _)| *start <= slot)
            .map(|(_, _, addr)| addr.clone())
    }

    /// Every primary in the last slot map read.
    pub(super) fn primaries(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .slots
            .read()
            .expect("slot map")
            .0
            .iter()
            .map(|(_, _, a)| a.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    pub(super) async fn batch(&mut self, kind: &str, batch: &Batch) -> Vec<RedisResult<Value>> {
        let stale = self
            .slots
            .read()
            .expect("slot map")
            .1
            .is_none_or(|at| at.elapsed() > SLOT_MAP_AGE);
        if stale {
            crate::metrics::get().round_trip("slot-map");
            let _ = self.refresh_slots().await;
        }
        let mut by_node: BTreeMap<Option<String>, Vec<usize>> = BTreeMap::new();
        for (i, slot) in batch.slots.iter().enumerate() {
            by_node.entry(self.owner(*slot)).or_default().push(i);
        }
        let mut out: Vec<Option<RedisResult<Value>>> = vec![None; batch.cmds.len()];
        let loads = batch.scripts.len();
        let sends = by_node.iter().filter_map(|(addr, idx)| {
            let addr = addr.clone()?;
            let pipe = batch.pipeline_of(idx);
            let me = self.clone();
            crate::metrics::get().round_trip(kind);
            Some(async move {
                let res = match me.node(&addr).await {
                    Ok(mut conn) => conn.req_packed_commands(&pipe, loads, idx.len()).await,
                    Err(e) => Err(e),
                };
                (addr, idx, res)
            })
        });
        let replies = futures_util::future::join_all(sends).await;
        let mut again = Vec::new();
        for (addr, idx, res) in replies {
            match res {
                Ok(values) if values.len() == idx.len() => {
                    for (i, v) in idx.iter().zip(values) {
                        match v.extract_error() {
                            Err(e) if redirected(&e) => again.push(*i),
                            r => out[*i] = Some(r),
                        }
                    }
                }
                // The primary did not answer (it failed over, or the connection broke): its
                // commands go again through the cluster client, and the connection is dropped.
                _ => {
                    self.nodes.lock().await.remove(&addr);
                    again.extend(idx.iter().copied());
                }
            }
        }
        // Slots no known primary owns are sent through the cluster client too.
        if let Some(unknown) = by_node.get(&None) {
            again.extend(unknown.iter().copied());
        }
        if !again.is_empty() {
            let _ = self.refresh_slots().await;
            // The script loads and the command as one pipeline each, all at once: the cluster
            // client routes each by its command's slot and follows redirects; scripts live per
            // node, so the new owner gets them first.
            let resends = again.iter().map(|&i| {
                let pipe = batch.pipeline_of(&[i]);
                let mut conn = self.conn.clone();
                async move {
                    let res = conn
                        .req_packed_commands(&pipe, loads, 1)
                        .await
                        .and_then(|mut v| {
                            v.pop().map(Value::extract_error).unwrap_or_else(|| {
                                Err(RedisError::from((redis::ErrorKind::Client, "no reply")))
                            })
                        });
                    (i, res)
                }
            });
            for (i, res) in futures_util::future::join_all(resends).await {
                out[i] = Some(res);
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(RedisError::from((redis::ErrorKind::Client, "no reply"))))
            })
            .collect()
    }
}

/// Whether `e` means the command's slot lives elsewhere now (or is moving).
pub(super) fn redirected(e: &RedisError) -> bool {
    use redis::ServerErrorKind as S;
    matches!(
        e.kind(),
        redis::ErrorKind::Server(S::Moved | S::Ask | S::TryAgain)
    )
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first
/// `{` and the next `}`, when not empty) or of the whole key, modulo 16384.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let len = bytes[open + 1..].iter().position(|b| *b == b'}')?;
            (len > 0).then(|| &bytes[open + 1..open + 1 + len])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for b in tagged {
        crc ^= u16::from(*b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}
