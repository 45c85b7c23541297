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

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use redis::AsyncConnectionConfig;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Script, Value};

pub mod sentinel;

pub use sentinel::SentinelTarget;

/// Selects the TLS crypto provider (ring) for `rediss://` connections. Call once, before the
/// first connection; later calls do nothing.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The URL with any password replaced by `***`, for logs and errors.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
            } else {
                url.to_string()
            }
        }
        _ => url.to_string(),
    }
}

/// What a Redis URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// One Redis node (`redis://`, `rediss://`, `unix://`).
    Node(String),
    /// A Redis Cluster, by its seed nodes as single-node URLs (`redis://…` or `rediss://…`,
    /// each with the credentials of the cluster URL).
    Cluster(Vec<String>),
    /// The primary of a Redis Sentinel service.
    Sentinel(SentinelTarget),
}

/// Reads a Redis URL: the schemes of the module doc. The error names the URL (password
/// hidden) and what is wrong with it.
pub fn target(url: &str) -> Result<Target, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "{} is not a Redis URL: it must start with redis://, rediss://, unix:// or redis+cluster://",
            redact(url)
        ));
    };
    let node_scheme = match scheme {
        "redis" | "rediss" | "unix" | "redis+unix" => return Ok(Target::Node(url.to_string())),
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        "redis+sentinel" | "rediss+sentinel" => return sentinel_target(url, scheme, rest),
        other => {
            return Err(format!(
                "redis URL scheme {other:?} is not supported (in {}): use redis://, rediss://, unix://, redis+cluster:// with the cluster's seed nodes, or redis+sentinel://host:port,host:port/service",
                redact(url)
            ));
        }
    };
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    let hosts = hosts.split(['/', '?']).next().unwrap_or("");
    let prefix = format!("{node_scheme}://{userinfo}");
    let seeds = node_urls(url, hosts, &prefix, "seed node", || {
        format!(
            "{} names no seed node: write redis+cluster://host:port,host:port",
            redact(url)
        )
    })?;
    Ok(Target::Cluster(seeds))
}

/// `prefix` + each of the comma-separated `hosts`, each checked as a URL (an error names it as
/// `what` of `url`); `none` is the error when there is none.
fn node_urls(
    url: &str,
    hosts: &str,
    prefix: &str,
    what: &str,
    none: impl FnOnce() -> String,
) -> Result<Vec<String>, String> {
    let urls: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{prefix}{h}"))
        .collect();
    if urls.is_empty() {
        return Err(none());
    }
    for u in &urls {
        redis::Client::open(u.as_str())
            .map_err(|e| format!("{what} {} of {}: {e}", redact(u), redact(url)))?;
    }
    Ok(urls)
}

/// Reads `redis+sentinel://[user:password@]host:port,…/service`.
fn sentinel_target(url: &str, scheme: &str, rest: &str) -> Result<Target, String> {
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, rest),
    };
    let (hosts, service) = rest.split_once('/').unwrap_or((rest, ""));
    let service = service.split('?').next().unwrap_or("");
    if service.is_empty() || service.contains('/') {
        return Err(format!(
            "{} names no service: write {scheme}://host:port,host:port/service (the name in `sentinel monitor <name> …`)",
            redact(url)
        ));
    }
    let sentinels = node_urls(url, hosts, "redis://", "sentinel", || {
        format!(
            "{} names no sentinel: write {scheme}://host:port,host:port/service",
            redact(url)
        )
    })?;
    let (username, password) = match userinfo.map(|u| u.split_once(':')) {
        None => (None, None),
        Some(None) => (userinfo.map(str::to_string), None),
        Some(Some((u, p))) => ((!u.is_empty()).then(|| u.to_string()), Some(p.to_string())),
    };
    Ok(Target::Sentinel(SentinelTarget {
        sentinels,
        service: service.to_string(),
        username,
        password,
        tls: scheme == "rediss+sentinel",
    }))
}

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

#[derive(Clone)]
struct Cluster {
    conn: ClusterConnection,
    /// Slot ranges → primary address (`host:port`), as `CLUSTER SLOTS` said last, and when.
    slots: Arc<RwLock<SlotMap>>,
    /// The host's own connection to each primary, for batches.
    nodes: Arc<tokio::sync::Mutex<std::collections::HashMap<String, MultiplexedConnection>>>,
    /// `scheme://userinfo@` of the seeds: a primary's URL is this and its address.
    node_url: Arc<str>,
    /// Timeouts of those connections.
    config: AsyncConnectionConfig,
}

/// Slot ranges (inclusive) → primary address, and when they were read.
type SlotMap = (Vec<(u16, u16, String)>, Option<std::time::Instant>);

/// How often a cluster's slot map is read at least.
const SLOT_MAP_AGE: Duration = Duration::from_secs(30);

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

fn by_address(addr: &str) -> RedisResult<SingleNodeRoutingInfo> {
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

impl Cluster {
    /// Reads the slot map (`CLUSTER SLOTS`).
    async fn refresh_slots(&self) -> RedisResult<()> {
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
    async fn node(&self, addr: &str) -> RedisResult<MultiplexedConnection> {
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
    fn owner(&self, slot: u16) -> Option<String> {
        let map = &self.slots.read().expect("slot map").0;
        let i = map.partition_point(|(_, end, _)| *end < slot);
        map.get(i)
            .filter(|(start, _, _)| *start <= slot)
            .map(|(_, _, addr)| addr.clone())
    }

    /// Every primary in the last slot map read.
    fn primaries(&self) -> Vec<String> {
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

    async fn batch(&mut self, kind: &str, batch: &Batch) -> Vec<RedisResult<Value>> {
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
fn redirected(e: &RedisError) -> bool {
    use redis::ServerErrorKind as S;
    matches!(
        e.kind(),
        redis::ErrorKind::Server(S::Moved | S::Ask | S::TryAgain)
    )
}

/// Commands for [`Conn::batch`]: each touches keys of one slot (one job's hash tag), and may be
/// a script call ([`Batch::script`]), whose script is loaded in the same round trip.
#[derive(Default)]
pub struct Batch {
    cmds: Vec<Cmd>,
    slots: Vec<u16>,
    scripts: Vec<&'static Script>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.cmds.is_empty()
    }

    /// How many commands were added.
    pub fn len(&self) -> usize {
        self.cmds.len()
    }

    /// Adds `cmd`, whose keys share the slot of `key`; returns its index in the replies.
    pub fn cmd(&mut self, key: &str, cmd: Cmd) -> usize {
        self.cmds.push(cmd);
        self.slots.push(slot_of(key));
        self.cmds.len() - 1
    }

    /// Adds a call of `script` with `keys` (sharing one slot) and `args`; returns its index.
    pub fn script<K: redis::ToRedisArgs, A: redis::ToRedisArgs>(
        &mut self,
        script: &'static Script,
        keys: &[K],
        args: A,
    ) -> usize {
        if !self.scripts.iter().any(|s| std::ptr::eq(*s, script)) {
            self.scripts.push(script);
        }
        let mut c = redis::cmd("EVALSHA");
        c.arg(script.get_hash()).arg(keys.len()).arg(keys).arg(args);
        let first = keys
            .first()
            .map(|k| k.to_redis_args())
            .and_then(|a| a.into_iter().next())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        self.cmd(&first, c)
    }

    /// The scripts' loads, then every command.
    fn pipeline(&self, idx: std::ops::Range<usize>) -> Pipeline {
        self.pipeline_of(&idx.collect::<Vec<_>>())
    }

    fn pipeline_of(&self, idx: &[usize]) -> Pipeline {
        let mut pipe = redis::pipe();
        for s in &self.scripts {
            pipe.load_script(s);
        }
        for i in idx {
            pipe.add_command(self.cmds[*i].clone());
        }
        pipe
    }
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

/// Clients for the host's notice listener (`PSUBSCRIBE`), one per node to try in turn: the one
/// node, or each seed of a cluster (a cluster delivers every `PUBLISH` to subscribers on any
/// node, so one node's subscription hears every job).
pub fn pubsub_clients(url: &str) -> anyhow::Result<PubSubSource> {
    let urls = match target(url).map_err(anyhow::Error::msg)? {
        Target::Node(u) => vec![u],
        Target::Cluster(seeds) => seeds,
        Target::Sentinel(t) => return Ok(PubSubSource::Sentinel(t)),
    };
    urls.iter()
        .map(|u| {
            redis::Client::open(u.as_str())
                .with_context(|| format!("invalid redis url {}", redact(u)))
        })
        .collect::<anyhow::Result<_>>()
        .map(PubSubSource::Nodes)
}

/// Where a host subscribes to notices: a node (or a cluster's seeds, tried in turn), or the
/// primary a Sentinel service names at the time of each (re)subscription.
#[derive(Clone, Debug)]
pub enum PubSubSource {
    /// These nodes, one after the other.
    Nodes(Vec<redis::Client>),
    /// The service's primary, found through its sentinels.
    Sentinel(SentinelTarget),
}

impl PubSubSource {
    /// The client to subscribe with on the `attempt`th try, within `timeout`.
    pub async fn client(&self, attempt: usize, timeout: Duration) -> RedisResult<redis::Client> {
        match self {
            PubSubSource::Nodes(clients) if clients.is_empty() => Err(RedisError::from((
                redis::ErrorKind::Client,
                "no node to subscribe on",
            ))),
            PubSubSource::Nodes(clients) => Ok(clients[attempt % clients.len()].clone()),
            PubSubSource::Sentinel(t) => t.primary(timeout).await,
        }
    }
}

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
