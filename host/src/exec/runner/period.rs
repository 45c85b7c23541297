//! One period's run on this node: enter it (new, resumed, retried or re-run), execute its steps
//! one at a time with a fenced checkpoint after each, and record how it ended.
//!
//! Length: one run of one period, from its record to its final write, with its retries and its
//! fan-out wait, in the order they happen.

use std::sync::atomic::Ordering;
use std::time::Instant;

use chrono::{SecondsFormat, Utc};
use tracing::{error, info, warn};

use super::decide::{self, AfterFailure, Entry};
use super::{NOT_READY_RETRY, RunEnd, Runner, now_rfc3339};
use crate::coord::fence::{Bookkeeping, TermWrite};
use crate::coord::term::Term;
use crate::coord::term_store::TermStore as _;
use crate::exec::runs::{self, FailureKind, RecordError, Request, RunRecord, RunStatus};
use crate::exec::runtime::{LoadedJob, RunInfo, StepContext, StepError, StepOutcome, Work};
use crate::exec::spec::Period;
use crate::units::show;

impl Runner {
    /// Runs (or resumes) one period until it is done, fails, waits, or the term ends. A run
    /// that has completed steps continues with the component version it started with; when
    /// this host no longer has that version, the run fails (versions are never mixed).
    /// `requested`: an operator asked for this period, so a final record other than `done` is
    /// run again as a new attempt.
    pub(super) async fn run_period(
        &self,
        term: &Term,
        period: &Period,
        request: Option<&Request>,
    ) -> RunEnd {
        let keys = &self.keys;
        let token = term.token();
        let mut version = &self.job;
        let existing = match term
            .bound(runs::read_from(&self.store, keys, &period.id))
            .await
        {
            None => return RunEnd::Lost,
            Some(Ok(r)) => r,
            Some(Err(e @ RecordError::Corrupt { .. })) => {
                return self.move_aside(term, &period.id, &e).await;
            }
            Some(Err(e @ (RecordError::Redis(_) | RecordError::Store(_)))) => {
                return RunEnd::Interrupted(e.to_string());
            }
        };
        let now = now_rfc3339();
        let mut record = match (decide::entry(existing.as_ref(), request), existing) {
            (Entry::Finished, _) => return RunEnd::Finished,
            (Entry::Cancel, Some(mut r)) => return self.cancelled(term, &mut r).await,
            (Entry::Rerun { attempt }, Some(mut r)) => {
                info!(period = %period.id, previous = r.status.as_str(), "re-running the period as an operator asked");
                // The attempt that ended stays in the period's history.
                r.attempts.push(runs::FailedAttempt::of_final(&r));
                if r.attempts.len() > runs::ATTEMPTS_KEPT {
                    r.attempts.remove(0);
                }
                r.attempt = attempt;
                r.error = None;
                r.status = RunStatus::Pending;
                r.step = 0;
                r.started_at = now.clone();
                r.finished_at = None;
                r.failure = None;
                r.retry_at = None;
                r
            }
            (Entry::Continue, Some(r)) => r,
            _ => RunRecord::new(period, RunStatus::Pending, &now),
        };
        if record.status == RunStatus::Pending
            && let Some(at) = record.retry_at.as_deref().and_then(decide::parse_rfc3339)
            && at > Utc::now()
        {
            let wait = (at - Utc::now()).to_std().unwrap_or_default();
            return RunEnd::Later(Instant::now() + wait);
        }
        if record.step > 0 && record.component != version.hash {
            match self.known.iter().find(|k| k.hash == record.component) {
                Some(old) => {
                    info!(period = %period.id, step = record.step, component = %old.hash, latest = %version.hash, "run continues with the component version it started with");
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
                .in_term(
                    term,
                    runs::read_checkpoint_from(&self.store, keys, &period.id),
                )
                .await
            {
                Ok(s) => s,
                Err(end) => return end,
            }
        };
        if record.status == RunStatus::Running && record.token != token {
            info!(period = %period.id, step = record.step, previous_token = record.token, previous_node = %record.node, "resuming run from its checkpoint");
        } else if record.status == RunStatus::Pending && record.attempt > 1 {
            info!(period = %period.id, step = record.step, attempt = record.attempt, "retrying run from its checkpoint");
        } else if record.step == 0 && record.status == RunStatus::Pending {
            info!(period = %period.id, "starting run");
            record.started_at = now.clone();
        }
        if decide::parse_rfc3339(&record.started_at).is_none() {
            // The maximum run time counts from the start: a start that does not parse (a record
            // edited by hand) would switch it off, so the run counts from now instead.
            warn!(period = %period.id, started_at = %record.started_at, "the run record's start time is not a time; the maximum run time counts from now");
            record.started_at = now.clone();
        }
        // A period the job's schedule no longer has: say so in the record (`runs`, status).
        let schedule = &self.job.spec.schedule;
        record.earlier_schedule = schedule.period_by_id(&period.id).is_none().then(|| {
            format!(
                "a period of an earlier schedule; the job's schedule is now {:?} ({})",
                schedule.expr(),
                schedule.tz()
            )
        });
        // The version that runs the run decides its policies (retry, maximum run time), not
        // the newest one loaded meanwhile.
        let policies = version.spec.policies;
        record.status = RunStatus::Running;
        record.error = None;
        record.retry_at = None;
        if let Err(end) = self.save(term, version, &mut record, None).await {
            return end;
        }
        let run = RunInfo {
            period: period.id.clone(),
            scheduled_at: record.scheduled_at.clone(),
            attempt: record.attempt,
        };
        // A run that waits for its tasks (this term's, or a predecessor's it takes over) waits
        // before its next step.
        if record.awaiting_tasks
            && let Err(end) = self.await_tasks(term, version, &mut record).await
        {
            return end;
        }
        loop {
            if !term.still_leader() {
                return RunEnd::Lost;
            }
            if let Some(max) = policies.max_run_time
                && decide::run_time_exceeded(&record.started_at, Utc::now(), Some(max))
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
                info!(period = %period.id, step = record.step, "job paused before the step; the run resumes here when the job is resumed");
                return RunEnd::Paused;
            }
            let ctx = StepContext {
                keys: keys.clone(),
                term: term.clone(),
                store: self.store.clone(),
                data_dir: self.data_dir.clone(),
                work: Work::Step(crate::exec::tasks::RunOf {
                    period: period.id.clone(),
                    attempt: record.attempt,
                    scheduled_at: record.scheduled_at.clone(),
                    component: version.hash.clone(),
                }),
                stderr: Default::default(),
            };
            let told = ctx.stderr.clone();
            let started = Instant::now();
            let outcome = self
                .runtime
                .run_step(version, ctx, &run, record.step, state.as_deref())
                .await;
            let took = started.elapsed();
            crate::metrics::get().step(&self.job.spec.name, decide::outcome_word(&outcome), took);
            // The record keeps the stderr of the step that failed or made the run wait; a step
            // that succeeds clears it.
            record.stderr = outcome.as_ref().err().and_then(|_| told.take());
            match outcome {
                Ok(StepOutcome::Continue(next) | StepOutcome::AwaitTasks(next))
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
                    info!(period = %period.id, step = record.step - 1, took_ms = format!("{:.1}", took.as_secs_f64() * 1e3), "step done");
                    state = Some(next);
                    // Between two steps: the job may go to its preferred member, which resumes
                    // the run from this checkpoint (only if it has this run's version).
                    let wanted = self.wanted();
                    if let Some(to) = self.balance.hand_over_to(
                        keys.job(),
                        wanted.as_ref(),
                        Some(&version.hash),
                        Instant::now(),
                    ) {
                        info!(period = %period.id, step = record.step, to = %to, "handing over to the job's preferred member between steps; it resumes the run from this checkpoint");
                        self.balance.ask(token);
                        return RunEnd::HandedOver;
                    }
                }
                Ok(StepOutcome::AwaitTasks(next)) => {
                    record.step += 1;
                    record.awaiting_tasks = true;
                    record.status = RunStatus::Waiting;
                    if let Err(end) = self.save(term, version, &mut record, Some(&next)).await {
                        return end;
                    }
                    info!(period = %period.id, step = record.step - 1, took_ms = format!("{:.1}", took.as_secs_f64() * 1e3), "step done; waiting for the run's tasks");
                    state = Some(next);
                    if let Err(end) = self.await_tasks(term, version, &mut record).await {
                        return end;
                    }
                }
                Ok(StepOutcome::Done) => {
                    record.step += 1;
                    record.status = RunStatus::Done;
                    record.finished_at = Some(now_rfc3339());
                    if let Err(end) = self.save(term, version, &mut record, None).await {
                        return end;
                    }
                    info!(period = %period.id, steps = record.step, attempt = record.attempt, component = %version.hash, "run done");
                    crate::metrics::get().run_final(&self.job.spec.name, "done");
                    return RunEnd::Finished;
                }
                Err(StepError::NotReady(why)) => {
                    info!(period = %period.id, step = record.step, "inputs not ready, trying again in {}: {why}", show(NOT_READY_RETRY));
                    record.status = RunStatus::Waiting;
                    record.error = Some(decide::clip(why));
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
                    warn!(period = %period.id, step = record.step, "step abandoned: leadership lost{}", why.map(|w| format!(" ({w})")).unwrap_or_default());
                    return RunEnd::Lost;
                }
                Err(StepError::Host(why)) => return RunEnd::Interrupted(why),
                Err(e) if !term.still_leader() => {
                    warn!(period = %period.id, step = record.step, "step abandoned after the term ended: {e}");
                    return RunEnd::Lost;
                }
                Err(e) => {
                    let kind = decide::failure_kind(&e);
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
        let why = decide::clip(why);
        let policies = version.spec.policies;
        if let AfterFailure::Retry { delay } =
            decide::after_failure(&policies, record.attempt, kind)
        {
            warn!(period = %record.period, step = record.step, attempt = record.attempt, failure = %kind, "attempt failed, retrying in {}: {why}", show(delay));
            record.attempts.push(runs::FailedAttempt {
                attempt: record.attempt,
                status: RunStatus::Failed,
                step: record.step,
                failure: Some(kind),
                error: why.clone(),
                at: now_rfc3339(),
            });
            if record.attempts.len() > runs::ATTEMPTS_KEPT {
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
        error!(period = %record.period, step = record.step, attempt = record.attempt, failure = %kind, "run failed: {why}");
        record.status = RunStatus::Failed;
        record.error = Some(why);
        record.failure = Some(kind);
        record.finished_at = Some(now_rfc3339());
        // A failed run waits for nothing (a task failure ends the wait for its tasks).
        record.awaiting_tasks = false;
        match self.save(term, version, record, None).await {
            Ok(()) => {
                crate::metrics::get().run_final(&self.job.spec.name, "failed");
                RunEnd::Finished
            }
            Err(end) => end,
        }
    }

    /// Records the open run `record` as cancelled by an operator, in one fenced write that
    /// deletes its checkpoint and ends its tasks (as every final record does). The record keeps
    /// naming the component version that ran it.
    async fn cancelled(&self, term: &Term, record: &mut RunRecord) -> RunEnd {
        let version = self
            .known
            .iter()
            .rev()
            .find(|k| k.hash == record.component)
            .unwrap_or(&self.job)
            .clone();
        record.status = RunStatus::Cancelled;
        record.error = Some(format!(
            "cancelled by an operator at step {}, attempt {}",
            record.step, record.attempt
        ));
        record.failure = None;
        record.retry_at = None;
        record.awaiting_tasks = false;
        record.finished_at = Some(now_rfc3339());
        match self.save(term, &version, record, None).await {
            Ok(()) => {
                info!(period = %record.period, step = record.step, attempt = record.attempt, "run cancelled as an operator asked");
                crate::metrics::get().run_final(&self.job.spec.name, "cancelled");
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
        record.note_writer(term.token(), &self.node);
        record.component = version.hash.clone();
        record.updated_at = now_rfc3339();
        let json = serde_json::to_vec(&record).expect("run records serialize");
        let mut sets = vec![(keys.run(&record.period), json.as_slice())];
        if let Some(c) = checkpoint {
            sets.push((keys.checkpoint(&record.period), c));
        }
        // A finished run's checkpoint and its tasks (records, payloads, outputs) go with it.
        let deletes = if record.status.is_final() {
            vec![
                keys.checkpoint(&record.period),
                keys.task_runs(&record.period),
                keys.task_data(&record.period),
            ]
        } else {
            vec![]
        };
        if record.status.is_final() {
            sets.push((keys.last_run(), record.period.as_bytes()));
        }
        // The open index follows the record in the same write: open while the run is.
        let period = [record.period.clone()];
        let book = if record.status.is_final() {
            Bookkeeping {
                open_remove: &period,
                runs_add: &period,
                // Its tasks end with it (I12): queued entries acknowledged, claims void.
                end_tasks: Some(&record.period),
                ..Bookkeeping::default()
            }
        } else {
            Bookkeeping {
                open_add: &period,
                runs_add: &period,
                ..Bookkeeping::default()
            }
        };
        self.fenced(term, TermWrite::new(&sets, &deletes).with(book))
            .await
    }

    /// Waits until every task of the run has finished (`await-tasks`), first taking over, as
    /// this term, the tasks an earlier term submitted and that have not finished (they run again
    /// under this term; their earlier attempts' results are refused). A task that failed on
    /// every attempt fails the run with its message; otherwise the run goes on with its next
    /// step.
    async fn await_tasks(
        &self,
        term: &Term,
        version: &LoadedJob,
        record: &mut RunRecord,
    ) -> Result<(), RunEnd> {
        let keys = &self.keys;
        let period = record.period.clone();
        let mut conn = self
            .store
            .redis_conn()
            .map_err(|e| RunEnd::Interrupted(format!("{e:#}")))?;
        let adopt =
            crate::exec::tasks::adopt(&mut conn, keys, (term.owner(), term.token()), &period);
        match term.bound(adopt).await {
            None => return Err(RunEnd::Lost),
            Some(Ok(0)) => {}
            Some(Ok(n)) => {
                info!(period = %period, tasks = n, "took over the run's unfinished tasks: they run again under this term")
            }
            Some(Err(crate::coord::fence::FenceError::Refused(r))) => {
                warn!(period = %period, "taking over the run's tasks was refused: {r}; stepping down");
                term.end();
                return Err(RunEnd::Lost);
            }
            Some(Err(e)) => return Err(RunEnd::Interrupted(e.to_string())),
        }
        let progress = loop {
            let progress = self
                .in_term(term, crate::exec::tasks::progress(&mut conn, keys, &period))
                .await?;
            if progress.done() {
                break progress;
            }
            // Tasks that never finish (no worker has the run's version, a task that kills its
            // worker every time) end with the run's maximum run time.
            if let Some(max) = version.spec.policies.max_run_time
                && decide::run_time_exceeded(&record.started_at, Utc::now(), Some(max))
            {
                let why = format!(
                    "the run has taken longer than its maximum run time of {} (started {}) waiting for {} of its {} tasks",
                    show(max),
                    record.started_at,
                    progress.submitted - progress.finished,
                    progress.submitted
                );
                return Err(self
                    .fail(term, version, record, FailureKind::RunTimeout, why)
                    .await);
            }
            tokio::select! {
                _ = self.notice.notified() => {}
                _ = tokio::time::sleep(self.timing.heartbeat) => {}
                _ = term.ended() => return Err(RunEnd::Lost),
            }
        };
        if progress.failed > 0 {
            let failed = self
                .in_term(
                    term,
                    crate::exec::tasks::first_failure(&mut conn, keys, &period),
                )
                .await?;
            let why = match failed {
                Some((id, attempts, error)) => {
                    format!("task {id} failed on all of its {attempts} attempts: {error}")
                }
                None => format!("{} of the run's tasks failed", progress.failed),
            };
            return Err(self
                .fail(term, version, record, FailureKind::TaskFailed, why)
                .await);
        }
        info!(period = %period, tasks = progress.submitted, "the run's tasks have finished");
        record.awaiting_tasks = false;
        record.status = RunStatus::Running;
        self.save(term, version, record, None).await
    }

    /// An unreadable record of `period` is moved aside to `lh:{job}:corrupt:<period>` (kept
    /// for the operator, listed as `corrupt` in the run history) and taken out of the open
    /// index, in one fenced write, so that it blocks nothing; the period is not run.
    async fn move_aside(&self, term: &Term, period: &str, why: &RecordError) -> RunEnd {
        let keys = &self.keys;
        let rest = crate::store::keys::JobKeys::run_rest(period);
        let raw = match self
            .in_term(term, self.store.read_key(keys.job(), &rest))
            .await
        {
            Ok(raw) => raw.unwrap_or_default(),
            Err(end) => return end,
        };
        let sets = [(keys.corrupt(period), raw.as_slice())];
        let deletes = [keys.run(period), keys.checkpoint(period)];
        let open_remove = [period.to_string()];
        let book = Bookkeeping {
            open_remove: &open_remove,
            runs_add: &open_remove,
            ..Bookkeeping::default()
        };
        match self
            .fenced(term, TermWrite::new(&sets, &deletes).with(book))
            .await
        {
            Ok(()) => {
                error!(period = %period, bytes = raw.len(), kept_at = %keys.corrupt(period), "{why}; moved aside, the period is not run (an operator may trigger it again)");
                RunEnd::Broken
            }
            Err(end) => end,
        }
    }
}
