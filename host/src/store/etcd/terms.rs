//! A job's term on etcd: campaign (with the term's entry in the job's history: `history`),
//! renewal (every term of a client at once), resignation, and the one lease a client's terms
//! share ([`super`]'s module doc states the guarantees).

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::tokens::{BASE, base_of, padded};
use super::{
    Campaign, EtcdResult, EtcdTerm, EtcdTerms, Fenced, bounded, data_key, holder_of, lease_key,
    ttl_seconds,
};

/// Tries of a campaign whose token base changed between its read and the campaign.
const BASE_ATTEMPTS: usize = 4;

/// A client's lease for its terms.
#[derive(Clone, Copy, Debug)]
pub(super) struct HostLease {
    id: i64,
    /// The TTL etcd granted.
    ttl: Duration,
    /// Until when it is alive for sure: its last grant's or keep-alive's send time plus its TTL.
    until: Instant,
}

/// Whether etcd answered that a lease does not exist (it lapsed, or was revoked).
fn lease_not_found(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::NotFound)
}

impl EtcdTerms {
    /// Campaigns for `job` as `owner`: a new term when the job is free, else who holds it. A
    /// won term's key is attached to this client's lease (one for all its terms, granted with
    /// `ttl` at its first campaign, as etcd grants it: whole seconds, never under its own floor;
    /// every campaign of one client asks for the same `ttl`). A campaign that did not hear
    /// whether it won releases the key if it is `owner`'s (in the background), so that a key
    /// created by an answer that was lost is not kept alive by the client's renewals.
    pub async fn campaign(&self, job: &str, owner: &str, ttl: Duration) -> EtcdResult<Campaign> {
        let key = lease_key(job)?;
        let mut retried = false;
        loop {
            let (lease, granted_ttl) = self.host_lease(ttl).await?;
            match self
                .campaign_with(job, &key, owner, lease, granted_ttl)
                .await
            {
                // The client's lease lapsed since it was last renewed (a host that followed
                // every job renews none): the next try grants a new one.
                Err(e) if !retried && lease_not_found(&e) => {
                    self.forget_host_lease(lease);
                    retried = true;
                }
                other => return other,
            }
        }
    }

    async fn campaign_with(
        &self,
        job: &str,
        key: &str,
        owner: &str,
        lease: i64,
        granted_ttl: Duration,
    ) -> EtcdResult<Campaign> {
        // The token base the campaign believes is compared in its transaction: a won term's
        // token is exactly that base plus its revision (`tokens`). A base changed meanwhile is
        // read from the answer and the campaign tried again.
        for _ in 0..BASE_ATTEMPTS {
            let base = self.token_base().await?;
            let key = key.to_string();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                    Compare::value(BASE, CompareOp::Equal, padded(base)),
                ])
                .and_then([
                    TxnOp::put(
                        key.clone(),
                        owner,
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    // The term's entry in the job's history, created with it (`history`).
                    super::history::opening(job, owner, base)?,
                ])
                .or_else([TxnOp::get(key, None), TxnOp::get(BASE, None)]);
            let reply = match self.txn(txn).await {
                Ok(r) => r,
                Err(e) if lease_not_found(&e) => return Err(e),
                Err(e) => {
                    let (me, job, owner) = (self.clone(), job.to_string(), owner.to_string());
                    tokio::spawn(async move {
                        let _ = me.release_owner(&job, &owner).await;
                    });
                    return Err(e);
                }
            };
            if reply.succeeded() {
                // The key was created by this transaction (its one write): its create revision
                // is the transaction's revision.
                let revision = reply.header().map_or(0, |h| h.revision());
                if revision <= 0 {
                    return Err(etcd_client::Error::InvalidArgs(
                        "etcd answered a campaign without its revision".into(),
                    ));
                }
                let me = self.clone();
                let trimmed = job.to_string();
                tokio::spawn(async move {
                    let _ = me.trim_history(&trimmed).await;
                });
                return Ok(Campaign::Won(EtcdTerm {
                    job: job.to_string(),
                    owner: owner.to_string(),
                    token: base + revision,
                    revision,
                    lease,
                    ttl: granted_ttl,
                }));
            }
            let replies = reply.op_responses();
            if let Some((owner, revision)) = holder_of(&replies) {
                return Ok(Campaign::Held { owner, revision });
            }
            // The job is free: the base is not the one believed.
            self.learn_base(base_of(&replies)?);
        }
        Err(etcd_client::Error::InvalidArgs(format!(
            "{BASE} kept changing: no campaign for {job} in {BASE_ATTEMPTS} tries"
        )))
    }

    /// Renews `term`'s lease once: whether the term still holds the job.
    pub async fn renew(&self, term: &EtcdTerm) -> EtcdResult<bool> {
        Ok(self
            .renew_all(std::slice::from_ref(term))
            .await?
            .first()
            .copied()
            .unwrap_or(false))
    }

    /// Renews every term of `terms` at once: for each, whether it still holds its job (one
    /// [`EtcdTerms::beat`] without a registration).
    pub async fn renew_all(&self, terms: &[EtcdTerm]) -> EtcdResult<Vec<bool>> {
        Ok(self.beat(None, terms).await?.held)
    }

    /// This client's lease for its terms, granted with `ttl` when it has none (or its last one
    /// lapsed, or may have: not renewed within its TTL); its id and the TTL etcd granted.
    pub(super) async fn host_lease(&self, ttl: Duration) -> EtcdResult<(i64, Duration)> {
        if let Some(h) = *self.host.lock().expect("host lease")
            && Instant::now() < h.until
        {
            return Ok((h.id, h.ttl));
        }
        let sent = Instant::now();
        let granted = self
            .resent(|mut c| async move { c.lease_grant(ttl_seconds(ttl), None).await })
            .await?;
        let lease = HostLease {
            id: granted.id(),
            ttl: Duration::from_secs(granted.ttl().max(1) as u64),
            until: sent + Duration::from_secs(granted.ttl().max(1) as u64),
        };
        let mut host = self.host.lock().expect("host lease");
        // Two campaigns at once may both have granted one: the first kept is used, the other
        // lapses unused.
        let h = match *host {
            Some(h) if Instant::now() < h.until => h,
            _ => *host.insert(lease),
        };
        Ok((h.id, h.ttl))
    }

    /// The lease `id` lapsed: the next campaign grants another.
    pub(super) fn forget_host_lease(&self, id: i64) {
        let mut host = self.host.lock().expect("host lease");
        if host.is_some_and(|h| h.id == id) {
            *host = None;
        }
    }

    /// The lease `id` was renewed by a keep-alive sent at `sent`.
    pub(super) fn note_renewed(&self, id: i64, sent: Instant) {
        if let Some(h) = self.host.lock().expect("host lease").as_mut()
            && h.id == id
        {
            h.until = sent + h.ttl;
        }
    }

    /// Releases `job`'s key if `owner` holds it (a campaign whose answer was lost): true when
    /// it did. The term's history entry, if the campaign made one, is left open (read as
    /// `crashed` once a later term begins).
    pub async fn release_owner(&self, job: &str, owner: &str) -> EtcdResult<bool> {
        let key = lease_key(job)?;
        let txn = Txn::new()
            .when([Compare::value(key.clone(), CompareOp::Equal, owner)])
            .and_then([TxnOp::delete(key, None)]);
        Ok(self.txn(txn).await?.succeeded())
    }

    /// Writes `value` under the job's `key`, fenced: applied only while `term` holds the job.
    pub async fn write(&self, term: &EtcdTerm, key: &str, value: &[u8]) -> EtcdResult<Fenced> {
        if term.revision <= 0 {
            // No term has revision 0: compared with a key that does not exist, it would match.
            return Ok(Fenced::Refused { holder: None });
        }
        let lease = lease_key(&term.job)?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                lease.clone(),
                CompareOp::Equal,
                term.revision,
            )])
            .and_then([TxnOp::put(data_key(&term.job, key)?, value, None)])
            .or_else([TxnOp::get(lease, None)]);
        let reply = self.txn(txn).await?;
        if reply.succeeded() {
            return Ok(Fenced::Applied {
                revision: reply.header().map_or(0, |h| h.revision()),
            });
        }
        Ok(Fenced::Refused {
            holder: holder_of(&reply.op_responses()),
        })
    }

    /// The job's `key`, as the cluster's leader has it.
    pub async fn read(&self, job: &str, key: &str) -> EtcdResult<Option<Vec<u8>>> {
        let mut c = self.client.clone();
        let got = bounded(self.timeout, c.get(data_key(job, key)?, None)).await?;
        Ok(got.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// Who holds `job` now (owner and its lease key's create revision), if anyone.
    pub async fn holder(&self, job: &str) -> EtcdResult<Option<(String, i64)>> {
        let mut c = self.client.clone();
        let got = bounded(
            self.timeout,
            c.get(lease_key(job)?, Some(GetOptions::new())),
        )
        .await?;
        Ok(got.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
            )
        }))
    }

    /// Ends `term` (a resignation): its key deleted only if it is still the term's (the
    /// client's lease goes on, for its other terms), and its history entry closed as
    /// `released` with it. Whether the key was the term's.
    pub async fn resign(&self, term: &EtcdTerm) -> EtcdResult<bool> {
        self.end_term(term, "released").await
    }
}
