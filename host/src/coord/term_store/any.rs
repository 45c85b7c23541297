//! [`Store`]: the store a URL names, Redis or etcd, behind [`TermStore`] as one type, so that
//! what holds a store does not choose between them (the contract suite runs through it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::{
    Beat, Beaten, Campaign, Candidacy, Collection, JobReads, JobStatus, RedisTerms, StoreTerm,
    TermHistory, TermStore, Written, Wrote,
};
use crate::coord::fence::TermWrite;
use crate::coord::members::{MemberInfo, Members};
use crate::coord::notices::{NoticeFor, ReleaseNotices};
use crate::coord::terms::TermEnd;
use crate::store::etcd::EtcdTerms;

/// A store: Redis (a node, a Sentinel service, a Cluster) or an etcd cluster. Cheap to clone
/// (each side is shared).
#[derive(Clone)]
pub enum Store {
    /// Redis, through the host's own scripts.
    Redis(Arc<RedisTerms>),
    /// An etcd cluster ([`crate::store::etcd`]).
    Etcd(Arc<EtcdTerms>),
}

/// Whether `url` names an etcd cluster (`etcd://`, `etcds://`) rather than Redis.
pub fn names_etcd(url: &str) -> bool {
    let scheme = url.split("://").next().unwrap_or("");
    scheme.eq_ignore_ascii_case("etcd") || scheme.eq_ignore_ascii_case("etcds")
}

impl Store {
    /// Connects to the store `url` names: `etcd://` and `etcds://` an etcd cluster, every other
    /// scheme the host takes Redis; each call answered within `timeout` or failed. An etcd
    /// cluster is asked once at connect (a wrong user or certificate fails here).
    pub async fn open(url: &str, timeout: Duration) -> anyhow::Result<Store> {
        if names_etcd(url) {
            let terms = EtcdTerms::connect_url(url, timeout)
                .await
                .with_context(|| format!("cannot reach etcd at {}", crate::store::redact(url)))?;
            Ok(Store::Etcd(Arc::new(terms)))
        } else {
            Ok(Store::redis(RedisTerms::open(url, timeout).await?))
        }
    }

    /// The Redis store `terms`.
    pub fn redis(terms: RedisTerms) -> Store {
        Store::Redis(Arc::new(terms))
    }

    /// Whether the store answers: Redis's `PING`; on etcd a read of the token base, which only
    /// a member with a quorum answers (what `/readyz` asks).
    pub async fn ping(&self) -> anyhow::Result<()> {
        match self {
            Store::Redis(r) => {
                let _: String = redis::cmd("PING")
                    .query_async(&mut r.conn().clone())
                    .await?;
                Ok(())
            }
            Store::Etcd(e) => Ok(e.ping().await?),
        }
    }

    /// The store's name, as messages say it: `redis` or `etcd`.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Redis(_) => "redis",
            Store::Etcd(_) => "etcd",
        }
    }

    /// Redis's connection, for what only the Redis store carries yet (fan-out tasks): on etcd,
    /// an error saying so.
    pub fn redis_conn(&self) -> anyhow::Result<crate::store::Conn> {
        match self {
            Store::Redis(r) => Ok(r.conn().clone()),
            Store::Etcd(_) => {
                anyhow::bail!(
                    "not on etcd yet: this part of the host runs only on Redis (issue 30)"
                )
            }
        }
    }
}

/// `body` with `s` the store inside, whichever it is. The etcd side's futures are large (a
/// gRPC call's state): boxed, so that a caller's future, often on a small stack, does not carry
/// them inline.
macro_rules! each {
    ($store:expr, $s:ident => $body:expr) => {
        match $store {
            Store::Redis($s) => {
                let $s: &RedisTerms = $s;
                $body
            }
            Store::Etcd($s) => {
                let $s: &EtcdTerms = $s;
                Box::pin(async { $body }).await
            }
        }
    };
}

impl TermStore for Store {
    async fn campaign(&self, job: &str, owner: &str, ttl: Duration) -> anyhow::Result<Campaign> {
        each!(self, s => TermStore::campaign(s, job, owner, ttl).await)
    }

    async fn campaign_many(&self, candidacies: &[Candidacy]) -> Vec<anyhow::Result<Campaign>> {
        each!(self, s => TermStore::campaign_many(s, candidacies).await)
    }

    async fn give_back(&self, job: &str, owner: &str) -> anyhow::Result<bool> {
        each!(self, s => TermStore::give_back(s, job, owner).await)
    }

    async fn raise_tokens(&self, job: &str, token: u64) -> anyhow::Result<bool> {
        each!(self, s => TermStore::raise_tokens(s, job, token).await)
    }

    async fn renew(&self, term: &StoreTerm) -> anyhow::Result<bool> {
        each!(self, s => TermStore::renew(s, term).await)
    }

    async fn renew_all(&self, terms: &[StoreTerm]) -> anyhow::Result<Vec<bool>> {
        each!(self, s => TermStore::renew_all(s, terms).await)
    }

    async fn register(
        &self,
        node: &str,
        info: &MemberInfo,
        ttl: Duration,
    ) -> anyhow::Result<Members> {
        each!(self, s => TermStore::register(s, node, info, ttl).await)
    }

    async fn beat(&self, beat: &Beat<'_>) -> Beaten {
        each!(self, s => TermStore::beat(s, beat).await)
    }

    async fn deregister(&self, node: &str) -> anyhow::Result<()> {
        each!(self, s => TermStore::deregister(s, node).await)
    }

    async fn publish_jobs(&self, node: &str, jobs: &[String]) -> anyhow::Result<()> {
        each!(self, s => TermStore::publish_jobs(s, node, jobs).await)
    }

    async fn served_jobs(&self) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
        each!(self, s => TermStore::served_jobs(s).await)
    }

    async fn write(&self, term: &StoreTerm, key: &str, value: &[u8]) -> anyhow::Result<Written> {
        each!(self, s => TermStore::write(s, term, key, value).await)
    }

    async fn write_all(&self, term: &StoreTerm, write: &TermWrite<'_>) -> anyhow::Result<Wrote> {
        each!(self, s => TermStore::write_all(s, term, write).await)
    }

    async fn read_key(&self, job: &str, rest: &str) -> anyhow::Result<Option<Vec<u8>>> {
        each!(self, s => TermStore::read_key(s, job, rest).await)
    }

    async fn members(
        &self,
        job: &str,
        collection: Collection,
    ) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        each!(self, s => TermStore::members(s, job, collection).await)
    }

    async fn read_keys(&self, job: &str, rests: &[String]) -> anyhow::Result<Vec<Option<Vec<u8>>>> {
        each!(self, s => TermStore::read_keys(s, job, rests).await)
    }

    async fn newest_runs(&self, job: &str, limit: usize) -> anyhow::Result<Vec<String>> {
        each!(self, s => TermStore::newest_runs(s, job, limit).await)
    }

    async fn job_state(&self, job: &str) -> anyhow::Result<JobReads> {
        each!(self, s => TermStore::job_state(s, job).await)
    }

    async fn job_status(&self, job: &str) -> anyhow::Result<JobStatus> {
        each!(self, s => TermStore::job_status(s, job).await)
    }

    async fn purge(&self, job: &str, prefix: &str) -> anyhow::Result<(u64, u64)> {
        each!(self, s => TermStore::purge(s, job, prefix).await)
    }

    async fn recount(&self, job: &str) -> anyhow::Result<(u64, u64)> {
        each!(self, s => TermStore::recount(s, job).await)
    }

    async fn request(
        &self,
        job: &str,
        period: &str,
        value: &str,
        replace: bool,
    ) -> anyhow::Result<bool> {
        each!(self, s => TermStore::request(s, job, period, value, replace).await)
    }

    async fn set_paused(&self, job: &str, reason: Option<&str>) -> anyhow::Result<()> {
        each!(self, s => TermStore::set_paused(s, job, reason).await)
    }

    async fn read(&self, job: &str, key: &str) -> anyhow::Result<Option<Vec<u8>>> {
        each!(self, s => TermStore::read(s, job, key).await)
    }

    async fn holder(&self, job: &str) -> anyhow::Result<Option<String>> {
        each!(self, s => TermStore::holder(s, job).await)
    }

    async fn resign(&self, term: &StoreTerm) -> anyhow::Result<bool> {
        each!(self, s => TermStore::resign(s, term).await)
    }

    async fn end(&self, term: &StoreTerm, how: TermEnd) -> anyhow::Result<bool> {
        each!(self, s => TermStore::end(s, term, how).await)
    }

    async fn history(&self, job: &str, limit: usize) -> anyhow::Result<TermHistory> {
        each!(self, s => TermStore::history(s, job, limit).await)
    }

    async fn await_vacancy(&self, job: &str, limit: Duration) -> anyhow::Result<bool> {
        each!(self, s => TermStore::await_vacancy(s, job, limit).await)
    }

    async fn listen(&self, notices: ReleaseNotices, stop: CancellationToken) {
        each!(self, s => TermStore::listen(s, notices, stop).await)
    }

    async fn notify(&self, job: &str, to: NoticeFor, payload: &str) -> anyhow::Result<()> {
        each!(self, s => TermStore::notify(s, job, to, payload).await)
    }
}

#[cfg(test)]
mod tests {
    use super::names_etcd;

    #[test]
    fn etcd_is_named_by_its_two_schemes_and_everything_else_is_redis() {
        assert!(names_etcd("etcd://127.0.0.1:2379"));
        assert!(names_etcd("etcds://a:2379,b:2379?cacert=/ca.pem"));
        assert!(names_etcd("ETCD://h:1"));
        for redis in [
            "redis://127.0.0.1:6379",
            "rediss://u:p@h:6380",
            "redis+sentinel://h:26379/svc",
            "redis+cluster://a:1,b:2",
            "etcdx://h:1",
            "h:2379",
        ] {
            assert!(!names_etcd(redis), "{redis}");
        }
    }
}
