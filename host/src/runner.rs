//! The runner of one job: while this node leads, it completes the job's due periods.
//!
//! For each due period (the schedule's current period, and periods requested with
//! `leasehold trigger`) the runner reads the period's run record: `done` and `failed` are final
//! and skipped; `running` or `waiting` resume from the saved step and checkpoint; no record
//! starts a run at step 0. Before every step it checks the term ([`Term::still_leader`]); after
//! every step it saves the record and the checkpoint in one fenced write. A step is stopped as
//! soon as the term ends (see [`crate::runtime`]), and nothing is written after that: the next
//! leader resumes from the last checkpoint (I5).
//!
//! On shutdown the running step is dropped (which stops the guest) before the elector releases
//! the lease (I7).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
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
use crate::spec::Period;
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
}

/// How a period's run ended on this node.
enum RunEnd {
    /// Done (now or earlier).
    Done,
    /// Failed (now or earlier).
    Failed,
    /// Waiting for inputs; try again after the delay.
    Waiting,
    /// The term ended; stop leading.
    Lost,
    /// A Redis error interrupted the run; it resumes from its last checkpoint.
    Interrupted(String),
    /// The run record is unreadable; the period is skipped (logged as an error).
    Broken,
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
        while term.still_leader() {
            self.refresh();
            let (job, node) = (&self.job.spec.name, &self.node);
            let now = Instant::now();
            let due = match term.bound(self.due(done)).await {
                None => return,
                Some(due) => due,
            };
            let due = match due {
                Ok(d) => d,
                Err(e) => {
                    warn!(job, node, token, "cannot read due periods: {e}");
                    Vec::new()
                }
            };
            let next = due
                .into_iter()
                .find(|p| not_before.get(&p.id).is_none_or(|t| *t <= now));
            let Some(period) = next else {
                // Nothing due: wait for the next fire time, a request, or the term's end.
                let until_fire = self
                    .job
                    .spec
                    .schedule
                    .next(Utc::now())
                    .and_then(|p| (p.fire.with_timezone(&Utc) - Utc::now()).to_std().ok())
                    .unwrap_or(poll);
                tokio::select! {
                    _ = tokio::time::sleep(until_fire.min(poll)) => {}
                    _ = term.ended() => {}
                }
                continue;
            };
            match self.run_period(term, &period).await {
                end @ (RunEnd::Done | RunEnd::Failed | RunEnd::Broken) => {
                    if done.len() >= DONE_CACHE {
                        done.clear();
                    }
                    done.insert(period.id.clone());
                    not_before.remove(&period.id);
                    let mut conn = self.conn.clone();
                    let cleared = async {
                        runs::clear_request(&mut conn, &self.keys, &period.id).await?;
                        if !matches!(end, RunEnd::Broken) {
                            runs::mark_open(&mut conn, &self.keys, &period.id, false).await?;
                        }
                        Ok::<_, redis::RedisError>(())
                    };
                    if let Err(e) = cleared.await {
                        warn!(job, node, token, period = %period.id, "cannot clear the run's request or open mark: {e}");
                    }
                }
                RunEnd::Waiting => {
                    not_before.insert(period.id.clone(), Instant::now() + NOT_READY_RETRY);
                }
                RunEnd::Lost => return,
                RunEnd::Interrupted(why) => {
                    warn!(job, node, token, period = %period.id, "run interrupted, resuming from its checkpoint: {why}");
                    not_before.insert(period.id.clone(), Instant::now() + ERROR_RETRY);
                }
            }
        }
    }

    /// Periods that may need work, in id order: the schedule's current period, periods whose
    /// run is open (`running`/`waiting`, possibly left by an earlier leader), and requested
    /// periods, minus those known to be finished (whose requests are cleared). The caller
    /// bounds it by the term.
    async fn due(&self, done: &HashSet<String>) -> anyhow::Result<Vec<Period>> {
        let keys = &self.keys;
        let schedule = &self.job.spec.schedule;
        let mut due: Vec<Period> = schedule.current(Utc::now()).into_iter().collect();
        let mut conn = self.conn.clone();
        let (requested, open) = runs::pending(&mut conn, keys).await?;
        for id in requested.iter().chain(&open) {
            if done.contains(id) {
                if requested.contains(id) {
                    runs::clear_request(&mut conn, keys, id).await?;
                }
                continue;
            }
            match schedule.period_by_id(id) {
                Some(p) => due.push(p),
                None => {
                    warn!(job = %self.job.spec.name, node = %self.node, period = %id, "period is not a period of schedule {:?} ({}); dropped", schedule.expr(), schedule.tz());
                    runs::clear_request(&mut conn, keys, id).await?;
                    runs::mark_open(&mut conn, keys, id, false).await?;
                }
            }
        }
        due.retain(|p| !done.contains(&p.id));
        due.sort_by(|a, b| a.id.cmp(&b.id));
        due.dedup_by(|a, b| a.id == b.id);
        Ok(due)
    }

    /// Runs (or resumes) one period until it is done, fails, waits, or the term ends. A run
    /// that has completed steps continues with the component version it started with; when
    /// this host no longer has that version, the run fails (versions are never mixed).
    async fn run_period(&self, term: &Term, period: &Period) -> RunEnd {
        let keys = &self.keys;
        let (job, node, token) = (&self.job.spec.name, &self.node, term.token());
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
            Some(r) if r.status == RunStatus::Done => return RunEnd::Done,
            Some(r) if r.status == RunStatus::Failed => return RunEnd::Failed,
            Some(r) => r,
            None => RunRecord {
                period: period.id.clone(),
                scheduled_at: period.fire.to_rfc3339(),
                status: RunStatus::Running,
                step: 0,
                attempt: 1,
                token,
                node: node.clone(),
                component: self.job.hash.clone(),
                started_at: now.clone(),
                updated_at: now,
                finished_at: None,
                error: None,
                failure: None,
            },
        };
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
        } else if record.step == 0 && record.status == RunStatus::Running {
            info!(job, node, token, period = %period.id, "starting run");
        }
        record.status = RunStatus::Running;
        record.error = None;
        if let Err(end) = self.save(term, version, &mut record, None).await {
            return end;
        }
        if let Err(e) = runs::mark_open(&mut conn, keys, &period.id, true).await {
            return RunEnd::Interrupted(e.to_string());
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
                    info!(job, node, token, period = %period.id, steps = record.step, component = %version.hash, "run done");
                    return RunEnd::Done;
                }
                Err(StepError::NotReady(why)) => {
                    info!(job, node, token, period = %period.id, step = record.step, "inputs not ready, trying again in {}: {why}", show(NOT_READY_RETRY));
                    record.status = RunStatus::Waiting;
                    record.error = Some(clip(why));
                    return match self.save(term, version, &mut record, None).await {
                        Ok(()) => RunEnd::Waiting,
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

    /// Records the run as failed (final in this version) with `kind` and `why`.
    async fn fail(
        &self,
        term: &Term,
        version: &LoadedJob,
        record: &mut RunRecord,
        kind: FailureKind,
        why: String,
    ) -> RunEnd {
        let why = clip(why);
        error!(job = %self.job.spec.name, node = %self.node, token = term.token(), period = %record.period, step = record.step, failure = ?kind, "run failed: {why}");
        record.status = RunStatus::Failed;
        record.error = Some(why);
        record.failure = Some(kind);
        record.finished_at = Some(now_rfc3339());
        match self.save(term, version, record, None).await {
            Ok(()) => RunEnd::Failed,
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
        let finished = matches!(record.status, RunStatus::Done | RunStatus::Failed);
        let deletes = if finished {
            vec![keys.checkpoint(&record.period)]
        } else {
            vec![]
        };
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
