//! Membership: the live replicas, each registered in Redis by itself, and which of them each
//! job prefers.
//!
//! **Registry.** Every heartbeat a host sends one script ([`register`], in its heartbeat's batch,
//! see [`crate::coord::heartbeat`]) that records it in
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
//! a leader hands a job over* ([`crate::coord::elector`]): who may write is decided by the lease and
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

use crate::store::Batch;

pub use crate::store::keys::{
    MEMBERS_INFO as INFO_KEY, MEMBERS_JOBS as JOBS_KEY, MEMBERS_JOINED as JOINED_CHANNEL,
    MEMBERS_LIVE as LIVE_KEY,
};

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
    /// When it last registered: its last heartbeat (RFC 3339, its own clock; informational).
    #[serde(default)]
    pub seen: String,
    /// Its task worker (fan-out): slots and what it ran since it started.
    #[serde(default)]
    pub tasks: WorkerStats,
}

/// What a member's task worker reports with every heartbeat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// Tasks it runs at once, at most (`--task-slots`).
    pub slots: u32,
    /// Tasks running now.
    pub running: u32,
    /// Task attempts it finished with an output that was accepted.
    pub done: u64,
    /// Task attempts that failed on it (retried or not).
    pub failed: u64,
    /// Task attempts that answered `not-ready` on it (queued again as the same attempt).
    #[serde(default)]
    pub not_ready: u64,
    /// Tasks it took over from a worker that stopped answering.
    pub reclaimed: u64,
    /// Outputs refused (its claim or the submitting term had moved on) or dropped.
    pub refused: u64,
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
            seen: String::new(),
            tasks: WorkerStats::default(),
        }
    }
}

/// The live members by node id, as the last registration saw them.
pub type Members = BTreeMap<String, MemberInfo>;

/// Node ids as one log field: `n0,n1,n2` (a JSON log line carries a plain string, not a string
/// holding an array).
pub fn joined<'a>(nodes: impl IntoIterator<Item = &'a String>) -> String {
    nodes
        .into_iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(",")
}

static REGISTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: live set, info hash, jobs hash.  ARGV: node id, ttl in ms, info JSON, joined channel.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1]) == 1 then
  -- A member that was not live: tell the others at once.
  redis.call('PUBLISH', ARGV[4], ARGV[1])
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, node in ipairs(dead) do
  redis.call('ZREM', KEYS[1], node)
  redis.call('HDEL', KEYS[2], node)
  redis.call('HDEL', KEYS[3], node)
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
-- KEYS: live set, info hash, jobs hash.  ARGV: node id.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
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
    let reply: redis::Value = REGISTER
        .key(LIVE_KEY)
        .key(INFO_KEY)
        .key(JOBS_KEY)
        .arg(node)
        .arg(ttl.as_millis() as u64)
        .arg(json)
        .arg(JOINED_CHANNEL)
        .invoke_async(conn)
        .await?;
    registered(Ok(reply))
}

/// Adds [`register`]'s script to `batch` (the host's heartbeat); its reply reads with
/// [`registered`].
pub(crate) fn register_into(
    batch: &mut Batch,
    node: &str,
    info: &MemberInfo,
    ttl: Duration,
) -> usize {
    let json = serde_json::to_string(info).expect("member info serializes");
    batch.script(
        &REGISTER,
        &[LIVE_KEY, INFO_KEY, JOBS_KEY],
        (node, ttl.as_millis() as u64, json, JOINED_CHANNEL),
    )
}

/// The live members from a registration's reply.
pub(crate) fn registered(reply: redis::RedisResult<redis::Value>) -> redis::RedisResult<Members> {
    let flat: Vec<String> = redis::from_redis_value(reply?)?;
    Ok(described(flat.chunks(2).filter_map(|pair| match pair {
        [node, info] => Some((node.clone(), info.as_bytes())),
        _ => None,
    })))
}

/// The members from `(node, description)` pairs, as any store keeps them: a description that
/// does not parse is read as capacity 1.
pub(crate) fn described<'a>(pairs: impl IntoIterator<Item = (String, &'a [u8])>) -> Members {
    pairs
        .into_iter()
        .map(|(node, info)| {
            (
                node,
                serde_json::from_slice(info).unwrap_or(MemberInfo::with_capacity(1)),
            )
        })
        .collect()
}

/// Removes `node` from the registry (at shutdown, after its leases are released).
pub async fn deregister<C: ConnectionLike>(conn: &mut C, node: &str) -> redis::RedisResult<()> {
    let _: i64 = DEREGISTER
        .key(LIVE_KEY)
        .key(INFO_KEY)
        .key(JOBS_KEY)
        .arg(node)
        .invoke_async(conn)
        .await?;
    Ok(())
}

/// Publishes the jobs `node` serves (after a scan of its jobs directory). Not a term's write: it
/// describes the host, like its registration, and is dropped with it.
pub async fn publish_jobs<C: ConnectionLike>(
    conn: &mut C,
    node: &str,
    jobs: impl IntoIterator<Item = &String>,
) -> redis::RedisResult<()> {
    let names: Vec<&str> = jobs.into_iter().map(String::as_str).collect();
    redis::cmd("HSET")
        .arg(JOBS_KEY)
        .arg(node)
        .arg(names.join("\n"))
        .query_async(conn)
        .await
}

/// The jobs the live members serve, by node: only members that have published theirs (a host
/// publishes once the files present at its start have loaded).
pub async fn served_jobs<C: ConnectionLike>(
    conn: &mut C,
) -> redis::RedisResult<BTreeMap<String, Vec<String>>> {
    let live: Vec<String> = redis::cmd("ZRANGE")
        .arg(LIVE_KEY)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?;
    if live.is_empty() {
        return Ok(BTreeMap::new());
    }
    let lists: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(JOBS_KEY)
        .arg(&live)
        .query_async(conn)
        .await?;
    Ok(live
        .into_iter()
        .zip(lists)
        .filter_map(|(node, list)| {
            let list = list?;
            Some((
                node,
                list.lines()
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect(),
            ))
        })
        .collect())
}

/// `members` with each description read again from Redis now (what each member wrote at its
/// last registration, rather than what this host's last registration read); a member whose
/// description cannot be read keeps the one given.
pub async fn refreshed<C: ConnectionLike>(conn: &mut C, members: &Members) -> Members {
    if members.is_empty() {
        return Members::new();
    }
    let nodes: Vec<&String> = members.keys().collect();
    let read: redis::RedisResult<Vec<Option<String>>> = redis::cmd("HMGET")
        .arg(INFO_KEY)
        .arg(&nodes)
        .query_async(conn)
        .await;
    let read = read.unwrap_or_default();
    members
        .iter()
        .enumerate()
        .map(|(i, (node, m))| {
            let now = read
                .get(i)
                .and_then(|raw| raw.as_deref())
                .and_then(|raw| serde_json::from_str(raw).ok())
                .unwrap_or_else(|| m.clone());
            (node.clone(), now)
        })
        .collect()
}

/// Why `job` cannot be asked for, when live members have published the jobs they serve and none
/// serves it; `None` when one does, or when none has published (nothing to check against).
pub fn not_served(job: &str, served: &BTreeMap<String, Vec<String>>) -> Option<String> {
    if served.is_empty() || served.values().any(|jobs| jobs.iter().any(|j| j == job)) {
        return None;
    }
    let all: std::collections::BTreeSet<&str> =
        served.values().flatten().map(String::as_str).collect();
    let shown = if all.is_empty() {
        "none".to_string()
    } else {
        all.into_iter().collect::<Vec<_>>().join(", ")
    };
    Some(format!(
        "no live host serves a job named {job} (the {} live host(s) serve: {shown}); a job is named by its file in the jobs directory",
        served.len()
    ))
}

/// How long a host remembers that a member left its view: a member that comes back within
/// this time has flapped, and must stay live longer before jobs are handed to it
/// ([`View::settled`]).
pub const FLAP_MEMORY: Duration = Duration::from_secs(600);
/// How many times the settling time a member that came back must stay live, the first time it
/// came back within [`FLAP_MEMORY`] (doubled each further time).
pub const RETURN_SETTLE: u32 = 10;

/// This host's view of the membership: who is live, since when on this host's monotonic clock
/// (a member that drops out and returns starts again), and who left recently.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// The live members, as the last registration returned them.
    pub members: Members,
    /// When this host first saw each of them (in an unbroken run of views).
    pub since: BTreeMap<String, Instant>,
    /// Members that left the view within [`FLAP_MEMORY`]: when they last left, and how often.
    pub left: BTreeMap<String, (Instant, u32)>,
}

impl View {
    /// The next view: `members` as registered now, at `now`.
    pub fn next(&self, members: Members, now: Instant) -> View {
        let since = members
            .keys()
            .map(|n| (n.clone(), self.since.get(n).copied().unwrap_or(now)))
            .collect();
        let mut left = self.left.clone();
        for n in self.members.keys().filter(|n| !members.contains_key(*n)) {
            let e = left.entry(n.clone()).or_insert((now, 0));
            *e = (now, e.1 + 1);
        }
        left.retain(|_, (t, _)| now.saturating_duration_since(*t) < FLAP_MEMORY);
        View {
            members,
            since,
            left,
        }
    }

    /// The member `job` prefers (see [`preferred`]).
    pub fn preferred(&self, job: &str, excluded: Option<&str>) -> Option<&str> {
        preferred(job, &self.members, excluded)
    }

    /// Whether `node` has been live, in this view, for at least `settled`; a member that left
    /// the view within [`FLAP_MEMORY`] and came back, [`RETURN_SETTLE`] times as long, doubled
    /// for each further time (at most 32 × that), so that a member that flaps (or a process
    /// that wakes from a long pause) is handed nothing while it flaps.
    pub fn settled(&self, node: &str, settled: Duration, now: Instant) -> bool {
        let need = match self.left.get(node) {
            None => settled,
            Some((_, flaps)) => settled * RETURN_SETTLE * 2u32.pow((*flaps).clamp(1, 6) - 1),
        };
        self.since
            .get(node)
            .is_some_and(|t| now.saturating_duration_since(*t) >= need)
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

    #[test]
    fn a_job_no_live_host_serves_is_named_with_what_they_serve() {
        let served: BTreeMap<String, Vec<String>> = [
            (
                "n0".to_string(),
                vec!["billing".to_string(), "recon".to_string()],
            ),
            ("n1".to_string(), vec!["recon".to_string()]),
        ]
        .into();
        assert_eq!(not_served("recon", &served), None);
        assert_eq!(not_served("billing", &served), None);
        let why = not_served("reconn", &served).unwrap();
        assert!(
            why.contains("no live host serves a job named reconn"),
            "{why}"
        );
        assert!(why.contains("serve: billing, recon"), "{why}");
        assert_eq!(not_served("anything", &BTreeMap::new()), None);
    }

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
    fn a_member_that_flaps_settles_slower_each_time() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let ab = members(&[("a", 1), ("b", 1)]);
        let a = members(&[("a", 1)]);
        let v = View::default().next(ab.clone(), t0);
        assert!(!v.settled("b", s, t0));
        assert!(v.settled("b", s, t0 + s));
        // b leaves and returns: RETURN_SETTLE times as long; again: twice that.
        let back = t0 + s * 2;
        let v = v.next(a.clone(), t0 + s).next(ab.clone(), back);
        assert!(!v.settled("b", s, back + s * (RETURN_SETTLE - 1)));
        assert!(v.settled("b", s, back + s * RETURN_SETTLE));
        let again = back + s * 20;
        let v = v.next(a, again - s).next(ab.clone(), again);
        assert!(!v.settled("b", s, again + s * (2 * RETURN_SETTLE - 1)));
        assert!(v.settled("b", s, again + s * 2 * RETURN_SETTLE));
        // Forgotten after FLAP_MEMORY.
        let later = again + FLAP_MEMORY + s;
        let v = v.next(ab, later);
        assert!(v.left.is_empty());
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
