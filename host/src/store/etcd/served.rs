//! The jobs each host serves, on etcd: what `leasehold trigger` checks a job name against and
//! the console lists (the Redis store's `lh:{members}:jobs`, [`crate::coord::members`]).
//!
//! A host's list is the key `lh/{served}/<node>`, the names one a line, written whenever the
//! names change and every minute. It is **not** on the host's lease: a lapse of that lease (a
//! long pause) would drop the list silently until the next write. Instead a read joins the
//! lists with the live members (`lh/{members}/`, on the lease) in one transaction, so only live
//! members' lists count, and a member that leaves deletes its list with its registration
//! ([`EtcdTerms::deregister`]). A crashed host's list stays until that node id publishes again
//! or leaves: one key per node id ever seen, never counted.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};

use super::beat::{MEMBERS, member_key};
use super::{EtcdResult, EtcdTerms, bounded};

/// Where the hosts' lists are.
const SERVED: &str = "lh/{served}/";

/// The key of `node`'s list.
pub(super) fn served_key(node: &str) -> EtcdResult<String> {
    Ok(format!("{SERVED}{}", &member_key(node)?[MEMBERS.len()..]))
}

impl EtcdTerms {
    /// Publishes the jobs `node` serves (not a term's write: it describes the host).
    pub async fn publish_jobs(&self, node: &str, jobs: &[String]) -> EtcdResult<()> {
        let mut c = self.client.clone();
        bounded(
            self.timeout,
            c.put(served_key(node)?, jobs.join("\n"), None),
        )
        .await?;
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
        Ok(lists
            .kvs()
            .iter()
            .filter(|kv| live.contains(&kv.key()[SERVED.len()..]))
            .map(|kv| {
                let node = String::from_utf8_lossy(&kv.key()[SERVED.len()..]).into_owned();
                let names = String::from_utf8_lossy(kv.value())
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect();
                (node, names)
            })
            .collect())
    }
}
