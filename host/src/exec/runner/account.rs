//! Accounting: every period that fired since the cursor gets a run record, written through the
//! fence, the new cursor with the last of them, so no period is dropped or accounted twice (I5).
//!
//! The records are written [`ACCOUNT_CHUNK`] at a time, oldest first, so that a pass after a
//! long outage stays within a store's limit on one write (etcd's `--max-txn-ops`, 128 by
//! default: three operations a record). A pass that fails part way leaves records that the
//! next pass keeps (a period with a record keeps it) and the cursor where it was, so the next
//! pass writes only what is missing.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use tracing::{error, info, warn};

use super::decide::{self, Fired};
use super::{RunEnd, Runner, now_rfc3339};
use crate::coord::fence::{Bookkeeping, TermWrite};
use crate::coord::term::Term;
use crate::coord::term_store::TermStore as _;
use crate::exec::runs::{self, RunRecord, RunStatus};
use crate::units::show;

/// Most periods accounted for in one pass (and recorded one by one after an outage).
const ACCOUNT_MAX: usize = 1000;

/// Most records in one fenced write of a pass (three operations each on etcd, with room for
/// the cursor and the write's own reads within etcd's default 128).
const ACCOUNT_CHUNK: usize = 32;

/// The cursor's instant: RFC 3339 (what this version writes: the UTC instant of the newest
/// period accounted for), or a wall-clock fire time `YYYY-MM-DDTHH:MM:SS` as earlier versions
/// wrote it, read as the instant that fire time maps to in `schedule`.
fn parse_cursor(s: &str, schedule: &crate::exec::spec::Schedule) -> Option<DateTime<Utc>> {
    if let Some(t) = super::decide::parse_rfc3339(s) {
        return Some(t);
    }
    let local = chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S").ok()?;
    Some(schedule.instant(local).with_timezone(&Utc))
}

impl Runner {
    /// Reads the job's state and accounts for fired periods, unless the job is paused.
    pub(super) async fn account_now(&self, term: &Term) -> Result<Vec<String>, RunEnd> {
        let state = self
            .in_term(term, runs::state_of(&self.store, &self.keys))
            .await?;
        self.note(&state);
        if state.paused.is_some() {
            return Ok(Vec::new());
        }
        self.account(term, &state).await
    }

    /// Accounts for the periods that fired since the cursor: each gets a record, `pending`
    /// (to be run), `missed` (catch-up policy) or `skipped` (overlap policy), written through
    /// the fence together with the new cursor. Returns the periods made pending.
    pub(super) async fn account(
        &self,
        term: &Term,
        state: &runs::JobState,
    ) -> Result<Vec<String>, RunEnd> {
        let token = term.token();
        let schedule = &self.job.spec.schedule;
        let policies = self.job.spec.policies;
        let cursor = match state.cursor.as_deref().map(|c| parse_cursor(c, schedule)) {
            Some(Some(c)) => Some(c),
            Some(None) => {
                warn!(cursor = ?state.cursor, "the scheduler cursor is not a date-time; starting from the current period");
                None
            }
            None => None,
        };
        let now = Utc::now();
        let (fired, truncated) = schedule.since(cursor, now, ACCOUNT_MAX);
        // Periods are ordered by their start: the last one is the newest.
        let Some(newest) = fired.last() else {
            return Ok(Vec::new());
        };
        if truncated {
            error!(cursor = ?state.cursor, oldest_recorded = %fired[0].id, "more than {ACCOUNT_MAX} periods fired since the cursor; the older ones are missed and not recorded one by one");
        }
        // Periods that already have a record (a trigger ran one early) keep it.
        let run_keys: Vec<String> = fired
            .iter()
            .map(|p| crate::store::keys::JobKeys::run_rest(&p.id))
            .collect();
        let existing = self
            .in_term(term, self.store.read_keys(self.keys.job(), &run_keys))
            .await?;
        let now_s = now_rfc3339();
        let mut busy = !state.open.is_empty();
        let mut records = Vec::new();
        let mut pending = Vec::new();
        for (p, existing) in fired.iter().zip(existing) {
            if existing.is_some() {
                continue;
            }
            let late = (now - p.fire.with_timezone(&Utc))
                .to_std()
                .unwrap_or_default();
            let mut rec = RunRecord::new(p, RunStatus::Pending, &now_s);
            rec.token = token;
            rec.node = self.node.clone();
            rec.component = self.job.hash.clone();
            match decide::on_fire(&policies, p.id == newest.id, late, busy) {
                Fired::Missed => {
                    rec.status = RunStatus::Missed;
                    rec.finished_at = Some(now_s.clone());
                    rec.error = Some(format!(
                        "fired {} ago while no replica ran the job; catch-up policy {:?} with window {} did not run it",
                        show(Duration::from_secs(late.as_secs())),
                        policies.catch_up,
                        show(policies.catch_up_window)
                    ));
                }
                Fired::Skipped => {
                    rec.status = RunStatus::Skipped;
                    rec.finished_at = Some(now_s.clone());
                    rec.error =
                        Some("fired while an earlier run was open; overlap policy skip".into());
                }
                Fired::Run => {
                    busy = true;
                    pending.push(p.id.clone());
                }
            }
            match rec.status {
                RunStatus::Pending => {
                    info!(period = %p.id, late_ms = late.as_millis() as u64, "period fired")
                }
                status => {
                    warn!(period = %p.id, status = status.as_str(), "period recorded as {}: {}", status.as_str(), rec.error.as_deref().unwrap_or(""))
                }
            }
            records.push(rec);
        }
        let jsons: Vec<Vec<u8>> = records
            .iter()
            .map(|r| serde_json::to_vec(r).expect("run records serialize"))
            .collect();
        let cursor_value = newest
            .fire
            .with_timezone(&Utc)
            .to_rfc3339_opts(SecondsFormat::Secs, true);
        // Each chunk's records with their periods in the run index (the pending ones in the
        // open index), all or nothing; the cursor with the last chunk (alone when every period
        // already had a record).
        let chunks: Vec<&[RunRecord]> = if records.is_empty() {
            vec![&[]]
        } else {
            records.chunks(ACCOUNT_CHUNK).collect()
        };
        let (mut jsons, last) = (jsons.iter(), chunks.len() - 1);
        for (i, chunk) in chunks.into_iter().enumerate() {
            let mut sets: Vec<(String, &[u8])> = chunk
                .iter()
                .zip(jsons.by_ref())
                .map(|(r, j)| (self.keys.run(&r.period), j.as_slice()))
                .collect();
            if i == last {
                sets.push((self.keys.cursor(), cursor_value.as_bytes()));
            }
            let indexed: Vec<String> = chunk.iter().map(|r| r.period.clone()).collect();
            let opened: Vec<String> = chunk
                .iter()
                .filter(|r| r.status == RunStatus::Pending)
                .map(|r| r.period.clone())
                .collect();
            let book = Bookkeeping {
                open_add: &opened,
                runs_add: &indexed,
                ..Bookkeeping::default()
            };
            self.fenced(term, TermWrite::new(&sets, &[]).with(book))
                .await?;
        }
        for r in records.iter().filter(|r| r.status.is_final()) {
            crate::metrics::get().run_final(&self.job.spec.name, r.status.as_str());
        }
        Ok(pending)
    }
}
