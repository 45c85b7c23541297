//! An operator's cleanup of a job's data on etcd (`leasehold purge`): what the Redis store's
//! purge and recount scripts do ([`crate::coord::quota`]), on etcd's transactions. Data keys
//! are `lh/<job>/data:<key>`; each counts as the quota counts it (the key spelled as the Redis
//! store spells it, `lh:{<job>}:data:<key>`, plus the value: [`super::fenced`]).
//!
//! **Purge.** The data keys under a prefix are read a page at a time in key order (keys and
//! values: etcd has no size-only read), and each page is deleted in one transaction that
//! compares every key's modification revision and the usage key's with those the read saw and
//! puts the usage lowered by what it deletes; a page that changed meanwhile (a run writing) is
//! read again, at most [`ATTEMPTS`] times. The read moves past each page, so every key is
//! visited once even while a run writes more. Unfenced, as on Redis: a run writing the same
//! keys meanwhile may write some again.
//!
//! **Recount.** Every data key is read, page by page at one revision, and counted; the count
//! is put in a transaction that compares the usage key's modification revision with the one
//! read and finds no data key written since, so a write in between makes it count again.
//!
//! **Costs.** One page is at most `--max-txn-ops` less one keys (127 at etcd's default); a
//! purge costs two requests a page, a recount one a page and one more.

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};

use super::fenced::parse_usage;
use super::{EtcdResult, EtcdTerms, bounded, job_key};

/// Reads and compares tried for one page (or one recount) before it gives up.
const ATTEMPTS: usize = 8;

/// The first key after every key that starts with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The first key after `key`.
fn after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// What a data key counts for: `(keys, bytes)`, its key as Redis spells it (two bytes longer
/// than etcd's: `lh:{j}:` against `lh/j/`) plus its value.
fn counted(kvs: &[KeyValue]) -> (u64, u64) {
    let bytes = kvs
        .iter()
        .map(|kv| (kv.key().len() + 2 + kv.value().len()) as u64)
        .sum();
    (kvs.len() as u64, bytes)
}

/// The usage key's count and modification revision (0 and 0 when it is absent).
fn usage_of(kvs: &[KeyValue]) -> ((u64, u64), i64) {
    kvs.first().map_or(((0, 0), 0), |kv| {
        (parse_usage(kv.value()).unwrap_or((0, 0)), kv.mod_revision())
    })
}

/// The two reads of a reply: the usage key's and a page's.
fn two_gets(reply: etcd_client::TxnResponse) -> EtcdResult<(Vec<KeyValue>, Vec<KeyValue>)> {
    let mut gets = reply.op_responses().into_iter().filter_map(|r| match r {
        TxnOpResponse::Get(mut g) => Some(g.take_kvs()),
        _ => None,
    });
    match (gets.next(), gets.next()) {
        (Some(usage), Some(page)) => Ok((usage, page)),
        _ => Err(etcd_client::Error::InvalidArgs(
            "etcd answered a purge's read short".into(),
        )),
    }
}

fn contended(what: &str) -> etcd_client::Error {
    etcd_client::Error::InvalidArgs(format!(
        "the job's data changed under the {what} {ATTEMPTS} times in a row (a run is writing); try again"
    ))
}

impl EtcdTerms {
    /// Keys in one page of a purge or a recount.
    fn page(&self) -> usize {
        self.max_txn_ops.saturating_sub(1).max(1)
    }

    /// Deletes every data key of `job` whose key (as the guest names it) starts with `prefix`,
    /// lowering the job's usage by each; what was deleted, `(keys, bytes)`.
    pub async fn purge(&self, job: &str, prefix: &str) -> EtcdResult<(u64, u64)> {
        let start = job_key(job, &format!("data:{prefix}"))?;
        let end = prefix_end(&start);
        let usage_key = job_key(job, "usage")?;
        let mut from = start.into_bytes();
        let mut purged = (0, 0);
        let mut c = self.client.clone();
        loop {
            let mut deleted = false;
            for _ in 0..ATTEMPTS {
                let page = GetOptions::new()
                    .with_range(end.clone())
                    .with_limit(self.page() as i64);
                let read = Txn::new().and_then([
                    TxnOp::get(usage_key.clone(), None),
                    TxnOp::get(from.clone(), Some(page)),
                ]);
                let (usage, kvs) = two_gets(bounded(self.timeout, c.txn(read)).await?)?;
                let Some(last) = kvs.last() else {
                    return Ok(purged);
                };
                let next = after(last.key());
                let ((k0, b0), usage_rev) = usage_of(&usage);
                let (k, b) = counted(&kvs);
                let mut when = vec![Compare::mod_revision(
                    usage_key.clone(),
                    CompareOp::Equal,
                    usage_rev,
                )];
                let mut then = Vec::with_capacity(kvs.len() + 1);
                for kv in &kvs {
                    when.push(Compare::mod_revision(
                        kv.key(),
                        CompareOp::Equal,
                        kv.mod_revision(),
                    ));
                    then.push(TxnOp::delete(kv.key(), None));
                }
                then.push(TxnOp::put(
                    usage_key.clone(),
                    format!("{} {}", k0.saturating_sub(k), b0.saturating_sub(b)),
                    None,
                ));
                let write = Txn::new().when(when).and_then(then);
                if bounded(self.timeout, c.txn(write)).await?.succeeded() {
                    purged = (purged.0 + k, purged.1 + b);
                    from = next;
                    deleted = true;
                    break;
                }
            }
            if !deleted {
                return Err(contended("purge"));
            }
        }
    }

    /// Counts every data key of `job` and sets its usage to that; the count, `(keys, bytes)`.
    pub async fn recount(&self, job: &str) -> EtcdResult<(u64, u64)> {
        let start = job_key(job, "data:")?;
        let end = prefix_end(&start);
        let usage_key = job_key(job, "usage")?;
        let mut c = self.client.clone();
        for _ in 0..ATTEMPTS {
            let page = || {
                GetOptions::new()
                    .with_range(end.clone())
                    .with_limit(self.page() as i64)
            };
            let read = Txn::new().and_then([
                TxnOp::get(usage_key.clone(), None),
                TxnOp::get(start.clone(), Some(page())),
            ]);
            let reply = bounded(self.timeout, c.txn(read)).await?;
            let revision = reply.header().map_or(0, |h| h.revision());
            let (usage, mut kvs) = two_gets(reply)?;
            let (_, usage_rev) = usage_of(&usage);
            let mut total = (0, 0);
            while let Some(last) = kvs.last() {
                let next = after(last.key());
                let (k, b) = counted(&kvs);
                total = (total.0 + k, total.1 + b);
                let more = page().with_revision(revision);
                kvs = bounded(self.timeout, c.get(next, Some(more)))
                    .await?
                    .take_kvs();
            }
            let write = Txn::new()
                .when([
                    Compare::mod_revision(usage_key.clone(), CompareOp::Equal, usage_rev),
                    Compare::mod_revision(start.clone(), CompareOp::Less, revision + 1)
                        .with_range(end.clone()),
                ])
                .and_then([TxnOp::put(
                    usage_key.clone(),
                    format!("{} {}", total.0, total.1),
                    None,
                )]);
            if bounded(self.timeout, c.txn(write)).await?.succeeded() {
                return Ok(total);
            }
        }
        Err(contended("recount"))
    }
}
