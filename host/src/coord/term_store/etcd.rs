//! The etcd store behind [`TermStore`]: [`crate::store::etcd`], with this seam's terms and
//! writes converted at the boundary.

use super::{
    Beat, Beaten, Campaign, Candidacy, Collection, JobReads, JobStatus, Lease, StoreTerm,
    TermHistory, TermStore, Written, Wrote,
};
use crate::coord::elector::owner_node;
use crate::coord::fence::{TermWrite, Written as TermWritten};
use crate::coord::members::{self, MemberInfo, Members};
use crate::coord::notices::{NoticeFor, ReleaseNotices};
use crate::coord::terms::{TermEnd, TermRecord};
use crate::store::etcd::{self, EtcdTerms};
use crate::store::keys::JobKeys;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The etcd side's term as this seam's.
fn from_etcd(t: etcd::EtcdTerm) -> anyhow::Result<StoreTerm> {
    Ok(StoreTerm {
        token: u64::try_from(t.token)?,
        job: t.job,
        owner: t.owner,
        ttl: t.ttl,
        lease: Some((t.lease, t.revision)),
    })
}

/// This seam's term as the etcd side's.
/// (A term of another store has no etcd lease nor revision: it is refused as one that lapsed.)
fn to_etcd(t: &StoreTerm) -> anyhow::Result<etcd::EtcdTerm> {
    let (lease, revision) = t.lease.unwrap_or((0, 0));
    Ok(etcd::EtcdTerm {
        job: t.job.clone(),
        owner: t.owner.clone(),
        token: i64::try_from(t.token)?,
        revision,
        lease,
        ttl: t.ttl,
    })
}

/// A job's state as the etcd side read it, as this seam's.
fn reads(s: etcd::JobStateRead) -> JobReads {
    let text = |v: Option<Vec<u8>>| v.map(|v| String::from_utf8_lossy(&v).into_owned());
    JobReads {
        requests: s.requests,
        open: s.open.into_iter().map(|(p, _)| p).collect(),
        paused: text(s.paused),
        cursor: text(s.cursor),
        wanted: text(s.wanted),
        indexed: s.indexed,
    }
}

/// What the etcd side's beat found, as this seam's (the states read are added by the caller).
fn beaten(beat: &Beat<'_>, found: etcd::Beaten) -> Beaten {
    let missing = || anyhow::anyhow!("no answer in etcd's reply");
    let mut held = found.held.into_iter();
    let mut looked = found.looked.into_iter();
    Beaten {
        members: Ok(members::described(
            found
                .members
                .unwrap_or_default()
                .iter()
                .map(|(n, i)| (n.clone(), i.as_slice())),
        )),
        renewed: beat
            .renew
            .iter()
            .map(|_| held.next().ok_or_else(missing))
            .collect(),
        looked: beat
            .look
            .iter()
            .map(|_| {
                let holder = looked.next().ok_or_else(missing)?;
                Ok(match holder {
                    Some(holder) => Lease::Held { holder, ttl: None },
                    None => Lease::Free,
                })
            })
            .collect(),
        read: Vec::new(),
    }
}

/// An etcd history entry as this seam's record (`None` for one with a word it does not know).
fn record(e: etcd::HistoryEntry) -> Option<TermRecord> {
    let end = match e.end.as_deref() {
        None => None,
        Some("released") => Some(TermEnd::Released),
        Some("expired") => Some(TermEnd::Expired),
        Some("fenced") => Some(TermEnd::Fenced),
        Some("crashed") => Some(TermEnd::Crashed),
        Some(_) => return None,
    };
    Some(TermRecord {
        token: u64::try_from(e.token).ok()?,
        node: owner_node(&e.owner).to_string(),
        owner: e.owner,
        started_ms: e.started_ms,
        ended_ms: e.ended_ms,
        end,
    })
}

impl TermStore for EtcdTerms {
    async fn campaign(&self, job: &str, owner: &str, ttl: Duration) -> anyhow::Result<Campaign> {
        Ok(match EtcdTerms::campaign(self, job, owner, ttl).await? {
            etcd::Campaign::Won(t) => Campaign::Won(from_etcd(t)?),
            etcd::Campaign::Held { owner, .. } => Campaign::Held { owner, left: None },
        })
    }

    async fn campaign_many(&self, candidacies: &[Candidacy]) -> Vec<anyhow::Result<Campaign>> {
        let each = candidacies
            .iter()
            .map(|c| TermStore::campaign(self, &c.job, &c.owner, c.ttl));
        futures_util::future::join_all(each).await
    }

    async fn give_back(&self, job: &str, owner: &str) -> anyhow::Result<bool> {
        Ok(EtcdTerms::release_owner(self, job, owner).await?)
    }

    async fn raise_tokens(&self, _job: &str, token: u64) -> anyhow::Result<bool> {
        Ok(EtcdTerms::raise_tokens(self, token).await?)
    }

    async fn renew(&self, term: &StoreTerm) -> anyhow::Result<bool> {
        Ok(EtcdTerms::renew(self, &to_etcd(term)?).await?)
    }

    async fn renew_all(&self, terms: &[StoreTerm]) -> anyhow::Result<Vec<bool>> {
        let terms: Vec<etcd::EtcdTerm> = terms.iter().map(to_etcd).collect::<Result<_, _>>()?;
        Ok(EtcdTerms::renew_all(self, &terms).await?)
    }

    async fn register(
        &self,
        node: &str,
        info: &MemberInfo,
        ttl: Duration,
    ) -> anyhow::Result<Members> {
        let json = serde_json::to_vec(info)?;
        let registration = etcd::Registration {
            node,
            info: &json,
            ttl,
        };
        let beaten = EtcdTerms::beat(self, Some(registration), &[]).await?;
        let found = beaten.members.unwrap_or_default();
        Ok(members::described(
            found.iter().map(|(n, i)| (n.clone(), i.as_slice())),
        ))
    }

    async fn beat(&self, beat: &Beat<'_>) -> Beaten {
        // The states' reads go at once with the beat (each its own read-only transaction).
        let json = match serde_json::to_vec(beat.info) {
            Ok(json) => json,
            Err(e) => return Beaten::failed(beat, &format!("cannot describe the member: {e}")),
        };
        let registration = etcd::Registration {
            node: beat.node,
            info: &json,
            ttl: beat.ttl,
        };
        let terms: anyhow::Result<Vec<etcd::EtcdTerm>> =
            beat.renew.iter().map(|t| to_etcd(t)).collect();
        let terms = match terms {
            Ok(terms) => terms,
            Err(e) => return Beaten::failed(beat, &format!("{e:#}")),
        };
        let looks: Vec<&str> = beat.look.iter().map(|l| l.job).collect();
        let states = beat
            .read
            .iter()
            .map(|job| async move { Ok(reads(EtcdTerms::job_state(self, job).await?)) });
        let (found, read) = futures_util::future::join(
            EtcdTerms::beat_looking(self, Some(registration), &terms, &looks),
            futures_util::future::join_all(states),
        )
        .await;
        let mut out = match found {
            Ok(found) => beaten(beat, found),
            Err(e) => Beaten::failed(beat, &format!("etcd: {e}")),
        };
        out.read = read;
        out
    }

    async fn deregister(&self, node: &str) -> anyhow::Result<()> {
        Ok(EtcdTerms::deregister(self, node).await?)
    }

    async fn publish_jobs(&self, node: &str, jobs: &[String]) -> anyhow::Result<()> {
        Ok(EtcdTerms::publish_jobs(self, node, jobs).await?)
    }

    async fn served_jobs(&self) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
        Ok(EtcdTerms::served_jobs(self).await?)
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
                etcd::WriteOutcome::Refused { holder } => {
                    Wrote::Refused(crate::coord::checks::Refusal::NotLeaseholder {
                        lease_holder: holder.map(|(owner, _)| owner).unwrap_or_default(),
                    })
                }
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

    async fn read_keys(&self, job: &str, rests: &[String]) -> anyhow::Result<Vec<Option<Vec<u8>>>> {
        Ok(EtcdTerms::get_many(self, job, rests).await?)
    }

    async fn newest_runs(&self, job: &str, limit: usize) -> anyhow::Result<Vec<String>> {
        let periods = EtcdTerms::last_members(self, job, "runs", limit + 1).await?;
        Ok(super::without_marker(periods, limit))
    }

    async fn job_state(&self, job: &str) -> anyhow::Result<JobReads> {
        Ok(reads(EtcdTerms::job_state(self, job).await?))
    }

    async fn purge(&self, job: &str, prefix: &str) -> anyhow::Result<(u64, u64)> {
        Ok(EtcdTerms::purge(self, job, prefix).await?)
    }

    async fn recount(&self, job: &str) -> anyhow::Result<(u64, u64)> {
        Ok(EtcdTerms::recount(self, job).await?)
    }

    async fn job_status(&self, job: &str) -> anyhow::Result<JobStatus> {
        let keys = JobKeys::new(job);
        let last = keys.last_run();
        let last = keys
            .rest(&last)
            .ok_or_else(|| anyhow::anyhow!("{last} is not a key of job {job}"))?;
        let s = EtcdTerms::job_status(self, job, last).await?;
        Ok(JobStatus {
            owner: s.owner,
            left: s.left,
            token: s.token.map(u64::try_from).transpose()?,
            paused: s.paused,
            last_run: s.last_run.map(|p| String::from_utf8_lossy(&p).into_owned()),
            usage: s.usage.unwrap_or((0, 0)),
            open: s.open,
        })
    }

    async fn request(
        &self,
        job: &str,
        period: &str,
        value: &str,
        replace: bool,
    ) -> anyhow::Result<bool> {
        Ok(EtcdTerms::request(self, job, period, value.as_bytes(), replace).await?)
    }

    async fn set_paused(&self, job: &str, reason: Option<&str>) -> anyhow::Result<()> {
        Ok(EtcdTerms::set_paused(self, job, reason).await?)
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

    async fn await_vacancy(&self, job: &str, limit: Duration) -> anyhow::Result<bool> {
        Ok(EtcdTerms::await_vacancy(self, job, limit).await?)
    }

    async fn end(&self, term: &StoreTerm, how: TermEnd) -> anyhow::Result<bool> {
        Ok(EtcdTerms::end_term(self, &to_etcd(term)?, how.as_str()).await?)
    }

    async fn history(&self, job: &str, limit: usize) -> anyhow::Result<TermHistory> {
        let (entries, unparsed) = EtcdTerms::history(self, job, limit).await?;
        let read = entries.len();
        let terms: Vec<TermRecord> = entries.into_iter().filter_map(record).collect();
        Ok(TermHistory {
            unparsed: unparsed + read - terms.len(),
            terms,
        })
    }

    async fn listen(&self, notices: ReleaseNotices, stop: CancellationToken) {
        EtcdTerms::listen(self, notices, stop).await
    }

    async fn notify(&self, job: &str, to: NoticeFor, payload: &str) -> anyhow::Result<()> {
        Ok(EtcdTerms::notify(self, job, to, payload).await?)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_stores_keep_as_many_terms() {
        assert_eq!(crate::store::etcd::HISTORY_KEPT, crate::coord::terms::KEPT);
    }
}
