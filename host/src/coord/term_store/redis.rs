//! The Redis store behind [`TermStore`]: the host's own scripts ([`crate::coord::lease`], the
//! fenced write) over the host's own connection ([`Conn`]: one node, a Sentinel service's
//! primary or a Cluster) and its notice subscriptions ([`PubSubSource`]).

use futures_util::StreamExt;
use redis::AsyncCommands;

use super::redis_beat::{self, state_cmds, state_reads};
use super::{
    Beat, Beaten, Campaign, Candidacy, Collection, JobReads, JobStatus, StoreTerm, TermHistory,
    TermStore, Written, Wrote,
};
use crate::coord::checks::FenceError;
use crate::coord::fence::{TermWrite, unchecked};
use crate::coord::lease::{self, Acquired};
use crate::coord::members::{self, MemberInfo, Members};
use crate::coord::notices::{NoticeFor, ReleaseNotices};
use crate::coord::terms::{self, TermEnd};
use crate::store::keys::JobKeys;
use crate::store::{Conn, PubSubSource};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What a job's status reads in one pipeline: the lease's owner and its `PTTL`, the fence's
/// token, the pause flag, the last run's period, the storage count (keys, bytes) and the open
/// runs' periods.
type StatusReads = (
    Option<String>,
    i64,
    Option<u64>,
    bool,
    Option<String>,
    (Option<u64>, Option<u64>),
    Vec<String>,
);

/// Terms on Redis, through the host's own scripts and connection.
#[derive(Clone)]
pub struct RedisTerms {
    conn: Conn,
    /// Where [`TermStore::await_vacancy`] and [`TermStore::listen`] subscribe (a connection of
    /// their own each).
    notices: PubSubSource,
    /// How long a subscription may take to open.
    timeout: Duration,
}

impl RedisTerms {
    /// Terms over `conn`, subscribing through `notices` within `timeout`.
    pub fn new(conn: Conn, notices: PubSubSource, timeout: Duration) -> Self {
        RedisTerms {
            conn,
            notices,
            timeout,
        }
    }

    /// Terms on the Redis `url` names (any URL the host takes: a node, `redis+sentinel://`, a
    /// Cluster's seeds), every call answered within `timeout` or failed.
    pub async fn open(url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let notices = crate::store::pubsub_clients(url)?;
        let conn = Conn::connect(url, timeout, Some(timeout)).await?;
        Ok(RedisTerms::new(conn, notices, timeout))
    }

    /// The connection (for what the seam does not carry yet).
    pub fn conn(&self) -> &Conn {
        &self.conn
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
                Acquired::Held { holder, ttl } => Campaign::Held {
                    owner: holder,
                    left: ttl,
                },
            },
        )
    }

    async fn campaign_many(&self, candidacies: &[Candidacy]) -> Vec<anyhow::Result<Campaign>> {
        let campaigns: Vec<lease::Campaign> = candidacies
            .iter()
            .map(|c| lease::Campaign {
                keys: JobKeys::new(&c.job),
                owner: c.owner.clone(),
                ttl: c.ttl,
                ask: c.ask.clone(),
            })
            .collect();
        let answers = lease::acquire_many(&mut self.conn.clone(), &campaigns).await;
        candidacies
            .iter()
            .zip(answers)
            .map(|(c, answer)| {
                Ok(match answer? {
                    Acquired::Granted { token } => Campaign::Won(StoreTerm {
                        job: c.job.clone(),
                        owner: c.owner.clone(),
                        token,
                        ttl: c.ttl,
                        lease: None,
                    }),
                    Acquired::Held { holder, ttl } => Campaign::Held {
                        owner: holder,
                        left: ttl,
                    },
                })
            })
            .collect()
    }

    async fn give_back(&self, job: &str, owner: &str) -> anyhow::Result<bool> {
        let keys = JobKeys::new(job);
        Ok(lease::release(&mut self.conn.clone(), &keys, owner, TermEnd::Released).await?)
    }

    async fn raise_tokens(&self, job: &str, token: u64) -> anyhow::Result<bool> {
        let keys = JobKeys::new(job);
        Ok(lease::raise_counter(&mut self.conn.clone(), &keys, token).await?)
    }

    async fn renew(&self, term: &StoreTerm) -> anyhow::Result<bool> {
        let keys = JobKeys::new(&term.job);
        Ok(lease::renew(&mut self.conn.clone(), &keys, &term.owner, term.ttl).await?)
    }

    async fn renew_all(&self, terms: &[StoreTerm]) -> anyhow::Result<Vec<bool>> {
        // One renewal script each, in one batch: one round trip per Redis node. Terms of
        // different lengths go in a batch each.
        let mut out = vec![false; terms.len()];
        let mut ttls: Vec<Duration> = terms.iter().map(|t| t.ttl).collect();
        ttls.sort();
        ttls.dedup();
        for ttl in ttls {
            let (at, keys): (Vec<usize>, Vec<JobKeys>) = terms
                .iter()
                .enumerate()
                .filter(|(_, t)| t.ttl == ttl)
                .map(|(i, t)| (i, JobKeys::new(&t.job)))
                .unzip();
            let owners = at.iter().map(|&i| terms[i].owner.as_str());
            let renewed =
                lease::renew_many(&mut self.conn.clone(), keys.iter().zip(owners), ttl).await;
            for (i, r) in at.into_iter().zip(renewed) {
                out[i] = r?;
            }
        }
        Ok(out)
    }

    async fn register(
        &self,
        node: &str,
        info: &MemberInfo,
        ttl: Duration,
    ) -> anyhow::Result<Members> {
        Ok(members::register(&mut self.conn.clone(), node, info, ttl).await?)
    }

    async fn beat(&self, beat: &Beat<'_>) -> Beaten {
        redis_beat::beat(&self.conn, beat).await
    }

    async fn deregister(&self, node: &str) -> anyhow::Result<()> {
        Ok(members::deregister(&mut self.conn.clone(), node).await?)
    }

    async fn publish_jobs(&self, node: &str, jobs: &[String]) -> anyhow::Result<()> {
        Ok(members::publish_jobs(&mut self.conn.clone(), node, jobs).await?)
    }

    async fn served_jobs(&self) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
        Ok(members::served_jobs(&mut self.conn.clone()).await?)
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
            Err(FenceError::Refused(r)) => Ok(Wrote::Refused(r)),
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

    async fn read_keys(&self, job: &str, rests: &[String]) -> anyhow::Result<Vec<Option<Vec<u8>>>> {
        if rests.is_empty() {
            return Ok(Vec::new());
        }
        let keys = JobKeys::new(job);
        let full: Vec<String> = rests.iter().map(|r| keys.of(r)).collect();
        Ok(redis::cmd("MGET")
            .arg(&full)
            .query_async(&mut self.conn.clone())
            .await?)
    }

    async fn newest_runs(&self, job: &str, limit: usize) -> anyhow::Result<Vec<String>> {
        // The marker may be among the first `limit + 1`: read one more, drop it.
        let periods: Vec<String> = redis::cmd("ZREVRANGEBYLEX")
            .arg(JobKeys::new(job).runs())
            .arg("+")
            .arg("-")
            .arg("LIMIT")
            .arg(0)
            .arg(limit + 1)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(super::without_marker(periods, limit))
    }

    async fn job_state(&self, job: &str) -> anyhow::Result<JobReads> {
        crate::metrics::get().round_trip("job-state");
        let mut pipe = redis::pipe();
        for c in state_cmds(&JobKeys::new(job)) {
            pipe.add_command(c);
        }
        let replies: Vec<redis::Value> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(state_reads(replies.into_iter().map(Ok).collect())?)
    }

    async fn purge(&self, job: &str, prefix: &str) -> anyhow::Result<(u64, u64)> {
        let purged =
            crate::coord::quota::purge(&mut self.conn.clone(), &JobKeys::new(job), prefix).await?;
        Ok((purged.keys, purged.bytes))
    }

    async fn recount(&self, job: &str) -> anyhow::Result<(u64, u64)> {
        Ok(crate::coord::quota::recount(&mut self.conn.clone(), &JobKeys::new(job)).await?)
    }

    async fn job_status(&self, job: &str) -> anyhow::Result<JobStatus> {
        let keys = JobKeys::new(job);
        let (owner, pttl, token, paused, last_run, (stored_keys, stored_bytes), mut open): StatusReads =
            redis::pipe()
            .get(keys.lease())
            .pttl(keys.lease())
            .hget(keys.fence(), "token")
            .exists(keys.paused())
            .get(keys.last_run())
            .cmd("HMGET")
            .arg(keys.usage())
            .arg("keys")
            .arg("bytes")
            .smembers(keys.open_runs())
            .query_async(&mut self.conn.clone())
            .await?;
        open.sort();
        Ok(JobStatus {
            owner,
            // PTTL: -2 without the key, -1 without an expiry.
            left: u64::try_from(pttl).ok().map(Duration::from_millis),
            token,
            paused,
            last_run,
            usage: (stored_keys.unwrap_or(0), stored_bytes.unwrap_or(0)),
            open,
        })
    }

    async fn request(
        &self,
        job: &str,
        period: &str,
        value: &str,
        replace: bool,
    ) -> anyhow::Result<bool> {
        // The notice wakes the leader's runner; without it (pub/sub down) the runner finds the
        // request at its next poll.
        let keys = JobKeys::new(job);
        let mut pipe = redis::pipe();
        if replace {
            pipe.hset(keys.requests(), period, value).ignore();
        } else {
            pipe.hset_nx(keys.requests(), period, value);
        }
        pipe.publish(keys.notice_channel(), "request").ignore();
        if replace {
            let () = pipe.query_async(&mut self.conn.clone()).await?;
            return Ok(true);
        }
        let (added,): (bool,) = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(added)
    }

    async fn set_paused(&self, job: &str, reason: Option<&str>) -> anyhow::Result<()> {
        let keys = JobKeys::new(job);
        let mut pipe = redis::pipe();
        match reason {
            Some(r) => pipe.set(keys.paused(), r),
            None => pipe.del(keys.paused()),
        };
        pipe.ignore()
            .publish(keys.notice_channel(), "paused")
            .ignore()
            .query_async::<()>(&mut self.conn.clone())
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

    async fn await_vacancy(&self, job: &str, limit: Duration) -> anyhow::Result<bool> {
        // Subscribed before the lease is read: a release between the read and the wait is
        // heard. A lapse publishes nothing; the lease's PTTL says when to read it again.
        let keys = JobKeys::new(job);
        let until = Instant::now() + limit;
        let client = self.notices.client(0, self.timeout).await?;
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(keys.released_channel()).await?;
        let mut released = pubsub.on_message();
        loop {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(keys.lease())
                .query_async(&mut self.conn.clone())
                .await?;
            // -2: no lease. (-1, a lease without expiry, is not the host's: held.)
            if pttl == -2 {
                return Ok(true);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let wait = match u64::try_from(pttl) {
                Ok(ms) => left.min(Duration::from_millis(ms)),
                Err(_) => left,
            };
            match tokio::time::timeout(wait, released.next()).await {
                Ok(Some(_)) => return Ok(true),
                Ok(None) => anyhow::bail!("the subscription to {job}'s releases ended"),
                Err(_) => continue,
            }
        }
    }

    async fn end(&self, term: &StoreTerm, how: TermEnd) -> anyhow::Result<bool> {
        let keys = JobKeys::new(&term.job);
        Ok(lease::release(&mut self.conn.clone(), &keys, &term.owner, how).await?)
    }

    async fn history(&self, job: &str, limit: usize) -> anyhow::Result<TermHistory> {
        let keys = JobKeys::new(job);
        let (terms, unparsed) = terms::history(&mut self.conn.clone(), &keys, limit).await?;
        Ok(TermHistory { terms, unparsed })
    }

    async fn listen(&self, notices: ReleaseNotices, stop: CancellationToken) {
        crate::coord::notices::listen_for_releases(self.notices.clone(), notices, stop).await
    }

    async fn notify(&self, job: &str, to: NoticeFor, payload: &str) -> anyhow::Result<()> {
        let _: i64 = self
            .conn
            .clone()
            .publish(to.channel(&JobKeys::new(job)), payload)
            .await?;
        Ok(())
    }
}
