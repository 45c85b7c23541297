//! What operators read of a job's status on etcd (HTTP `GET /jobs/<job>`, the console): who
//! holds the job and for how long yet, the newest term's token, the pause flag, the last run's
//! period, the job's storage count and its open runs — on Redis one pipeline of the job's slot.
//!
//! One read-only transaction reads every part at one revision; the lease's time left is a
//! second request (etcd's `LeaseTimeToLive`, whole seconds), sent only while a term holds the
//! job. The token is the newest history entry's ([`super::history`]): the campaign that
//! created the term's key created it in the same transaction, so it is the holder's token while
//! a term holds the job and the last term's once none does, as the Redis fence's `token` field.

use std::time::Duration;

use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use serde::Deserialize;

use super::fenced::parse_usage;
use super::{EtcdResult, EtcdTerms, bounded, job_key, lease_key, member_key};

/// A job's status as [`EtcdTerms::job_status`] read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusRead {
    /// The holder's owner (`node:uuid`), while a term holds the job.
    pub owner: Option<String>,
    /// The holder's lease time left, as etcd counts it (whole seconds).
    pub left: Option<Duration>,
    /// The newest term's token, if the job ever had one.
    pub token: Option<i64>,
    /// Whether the job is paused.
    pub paused: bool,
    /// The job's key `last_run` (the last run's period), as stored.
    pub last_run: Option<Vec<u8>>,
    /// The job's storage count: keys and bytes.
    pub usage: Option<(u64, u64)>,
    /// The periods whose run is open, in key order.
    pub open: Vec<String>,
}

/// The part of a history entry the token needs.
#[derive(Deserialize)]
struct Based {
    #[serde(default)]
    base: i64,
}

impl EtcdTerms {
    /// `job`'s status, `last_run` naming the job's key that holds the last run's period.
    pub async fn job_status(&self, job: &str, last_run: &str) -> EtcdResult<StatusRead> {
        let open = member_key(job, "open", "")?;
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1);
        let txn = Txn::new().and_then([
            TxnOp::get(lease_key(job)?, None),
            TxnOp::get(member_key(job, "history", "")?, Some(newest)),
            TxnOp::get(
                job_key(job, "paused")?,
                Some(GetOptions::new().with_count_only()),
            ),
            TxnOp::get(job_key(job, last_run)?, None),
            TxnOp::get(job_key(job, "usage")?, None),
            TxnOp::get(
                open.clone(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ),
        ]);
        let mut c = self.client.clone();
        let reply = bounded(self.timeout, c.txn(txn)).await?;
        let gets: Vec<_> = reply
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let [term, history, paused, last, usage, opened] = <[_; 6]>::try_from(gets)
            .map_err(|_| etcd_client::Error::InvalidArgs("etcd answered a status short".into()))?;
        let held = term.kvs().first();
        let left = match held.map(|kv| kv.lease()).filter(|l| *l != 0) {
            Some(lease) => {
                let ttl = bounded(self.timeout, c.lease_time_to_live(lease, None)).await?;
                u64::try_from(ttl.ttl()).ok().map(Duration::from_secs)
            }
            None => None,
        };
        let token = history.kvs().first().and_then(|kv| {
            let based: Based = serde_json::from_slice(kv.value()).ok()?;
            Some(based.base + kv.create_revision())
        });
        Ok(StatusRead {
            owner: held.map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
            left,
            token,
            paused: paused.count() > 0,
            last_run: last.kvs().first().map(|kv| kv.value().to_vec()),
            usage: usage.kvs().first().and_then(|kv| parse_usage(kv.value())),
            open: opened
                .kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(&kv.key()[open.len()..]).into_owned())
                .collect(),
        })
    }
}
