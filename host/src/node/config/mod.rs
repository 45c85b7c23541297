//! Host configuration, from raw values to validated ones, in one place.
//!
//! `leasehold run` (and `check`, for the limits) hands over what it was given on the command
//! line or in the environment as a [`RawConfig`] (or [`RawLimits`]); [`NodeConfig::from_raw`]
//! and [`RawLimits::validate`] apply the defaults and check every rule, and report *all*
//! violations at once, each naming the setting and its value ([`ConfigError`]). Nothing else
//! in the host validates configuration: a host never starts with settings that break a rule.
//!
//! | setting | rule |
//! | --- | --- |
//! | timings | the relations of [`crate::coord::timing`] (I4) |
//! | `node-id` | 1–64 characters from `A-Z a-z 0-9 . _ -` (it appears in lease owners `node-id:uuid`) |
//! | `max-memory` | at least 1 MiB |
//! | `max-step-time` | at least 100ms, at most 1 day |
//! | `max-write-size` | at least 1 KiB |
//! | `max-component-size` | at least 64 KiB |
//! | `max-stored-keys` | at least 1 |
//! | `max-stored-bytes` | at least 1 KiB |
//! | `cache-dir` | not inside `jobs-dir` (whoever can drop a job there could plant compiled code) |
//! | `http-token` | not empty when set |
//! | `redis-url` | `redis://`, `rediss://`, `unix://`, `redis+cluster://` (seeds) or `redis+sentinel://` (sentinels and service) |
//! | `replica-timeout` | above zero and at most `lease-ttl` |
//! | `database` | `NAME=URL`: a name of `a-z 0-9 _ -`, a `postgres://` URL, no name twice |
//! | `max-statement-time` | at least 100ms, at most 1h |
//!
//! Job specs are validated where they are read, in [`crate::exec::spec`].

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::coord::timing::Timing;
pub use crate::setting::{ConfigError, Setting, Violation};
pub use crate::units::{parse_duration, parse_size, show, show_size};

use crate::coord::term::Replicas;
use crate::exec::spec::HostLimits;

mod limits;
pub use limits::RawLimits;

/// Everything `leasehold run` was given, before defaults and validation.
#[derive(Clone, Debug)]
pub struct RawConfig {
    /// Redis URL.
    pub redis_url: String,
    /// Directory of `.wasm` job components.
    pub jobs_dir: PathBuf,
    /// Directory of read-only job inputs.
    pub data_dir: Option<PathBuf>,
    /// Directory for compiled code; default `$XDG_CACHE_HOME/leasehold` or
    /// `~/.cache/leasehold`.
    pub cache_dir: Option<PathBuf>,
    /// Node id; default the host name.
    pub node_id: Option<String>,
    /// Lease TTL.
    pub lease_ttl: Duration,
    /// Renewal interval.
    pub heartbeat: Duration,
    /// Safety margin; default a tenth of the TTL.
    pub lease_margin: Option<Duration>,
    /// Bound on Redis calls; default half the heartbeat.
    pub redis_timeout: Option<Duration>,
    /// HTTP API address.
    pub http: Option<std::net::SocketAddr>,
    /// Bearer token for the HTTP API's POST endpoints.
    pub http_token: Option<String>,
    /// Host limits.
    pub limits: RawLimits,
    /// Start even when Redis may evict keys (`maxmemory-policy` other than `noeviction`).
    pub allow_evicting_redis: bool,
    /// Replicas that must acknowledge every write of a term (0: none).
    pub min_replicas: u32,
    /// How long a write waits for them; default the Redis timeout.
    pub replica_timeout: Option<Duration>,
    /// Weight for leadership balancing (1 to 1000).
    pub capacity: u32,
    /// Tasks of fan-out jobs this host runs at once (0: none; default: one per CPU).
    pub task_slots: Option<u32>,
    /// `NAME=URL` of every database jobs may be granted.
    pub databases: Vec<String>,
    /// The longest statement a job may ask for.
    pub max_statement_time: Duration,
    /// The most rows one statement may return to a job.
    pub max_sql_rows: u64,
    /// The most bytes one statement's rows may carry.
    pub max_sql_result: u64,
    /// HTTP destinations jobs may be granted.
    pub http_allow: Vec<String>,
    /// Whether jobs' requests may reach non-global addresses.
    pub http_allow_private: bool,
    /// The longest HTTP timeout a job may ask for.
    pub max_http_timeout: Duration,
    /// The largest HTTP response a job may ask for.
    pub max_http_response: u64,
}

/// Everything `leasehold run` is configured with, validated.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Redis URL (`redis://`, `rediss://`, with optional user and password).
    pub redis_url: String,
    /// Directory of `.wasm` job components.
    pub jobs_dir: PathBuf,
    /// Directory of read-only job inputs, one subfolder per job.
    pub data_dir: Option<PathBuf>,
    /// Directory for compiled job code (see [`crate::exec::runtime::cache`]); none: compile at
    /// every start.
    pub cache_dir: Option<PathBuf>,
    /// This node's id.
    pub node_id: String,
    /// Lease timings.
    pub timing: Timing,
    /// Host limits for jobs.
    pub limits: HostLimits,
    /// Where the HTTP API listens, if anywhere (port 0: any free port, logged once bound).
    pub http: Option<std::net::SocketAddr>,
    /// Bearer token the HTTP API's mutating endpoints require, if set.
    pub http_token: Option<String>,
    /// Start even when Redis may evict keys (see [`crate::store::deployment`]).
    pub allow_evicting_redis: bool,
    /// Replicas every write of a term waits for, if any.
    pub replicas: Option<Replicas>,
    /// Weight for leadership balancing ([`crate::coord::members`]).
    pub capacity: u32,
    /// Tasks of fan-out jobs this host runs at once ([`crate::exec::workers`]); 0: it runs none.
    pub task_slots: u32,
    /// The databases jobs may be granted ([`crate::exec::sql`]).
    pub databases: Vec<crate::exec::sql::DatabaseConfig>,
    /// The most a job's statements may ask for.
    pub sql_caps: crate::exec::sql::SqlCaps,
    /// Outbound HTTP: the destinations jobs may be granted and the caps.
    pub http_caps: crate::exec::http::HttpCaps,
}

impl NodeConfig {
    /// Applies the defaults and checks every rule of the module doc; all violations are
    /// reported together.
    pub fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let mut bad = Vec::new();
        if crate::coord::term_store::names_etcd(&raw.redis_url) {
            if let Err(why) = crate::store::etcd::parse_url(&raw.redis_url) {
                bad.push(Violation::new(
                    Setting::RedisUrl,
                    format!("redis-url: {why}"),
                ));
            }
            // WAIT is Redis's: etcd answers a write once a majority of its members has it.
            if raw.min_replicas > 0 {
                bad.push(Violation::new(
                    Setting::MinReplicas,
                    "min-replicas applies to Redis only: etcd acknowledges a write once a majority of its members has it".to_string(),
                ));
            }
        } else if let Err(why) = crate::store::target(&raw.redis_url) {
            bad.push(Violation::new(
                Setting::RedisUrl,
                format!("redis-url: {why}"),
            ));
        }
        let node_id = raw.node_id.clone().unwrap_or_else(hostname);
        if let Err(v) = validate_node_id(&node_id) {
            bad.push(v);
        }
        let timing = Timing::new(
            raw.lease_ttl,
            raw.heartbeat,
            raw.lease_margin,
            raw.redis_timeout,
        )
        .map_err(|e| bad.extend(e.violations))
        .ok();
        raw.limits.check(&mut bad);
        let cache_dir = raw.cache_dir.clone().or_else(default_cache_dir);
        if let Some(cache) = &cache_dir
            && absolute(cache).starts_with(absolute(&raw.jobs_dir))
        {
            bad.push(Violation::new(
                Setting::CacheDir,
                format!(
                    "cache-dir {} must not be inside jobs-dir {}: whoever can drop a job there could plant compiled code",
                    cache.display(),
                    raw.jobs_dir.display()
                ),
            ));
        }
        if raw.http_token.as_deref() == Some("") {
            bad.push(Violation::new(
                Setting::HttpToken,
                "http-token is empty: set a token or leave it unset".into(),
            ));
        }
        if raw
            .replica_timeout
            .is_some_and(|t| t.is_zero() || t > raw.lease_ttl)
        {
            bad.push(Violation::new(
                Setting::ReplicaTimeout,
                format!(
                    "replica-timeout must be greater than zero and at most lease-ttl (replica-timeout {}, lease-ttl {})",
                    show(raw.replica_timeout.unwrap_or_default()),
                    show(raw.lease_ttl)
                ),
            ));
        }
        if !(1..=1000).contains(&raw.capacity) {
            bad.push(Violation::new(
                Setting::Capacity,
                format!("capacity ({}) must be between 1 and 1000", raw.capacity),
            ));
        }
        let task_slots = raw
            .task_slots
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
        if task_slots > 1024 {
            bad.push(Violation::new(
                Setting::TaskSlots,
                format!("task-slots ({task_slots}) must be at most 1024"),
            ));
        }
        let mut databases: Vec<crate::exec::sql::DatabaseConfig> = Vec::new();
        for arg in &raw.databases {
            match crate::exec::sql::parse_database(arg) {
                Ok(d) if databases.iter().any(|o| o.name == d.name) => bad.push(Violation::new(
                    Setting::Database,
                    format!("database {} is configured twice", d.name),
                )),
                Ok(d) => databases.push(d),
                Err(why) => bad.push(Violation::new(
                    Setting::Database,
                    format!("database: {why}"),
                )),
            }
        }
        if raw.max_statement_time < Duration::from_millis(100)
            || raw.max_statement_time > Duration::from_secs(3600)
        {
            bad.push(Violation::new(
                Setting::MaxStatementTime,
                format!(
                    "max-statement-time ({}) must be at least 100ms and at most 1h",
                    show(raw.max_statement_time)
                ),
            ));
        }
        let mut http_allow = Vec::new();
        for arg in raw.http_allow.iter().filter(|a| !a.is_empty()) {
            match crate::exec::http::Destination::parse(arg) {
                Ok(d) if !http_allow.contains(&d) => http_allow.push(d),
                Ok(_) => {}
                Err(why) => bad.push(Violation::new(
                    Setting::HttpAllow,
                    format!("http-allow: {why}"),
                )),
            }
        }
        if raw.max_http_timeout < Duration::from_millis(100)
            || raw.max_http_timeout > Duration::from_secs(3600)
        {
            bad.push(Violation::new(
                Setting::MaxHttpTimeout,
                format!(
                    "max-http-timeout ({}) must be at least 100ms and at most 1h",
                    show(raw.max_http_timeout)
                ),
            ));
        }
        let (Some(timing), true) = (timing, bad.is_empty()) else {
            return Err(ConfigError { violations: bad });
        };
        Ok(NodeConfig {
            redis_url: raw.redis_url,
            jobs_dir: raw.jobs_dir,
            data_dir: raw.data_dir,
            cache_dir,
            node_id,
            timing,
            limits: raw.limits.validate()?,
            http: raw.http,
            http_token: raw.http_token,
            allow_evicting_redis: raw.allow_evicting_redis,
            replicas: (raw.min_replicas > 0).then(|| Replicas {
                count: raw.min_replicas,
                timeout: raw.replica_timeout.unwrap_or(timing.redis_timeout),
            }),
            capacity: raw.capacity,
            task_slots,
            databases,
            http_caps: crate::exec::http::HttpCaps {
                allow: http_allow,
                timeout: raw.max_http_timeout,
                max_response: raw.max_http_response.max(1024),
                private: raw.http_allow_private,
            },
            sql_caps: crate::exec::sql::SqlCaps {
                statement_time: raw.max_statement_time,
                rows: raw.max_sql_rows.max(1),
                result_bytes: raw.max_sql_result.max(1024),
            },
        })
    }
}

/// Checks a node id: 1–64 characters from `A-Z a-z 0-9 . _ -`. The id appears in lease owners
/// (`node-id:uuid`), logs and status.
pub fn validate_node_id(id: &str) -> Result<(), Violation> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Violation::new(
            Setting::NodeId,
            format!("node-id must be 1 to 64 characters from A-Z a-z 0-9 . _ - (node-id {id:?})"),
        ))
    }
}

/// This machine's host name (`$HOSTNAME`, else the kernel's), or `node`.
pub fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_string())
}

/// The compiled-code cache a host uses when `--cache-dir` is not given:
/// `$XDG_CACHE_HOME/leasehold`, else `~/.cache/leasehold`; `None` without either variable.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("leasehold"))
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests;
