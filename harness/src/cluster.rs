//! A real Redis Cluster on this machine: `redis-server` nodes in cluster mode, each on ports
//! the harness picks ([`RedisConfig::cluster`]), joined by `redis-cli --cluster create`, and
//! killed on drop.
//!
//! A cluster is ready once every node reports `cluster_state:ok` with every slot assigned and
//! agrees on which primary owns each slot. [`RedisCluster::url`] is the seed-node URL a
//! `leasehold` host takes (`redis+cluster://host:port,host:port,…`).
//!
//! [`RedisCluster::move_slot`] moves one slot, with its keys, from its primary to another
//! while clients keep using it (`CLUSTER SETSLOT … IMPORTING/MIGRATING`, `MIGRATE` in batches,
//! then `SETSLOT … NODE`): what `redis-cli --cluster reshard` does, for one chosen slot.

use std::process::Command;
use std::time::Duration;

use crate::redis::{RedisConfig, RedisServer};
use crate::wait::poll_until;

/// How long a new cluster may take to agree on its slots.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A Redis Cluster of primaries (and optionally a replica each) started by the harness.
pub struct RedisCluster {
    /// Every node, primaries first (in `redis-cli --cluster create` order, replicas after).
    pub nodes: Vec<RedisServer>,
    primaries: usize,
    replicas: usize,
}

/// One primary as `CLUSTER SLOTS` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Primary {
    /// `host:port`.
    pub addr: String,
    /// The node id.
    pub id: String,
    /// Slot ranges it owns (inclusive).
    pub slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts `primaries` primaries with `replicas` replicas each and joins them; panics if it
    /// cannot (redis-server and redis-cli must be on PATH: `./dev test` installs them).
    pub async fn start(primaries: usize, replicas: usize) -> Self {
        let mut nodes = Vec::new();
        for _ in 0..primaries * (1 + replicas) {
            nodes.push(RedisServer::start_with(RedisConfig::new().cluster()).await);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli --cluster create: {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster {
            nodes,
            primaries,
            replicas,
        };
        cluster.wait_ready().await;
        cluster
    }

    /// Waits until every node reports the cluster ok, knows every node, and agrees on the
    /// owners of the slots, and every replica has synced with its primary: each primary counts
    /// its replicas online (a node told to replicate only after the others agree is still a
    /// primary without slots for a moment, so "no replica out of sync" alone passes too early).
    pub async fn wait_ready(&self) {
        let want = self.nodes.len();
        let online = format!("connected_slaves:{}", self.replicas);
        poll_until(
            "the cluster to agree on its slots",
            READY_WITHIN,
            Duration::from_millis(100),
            || async {
                let mut maps = Vec::new();
                for n in &self.nodes {
                    let mut c = n.conn().await;
                    let info: String = ::redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query_async(&mut c)
                        .await
                        .ok()?;
                    let ok = info.contains("cluster_state:ok")
                        && info.contains("cluster_slots_assigned:16384")
                        && info.contains(&format!("cluster_known_nodes:{want}"));
                    if !ok {
                        return None;
                    }
                    // A replica counts once it has synced with its primary (only a synced one can
                    // be promoted).
                    let replication: String = ::redis::cmd("INFO")
                        .arg("replication")
                        .query_async(&mut c)
                        .await
                        .ok()?;
                    if replication.contains("role:slave")
                        && !replication.contains("master_link_status:up")
                    {
                        return None;
                    }
                    let map = slots_of(&mut c).await?;
                    let me = format!("127.0.0.1:{}", n.port);
                    let owns_slots = map.iter().any(|p| p.addr == me);
                    if owns_slots
                        && self.replicas > 0
                        && (!replication.contains(&online)
                            || replicas_behind(&replication, 0).is_none())
                    {
                        return None;
                    }
                    maps.push(map);
                }
                maps.windows(2).all(|w| w[0] == w[1]).then_some(())
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// The seed-node URL for `leasehold` (its primaries): `redis+cluster://127.0.0.1:p,…`.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes[..self.primaries]
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The primaries as the first node sees them now.
    pub async fn primaries(&self) -> Vec<Primary> {
        self.primaries_seen_by(0).await
    }

    /// The primaries as node `i` sees them now.
    pub async fn primaries_seen_by(&self, i: usize) -> Vec<Primary> {
        let mut c = self.nodes[i].conn().await;
        slots_of(&mut c).await.expect("CLUSTER SLOTS")
    }

    /// Kills primary `i` (SIGKILL) and waits until node `witness` sees `slot` owned by another
    /// node (its replica, promoted by the cluster); returns that node's index.
    ///
    /// Before the kill it waits until the replicas have acknowledged everything primary `i` had
    /// written ([`RedisCluster::wait_replicated`]): the promoted replica then has at least what
    /// was written before this call (later writes may be lost, as replication is asynchronous).
    pub async fn fail_over(&mut self, i: usize, slot: u16, witness: usize) -> usize {
        let dead = format!("127.0.0.1:{}", self.nodes[i].port);
        self.wait_replicated(i).await;
        self.nodes[i].kill();
        let me = &*self;
        let dead = dead.as_str();
        let addr = poll_until(
            "a replica promoted in the dead primary's place",
            READY_WITHIN,
            Duration::from_millis(100),
            || async move {
                let mut c = me.nodes[witness].conn().await;
                let owner = slots_of(&mut c)
                    .await?
                    .into_iter()
                    .find(|p| p.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))?;
                (owner.addr != dead).then_some(owner.addr)
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        self.index_of(&addr)
    }

    /// Waits until every replica of primary `i` has acknowledged the primary's replication
    /// offset as it is now. Replicas acknowledge about once a second, so this takes up to that.
    pub async fn wait_replicated(&self, i: usize) {
        let info = |c: ::redis::aio::MultiplexedConnection| async move {
            let mut c = c;
            ::redis::cmd("INFO")
                .arg("replication")
                .query_async::<String>(&mut c)
                .await
                .ok()
        };
        let now = info(self.nodes[i].conn().await)
            .await
            .and_then(|r| field(&r, "master_repl_offset")?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("node {i} reports no replication offset"));
        let node = &self.nodes[i];
        poll_until(
            "the replicas to acknowledge the primary's writes",
            READY_WITHIN,
            Duration::from_millis(50),
            || async move {
                let r = info(node.conn().await).await?;
                (replicas_behind(&r, now)? == 0).then_some(())
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// The node (index into [`RedisCluster::nodes`]) of the primary that owns `slot` now.
    pub async fn owner_of(&self, slot: u16) -> usize {
        let p = self
            .primaries()
            .await
            .into_iter()
            .find(|p| p.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .expect("every slot has an owner");
        self.index_of(&p.addr)
    }

    fn index_of(&self, addr: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| format!("127.0.0.1:{}", n.port) == addr)
            .unwrap_or_else(|| panic!("{addr} is not a node of this cluster"))
    }

    /// The slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
    pub async fn slot_of(&self, key: &str) -> u16 {
        let mut c = self.nodes[0].conn().await;
        ::redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut c)
            .await
            .expect("CLUSTER KEYSLOT")
    }

    /// The node id of node `i`.
    pub async fn node_id(&self, i: usize) -> String {
        let mut c = self.nodes[i].conn().await;
        ::redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(&mut c)
            .await
            .expect("CLUSTER MYID")
    }

    /// Moves `slot` and every key in it from its primary to primary `to` (an index into
    /// [`RedisCluster::nodes`]) while clients keep working: keys are migrated in batches of
    /// `batch`, pausing `between` after each, so a test can act while the slot is half moved.
    /// Returns the index of the node it came from.
    pub async fn move_slot(&self, slot: u16, to: usize, batch: usize, between: Duration) -> usize {
        let from = self.owner_of(slot).await;
        assert_ne!(from, to, "slot {slot} is already on node {to}");
        let (from_id, to_id) = (self.node_id(from).await, self.node_id(to).await);
        let mut src = self.nodes[from].conn().await;
        let mut dst = self.nodes[to].conn().await;
        let setslot = |state: &str, id: &str| {
            let mut c = ::redis::cmd("CLUSTER");
            c.arg("SETSLOT").arg(slot).arg(state).arg(id);
            c
        };
        let _: () = setslot("IMPORTING", &from_id)
            .query_async(&mut dst)
            .await
            .expect("SETSLOT IMPORTING");
        let _: () = setslot("MIGRATING", &to_id)
            .query_async(&mut src)
            .await
            .expect("SETSLOT MIGRATING");
        loop {
            let keys: Vec<String> = ::redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(batch)
                .query_async(&mut src)
                .await
                .expect("GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            let _: ::redis::Value = ::redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.nodes[to].port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query_async(&mut src)
                .await
                .expect("MIGRATE");
            tokio::time::sleep(between).await;
        }
        // The new owner first, then the old one, then everyone else (as redis-cli does).
        for i in [to, from]
            .into_iter()
            .chain((0..self.nodes.len()).filter(|i| *i != to && *i != from))
        {
            let mut c = self.nodes[i].conn().await;
            let _: Result<(), _> = setslot("NODE", &to_id).query_async(&mut c).await;
        }
        self.wait_ready().await;
        from
    }
}

/// `CLUSTER SLOTS` as primaries with their slot ranges, sorted by address.
async fn slots_of(c: &mut ::redis::aio::MultiplexedConnection) -> Option<Vec<Primary>> {
    let ranges: Vec<::redis::Value> = ::redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(c)
        .await
        .ok()?;
    let mut out: Vec<Primary> = Vec::new();
    for r in ranges {
        let ::redis::Value::Array(items) = r else {
            return None;
        };
        let start: u16 = ::redis::from_redis_value(items.first()?.clone()).ok()?;
        let end: u16 = ::redis::from_redis_value(items.get(1)?.clone()).ok()?;
        let ::redis::Value::Array(node) = items.get(2)? else {
            return None;
        };
        let host: String = ::redis::from_redis_value(node.first()?.clone()).ok()?;
        let port: u16 = ::redis::from_redis_value(node.get(1)?.clone()).ok()?;
        let id: String = ::redis::from_redis_value(node.get(2)?.clone()).ok()?;
        let addr = format!("{host}:{port}");
        match out.iter_mut().find(|p| p.addr == addr) {
            Some(p) => p.slots.push((start, end)),
            None => out.push(Primary {
                addr,
                id,
                slots: vec![(start, end)],
            }),
        }
    }
    for p in &mut out {
        p.slots.sort();
    }
    out.sort_by(|a, b| a.addr.cmp(&b.addr));
    Some(out)
}

/// A `name:value` line of an `INFO` reply.
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
}

/// How many of the replicas listed in a primary's `INFO replication` (`slaveN:…,state=…,
/// offset=…`) are not online or have acknowledged less than `offset`; `None` when it lists no
/// replica at all.
fn replicas_behind(info: &str, offset: u64) -> Option<usize> {
    let replicas: Vec<&str> = info
        .lines()
        .filter(|l| l.starts_with("slave") && l.contains("ip="))
        .collect();
    if replicas.is_empty() {
        return None;
    }
    Some(
        replicas
            .iter()
            .filter(|l| {
                let acked = l
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("offset="))
                    .and_then(|v| v.trim().parse::<u64>().ok());
                !l.contains("state=online") || acked.is_none_or(|a| a < offset)
            })
            .count(),
    )
}
