//! The term history on etcd: who led a job when, with which token, and how each term ended —
//! what the Redis store's capped list `lh:{job}:terms` holds (`crate::coord::terms`), on etcd's
//! keys (`docs/store-contract.md`, section 1).
//!
//! **How.** An entry is the key `lh/<job>/history/<owner>` (an owner is one campaign's own),
//! created by the campaign's own transaction, the one that creates the term's key: so only a
//! term etcd granted has an entry, a stale leader cannot add one, and the entry's create
//! revision plus the base its campaign compared (kept in the entry) is the term's token. Its value is the owner, when the term began (the host's clock:
//! etcd keeps none) and, once it ended, when and how. Read back newest first (sorted by create
//! revision, [`HISTORY_KEPT`] at most); a won campaign deletes the entries beyond that, in the
//! background. A term's end ([`EtcdTerms::end_term`]) deletes its key and closes its entry in
//! one transaction while the term still holds the job; once it does not (it lapsed), an entry
//! not yet closed is closed as `expired` or `fenced` — a resignation that found its term gone
//! says `expired` — and a closed one is left alone, as on Redis.
//!
//! **Guarantees.** Entries in token order; an entry whose term a later term followed without
//! its end being written reads `crashed`, ended when the next began (on Redis the next
//! campaign writes that; here the read derives it, and a later `expired` or `fenced` from the
//! holder replaces it alike). **Non-guarantees.** Times are the hosts' clocks, not the store's.
//! The history is informational: nothing decides a write by it.

use std::time::{SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::{EtcdResult, EtcdTerm, EtcdTerms, bounded, holder_of, lease_key, member_key};

/// How many terms a job's history keeps (as the Redis store's, `crate::coord::terms::KEPT`).
pub const HISTORY_KEPT: usize = 32;

/// The collection the entries are members of (`lh/<job>/history/<owner>`).
const HISTORY: &str = "history";

/// Tries of a term's end when its entry changed between the read and the write.
const END_ATTEMPTS: usize = 4;

/// An entry as stored (the token is `base` plus its key's create revision).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Stored {
    owner: String,
    /// The token base its term's campaign compared (`super::tokens`).
    #[serde(default)]
    base: i64,
    started_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ended_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    end: Option<String>,
}

/// One term of a job's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    /// The term's token (the base its campaign compared plus its key's create revision).
    pub token: i64,
    /// Its owner (`node:uuid`).
    pub owner: String,
    /// When it began (ms since the epoch, the campaigning host's clock).
    pub started_ms: u64,
    /// When it ended, once it has.
    pub ended_ms: Option<u64>,
    /// How it ended (`released`, `expired`, `fenced`, `crashed`); `None` while it lasts.
    pub end: Option<String>,
}

fn history_key(job: &str, owner: &str) -> EtcdResult<String> {
    if owner.is_empty() || owner.contains('/') {
        return Err(etcd_client::Error::InvalidArgs(format!(
            "owner {owner:?}: empty or with a '/'"
        )));
    }
    member_key(job, HISTORY, owner)
}

/// Milliseconds since the Unix epoch by this host's clock (0 before it).
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The operation that opens `owner`'s entry, for the campaign's transaction.
pub(super) fn opening(job: &str, owner: &str, base: i64) -> EtcdResult<TxnOp> {
    let stored = Stored {
        owner: owner.to_string(),
        base,
        started_ms: now_ms(),
        ended_ms: None,
        end: None,
    };
    let value = serde_json::to_vec(&stored).expect("an entry serialises");
    Ok(TxnOp::put(history_key(job, owner)?, value, None))
}

/// `entries` (newest first) with every open entry that a later one follows read as `crashed`,
/// ended when the next began.
fn with_crashes(mut entries: Vec<HistoryEntry>) -> Vec<HistoryEntry> {
    for i in 1..entries.len() {
        if entries[i].end.is_none() {
            entries[i].end = Some("crashed".into());
            entries[i].ended_ms = Some(entries[i - 1].started_ms);
        }
    }
    entries
}

impl EtcdTerms {
    /// `job`'s terms, newest first, at most `limit` (and [`HISTORY_KEPT`]), and how many of the
    /// entries read did not parse (left out).
    pub async fn history(&self, job: &str, limit: usize) -> EtcdResult<(Vec<HistoryEntry>, usize)> {
        let prefix = member_key(job, HISTORY, "")?;
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(limit.clamp(1, HISTORY_KEPT) as i64);
        let mut c = self.client.clone();
        let got = bounded(self.timeout, c.get(prefix, Some(options))).await?;
        let entries: Vec<HistoryEntry> = got
            .kvs()
            .iter()
            .filter_map(|kv| {
                let s: Stored = serde_json::from_slice(kv.value()).ok()?;
                Some(HistoryEntry {
                    token: s.base + kv.create_revision(),
                    owner: s.owner,
                    started_ms: s.started_ms,
                    ended_ms: s.ended_ms,
                    end: s.end,
                })
            })
            .collect();
        let unparsed = got.kvs().len() - entries.len();
        Ok((with_crashes(entries), unparsed))
    }

    /// Ends `term`, saying `how` (`released`, `expired`, `fenced`): its key deleted and its
    /// entry closed in one transaction while it still holds the job; once it does not, only an
    /// entry not yet closed is, and `released` is written `expired` (the term had lapsed).
    /// Whether the key was the term's.
    pub async fn end_term(&self, term: &EtcdTerm, how: &str) -> EtcdResult<bool> {
        if term.revision <= 0 {
            return Ok(false);
        }
        let key = lease_key(&term.job)?;
        let entry_key = history_key(&term.job, &term.owner)?;
        let mut c = self.client.clone();
        for _ in 0..END_ATTEMPTS {
            let got = bounded(self.timeout, c.get(entry_key.as_str(), None)).await?;
            let entry = got
                .kvs()
                .first()
                .filter(|kv| kv.create_revision() == term.revision)
                .and_then(|kv| {
                    let s: Stored = serde_json::from_slice(kv.value()).ok()?;
                    Some((s, kv.mod_revision()))
                });
            let held = Compare::create_revision(key.clone(), CompareOp::Equal, term.revision);
            let Some((mut stored, revision)) = entry else {
                // No entry (trimmed, or of a host without one): the key alone.
                let txn = Txn::new()
                    .when([held])
                    .and_then([TxnOp::delete(key.clone(), None)]);
                return Ok(self.txn(txn).await?.succeeded());
            };
            let open = stored.end.is_none();
            stored.end = Some(how.to_string());
            stored.ended_ms = Some(now_ms());
            let closing = serde_json::to_vec(&stored).expect("an entry serialises");
            let unchanged = Compare::mod_revision(entry_key.clone(), CompareOp::Equal, revision);
            let mut then = vec![TxnOp::delete(key.clone(), None)];
            if open {
                then.push(TxnOp::put(entry_key.clone(), closing, None));
            }
            let txn = Txn::new()
                .when([held, unchanged.clone()])
                .and_then(then)
                .or_else([TxnOp::get(key.clone(), None)]);
            let reply = self.txn(txn).await?;
            if reply.succeeded() {
                return Ok(true);
            }
            if holder_of(&reply.op_responses())
                .is_some_and(|(_, revision)| revision == term.revision)
            {
                // Still the term's: the entry changed meanwhile (another end of this term).
                continue;
            }
            // The term no longer holds the job: a holder back from a pause or a cut says why it
            // went quiet; a resignation that found its term gone says it expired (as on Redis).
            if open {
                if how == "released" {
                    stored.end = Some("expired".into());
                }
                let closed = serde_json::to_vec(&stored).expect("an entry serialises");
                let txn = Txn::new().when([unchanged]).and_then([TxnOp::put(
                    entry_key.clone(),
                    closed,
                    None,
                )]);
                self.txn(txn).await?;
            }
            return Ok(false);
        }
        Ok(false)
    }

    /// Deletes `job`'s entries beyond the newest [`HISTORY_KEPT`].
    pub(super) async fn trim_history(&self, job: &str) -> EtcdResult<()> {
        let prefix = member_key(job, HISTORY, "")?;
        let options = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Descend);
        let mut c = self.client.clone();
        let got = bounded(self.timeout, c.get(prefix, Some(options))).await?;
        let beyond: Vec<TxnOp> = got
            .kvs()
            .iter()
            .skip(HISTORY_KEPT)
            .map(|kv| TxnOp::delete(kv.key().to_vec(), None))
            .collect();
        let mut ops = beyond.into_iter().peekable();
        while ops.peek().is_some() {
            let chunk: Vec<TxnOp> = ops.by_ref().take(self.max_txn_ops.max(1)).collect();
            bounded(self.timeout, c.txn(Txn::new().and_then(chunk))).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(token: i64, started_ms: u64, end: Option<&str>) -> HistoryEntry {
        HistoryEntry {
            token,
            owner: format!("n:{token}"),
            started_ms,
            ended_ms: end.map(|_| started_ms + 1),
            end: end.map(str::to_string),
        }
    }

    #[test]
    fn an_open_entry_followed_by_a_later_term_reads_crashed_ended_when_the_next_began() {
        let read = with_crashes(vec![
            entry(30, 3000, None),
            entry(20, 2000, None),
            entry(10, 1000, Some("released")),
        ]);
        assert_eq!(read[0].end, None, "the newest term still lasts");
        assert_eq!(read[1].end.as_deref(), Some("crashed"));
        assert_eq!(read[1].ended_ms, Some(3000));
        assert_eq!(read[2].end.as_deref(), Some("released"));
    }

    #[test]
    fn owners_with_a_slash_have_no_entry() {
        assert!(history_key("billing", "n1:abc").is_ok());
        assert!(history_key("billing", "n1/abc").is_err());
    }
}
