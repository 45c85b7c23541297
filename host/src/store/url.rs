//! Redis URLs as the host reads them (one node, a cluster's seeds, a Sentinel service), the
//! TLS provider, passwords kept out of messages, and where notices are subscribed.

use std::time::Duration;

use anyhow::Context as _;
use redis::{RedisError, RedisResult};

use super::*;

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
