//! The runner of one job: while this node leads, it completes the job's due periods.
//!
//! Every round (each heartbeat, each fire time, or sooner) the leader reads the job's state in
//! one round trip (requests, open runs, pause flag, cursor), then:
//!
//! 1. **Accounts** for the periods that fired since the cursor ([`crate::spec::Schedule::since`]):
//!    each gets a run record in one fenced write with the new cursor — `pending`, or `missed`
//!    under the catch-up policy, or `skipped` under the overlap policy — so no period is ever
//!    dropped silently (I5).
//! 2. **Runs** the first due period (open runs, requests, and what it just made pending, in
//!    period order): `done` is final; `running`/`waiting`/`pending` resume from the saved step
//!    and checkpoint; a requested period whose record is `failed`, `missed` or `skipped` runs
//!    again as a new attempt. Before every step it checks the term
//!    ([`Term::still_leader`]), the pause flag (as last read, at most a heartbeat old) and the
//!    maximum run time; after every step it saves
//!    the record and the checkpoint in one fenced write. A failed step is retried from the
//!    checkpoint under the retry policy. A step is stopped as soon as the term ends (see
//!    [`crate::runtime`]), and nothing is written after that: the next leader resumes from the
//!    last checkpoint.
//!
//! On shutdown the running step is dropped (which stops the guest) before the elector releases
//! the lease (I7).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{SecondsFormat, Utc};
use redis::aio::ConnectionManager;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::config::{Timing, show};
use crate::elector::Role;
use crate::fence::{self, TermWriteError};
use crate::keys::JobKeys;
use crate::runs::{self, FailureKind, RunRecord, RunStatus};
use crate::runtime::{LoadedJob, RunInfo, Runtime, StepContext, StepError, StepOutcome};
use crate::spec::{CatchUp, Overlap, Period};
use crate::term::Term;

/// How long a period whose inputs are not ready waits before its step is tried again.
pub const NOT_READY_RETRY: Duration = Duration::from_secs(30);
/// How long after a Redis error the runner tries again.
const ERROR_RETRY: Duration = Duration::from_secs(1);
/// Finished periods remembered to avoid re-reading their records; forgotten all at once when
/// full (forgetting costs one read per period).
const DONE_CACHE: usize = 10_000;
/// Longest error message kept in a run record.
const ERROR_MAX: usize = 4096;

/// `why`, cut to [`ERROR_MAX`] bytes on a character boundary.
fn clip(mut why: String) -> String {
    if why.len() > ERROR_MAX {
        let mut cut = ERROR_MAX;
        while !why.is_char_boundary(cut) {
            cut -= 1;
        }
        why.truncate(cut);
        why.push_str(" [cut]");
    }
    why
}

/// Component versions of one job a runner keeps, newest last, so that a run started before a
/// replacement finishes with the version it started with.
const VERSIONS_KEPT: usize = 8;

/// Everything one job's runner needs.
pub struct Runner {
    /// The version new runs use (the latest loaded).
    job: Arc<LoadedJob>,
    /// Where newer versions arrive (from the jobs directory).
    versions: watch::Receiver<Arc<LoadedJob>>,
    /// Versions seen since start, oldest first (at most [`VERSIONS_KEPT`]).
    known: Vec<Arc<LoadedJob>>,
    runtime: Runtime,
    conn: ConnectionManager,
    node: String,
    timing: Timing,
    data_dir: Option<PathBuf>,
    keys: JobKeys,
    /// The pause flag as last read (every round, and at each fire time or heartbeat during a
    /// run): checked before each step without a round trip of its own.
    paused: AtomicBool,
}

/// How a period's run ended on this node.
enum RunEnd {
    /// The record is final (done, failed, missed or skipped), now or earlier.
    Finished,
    /// Not now: waiting for inputs or for a retry's backoff; try again at the instant.
    Later(Instant),
    /// The job is paused; the run resumes when it is resumed.
    Paused,
    /// The term ended; stop leading.
    Lost,
    /// A Redis error interrupted the run; it resumes from its last checkpoint.
    Interrupted(String),
    /// The run record is unreadable; the period is skipped (logged as an error).
    Broken,
}

impl RunEnd {
    fn why(&self) -> String {
        match self {
            RunEnd::Interrupted(w) => w.clone(),
            RunEnd::Lost => "the term ended".into(),
            _ => String::new(),
        }
    }
}

/// Most periods accounted for in one pass (and recorded one by one after an outage).
const ACCOUNT_MAX: usize = 1000;
/// How the cursor writes a wall-clock fire time.
const CURSOR_FORMAT: &str = "%Y-%m-%dT%H:%M:%S";

fn parse_local(s: &str) -> Option<chrono::NaiveDateTime> {
    chrono::NaiveDateTime::parse_from_str(s, CURSOR_FORMAT).ok()
}

fn parse_rfc3339(s: &str) -> Option<chrono::DateTime<Utc>> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

impl Runner {
    /// A runner for the job whose versions arrive on `versions` (the current one first), with
    /// inputs from `data_dir` (`<data-dir>/<job>/`, when it exists).
    pub fn new(
        mut versions: watch::Receiver<Arc<LoadedJob>>,
        runtime: Runtime,
        conn: ConnectionManager,
        node: String,
        timing: Timing,
        data_dir: Option<PathBuf>,
    ) -> Self {
        let job = versions.borrow_and_update().clone();
        Runner {
            keys: JobKeys::new(&job.spec.name),
            known: vec![job.clone()],
            job,
            versions,
            runtime,
            conn,
            node,
            timing,
            data_dir,
            paused: AtomicBool::new(false),
        }
    }

    /// Takes up a newer version, if one arrived.
    fn refresh(&mut self) {
        if self.versions.has_changed().unwrap_or(false) {
            let job = self.versions.borrow_and_update().clone();
            self.known.retain(|k| k.hash != job.hash);
            self.known.push(job.clone());
            if self.known.len() > VERSIONS_KEPT {
                self.known.remove(0);
            }
            self.job = job;
        }
    }

    /// Runs the job whenever `role` says this node leads, until `shutdown` turns true.
    pub async fn run(
        mut self,
        mut role: watch::Receiver<Role>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut done = HashSet::new();
        let mut not_before = HashMap::new();
        loop {
            let term = loop {
                if *shutdown.borrow() {
                    return;
                }
                if let Some(t) = role.borrow_and_update().term() {
                    break t.clone();
                }
                tokio::select! {
                    changed = role.changed() => if changed.is_err() { return },
                    _ = shutdown.wait_for(|s| *s) => return,
                }
            };
            tokio::select! {
                _ = self.lead(&term, &mut done, &mut not_before) => {}
                _ = shutdown.wait_for(|s| *s) => {
                    info!(job = %self.job.spec.name, node = %self.node, token = term.token(), "shutdown: running step stopped");
                    return;
                }
            }
        }
    }

    /// Completes due periods while `term` lasts.
    async fn lead(
        &mut self,
        term: &Term,
        done: &mut HashSet<String>,
        not_before: &mut HashMap<String, Instant>,
    ) {
        let token = term.token();
        let poll = self.timing.heartbeat;
        let mut paused_logged = false;
        while term.still_leader() {
            self.refresh();
            let (job, node) = (&self.job.spec.name, &self.node);
            let mut conn = self.conn.clone();
            let state = match self.in_term(term, runs::state(&mut conn, &self.keys)).await {
                Ok(s) => s,
                Err(RunEnd::Lost) => return,
                Err(e) => {
                    warn!(job, node, token, "cannot read the job's state: {}", e.why());
                    self.pause_for(term, ERROR_RETRY).await;
                    continue;
                }
            };
            self.paused.store(state.paused.is_some(), Ordering::Relaxed);
            if let Some(why) = &state.paused {
                if !paused_logged {
                    info!(job, node, token, paused = %why, "job paused: no step starts until it is resumed; periods that fire meanwhile are handled by the catch-up policy on resume");
                    paused_logged = true;
                }
                self.pause_for(term, poll).await;
                continue;
            }
            if paused_logged {
                info!(job, node, token, "job resumed");
                paused_logged = false;
            }
            let accounted = match self.account(term, &state).await {
                Ok(p) => p,
                Err(RunEnd::Lost) => return,
                Err(e) => {
                    warn!(
                        job,
                        node,
                        token,
                        "cannot account for fired periods: {}",
                        e.why()
                    );
                    Vec::new()
                }
            };
            let now = Instant::now();
            let mut due: Vec<String> = state
                .open
                .iter()
                .chain(&state.requested)
                .chain(&accounted)
                .filter(|id| !done.contains(*id) || state.requested.contains(*id))
                .cloned()
                .collect();
            due.sort();
            due.dedup();
            let next = due
                .into_iter()
                .find(|id| not_before.get(id).is_none_or(|t| *t <= now));
            let Some(id) = next else {
                // Nothing due: wait for the next fire time, a request, a retry, or the term's end.
                let until_fire = self.until_next_fire(poll);
                let until_retry = not_before
                    .values()
                    .map(|t| t.saturating_duration_since(now))
                    .min()
                    .unwrap_or(poll);
                self.pause_for(term, until_fire.min(until_retry).min(poll))
                    .await;
                continue;
            };
            let requested = state.requested.contains(&id);
            let Some(period) = self.period_of(&id).await else {
                continue;
            };
            // Periods keep being accounted for at their fire times while the run goes on, so
            // the overlap and catch-up policies see them on time.
            let end = {
                let run = self.run_period(term, &period, requested);
                tokio::pin!(run);
                loop {
                    tokio::select! {
                        end = &mut run => break end,
                        _ = tokio::time::sleep(self.until_next_fire(poll)) => {
                            if let Err(e) = self.account_now(term).await {
                                warn!(job = %self.job.spec.name, node = %self.node, token, "cannot account for fired periods during a run: {}", e.why());
                            }
                        }
                    }
                }
            };
            match end {
                end @ (RunEnd::Finished | RunEnd::Broken) => {
                    if done.len() >= DONE_CACHE {
                        done.clear();
                    }
                    done.insert(period.id.clone());
                    not_before.remove(&period.id);
                    let cleared = async {
                        runs::clear_request(&mut conn, &self.keys, &period.id).await?;
                        if !matches!(end, RunEnd::Broken) {
                            runs::mark_open(&mut conn, &self.keys, &period.id, false).await?;
                        }
                        Ok::<_, redis::RedisError>(())
                    };
                    if let Err(e) = cleared.await {
                        warn!(job = %self.job.spec.name, node = %self.node, token, period = %period.id, "cannot clear the run's request or open mark: {e}");
                    }
                }
                RunEnd::Later(at) => {
                    not_before.insert(period.id.clone(), at);
                }
                RunEnd::Paused => {}
                RunEnd::Lost => return,
                RunEnd::Interrupted(why) => {
                    warn!(job = %self.job.spec.name, node = %self.node, token, period = %period.id, "run interrupted, resuming from its checkpoint: {why}");
                    not_before.insert(period.id.clone(), Instant::now() + ERROR_RETRY);
                }
            }
        }
    }

    /// How long until the schedule fires next (at most `cap`).
    fn until_next_fire(&self, cap: Duration) -> Duration {
        self.job
            .spec
            .schedule
            .next(Utc::now())
            .and_then(|p| (p.fire.with_timezone(&Utc) - Utc::now()).to_std().ok())
            .map(|d| d + Duration::from_millis(5))
            .unwrap_or(cap)
            .min(cap)
    }

    /// Reads the job's state and accounts for fired periods, unless the job is paused.
    async fn account_now(&self, term: &Term) -> Result<Vec<String>, RunEnd> {
        let mut conn = self.conn.clone();
        let state = self
            .in_term(term, runs::state(&mut conn, &self.keys))
            .await?;
        self.paused.store(state.paused.is_some(), Ordering::Relaxed);
        if state.paused.is_some() {
            return Ok(Vec::new());
        }
        self.account(term, &state).await
    }

    /// Waits `d` or until the term ends.
    async fn pause_for(&self, term: &Term, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = term.ended() => {}
        }
    }

    /// The period `id` names in the job's schedule. A period that is not one (a bad request,
    /// or a record left by a version with another schedule) is dropped from the request and
    /// open sets, with a warning.
    async fn period_of(&self, id: &str) -> Option<Period> {
        let schedule = &self.job.spec.schedule;
        if let Some(p) = schedule.period_by_id(id) {
            return Some(p);
        }
        warn!(job = %self.job.spec.name, node = %self.node, period = %id, "period is not a period of schedule {:?} ({}); dropped", schedule.expr(), schedule.tz());
        let mut conn = self.conn.clone();
        let dropped = async {
            runs::clear_request(&mut conn, &self.keys, id).await?;
            runs::mark_open(&mut conn, &self.keys, id, false).await
        };
        if let Err(e) = dropped.await {
            warn!(job = %self.job.spec.name, node = %self.node, period = %id, "cannot drop the period: {e}");
        }
        None
    }

    /// Accounts for the periods that fired since the cursor: each gets a record, `pending`
    /// (to be run), `missed` (catch-up policy) or `skipped` (overlap policy), written through
    /// the fence together with the new cursor. Returns the periods made pending.
    async fn account(&self, term: &Term, state: &runs::JobState) -> Result<Vec<String>, RunEnd> {
        let (job, node, token) = (&self.job.spec.name, &self.node, term.token());
        let schedule = &self.job.spec.schedule;
        let policies = self.job.spec.policies;
        let cursor = match state.cursor.as_deref().map(parse_local) {
            Some(Some(c)) => Some(c),
            Some(None) => {
                warn!(job, node, token, cursor = ?state.cursor, "the scheduler cursor is not a date-time; starting from the current period");
                None
            }
            None => None,
        };
        let now = Utc::now();
        let (fired, truncated) = schedule.since(cursor, now, ACCOUNT_MAX);
        let Some(newest) = fired.last() else {
            return Ok(Vec::new());
        };
        if truncated {
            error!(job, node, token, cursor = ?state.cursor, oldest_recorded = %fired[0].id, "more than {ACCOUNT_MAX} periods fired since the cursor; the older ones are missed and not recorded one by one");
        }
        // Periods that already have a record (a trigger ran one early) keep it.
        let mut conn = self.conn.clone();
        let run_keys: Vec<String> = fired.iter().map(|p| self.keys.run(&p.id)).collect();
        let existing: Vec<Option<String>> = self
            .in_term(
                term,
                redis::cmd("MGET")
                    .arg(&run_keys)
                    .query_async::<Vec<Option<String>>>(&mut conn),
            )
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
            let run = match policies.catch_up {
                CatchUp::Latest => p.id == newest.id,
                CatchUp::Skip | CatchUp::All => late <= policies.catch_up_window,
            };
            let mut rec = RunRecord::new(p, RunStatus::Pending, &now_s);
            rec.token = token;
            rec.node = node.clone();
            rec.component = self.job.hash.clone();
            if !run {
                rec.status = RunStatus::Missed;
                rec.finished_at = Some(now_s.clone());
                rec.error = Some(format!(
                    "fired {} ago while no replica ran the job; catch-up policy {:?} with window {} did not run it",
                    show(Duration::from_secs(late.as_secs())),
                    policies.catch_up,
                    show(policies.catch_up_window)
                ));
            } else if busy && policies.overlap == Overlap::Skip {
                rec.status = RunStatus::Skipped;
                rec.finished_at = Some(now_s.clone());
                rec.error = Some("fired while an earlier run was open; overlap policy skip".into());
            } else {
                busy = true;
                pending.push(p.id.clone());
            }
            match rec.status {
                RunStatus::Pending => {
                    info!(job, node, token, period = %p.id, late_ms = late.as_millis() as u64, "period fired")
                }
                status => {
                    warn!(job, node, token, period = %p.id, status = status.as_str(), "period recorded as {}: {}", status.as_str(), rec.error.as_deref().unwrap_or(""))
                }
            }
            records.push(rec);
        }
        // The open index first: if this node dies before the records are written, the next
        // leader finds the ids (and, the cursor not having moved, accounts for them again).
        for id in &pending {
            if let Err(e) = runs::mark_open(&mut conn, &self.keys, id, true).await {
                return Err(RunEnd::Interrupted(e.to_string()));
            }
        }
        let jsons: Vec<Vec<u8>> = records
            .iter()
            .map(|r| serde_json::to_vec(r).expect("run records serialize"))
            .collect();
        let cursor_value = newest.local.format(CURSOR_FORMAT).to_string();
        let mut sets: Vec<(String, &[u8])> = records
            .iter()
            .zip(&jsons)
            .map(|(r, j)| (self.keys.run(&r.period), j.as_slice()))
            .collect();
        sets.push((self.keys.cursor(), cursor_value.as_bytes()));
        let who = (job.as_str(), node.as_str());
        match fence::write_in_term(&mut conn, &self.keys, term, who, &sets, &[]).await {
            Ok(()) => {
                for r in records.iter().filter(|r| r.status.is_final()) {
                    crate::metrics::get().run_final(job, r.status.as_str());
                }
                Ok(pending)
            }
            Err(TermWriteError::Ended | TermWriteError::Refused(_)) => Err(RunEnd::Lost),
            Err(TermWriteError::Redis(e)) => Err(RunEnd::Interrupted(e.to_string())),
        }
    }

    /// Runs (or resumes) one period until it is done, fails, waits, or the term ends. A run
    /// that has completed steps continues with the component version it started with; when
    /// this host no longer has that version, the run fails (versions are never mixed).
    /// `requested`: an operator asked for this period, so a final record other than `done` is
    /// run again as a new attempt.
    async fn run_period(&self, term: &Term, period: &Period, requested: bool) -> RunEnd {
        let keys = &self.keys;
        let (job, node, token) = (&self.job.spec.name, &self.node, term.token());
        let policies = self.job.spec.policies;
        let mut version = &self.job;
        let mut conn = self.conn.clone();
        let existing = match self
            .in_term(term, runs::read(&mut conn, keys, &period.id))
            .await
        {
            Ok(r) => r,
            Err(RunEnd::Interrupted(why)) if why.contains("is not valid") => {
                error!(job, node, token, period = %period.id, "{why}; the period is skipped until the record is repaired or deleted");
                return RunEnd::Broken;
            }
            Err(end) => return end,
        };
        let now = now_rfc3339();
        let mut record = match existing {
            Some(r) if r.status == RunStatus::Done => return RunEnd::Finished,
            Some(mut r) if r.status.is_final() && requested => {
                info!(job, node, token, period = %period.id, previous = r.status.as_str(), "re-running the period as an operator asked");
                r.attempt = if r.status == RunStatus::Failed {
                    r.attempt + 1
                } else {
                    1
                };
                r.status = RunStatus::Pending;
                r.step = 0;
                r.started_at = now.clone();
                r.finished_at = None;
                r.failure = None;
                r.retry_at = None;
                r
            }
            Some(r) if r.status.is_final() => return RunEnd::Finished,
            Some(r) => r,
            None => RunRecord::new(period, RunStatus::Pending, &now),
        };
        if record.status == RunStatus::Pending
            && let Some(at) = record.retry_at.as_deref().and_then(parse_rfc3339)
            && at > Utc::now()
        {
            let wait = (at - Utc::now()).to_std().unwrap_or_default();
            return RunEnd::Later(Instant::now() + wait);
        }
        if record.step > 0 && record.component != version.hash {
            match self.known.iter().find(|k| k.hash == record.component) {
                Some(old) => {
                    info!(job, node, token, period = %period.id, step = record.step, component = %old.hash, latest = %version.hash, "run continues with the component version it started with");
                    version = old;
                }
                None => {
                    let why = format!(
                        "the run started with component {} and completed {} steps; this host has only {}, and a run never mixes versions",
                        record.component, record.step, version.hash
                    );
                    return self
                        .fail(term, version, &mut record, FailureKind::VersionChanged, why)
                        .await;
                }
            }
        }
        let mut state = if record.step == 0 {
            None
        } else {
            match self
                .in_term(term, runs::read_checkpoint(&mut conn, keys, &period.id))
                .await
            {
                Ok(s) => s,
                Err(end) => return end,
            }
        };
        if record.status == RunStatus::Running && record.token != token {
            info!(job, node, token, period = %period.id, step = record.step, previous_token = record.token, previous_node = %record.node, "resuming run from its checkpoint");
        } else if record.status == RunStatus::Pending && record.attempt > 1 {
            info!(job, node, token, period = %period.id, step = record.step, attempt = record.attempt, "retrying run from its checkpoint");
        } else if record.step == 0 && record.status == RunStatus::Pending {
            info!(job, node, token, period = %period.id, "starting run");
            record.started_at = now.clone();
        }
        record.status = RunStatus::Running;
        record.error = None;
        record.retry_at = None;
        if let Err(e) = runs::mark_open(&mut conn, keys, &period.id, true).await {
            return RunEnd::Interrupted(e.to_string());
        }
        if let Err(end) = self.save(term, version, &mut record, None).await {
            return end;
        }
        let run = RunInfo {
            period: period.id.clone(),
            scheduled_at: record.scheduled_at.clone(),
            attempt: record.attempt,
        };
        loop {
            if !term.still_leader() {
                return RunEnd::Lost;
            }
            if let Some(max) = policies.max_run_time
                && let Some(started) = parse_rfc3339(&record.started_at)
                && (Utc::now() - started).to_std().unwrap_or_default() > max
            {
                let why = format!(
                    "the run has taken longer than its maximum run time of {} (started {})",
                    show(max),
                    record.started_at
                );
                return self
                    .fail(term, version, &mut record, FailureKind::RunTimeout, why)
                    .await;
            }
            if self.paused.load(Ordering::Relaxed) {
                info!(job, node, token, period = %period.id, step = record.step, "job paused before the step; the run resumes here when the job is resumed");
                return RunEnd::Paused;
            }
            let ctx = StepContext {
                job: job.clone(),
                node: node.clone(),
                keys: keys.clone(),
                term: term.clone(),
                conn: self.conn.clone(),
                data_dir: self.data_dir.clone(),
            };
            let started = Instant::now();
            let outcome = self
                .runtime
                .run_step(version, ctx, &run, record.step, state.as_deref())
                .await;
            let took = started.elapsed();
            let outcome_word = match &outcome {
                Ok(StepOutcome::Continue(_)) => "continue",
                Ok(StepOutcome::Done) => "done",
                Err(StepError::Failed(_)) => "failed",
                Err(StepError::NotReady(_)) => "not-ready",
                Err(StepError::LostLeadership(_)) => "lost-leadership",
                Err(StepError::Timeout(_)) => "timeout",
                Err(StepError::Trap(_)) => "trap",
                Err(StepError::MemoryLimit(_)) => "memory-limit",
                Err(StepError::Host(_)) => "host",
            };
            crate::metrics::get().step(job, outcome_word, took);
            match outcome {
                Ok(StepOutcome::Continue(next))
                    if next.len() as u64 > version.spec.limits.write_bytes =>
                {
                    let why = format!(
                        "step {} returned a state of {} bytes, more than the job's write limit of {} bytes",
                        record.step,
                        next.len(),
                        version.spec.limits.write_bytes
                    );
                    return self
                        .fail(term, version, &mut record, FailureKind::StateTooLarge, why)
                        .await;
                }
                Ok(StepOutcome::Continue(next)) => {
                    record.step += 1;
                    if let Err(end) = self.save(term, version, &mut record, Some(&next)).await {
                        return end;
                    }
                    // Logged once the checkpoint is saved: a step that is "done" is never redone.
                    info!(job, node, token, period = %period.id, step = record.step - 1, took_ms = format!("{:.1}", took.as_secs_f64() * 1e3), "step done");
                    state = Some(next);
                }
                Ok(StepOutcome::Done) => {
                    record.step += 1;
                    record.status = RunStatus::Done;
                    record.finished_at = Some(now_rfc3339());
                    if let Err(end) = self.save(term, version, &mut record, None).await {
                        return end;
                    }
                    info!(job, node, token, period = %period.id, steps = record.step, attempt = record.attempt, component = %version.hash, "run done");
                    crate::metrics::get().run_final(job, "done");
                    return RunEnd::Finished;
                }
                Err(StepError::NotReady(why)) => {
                    info!(job, node, token, period = %period.id, step = record.step, "inputs not ready, trying again in {}: {why}", show(NOT_READY_RETRY));
                    record.status = RunStatus::Waiting;
                    record.error = Some(clip(why));
                    return match self.save(term, version, &mut record, None).await {
                        Ok(()) => RunEnd::Later(Instant::now() + NOT_READY_RETRY),
                        Err(end) => end,
                    };
                }
                Err(StepError::LostLeadership(None)) if term.still_leader() => {
                    return RunEnd::Interrupted(
                        "the job returned lost-leadership while this node still leads".into(),
                    );
                }
                Err(StepError::LostLeadership(why)) => {
                    warn!(job, node, token, period = %period.id, step = record.step, "step abandoned: leadership lost{}", why.map(|w| format!(" ({w})")).unwrap_or_default());
                    return RunEnd::Lost;
                }
                Err(StepError::Host(why)) => return RunEnd::Interrupted(why),
                Err(e) if !term.still_leader() => {
                    warn!(job, node, token, period = %period.id, step = record.step, "step abandoned after the term ended: {e}");
                    return RunEnd::Lost;
                }
                Err(e) => {
                    let kind = match &e {
                        StepError::Trap(_) => FailureKind::Trap,
                        StepError::MemoryLimit(_) => FailureKind::MemoryLimit,
                        StepError::Timeout(_) => FailureKind::Timeout,
                        _ => FailureKind::JobError,
                    };
                    return self
                        .fail(term, version, &mut record, kind, e.to_string())
                        .await;
                }
            }
        }
    }

    /// A step failed (or the run cannot go on): with attempts left under the retry policy (and
    /// a failure worth retrying), the run becomes `pending` again and retries from its
    /// checkpoint after the backoff; otherwise it is `failed`. Either way the attempt is
    /// recorded.
    async fn fail(
        &self,
        term: &Term,
        version: &LoadedJob,
        record: &mut RunRecord,
        kind: FailureKind,
        why: String,
    ) -> RunEnd {
        let why = clip(why);
        let policies = self.job.spec.policies;
        let retryable = !matches!(kind, FailureKind::VersionChanged | FailureKind::RunTimeout);
        let (job, node, token) = (&self.job.spec.name, &self.node, term.token());
        if retryable && record.attempt < policies.retry_attempts {
            let delay = policies.retry_delay(record.attempt + 1);
            warn!(job, node, token, period = %record.period, step = record.step, attempt = record.attempt, failure = ?kind, "attempt failed, retrying in {}: {why}", show(delay));
            record.attempts.push(runs::FailedAttempt {
                attempt: record.attempt,
                step: record.step,
                failure: kind,
                error: why.clone(),
                at: now_rfc3339(),
            });
            if record.attempts.len() > 20 {
                record.attempts.remove(0);
            }
            record.attempt += 1;
            record.status = RunStatus::Pending;
            record.error = Some(why);
            record.failure = Some(kind);
            let at = Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
            record.retry_at = Some(at.to_rfc3339_opts(SecondsFormat::Millis, true));
            return match self.save(term, version, record, None).await {
                Ok(()) => RunEnd::Later(Instant::now() + delay),
                Err(end) => end,
            };
        }
        error!(job, node, token, period = %record.period, step = record.step, attempt = record.attempt, failure = ?kind, "run failed: {why}");
        record.status = RunStatus::Failed;
        record.error = Some(why);
        record.failure = Some(kind);
        record.finished_at = Some(now_rfc3339());
        match self.save(term, version, record, None).await {
            Ok(()) => {
                crate::metrics::get().run_final(job, "failed");
                RunEnd::Finished
            }
            Err(end) => end,
        }
    }

    /// Saves the record (and the checkpoint, when given) in one fenced write, naming `version`
    /// as the component that runs it. A finished run's checkpoint is deleted in the same write.
    async fn save(
        &self,
        term: &Term,
        version: &LoadedJob,
        record: &mut RunRecord,
        checkpoint: Option<&[u8]>,
    ) -> Result<(), RunEnd> {
        let keys = &self.keys;
        record.token = term.token();
        record.node = self.node.clone();
        record.component = version.hash.clone();
        record.updated_at = now_rfc3339();
        let json = serde_json::to_vec(&record).expect("run records serialize");
        let mut sets = vec![(keys.run(&record.period), json.as_slice())];
        if let Some(c) = checkpoint {
            sets.push((keys.checkpoint(&record.period), c));
        }
        let deletes = if record.status.is_final() {
            vec![keys.checkpoint(&record.period)]
        } else {
            vec![]
        };
        if record.status.is_final() {
            sets.push((keys.last_run(), record.period.as_bytes()));
        }
        let who = (self.job.spec.name.as_str(), self.node.as_str());
        let mut conn = self.conn.clone();
        match fence::write_in_term(&mut conn, keys, term, who, &sets, &deletes).await {
            Ok(()) => Ok(()),
            Err(TermWriteError::Ended | TermWriteError::Refused(_)) => Err(RunEnd::Lost),
            Err(TermWriteError::Redis(e)) => Err(RunEnd::Interrupted(e.to_string())),
        }
    }
}

impl Runner {
    /// Runs one Redis read of `term`'s work: a call still pending when the term ends is
    /// abandoned.
    async fn in_term<T, E: Into<anyhow::Error>>(
        &self,
        term: &Term,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, RunEnd> {
        match term.bound(call).await {
            Some(r) => r.map_err(|e| RunEnd::Interrupted(format!("{:#}", e.into()))),
            None => Err(RunEnd::Lost),
        }
    }
}

fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}
