//! Notices on etcd: one watch per host hears every job's release and lapse, and every notice
//! for a job's runner or its task workers — what the Redis store's pattern subscriptions do
//! (`crate::coord::notices`), on etcd's watches (`docs/store-contract.md`, section 5).
//!
//! **How.** Every job's term key and notice keys are under one prefix, `lh/{jobs}/`, apart from
//! the jobs' data, so one watch of that prefix (with each event's previous value) carries no
//! guest write: a term key's delete is the job's release (its holder resigned) or its lapse
//! (etcd's revoke of the holder's lease deletes the key), and names the holder that was, as the
//! Redis store's release message does; a put of `lh/{jobs}/notify/<job>` or
//! `lh/{jobs}/work/<job>` ([`EtcdTerms::notify`]) is a notice for its runner or its workers. Each
//! wakes what the host registered under the Redis channel of the same meaning
//! ([`ReleaseNotices`], keyed by `lh:{job}:released`, `lh:{job}:notify`, `lh:{job}:work`), so the
//! host's electors, runners and workers are the same on both stores. Jobs added later need no
//! new watch.
//!
//! **Guarantees.** A lapse wakes followers too (on Redis only a release does; a lapse is noticed
//! at the lease's expiry). A watch that broke is opened again from the revision after the last
//! event it delivered, so no event in between is missed; when that revision was compacted away,
//! the watch resumes from the oldest revision etcd still keeps and every registered notice is
//! woken once, so that what may have been missed before it is looked at again. Both tested in
//! `tests/integration/etcd.rs`: each member killed in turn, a notice sent right after each kill
//! is still heard; a watch cut off past a compaction wakes everyone, then hears the next
//! notice. **Non-guarantees.** While no watch is open (etcd
//! unreachable, a member without a leader), nothing is woken: followers fall back to their
//! heartbeat's look at the term, runners and workers to their polls, as on Redis. Notice keys
//! live on a shared short lease (60–90 s), so an old notice is not kept. **Cost.** Every host
//! receives every job's term creations and ends and every notice: two events a term and one a
//! notice, whatever the number of hosts' writes.

use std::time::Duration;

use etcd_client::{EventType, PutOptions, WatchOptions, WatchResponse};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{EtcdResult, EtcdTerms, JOBS, bounded, lease_key};
use crate::store::keys::JobKeys;
use crate::store::notice::{NoticeFor, ReleaseNotices};

/// How long the listener waits before it opens a watch again after one broke.
const REWATCH: Duration = Duration::from_millis(500);

/// The key a notice for `job`'s runner or workers is put under.
pub(super) fn notice_key(job: &str, to: NoticeFor) -> EtcdResult<String> {
    lease_key(job)?;
    let kind = match to {
        NoticeFor::Runner => "notify",
        NoticeFor::Workers => "work",
    };
    Ok(format!("{JOBS}{kind}/{job}"))
}

/// What an event under `lh/{jobs}/` means for the host: the channel to wake and the payload to
/// keep, if any.
fn meaning(
    kind: EventType,
    key: &[u8],
    value: &[u8],
    prev: Option<&[u8]>,
) -> Option<(String, String)> {
    let rest = std::str::from_utf8(key).ok()?.strip_prefix(JOBS)?;
    let (what, job) = rest.split_once('/')?;
    let keys = JobKeys::new(job);
    let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    match (what, kind) {
        ("lease", EventType::Delete) => {
            Some((keys.released_channel(), prev.map(text).unwrap_or_default()))
        }
        ("notify", EventType::Put) => Some((NoticeFor::Runner.channel(&keys), text(value))),
        ("work", EventType::Put) => Some((NoticeFor::Workers.channel(&keys), text(value))),
        // A term's creation, and a notice key's expiry, wake nobody.
        _ => None,
    }
}

impl EtcdTerms {
    /// Sends a notice about `job` to its runner or its task workers, with `payload` (kept as
    /// the last payload of the notice's channel). Heard by every host's [`EtcdTerms::listen`].
    pub async fn notify(&self, job: &str, to: NoticeFor, payload: &str) -> EtcdResult<()> {
        let key = notice_key(job, to)?;
        let lease = self.applied_lease().await?;
        let mut c = self.client.clone();
        bounded(
            self.timeout,
            c.put(key, payload, Some(PutOptions::new().with_lease(lease))),
        )
        .await?;
        Ok(())
    }

    /// Listens for every job's releases, lapses and notices, and wakes what `notices`
    /// registers for each, until `stop` is cancelled: one watch, opened again when it breaks.
    pub async fn listen(&self, notices: ReleaseNotices, stop: CancellationToken) {
        // The revision to resume from; none at first (from the present).
        let mut next: Option<i64> = None;
        let mut warned = false;
        while !stop.is_cancelled() {
            let broke = tokio::select! {
                r = self.watch_jobs(&notices, &mut next, &mut warned) => r,
                _ = stop.cancelled() => return,
            };
            if !warned {
                warn!(
                    "notices from etcd interrupted ({}); followers fall back to their heartbeat's look at the term until the watch is open again",
                    broke
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_else(|| "the watch ended".into())
                );
                warned = true;
            }
            tokio::select! {
                _ = tokio::time::sleep(REWATCH) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// One watch of `lh/{jobs}/` from `next` (or the present), until it breaks.
    async fn watch_jobs(
        &self,
        notices: &ReleaseNotices,
        next: &mut Option<i64>,
        warned: &mut bool,
    ) -> EtcdResult<()> {
        let mut options = WatchOptions::new().with_prefix().with_prev_key();
        if let Some(revision) = *next {
            options = options.with_start_revision(revision);
        }
        let mut c = self.client.clone();
        let mut stream = bounded(self.timeout, c.watch(JOBS, Some(options))).await?;
        if *warned {
            info!("notices from etcd heard again");
            *warned = false;
        }
        while let Some(answer) = stream.message().await? {
            if answer.compact_revision() > 0 {
                // The revision to resume from is gone: resume from the oldest one etcd still
                // keeps (nothing after it is missed), and let everyone look again at what they
                // may have missed before it.
                *next = Some(answer.compact_revision());
                wake_all(notices);
                return Ok(());
            }
            if answer.canceled() {
                return Ok(());
            }
            deliver(notices, &answer, next);
        }
        Ok(())
    }
}

/// Wakes what each event of `answer` means, and moves `next` past it.
fn deliver(notices: &ReleaseNotices, answer: &WatchResponse, next: &mut Option<i64>) {
    for event in answer.events() {
        let Some(kv) = event.kv() else { continue };
        *next = Some(next.unwrap_or(0).max(kv.mod_revision() + 1));
        let prev = event.prev_kv().map(|p| p.value());
        let Some((channel, payload)) = meaning(event.event_type(), kv.key(), kv.value(), prev)
        else {
            continue;
        };
        let notice = notices
            .lock()
            .expect("release notices")
            .get(&channel)
            .cloned();
        if let Some(n) = notice {
            if let Some(p) = &n.payload {
                *p.lock().expect("notice payload") = payload;
            }
            n.wake.notify_one();
        }
    }
}

/// Wakes every registered notice once.
fn wake_all(notices: &ReleaseNotices) {
    for n in notices.lock().expect("release notices").values() {
        n.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_under_the_jobs_prefix_mean_what_the_redis_channels_do() {
        let released = meaning(
            EventType::Delete,
            b"lh/{jobs}/lease/billing",
            b"",
            Some(b"n1:42".as_slice()),
        );
        assert_eq!(
            released,
            Some(("lh:{billing}:released".into(), "n1:42".into()))
        );
        assert_eq!(
            meaning(EventType::Put, b"lh/{jobs}/notify/billing", b"paused", None),
            Some(("lh:{billing}:notify".into(), "paused".into()))
        );
        assert_eq!(
            meaning(EventType::Put, b"lh/{jobs}/work/billing", b"tasks", None),
            Some(("lh:{billing}:work".into(), "tasks".into()))
        );
        // A term's creation and a notice key's expiry wake nobody.
        assert_eq!(
            meaning(EventType::Put, b"lh/{jobs}/lease/billing", b"n1:42", None),
            None
        );
        assert_eq!(
            meaning(EventType::Delete, b"lh/{jobs}/notify/billing", b"", None),
            None
        );
        assert_eq!(
            meaning(EventType::Put, b"lh/billing/cursor", b"x", None),
            None
        );
    }

    #[test]
    fn notice_keys_refuse_job_names_that_would_fall_under_another_prefix() {
        assert_eq!(
            notice_key("billing", NoticeFor::Workers).unwrap(),
            "lh/{jobs}/work/billing"
        );
        assert!(notice_key("a/b", NoticeFor::Runner).is_err());
        assert!(notice_key("{members}", NoticeFor::Runner).is_err());
    }
}
