//! A host's heartbeat on etcd: its membership and every term it leads, kept alive together in
//! two requests for up to 126 terms and followed jobs, one more for each 128 beyond
//! (`docs/store-contract.md`, sections 1 and 4).
//!
//! A member is the key `lh/{members}/<node>` holding its description, attached to the host's
//! lease (the one its terms share): it is there while the host beats, and goes with the lease
//! when the host stops beating (a crash, a pause, a cut) — no sweep of the dead, as the Redis
//! store's registration does by its members' expiries. (`{` cannot be in a job name, so no job's
//! keys fall under `lh/{members}/`.) A beat is one keep-alive of each lease in use (one, as a
//! rule) and one transaction that writes the member's description and reads the live members,
//! every term's key and the lease key of every job the host follows
//! ([`EtcdTerms::beat_looking`]). A member that leaves deletes its key and the list of the jobs it served
//! ([`EtcdTerms::deregister`], [`super::served`]).

use std::time::{Duration, Instant};

use etcd_client::{GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::{EtcdResult, EtcdTerm, EtcdTerms, bounded, lease_key};

/// Where the members are.
pub(super) const MEMBERS: &str = "lh/{members}/";

/// What a beat found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Beaten {
    /// The live members and their descriptions, by node (when the beat registered one).
    pub members: Option<Vec<(String, Vec<u8>)>>,
    /// For each term beaten, whether it still holds its job.
    pub held: Vec<bool>,
    /// For each job looked at, who holds it (its lease key's owner), if anyone.
    pub looked: Vec<Option<String>>,
}

/// A member's registration: its node id and description, and the TTL of the host's lease
/// should one have to be granted.
#[derive(Clone, Copy, Debug)]
pub struct Registration<'a> {
    /// The node id (1–64 of `A-Z a-z 0-9 . _ -`).
    pub node: &'a str,
    /// Its description.
    pub info: &'a [u8],
    /// The lease's TTL.
    pub ttl: Duration,
}

pub(super) fn member_key(node: &str) -> EtcdResult<String> {
    if node.is_empty() || node.contains('/') {
        return Err(etcd_client::Error::InvalidArgs(format!(
            "node id {node:?}: empty or with a '/'"
        )));
    }
    Ok(format!("{MEMBERS}{node}"))
}

impl EtcdTerms {
    /// One heartbeat: registers `member` (if given) and renews every term of `terms`; the live
    /// members and, for each term, whether it still holds its job (its key there with its
    /// create revision, on a lease that was kept alive). A lease that lapsed is gone for good,
    /// and with it every term and the registration on it; the client grants a new one for the
    /// registration at once, and for terms at its next campaign.
    pub async fn beat(
        &self,
        member: Option<Registration<'_>>,
        terms: &[EtcdTerm],
    ) -> EtcdResult<Beaten> {
        self.beat_looking(member, terms, &[]).await
    }

    /// [`EtcdTerms::beat`], and a follower's look at each job of `looks` (its lease key read in
    /// the same transactions): who holds it.
    pub async fn beat_looking(
        &self,
        member: Option<Registration<'_>>,
        terms: &[EtcdTerm],
        looks: &[&str],
    ) -> EtcdResult<Beaten> {
        let mut leases: Vec<i64> = terms.iter().map(|t| t.lease).collect();
        let mut host = None;
        if let Some(m) = member {
            let (id, _) = self.host_lease(m.ttl).await?;
            leases.push(id);
            host = Some(id);
        }
        leases.sort_unstable();
        leases.dedup();
        let mut alive: Vec<i64> = Vec::new();
        for lease in leases {
            let sent = Instant::now();
            // The client sends one keep-alive as it opens the stream and reads its answer: a
            // lease etcd no longer has is answered with a TTL of 0, which it reports as
            // `LeaseKeepAliveError` (as it does a stream it could not feed: either way what is on
            // the lease cannot count on it).
            match self.keep_alive_once(lease).await {
                Ok(_) => {
                    self.note_renewed(lease, sent);
                    alive.push(lease);
                }
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => self.forget_host_lease(lease),
                Err(e) => return Err(e),
            }
        }
        // The registration and the members' read first, then a read of each term's key, in as
        // few transactions as etcd's operation limit allows (sent at once).
        let mut ops: Vec<TxnOp> = Vec::new();
        if let Some(m) = member {
            let lease = match host {
                Some(id) if alive.contains(&id) => id,
                // The host's lease lapsed: the registration goes on a new one.
                _ => self.host_lease(m.ttl).await?.0,
            };
            ops.push(TxnOp::put(
                member_key(m.node)?,
                m.info,
                Some(PutOptions::new().with_lease(lease)),
            ));
            ops.push(TxnOp::get(MEMBERS, Some(GetOptions::new().with_prefix())));
        }
        for t in terms {
            ops.push(TxnOp::get(lease_key(&t.job)?, None));
        }
        for job in looks {
            ops.push(TxnOp::get(lease_key(job)?, None));
        }
        if ops.is_empty() {
            return Ok(Beaten::default());
        }
        let per = self.max_txn_ops.max(2);
        let mut chunks: Vec<Vec<TxnOp>> = Vec::new();
        for op in ops {
            match chunks.last_mut() {
                Some(chunk) if chunk.len() < per => chunk.push(op),
                _ => chunks.push(vec![op]),
            }
        }
        let sends = chunks
            .into_iter()
            .map(|chunk| async move { self.txn(Txn::new().and_then(chunk)).await });
        let mut replies = Vec::new();
        for got in futures_util::future::join_all(sends).await {
            replies.extend(got?.op_responses());
        }
        let mut replies = replies.into_iter();
        let members = match member {
            Some(_) => {
                replies.next();
                match replies.next() {
                    Some(TxnOpResponse::Get(g)) => Some(
                        g.kvs()
                            .iter()
                            .map(|kv| {
                                (
                                    String::from_utf8_lossy(&kv.key()[MEMBERS.len()..])
                                        .into_owned(),
                                    kv.value().to_vec(),
                                )
                            })
                            .collect(),
                    ),
                    _ => Some(Vec::new()),
                }
            }
            None => None,
        };
        let held = terms
            .iter()
            .zip(replies.by_ref())
            .map(|(t, r)| {
                alive.contains(&t.lease)
                    && matches!(&r, TxnOpResponse::Get(g)
                        if g.kvs().first().is_some_and(|kv| kv.create_revision() == t.revision && kv.lease() == t.lease))
            })
            .collect();
        let looked = looks
            .iter()
            .zip(replies)
            .map(|(_, r)| match r {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
                _ => None,
            })
            .collect();
        Ok(Beaten {
            members,
            held,
            looked,
        })
    }

    /// Takes `node` out of the membership (at shutdown, after its terms are released).
    pub async fn deregister(&self, node: &str) -> EtcdResult<()> {
        let gone = [
            TxnOp::delete(member_key(node)?, None),
            TxnOp::delete(super::served::served_key(node)?, None),
        ];
        let mut c = self.client.clone();
        bounded(self.timeout, c.txn(Txn::new().and_then(gone))).await?;
        Ok(())
    }
}
