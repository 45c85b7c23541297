//! Waiting for a job to fall free: a follower's wake-up on etcd, where Redis has the release
//! channel. A watch on the job's lease key from the revision the key was read at hears its
//! delete, whether the holder resigned (a delete) or its lease lapsed (etcd's revoke deletes
//! every key attached to it), so a follower campaigns at once instead of polling.
//!
//! **Guarantees.** `true` means the key was absent at some revision after the call began: at
//! the first read, or at the delete the watch reported. It does not mean the job is still free
//! (another follower may have won it since); the campaign decides. **Non-guarantees.** A watch
//! the cluster cancels (compaction past its start, a member lost) or that ends is opened again
//! after a re-read, 50 ms later; meanwhile a vacancy is noticed only at that re-read.

use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchFilterType, WatchOptions};

use super::{EtcdResult, EtcdTerms, bounded, lease_key};

/// How long a follower waits before reading the key again after its watch ended.
const REWATCH: Duration = Duration::from_millis(50);

impl EtcdTerms {
    /// Waits until `job`'s lease key is absent, or `limit` has passed: true when the job was
    /// free at some moment since the call, false when it was held throughout `limit`.
    pub async fn await_vacancy(&self, job: &str, limit: Duration) -> EtcdResult<bool> {
        let key = lease_key(job)?;
        let until = Instant::now() + limit;
        loop {
            let mut c = self.client.clone();
            let got = bounded(self.timeout, c.get(key.as_str(), None)).await?;
            if got.kvs().is_empty() {
                return Ok(true);
            }
            let revision = got.header().map(|h| h.revision()).unwrap_or(0);
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            // From the revision after the read: a delete between the read and the watch's start
            // is reported too. Puts (renewals do not write the key; a new term's create does)
            // are filtered out by etcd.
            let options = WatchOptions::new()
                .with_start_revision(revision + 1)
                .with_filters([WatchFilterType::NoPut]);
            // (Dropping the stream ends the watch: its request stream closes.)
            let mut stream = bounded(self.timeout, c.watch(key.as_str(), Some(options))).await?;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, stream.message()).await {
                    Err(_) => return Ok(false),
                    Ok(Ok(Some(answer))) => {
                        if answer
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                        {
                            return Ok(true);
                        }
                        if answer.canceled() {
                            break;
                        }
                    }
                    // Ended or failed: read again and watch anew.
                    Ok(Ok(None)) | Ok(Err(_)) => break,
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            tokio::time::sleep(left.min(REWATCH)).await;
        }
    }
}
