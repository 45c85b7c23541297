//! Operators' writes on etcd: a request for a run and the pause flag (`leasehold trigger`,
//! `cancel`, `pause`, `resume` and the HTTP API), unfenced — they are inputs to the leader, not a
//! term's results — each with the notice that wakes the job's runner, in one transaction, as
//! the Redis store sends them in one pipeline.
//!
//! A request is the key `lh/<job>/requests/<period>` (the member of the job's `requests` hash);
//! the pause flag is `lh/<job>/paused`; the notice is the runner's
//! (`lh/{jobs}/notify/<job>`, [`super::notices`]), on the shared short lease notices live on.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::notices::notice_key;
use super::{EtcdResult, EtcdTerms, bounded, job_key, member_key};
use crate::store::notice::NoticeFor;

impl EtcdTerms {
    /// Writes the request `value` for `period` of `job` and sends its runner the notice
    /// `request`: replacing any request there (`replace`), or only where there is none. True when
    /// it was written; with no request written, no notice either.
    pub async fn request(
        &self,
        job: &str,
        period: &str,
        value: &[u8],
        replace: bool,
    ) -> EtcdResult<bool> {
        let key = member_key(job, "requests", period)?;
        let notice = self.notice_put(job, "request").await?;
        let puts = [TxnOp::put(key.clone(), value, None), notice];
        let txn = if replace {
            Txn::new().and_then(puts)
        } else {
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then(puts)
        };
        let mut c = self.client.clone();
        Ok(bounded(self.timeout, c.txn(txn)).await?.succeeded())
    }

    /// Pauses `job` with `reason` (who paused it and when) or resumes it (`None`), and sends
    /// its runner the notice `paused`.
    pub async fn set_paused(&self, job: &str, reason: Option<&str>) -> EtcdResult<()> {
        let key = job_key(job, "paused")?;
        let flag = match reason {
            Some(r) => TxnOp::put(key, r, None),
            None => TxnOp::delete(key, None),
        };
        let notice = self.notice_put(job, "paused").await?;
        let mut c = self.client.clone();
        bounded(self.timeout, c.txn(Txn::new().and_then([flag, notice]))).await?;
        Ok(())
    }

    /// The put of a notice for `job`'s runner with `payload`, on the notices' lease.
    async fn notice_put(&self, job: &str, payload: &str) -> EtcdResult<TxnOp> {
        let lease = self.applied_lease().await?;
        Ok(TxnOp::put(
            notice_key(job, NoticeFor::Runner)?,
            payload,
            Some(PutOptions::new().with_lease(lease)),
        ))
    }
}
