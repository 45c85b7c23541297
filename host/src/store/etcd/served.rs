//! The jobs each host serves, on etcd: what `leasehold trigger` checks a job name against and
//! the console lists (the Redis store's `lh:{members}:jobs`, [`crate::coord::members`]).
//!
//! A host's list is the key `lh/{served}/<node>`: the time it was written (milliseconds since
//! the epoch, by the writer's clock) on the first line, then the names one a line, written
//! whenever the names change and every minute. It is **not** on the host's lease: a lapse of
//! that lease (a long pause) would drop the list silently until the next write. Instead a read
//! joins the lists with the live members (`lh/{members}/`, on the lease) in one transaction, so
//! only live members' lists count, and a member that leaves deletes its list with its
//! registration ([`EtcdTerms::deregister`]).
//!
//! A crashed host leaves its list behind (node ids default to host names, so every new pod
//! would leave one). The read sweeps them: a list of a node that is not a member, written more
//! than [`STALE`] ago, is deleted in a transaction that compares the member key's create
//! revision with 0 (still no member) and the list's modification revision with the one read
//! (not written since), so a host that publishes before it registers, or publishes again, keeps
//! its list. At most [`SWEPT`] lists a read; a failed sweep is tried again by the next read.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};

use super::beat::{MEMBERS, member_key};
use super::history::now_ms;
use super::{EtcdResult, EtcdTerms, bounded};

/// Where the hosts' lists are.
const SERVED: &str = "lh/{served}/";

/// How old a list of a node that is not a member must be to be swept: far beyond the minute
/// between a live host's writes and any clock difference between hosts.
const STALE: Duration = Duration::from_secs(3600);

/// At most this many lists are swept by one read.
const SWEPT: usize = 64;

/// A list as stored: the time it was written, then the names.
fn encode(jobs: &[String]) -> String {
    let mut value = now_ms().to_string();
    for job in jobs {
        value.push('\n');
        value.push_str(job);
    }
    value
}

/// The time a stored list was written (0 when the first line is not a time) and its names.
fn decode(value: &[u8]) -> (u64, Vec<String>) {
    let text = String::from_utf8_lossy(value);
    let mut lines = text.lines();
    let at = lines.next().and_then(|l| l.parse().ok()).unwrap_or(0);
    let names = lines
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    (at, names)
}

/// The key of `node`'s list.
pub(super) fn served_key(node: &str) -> EtcdResult<String> {
    Ok(format!("{SERVED}{}", &member_key(node)?[MEMBERS.len()..]))
}

impl EtcdTerms {
    /// Publishes the jobs `node` serves (not a term's write: it describes the host).
    pub async fn publish_jobs(&self, node: &str, jobs: &[String]) -> EtcdResult<()> {
        let mut c = self.client.clone();
        bounded(self.timeout, c.put(served_key(node)?, encode(jobs), None)).await?;
        Ok(())
    }

    /// The jobs the live members serve, by node: only members that have published theirs, read
    /// at one revision with the members.
    pub async fn served_jobs(&self) -> EtcdResult<BTreeMap<String, Vec<String>>> {
        let txn = Txn::new().and_then([
            TxnOp::get(
                MEMBERS,
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ),
            TxnOp::get(SERVED, Some(GetOptions::new().with_prefix())),
        ]);
        let mut c = self.client.clone();
        let reply = bounded(self.timeout, c.txn(txn)).await?;
        let mut gets = reply.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let (Some(live), Some(lists)) = (gets.next(), gets.next()) else {
            return Err(etcd_client::Error::InvalidArgs(
                "etcd answered the served jobs' read short".into(),
            ));
        };
        let live: BTreeSet<&[u8]> = live
            .kvs()
            .iter()
            .map(|kv| &kv.key()[MEMBERS.len()..])
            .collect();
        let stale_before = now_ms().saturating_sub(STALE.as_millis() as u64);
        let mut served = BTreeMap::new();
        let mut stale = Vec::new();
        for kv in lists.kvs() {
            let node = &kv.key()[SERVED.len()..];
            let (at, names) = decode(kv.value());
            if live.contains(node) {
                served.insert(String::from_utf8_lossy(node).into_owned(), names);
            } else if at < stale_before && stale.len() < SWEPT {
                stale.push((
                    String::from_utf8_lossy(node).into_owned(),
                    kv.mod_revision(),
                ));
            }
        }
        for (node, seen) in stale {
            if let Err(e) = self.sweep(&node, seen).await {
                tracing::debug!(node, error = %e, "an old list of served jobs not swept yet");
            }
        }
        Ok(served)
    }

    /// Deletes `node`'s list, last written at revision `seen`, if `node` is still no member and
    /// the list was not written since.
    async fn sweep(&self, node: &str, seen: i64) -> EtcdResult<()> {
        let key = served_key(node)?;
        let txn = Txn::new()
            .when([
                Compare::create_revision(member_key(node)?, CompareOp::Equal, 0),
                Compare::mod_revision(key.as_str(), CompareOp::Equal, seen),
            ])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let mut c = self.client.clone();
        bounded(self.timeout, c.txn(txn)).await?;
        Ok(())
    }
}
