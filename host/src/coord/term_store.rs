//! The seam between a term and its store (issue 30, its first cut): what a term asks of the
//! store — campaign, renew, a fenced write, a read, resign — as one trait, [`TermStore`], with
//! the Redis store (the scripts the host runs today: [`crate::coord::lease`] and the fenced
//! write) and the etcd store ([`crate::store::etcd`]) behind it. The contract both must keep is
//! tested against both by the same tests (`tests/integration/contract.rs`).
//!
//! **The contract** (`docs/store-contract.md`, C1 and C4). At most one term holds a job; a
//! campaign on a held job names the holder. Every new term of a job has a higher token than every
//! earlier one. A fenced write applies only while its term holds the job: once the term was
//! resigned, or its lease lapsed and a later term began, the store itself refuses the write and
//! writes nothing, whatever the writer's clock says. A term renewed before its TTL goes on; one
//! not renewed lapses after it (on etcd: the TTL etcd granted, in whole seconds, and longer while
//! etcd changes leaders). Resigning and renewing are only the term's own: a later term's hold is
//! never released or extended by an earlier one — on Redis given that every campaign has an
//! owner of its own (the scripts compare the owner; the host makes one `node:uuid` per
//! candidacy), on etcd by the term's lease and token.
//!
//! Tokens are each store's own: Redis's are microseconds since the epoch, etcd's revisions;
//! they grow within one store, not across a move from one to the other.
//!
//! **Not yet.** The host still calls the Redis functions directly (its heartbeat batches
//! renewals of many jobs in one round trip, which this per-term interface does not); moving it
//! onto the seam, and the rest of the store (run records, members, notices, tasks) behind it,
//! is the rest of issue 30.

use std::future::Future;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use crate::coord::checks::FenceError;
use crate::coord::fence::unchecked;
use crate::coord::lease::{self, Acquired};
use crate::coord::terms::TermEnd;
use crate::store::etcd::{self, EtcdTerms};
use crate::store::keys::JobKeys;

/// A term a store granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreTerm {
    /// The job.
    pub job: String,
    /// Who holds it.
    pub owner: String,
    /// Its fencing token.
    pub token: u64,
    /// Its lease's length.
    pub ttl: Duration,
    /// The etcd lease the term's key is attached to (etcd only).
    lease: Option<i64>,
}

/// What a campaign found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Campaign {
    /// The job was free: this term is ours.
    Won(StoreTerm),
    /// Another term holds the job.
    Held {
        /// Its owner.
        owner: String,
    },
}

/// What a fenced write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Applied.
    Applied,
    /// Refused by the store, nothing written: the term no longer holds the job.
    Refused,
}

/// What a term asks of its store (the module doc states the contract).
pub trait TermStore {
    /// Campaigns for `job` as `owner` (one of its own per campaign) with a lease of `ttl`.
    fn campaign(
        &self,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = anyhow::Result<Campaign>> + Send;

    /// Renews `term`'s lease for its TTL: false when the term no longer holds the job.
    fn renew(&self, term: &StoreTerm) -> impl Future<Output = anyhow::Result<bool>> + Send;

    /// Writes `value` under the job's `key`, fenced by `term`.
    fn write(
        &self,
        term: &StoreTerm,
        key: &str,
        value: &[u8],
    ) -> impl Future<Output = anyhow::Result<Written>> + Send;

    /// The job's `key`.
    fn read(
        &self,
        job: &str,
        key: &str,
    ) -> impl Future<Output = anyhow::Result<Option<Vec<u8>>>> + Send;

    /// Who holds `job` now, if anyone.
    fn holder(&self, job: &str) -> impl Future<Output = anyhow::Result<Option<String>>> + Send;

    /// Ends `term`: false when it no longer held the job.
    fn resign(&self, term: &StoreTerm) -> impl Future<Output = anyhow::Result<bool>> + Send;
}

/// Terms on one Redis node, through the host's own scripts (over a plain connection, not the
/// host's [`crate::store::Conn`]: no Cluster or Sentinel here yet).
#[derive(Clone)]
pub struct RedisTerms {
    conn: MultiplexedConnection,
}

impl RedisTerms {
    /// Terms on the Redis `conn` speaks to.
    pub fn new(conn: MultiplexedConnection) -> Self {
        RedisTerms { conn }
    }
}

impl TermStore for RedisTerms {
    async fn campaign(&self, job: &str, owner: &str, ttl: Duration) -> anyhow::Result<Campaign> {
        let keys = JobKeys::new(job);
        Ok(
            match lease::acquire(&mut self.conn.clone(), &keys, owner, ttl).await? {
                Acquired::Granted { token } => Campaign::Won(StoreTerm {
                    job: job.to_string(),
                    owner: owner.to_string(),
                    token,
                    ttl,
                    lease: None,
                }),
                Acquired::Held { holder, .. } => Campaign::Held { owner: holder },
            },
        )
    }

    async fn renew(&self, term: &StoreTerm) -> anyhow::Result<bool> {
        let keys = JobKeys::new(&term.job);
        Ok(lease::renew(&mut self.conn.clone(), &keys, &term.owner, term.ttl).await?)
    }

    async fn write(&self, term: &StoreTerm, key: &str, value: &[u8]) -> anyhow::Result<Written> {
        let keys = JobKeys::new(&term.job);
        let sets = [(keys.data(key), value)];
        match unchecked::write(
            &mut self.conn.clone(),
            &keys,
            &term.owner,
            term.token,
            &sets,
        )
        .await
        {
            Ok(()) => Ok(Written::Applied),
            Err(FenceError::Refused(_)) => Ok(Written::Refused),
            Err(e) => Err(e.into()),
        }
    }

    async fn read(&self, job: &str, key: &str) -> anyhow::Result<Option<Vec<u8>>> {
        let keys = JobKeys::new(job);
        Ok(self.conn.clone().get(keys.data(key)).await?)
    }

    async fn holder(&self, job: &str) -> anyhow::Result<Option<String>> {
        let keys = JobKeys::new(job);
        Ok(self.conn.clone().get(keys.lease()).await?)
    }

    async fn resign(&self, term: &StoreTerm) -> anyhow::Result<bool> {
        let keys = JobKeys::new(&term.job);
        Ok(lease::release(
            &mut self.conn.clone(),
            &keys,
            &term.owner,
            TermEnd::Released,
        )
        .await?)
    }
}

/// The etcd side's term as this seam's.
fn from_etcd(t: etcd::EtcdTerm) -> anyhow::Result<StoreTerm> {
    Ok(StoreTerm {
        token: u64::try_from(t.token)?,
        job: t.job,
        owner: t.owner,
        ttl: t.ttl,
        lease: Some(t.lease),
    })
}

/// This seam's term as the etcd side's.
/// (A term of another store has no etcd lease: it is refused as one that lapsed.)
fn to_etcd(t: &StoreTerm) -> anyhow::Result<etcd::EtcdTerm> {
    Ok(etcd::EtcdTerm {
        job: t.job.clone(),
        owner: t.owner.clone(),
        token: i64::try_from(t.token)?,
        lease: t.lease.unwrap_or(0),
        ttl: t.ttl,
    })
}

impl TermStore for EtcdTerms {
    async fn campaign(&self, job: &str, owner: &str, ttl: Duration) -> anyhow::Result<Campaign> {
        Ok(match EtcdTerms::campaign(self, job, owner, ttl).await? {
            etcd::Campaign::Won(t) => Campaign::Won(from_etcd(t)?),
            etcd::Campaign::Held { owner, .. } => Campaign::Held { owner },
        })
    }

    async fn renew(&self, term: &StoreTerm) -> anyhow::Result<bool> {
        Ok(EtcdTerms::renew(self, &to_etcd(term)?).await?)
    }

    async fn write(&self, term: &StoreTerm, key: &str, value: &[u8]) -> anyhow::Result<Written> {
        Ok(
            match EtcdTerms::write(self, &to_etcd(term)?, key, value).await? {
                etcd::Fenced::Applied { .. } => Written::Applied,
                etcd::Fenced::Refused { .. } => Written::Refused,
            },
        )
    }

    async fn read(&self, job: &str, key: &str) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(EtcdTerms::read(self, job, key).await?)
    }

    async fn holder(&self, job: &str) -> anyhow::Result<Option<String>> {
        Ok(EtcdTerms::holder(self, job).await?.map(|(owner, _)| owner))
    }

    async fn resign(&self, term: &StoreTerm) -> anyhow::Result<bool> {
        Ok(EtcdTerms::resign(self, &to_etcd(term)?).await?)
    }
}
