//! The Redis store's heartbeat ([`super::TermStore::beat`]): the registration script, a
//! renewal script per term, a look per followed job and the job-state commands per read, in one
//! [`Batch`] — one round trip per Redis node, the batch the heartbeat has always sent — and the
//! job-state commands it shares with [`super::TermStore::job_state`].

use super::{Beat, Beaten, JobReads};
use crate::coord::lease;
use crate::coord::members;
use crate::store::keys::JobKeys;
use crate::store::{Batch, Conn};

/// How many commands [`state_cmds`] makes.
const STATE_CMDS: usize = 6;

/// The commands that read a job's [`JobReads`] (all of the job's slot), for a pipeline or a
/// [`Batch`]; their replies, in order, read with [`state_reads`].
pub(super) fn state_cmds(keys: &JobKeys) -> [redis::Cmd; STATE_CMDS] {
    [
        redis::cmd("HGETALL").arg(keys.requests()).clone(),
        redis::cmd("SMEMBERS").arg(keys.open_runs()).clone(),
        redis::cmd("GET").arg(keys.paused()).clone(),
        redis::cmd("GET").arg(keys.cursor()).clone(),
        redis::cmd("GET").arg(keys.wanted()).clone(),
        redis::cmd("ZSCORE")
            .arg(keys.runs())
            .arg(crate::store::keys::INDEXED)
            .clone(),
    ]
}

/// The [`JobReads`] from the replies to [`state_cmds`], in order.
pub(super) fn state_reads(
    replies: Vec<redis::RedisResult<redis::Value>>,
) -> redis::RedisResult<JobReads> {
    let mut it = replies.into_iter();
    let mut next = || {
        it.next().unwrap_or_else(|| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "missing reply",
            )))
        })
    };
    let requests: std::collections::BTreeMap<String, Vec<u8>> = redis::from_redis_value(next()?)?;
    let open: Vec<String> = redis::from_redis_value(next()?)?;
    let paused: Option<String> = redis::from_redis_value(next()?)?;
    let cursor: Option<String> = redis::from_redis_value(next()?)?;
    let wanted: Option<String> = redis::from_redis_value(next()?)?;
    let indexed: Option<f64> = redis::from_redis_value(next()?)?;
    Ok(JobReads {
        requests: requests.into_iter().collect(),
        open,
        paused,
        cursor,
        wanted,
        indexed: indexed.is_some(),
    })
}

/// One heartbeat on Redis ([`super::TermStore::beat`]): one batch, so one round trip per
/// Redis node (on a Cluster, a node that does not answer fails only the parts it holds).
pub(super) async fn beat(conn: &Conn, beat: &Beat<'_>) -> Beaten {
    // One batch: one round trip per Redis node, each part's replies at the indices it got.
    let mut batch = Batch::new();
    let registration = members::register_into(&mut batch, beat.node, beat.info, beat.ttl);
    let renewals: Vec<usize> = beat
        .renew
        .iter()
        .map(|t| lease::renew_into(&mut batch, &JobKeys::new(&t.job), &t.owner, beat.ttl))
        .collect();
    let looks: Vec<usize> = beat
        .look
        .iter()
        .map(|l| lease::observe_into(&mut batch, &JobKeys::new(l.job), l.ask, beat.ttl))
        .collect();
    let reads: Vec<usize> = beat
        .read
        .iter()
        .map(|job| {
            let keys = JobKeys::new(job);
            let first = batch.len();
            for c in state_cmds(&keys) {
                batch.cmd(&keys.lease(), c);
            }
            first
        })
        .collect();
    let mut replies: Vec<Option<redis::RedisResult<redis::Value>>> = conn
        .clone()
        .batch("heartbeat", &batch)
        .await
        .into_iter()
        .map(Some)
        .collect();
    let mut take = |i: usize| {
        replies
            .get_mut(i)
            .and_then(Option::take)
            .unwrap_or_else(|| {
                Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "no reply",
                )))
            })
    };
    Beaten {
        members: members::registered(take(registration)).map_err(Into::into),
        renewed: renewals
            .into_iter()
            .map(|i| lease::renewed(take(i)).map_err(Into::into))
            .collect(),
        looked: looks
            .into_iter()
            .map(|i| lease::observed(take(i)).map_err(Into::into))
            .collect(),
        read: reads
            .into_iter()
            .map(|first| {
                let replies = (first..first + STATE_CMDS).map(&mut take).collect();
                state_reads(replies).map_err(Into::into)
            })
            .collect(),
    }
}
