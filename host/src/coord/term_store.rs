//! The seam between a term and its store (issue 30, its first cut): what a term asks of the
//! store — campaign, renew, a fenced write, a whole term write (a guest's keys against its
//! quota, `create`, deletes, a resend's answer, the run bookkeeping: [`TermStore::write_all`]),
//! reads, resign — as one trait, [`TermStore`], with
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
//! onto the seam, and the rest of the store (the runner's state reads, members, notices, tasks,
//! the term history) behind it, is the rest of issue 30. A task's write (a worker's claim) is
//! not part of the contract yet: the etcd store refuses one.

use std::future::Future;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use crate::coord::checks::FenceError;
use crate::coord::fence::{TermWrite, Written as TermWritten, unchecked};
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

/// What a whole term write did ([`TermStore::write_all`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wrote {
    /// Applied (for `create` that found a key: answered, nothing written).
    Applied(TermWritten),
    /// Refused by the store, nothing written: the term no longer holds the job.
    Refused,
    /// Refused, nothing written: the write would take the job past its quota; what it would
    /// keep `(keys, bytes)`.
    Quota(u64, u64),
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

    /// Applies `write` as `term`, all or nothing ([`crate::coord::fence`]'s module doc lists
    /// what a write does; a task's write, with a claim, is not part of this contract yet).
    /// Its keys are the job's keys as [`JobKeys`] names them.
    fn write_all(
        &self,
        term: &StoreTerm,
        write: &TermWrite<'_>,
    ) -> impl Future<Output = anyhow::Result<Wrote>> + Send;

    /// The job's key `rest` ([`JobKeys::rest`] of it: `cursor`, `run:<period>`, …).
    fn read_key(
        &self,
        job: &str,
        rest: &str,
    ) -> impl Future<Output = anyhow::Result<Option<Vec<u8>>>> + Send;

    /// The members of the job's open-runs index (`open`) or run index (`runs`), or the
    /// periods and values of its operators' requests (`requests`), ordered by member.
    fn members(
        &self,
        job: &str,
        collection: Collection,
    ) -> impl Future<Output = anyhow::Result<Vec<(String, Vec<u8>)>>> + Send;

    /// Asks for a run of `period` with the request `value` (an operator's write, unfenced).
    fn request(
        &self,
        job: &str,
        period: &str,
        value: &str,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The job's key.
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

/// A job's set or hash that a term write's bookkeeping changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collection {
    /// The open-runs index.
    Open,
    /// The run index.
    Runs,
    /// Operators' requests, period → request.
    Requests,
}

impl Collection {
    fn name(self) -> &'static str {
        match self {
            Collection::Open => "open",
            Collection::Runs => "runs",
            Collection::Requests => "requests",
        }
    }
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

    async fn write_all(&self, term: &StoreTerm, write: &TermWrite<'_>) -> anyhow::Result<Wrote> {
        let keys = JobKeys::new(&term.job);
        let owner = (term.owner.as_str(), term.token);
        match unchecked::invoke(&mut self.conn.clone(), &keys, owner, write).await {
            Ok(w) => Ok(Wrote::Applied(w)),
            Err(FenceError::Refused(_)) => Ok(Wrote::Refused),
            Err(FenceError::Quota(q)) => Ok(Wrote::Quota(q.keys, q.bytes)),
            Err(FenceError::Redis(e)) => Err(e.into()),
        }
    }

    async fn read_key(&self, job: &str, rest: &str) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(self.conn.clone().get(JobKeys::new(job).of(rest)).await?)
    }

    async fn members(
        &self,
        job: &str,
        collection: Collection,
    ) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let keys = JobKeys::new(job);
        let mut conn = self.conn.clone();
        let mut out: Vec<(String, Vec<u8>)> = match collection {
            Collection::Open => {
                let m: Vec<String> = conn.smembers(keys.open_runs()).await?;
                m.into_iter().map(|p| (p, Vec::new())).collect()
            }
            Collection::Runs => {
                let m: Vec<String> = conn.zrange(keys.runs(), 0, -1).await?;
                m.into_iter().map(|p| (p, Vec::new())).collect()
            }
            Collection::Requests => {
                let m: std::collections::BTreeMap<String, Vec<u8>> =
                    conn.hgetall(keys.requests()).await?;
                m.into_iter().collect()
            }
        };
        out.sort();
        Ok(out)
    }

    async fn request(&self, job: &str, period: &str, value: &str) -> anyhow::Result<()> {
        let keys = JobKeys::new(job);
        let _: () = self
            .conn
            .clone()
            .hset(keys.requests(), period, value)
            .await?;
        Ok(())
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

    async fn write_all(&self, term: &StoreTerm, write: &TermWrite<'_>) -> anyhow::Result<Wrote> {
        if write.claim.is_some() {
            anyhow::bail!("a task's write (a worker's claim) is not on the etcd store yet");
        }
        let keys = JobKeys::new(&term.job);
        let rest = |k: &str| -> anyhow::Result<String> {
            keys.rest(k)
                .map(str::to_string)
                .ok_or_else(|| anyhow::anyhow!("{k} is not a key of job {}", term.job))
        };
        let set_keys: Vec<String> = write
            .sets
            .iter()
            .map(|(k, _)| rest(k))
            .collect::<Result<_, _>>()?;
        let sets: Vec<(&str, &[u8])> = set_keys
            .iter()
            .zip(write.sets)
            .map(|(k, (_, v))| (k.as_str(), *v))
            .collect();
        let delete_keys: Vec<String> = write
            .deletes
            .iter()
            .map(|k| rest(k))
            .collect::<Result<_, _>>()?;
        let deletes: Vec<&str> = delete_keys.iter().map(String::as_str).collect();
        let book = &write.book;
        let w = etcd::EtcdWrite {
            sets: &sets,
            deletes: &deletes,
            create: write.create,
            quota: write.quota.map(|q| (q.keys, q.bytes)),
            id: write.id,
            open_add: book.open_add,
            open_remove: book.open_remove,
            clear_requests: book.clear_requests,
            runs_add: book.runs_add,
        };
        Ok(
            match EtcdTerms::write_all(self, &to_etcd(term)?, &w).await? {
                etcd::WriteOutcome::Applied {
                    created,
                    deleted,
                    usage,
                } => Wrote::Applied(TermWritten {
                    created,
                    deleted,
                    usage,
                }),
                etcd::WriteOutcome::Refused { .. } => Wrote::Refused,
                etcd::WriteOutcome::Quota { keys, bytes } => Wrote::Quota(keys, bytes),
            },
        )
    }

    async fn read_key(&self, job: &str, rest: &str) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(EtcdTerms::get(self, job, rest).await?)
    }

    async fn members(
        &self,
        job: &str,
        collection: Collection,
    ) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        Ok(EtcdTerms::members(self, job, collection.name()).await?)
    }

    async fn request(&self, job: &str, period: &str, value: &str) -> anyhow::Result<()> {
        Ok(EtcdTerms::set_member(self, job, "requests", period, value.as_bytes()).await?)
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
