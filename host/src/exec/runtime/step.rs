//! Running one step (or one task): a fresh store, the guest's `run-step` (or `run-task`) call
//! raced against the term and a hard deadline, and every way it can end turned into a
//! [`StepError`] value.

use std::time::Instant;

use tracing::{Level, debug, warn};

use super::bindings::leasehold::job::tasks::Task;
use super::error::StepError;
use super::imports::STDERR_CAPACITY;
use super::world::{Call, Returned};
use super::{
    EPOCH_TICK, HostState, JobError, LoadedJob, RunInfo, Runtime, StepContext, StepOutcome,
};

impl Runtime {
    /// Runs one step of `job` in a fresh store. Never panics on guest misbehaviour: every way a
    /// step can end is a value.
    pub async fn run_step(
        &self,
        job: &LoadedJob,
        ctx: StepContext,
        run: &RunInfo,
        step: u32,
        state: Option<&[u8]>,
    ) -> Result<StepOutcome, StepError> {
        let call = Call::Step { run, step, state };
        match self.call(job, ctx, call).await? {
            Returned::Step(outcome) => Ok(outcome),
            Returned::Task(_) => Err(StepError::Host("run-step returned a task's output".into())),
        }
    }

    /// Runs one task of `job` (a fan-out job: it exports `run-task`) in a fresh store, as a
    /// step runs: the same sandbox, limits and containment. `ctx.term` is the submitting term,
    /// valid while the worker's claim holds.
    pub async fn run_task(
        &self,
        job: &LoadedJob,
        ctx: StepContext,
        run: &RunInfo,
        task: &Task,
    ) -> Result<Vec<u8>, StepError> {
        match self.call(job, ctx, Call::Task { run, task }).await? {
            Returned::Task(output) => Ok(output),
            Returned::Step(_) => Err(StepError::Host("run-task returned a step outcome".into())),
        }
    }

    /// One call into `job` in a fresh store.
    async fn call(
        &self,
        job: &LoadedJob,
        ctx: StepContext,
        what: Call<'_>,
    ) -> Result<Returned, StepError> {
        let step = match &what {
            Call::Step { step, .. } => Some(*step),
            Call::Task { .. } => None,
        };
        let term = ctx.term.clone();
        let told = ctx.stderr.clone();
        let limits = job.spec.limits;
        let (mut host_state, stderr) = HostState::new(
            &limits,
            self.host_limits.counts,
            self.host_limits.log_lines,
            Some(ctx),
        )
        .map_err(|e| StepError::Host(format!("{e:#}")))?;
        host_state.sql = Some(super::sql_import::StepSql::new(
            self.databases.for_job(&job.spec.sql),
        ));
        if let Some(step) = &host_state.step {
            let period = match &step.work {
                super::imports::Work::Step(run) => &run.period,
                super::imports::Work::Task(claim) => &claim.period,
            };
            host_state.http = crate::exec::http::HttpHooks::for_step(
                &job.spec.name,
                period,
                term.clone(),
                self.outbound.for_job(&job.spec.http),
            );
        }
        // A slot of the instance pool, or the term's end while waiting for one.
        let _slot = tokio::select! {
            slot = self.slot() => slot,
            _ = term.ended() => return Err(StepError::LostLeadership(None)),
        };
        let mut store = self.store(host_state);
        let hard_deadline = Instant::now() + limits.step_time + EPOCH_TICK * 5;
        let result = {
            let call = job.pre.call(&mut store, term.clone(), what);
            tokio::select! {
                r = call => Some(r),
                _ = term.ended() => None,
                _ = tokio::time::sleep_until(hard_deadline.into()) => None,
            }
        };
        let data = store.data();
        crate::metrics::get().guest_memory(&job.spec.name, data.limits.memory());
        // A trap's record carries the guest's last stderr lines: its own explanation.
        let explained = |m: String| {
            let tail = stderr.tail();
            if tail.is_empty() {
                m
            } else {
                format!("{m}; the job's last stderr lines:\n{tail}")
            }
        };
        // Whatever noticed first (the guest, the epoch callback, or the select), a lost term
        // carries the fence's refusal when a refused write is what ended it.
        let lost = || StepError::LostLeadership(data.refusal.as_ref().map(|r| r.to_string()));
        let outcome = match result {
            Some(Ok(Ok(outcome))) => Ok(outcome),
            // A step that fails after the quota refused a write is recorded as such, with
            // the figures and the job's own words.
            Some(Ok(Err(JobError::Failed(m)))) => Err(match data.quota_refused {
                Some(usage) => StepError::QuotaExceeded(format!("{usage}; the job said: {m}")),
                None => StepError::Failed(m),
            }),
            Some(Ok(Err(JobError::NotReady(m)))) => Err(StepError::NotReady(m)),
            Some(Ok(Err(JobError::LostLeadership))) => Err(lost()),
            Some(Err(trap)) => Err(match &data.interrupt {
                Some(StepError::Timeout(_)) => {
                    StepError::Timeout(crate::units::show(limits.step_time))
                }
                Some(StepError::LostLeadership(_)) => lost(),
                Some(i) => i.clone(),
                None if data.limits.memory_exceeded => {
                    StepError::MemoryLimit(explained(trap_message(&trap)))
                }
                // A guest that panics on the refusal (an `unwrap`) still failed on its quota.
                None if data.quota_refused.is_some() => {
                    StepError::QuotaExceeded(explained(format!(
                        "{}; the job then trapped: {}",
                        data.quota_refused.unwrap_or_else(|| unreachable!()),
                        trap_message(&trap)
                    )))
                }
                None => StepError::Trap(explained(trap_message(&trap))),
            }),
            None if !term.still_leader() => Err(lost()),
            None => Err(StepError::Timeout(crate::units::show(limits.step_time))),
        };
        if data.log_dropped > 0 {
            warn!(
                dropped = data.log_dropped,
                "guest log lines dropped (more than {} in one step)", self.host_limits.log_lines
            );
        }
        told.set(stderr.tail());
        let (err_bytes, err_dropped) = stderr.take();
        for line in String::from_utf8_lossy(&err_bytes)
            .lines()
            .filter(|l| !l.trim().is_empty())
        {
            tracing::event!(Level::WARN, stderr = true, "guest: {line}");
        }
        if err_dropped > 0 {
            warn!(
                dropped = err_dropped,
                "guest stderr cut: more than {STDERR_CAPACITY} bytes in one step"
            );
        }
        debug!(step, "call finished");
        outcome
    }
}

/// One line naming what went wrong: the trap (`unreachable` after a panic, call stack
/// exhausted, …) or the root cause (a memory grow refused by the limits). A panic's message
/// or a traceback comes through the guest's stderr: logged with the step, and its last lines
/// added to the failure.
fn trap_message(e: &wasmtime::Error) -> String {
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => e.root_cause().to_string(),
    }
}
