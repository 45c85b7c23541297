//! Membership: the live replicas, each registered in Redis by itself, and which of them each
//! job prefers.
//!
//! **Registry.** Every heartbeat a host sends one script ([`register`]) that records it in
//! `lh:{members}:live` (a sorted set: node id → expiry in Redis's clock, `TIME` plus the member
//! TTL) with its [`MemberInfo`] in `lh:{members}:info` (a hash: node id → JSON), drops every
//! member whose expiry has passed, and returns the live members. A host that stops deregisters
//! ([`deregister`]); one that dies drops out when its TTL runs out. Both keys share the hash
//! tag `{members}`, so the script touches one slot (Redis Cluster).
//!
//! **Preference.** [`preferred`] ranks the live members for a job by weighted rendezvous
//! hashing: each member scores `-capacity / ln(h)` with `h` a hash of (job, node) in (0, 1), and
//! the highest score wins. Every host computes the same answer from the same membership; a job
//! moves only when its preferred member joins or leaves (about `1/n` of the jobs when the
//! `n`-th member joins), and a member with twice the capacity is preferred for about twice the
//! jobs.
//!
//! **Guarantees and non-guarantees.** Preference decides only *when a host campaigns* and *when
//! a leader hands a job over* ([`crate::elector`]): who may write is decided by the lease and
//! the fence alone (I10). Hosts whose views of the membership differ for a heartbeat may both
//! think themselves preferred, or neither: the lease still lets one of them lead, and the next
//! heartbeat's view converges. Membership uses Redis's clock for expiry (one clock for every
//! member); a member's local clock is never compared with another's.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::Script;
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The sorted set of live members (node id → expiry, ms of Redis's clock).
pub const LIVE_KEY: &str = "lh:{members}:live";
/// The hash of member descriptions (node id → [`MemberInfo`] as JSON).
pub const INFO_KEY: &str = "lh:{members}:info";

/// What a member says about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Relative weight for balancing (`--capacity`): a member with twice the capacity is
    /// preferred for about twice the jobs. At least 1.
    pub capacity: u32,
    /// The host's version (`leasehold --version`).
    pub version: String,
    /// Its HTTP API address, if it serves one.
    pub http: Option<String>,
    /// When it registered (RFC 3339, its own clock; informational).
    pub since: String,
}

impl MemberInfo {
    /// A member known only by its capacity: no version, address or start time (how a
    /// description that does not parse is read).
    pub fn with_capacity(capacity: u32) -> Self {
        MemberInfo {
            capacity,
            version: String::new(),
            http: None,
            since: String::new(),
        }
    }
}

/// The live members by node id, as the last registration saw them.
pub type Members = BTreeMap<String, MemberInfo>;

static REGISTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: live set, info hash.  ARGV: node id, ttl in ms, info JSON.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, node in ipairs(dead) do
  redis.call('ZREM', KEYS[1], node)
  redis.call('HDEL', KEYS[2], node)
end
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {}
for _, node in ipairs(live) do
  table.insert(out, node)
  table.insert(out, redis.call('HGET', KEYS[2], node) or '')
end
return out
"#,
    )
});

static DEREGISTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: live set, info hash.  ARGV: node id.
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('HDEL', KEYS[2], ARGV[1])
"#,
    )
});

/// Registers `node` for `ttl` with `info` and returns the live members (this one included).
/// A member whose description does not parse is listed with capacity 1.
pub async fn register<C: ConnectionLike>(
    conn: &mut C,
    node: &str,
    info: &MemberInfo,
    ttl: Duration,
) -> redis::RedisResult<Members> {
    let json = serde_json::to_string(info).expect("member info serializes");
    let flat: Vec<String> = REGISTER
        .key(LIVE_KEY)
        .key(INFO_KEY)
        .arg(node)
        .arg(ttl.as_millis() as u64)
        .arg(json)
        .invoke_async(conn)
        .await?;
    Ok(flat
        .chunks(2)
        .filter_map(|pair| match pair {
            [node, info] => Some((
                node.clone(),
                serde_json::from_str(info).unwrap_or(MemberInfo::with_capacity(1)),
            )),
            _ => None,
        })
        .collect())
}

/// Removes `node` from the registry (at shutdown, after its leases are released).
pub async fn deregister<C: ConnectionLike>(conn: &mut C, node: &str) -> redis::RedisResult<()> {
    let _: i64 = DEREGISTER
        .key(LIVE_KEY)
        .key(INFO_KEY)
        .arg(node)
        .invoke_async(conn)
        .await?;
    Ok(())
}

/// This host's view of the membership: who is live, and since when on this host's monotonic
/// clock (a member that drops out and returns starts again).
#[derive(Clone, Debug, Default)]
pub struct View {
    /// The live members, as the last registration returned them.
    pub members: Members,
    /// When this host first saw each of them (in an unbroken run of views).
    pub since: BTreeMap<String, Instant>,
}

impl View {
    /// The next view: `members` as registered now, at `now`.
    pub fn next(&self, members: Members, now: Instant) -> View {
        let since = members
            .keys()
            .map(|n| (n.clone(), self.since.get(n).copied().unwrap_or(now)))
            .collect();
        View { members, since }
    }

    /// The member `job` prefers (see [`preferred`]).
    pub fn preferred(&self, job: &str, excluded: Option<&str>) -> Option<&str> {
        preferred(job, &self.members, excluded)
    }

    /// Whether `node` has been live, in this view, for at least `settled`.
    pub fn settled(&self, node: &str, settled: Duration, now: Instant) -> bool {
        self.since
            .get(node)
            .is_some_and(|t| now.saturating_duration_since(*t) >= settled)
    }
}

/// Registers this host every `heartbeat` (each call bounded by `timeout`) and publishes the
/// membership it returns on `view`, until `stop` is cancelled; then deregisters it. A failed
/// registration keeps the last view (logged once until one succeeds again).
pub(crate) async fn keep_registered(
    mut conn: redis::aio::ConnectionManager,
    node: String,
    info: MemberInfo,
    (ttl, heartbeat, timeout): (Duration, Duration, Duration),
    view: watch::Sender<View>,
    stop: CancellationToken,
) {
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(heartbeat) => {}
            _ = stop.cancelled() => break,
        }
        crate::metrics::get().round_trip("membership");
        match tokio::time::timeout(timeout, register(&mut conn, &node, &info, ttl)).await {
            Ok(Ok(members)) => {
                if failing {
                    info!(node = %node, "membership registration works again");
                    failing = false;
                }
                let next = view.borrow().next(members, Instant::now());
                if next.members.keys().ne(view.borrow().members.keys()) {
                    info!(node = %node, members = ?next.members.keys().collect::<Vec<_>>(), "membership changed");
                }
                view.send_replace(next);
            }
            Ok(Err(e)) if !failing => {
                warn!(node = %node, "membership registration failed: {e}; balancing uses the last view");
                failing = true;
            }
            Err(_) if !failing => {
                warn!(node = %node, "membership registration got no reply within {}; balancing uses the last view", crate::config::show(timeout));
                failing = true;
            }
            _ => {}
        }
    }
    match tokio::time::timeout(timeout, deregister(&mut conn, &node)).await {
        Ok(Ok(())) => info!(node = %node, "left the membership"),
        _ => {
            warn!(node = %node, "could not leave the membership; it expires after {}", crate::config::show(ttl))
        }
    }
}

/// 64-bit FNV-1a: stable across processes and versions (unlike `std`'s hasher), which
/// preference needs, since every host must compute the same ranking.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        for b in part.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    // FNV's low bits mix poorly for short inputs: finish with a 64-bit mixer (splitmix64).
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The rendezvous score of `node` (with `capacity`) for `job`: higher is preferred.
fn score(job: &str, node: &str, capacity: u32) -> f64 {
    // h in (0, 1): the top 53 bits, never 0 or 1.
    let h = ((fnv1a(&[job, node]) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(capacity.max(1)) / h.ln()
}

/// The member `job` prefers among `members` (ignoring `excluded`), or `None` when none is left.
/// Ties (equal scores) go to the smaller node id.
pub fn preferred<'a>(job: &str, members: &'a Members, excluded: Option<&str>) -> Option<&'a str> {
    members
        .iter()
        .filter(|(node, _)| Some(node.as_str()) != excluded)
        .map(|(node, info)| (node.as_str(), score(job, node, info.capacity)))
        .fold(None, |best: Option<(&str, f64)>, (node, s)| match best {
            Some((_, b)) if b >= s => best,
            _ => Some((node, s)),
        })
        .map(|(node, _)| node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(nodes: &[(&str, u32)]) -> Members {
        nodes
            .iter()
            .map(|(n, c)| (n.to_string(), MemberInfo::with_capacity(*c)))
            .collect()
    }

    fn counts(jobs: usize, m: &Members) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for j in 0..jobs {
            let p = preferred(&format!("job-{j}"), m, None).unwrap();
            *out.entry(p.to_string()).or_insert(0) += 1;
        }
        out
    }

    #[test]
    fn a_thousand_jobs_spread_within_ten_percent_over_three_equal_members() {
        let m = members(&[("node-a", 1), ("node-b", 1), ("node-c", 1)]);
        let c = counts(1000, &m);
        assert_eq!(c.len(), 3, "{c:?}");
        for (node, n) in &c {
            assert!(
                (300..=367).contains(n),
                "{node} is preferred for {n} of 1000: {c:?}"
            );
        }
    }

    #[test]
    fn capacity_weights_the_share() {
        let m = members(&[("big", 2), ("small", 1)]);
        let c = counts(3000, &m);
        let big = c["big"] as f64 / 3000.0;
        assert!(
            (0.6..0.73).contains(&big),
            "big has {big:.2} of the jobs: {c:?}"
        );
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_jobs_and_joining_moves_about_a_third() {
        let three = members(&[("a", 1), ("b", 1), ("c", 1)]);
        let two = members(&[("a", 1), ("b", 1)]);
        let mut moved_on_join = 0;
        for j in 0..1000 {
            let job = format!("job-{j}");
            let before = preferred(&job, &two, None).unwrap();
            let after = preferred(&job, &three, None).unwrap();
            if before != after {
                assert_eq!(after, "c", "{job} moved between two old members");
                moved_on_join += 1;
            }
            // Excluding c is the same as c being gone.
            assert_eq!(preferred(&job, &three, Some("c")), Some(before));
        }
        assert!(
            (280..=390).contains(&moved_on_join),
            "{moved_on_join} of 1000 moved"
        );
    }

    #[test]
    fn every_host_computes_the_same_preference() {
        // Fixed values: the hash must not change between processes or versions.
        assert_eq!(fnv1a(&["billing", "node-a"]), fnv1a(&["billing", "node-a"]));
        assert_ne!(fnv1a(&["ab", "c"]), fnv1a(&["a", "bc"]));
        let m = members(&[("a", 1)]);
        assert_eq!(preferred("x", &m, Some("a")), None);
        assert_eq!(preferred("x", &m, None), Some("a"));
    }
}
