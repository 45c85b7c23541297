//! The runner of one job: while this node leads, it completes the job's due periods.
//!
//! Every round (each heartbeat, each fire time, or sooner) the leader reads the job's state in
//! one round trip (requests, open runs, pause flag, cursor), then:
//!
//! 1. **Accounts** ([`account`]) for the periods that fired since the cursor
//!    ([`crate::exec::spec::Schedule::since`]): each gets a run record in one fenced write with the
//!    new cursor — `pending`, or `missed` under the catch-up policy, or `skipped` under the
//!    overlap policy — so no period is ever dropped silently (I5).
//! 2. **Runs** ([`period`]) the first due period (open runs, requests, and what it just made
//!    pending, in period order): `done` is final; `running`/`waiting`/`pending` resume from
//!    the saved step and checkpoint; a requested period whose record is `failed`, `missed` or
//!    `skipped` runs again as a new attempt. Before every step it checks the term
//!    ([`Term::still_leader`]), the pause flag (as last read, at most a heartbeat old) and the
//!    maximum run time; after every step it saves the record and the checkpoint in one fenced
//!    write. A failed step is retried from the checkpoint under the retry policy. A step is
//!    stopped as soon as the term ends (see [`crate::exec::runtime`]), and nothing is written after
//!    that: the next leader resumes from the last checkpoint.
//!
//! The rules themselves (catch-up, overlap, re-runs, retries, which period is next) are pure
//! functions in [`decide`], tested on their own.
//!
//! The runner's task runs inside the job's `job` span and each term inside a `term` span
//! (`token`), so log lines here carry `job`, `node` and `token` without naming them.
//!
//! On shutdown the running step is dropped (which stops the guest) before the elector releases
//! the lease (I7).
//!
//! Length: `Runner::lead` is the leader's whole loop (account, pick, run, hand over, idle) and
//! reads as one piece; accounting, running a period and the period index are in `account`,
//! `period` and `index`.

mod account;
mod decide;
mod index;
mod period;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, error_span, info, warn};

use crate::coord::balance::{Ask, Balance};
use crate::coord::elector::Role;
use crate::coord::fence::{self, Bookkeeping, TermWrite, TermWriteError};
use crate::coord::heartbeat::Heartbeat;
use crate::coord::term::Term;
use crate::coord::timing::Timing;
use crate::exec::runs::{self, JobState, Request};
use crate::exec::runtime::{LoadedJob, Runtime};
use crate::exec::spec::Period;
use crate::store::keys::JobKeys;

/// How long a period whose inputs are not ready waits before its step is tried again.
pub(crate) const NOT_READY_RETRY: Duration = Duration::from_secs(30);
/// An idle runner reads its state at least every this many heartbeats; notices wake it sooner.
const SAFETY_POLL_HEARTBEATS: u32 = 10;
/// The longest an idle runner sleeps on its own (the heartbeat's safety poll wakes it sooner).
const IDLE_CAP: Duration = Duration::from_secs(3600);
/// How long after a Redis error the runner tries again.
const ERROR_RETRY: Duration = Duration::from_secs(1);
/// Finished periods remembered to avoid re-reading their records; forgotten all at once when
/// full (forgetting costs one read per period).
const DONE_CACHE: usize = 10_000;
/// Component versions of one job a runner keeps, newest last, so that a run started before a
/// replacement finishes with the version it started with.
const VERSIONS_KEPT: usize = 8;

/// Everything one job's runner needs.
pub(crate) struct Runner {
    /// The version new runs use (the latest loaded).
    job: Arc<LoadedJob>,
    /// Where newer versions arrive (from the jobs directory).
    versions: watch::Receiver<Arc<LoadedJob>>,
    /// Versions seen since start, oldest first (at most [`VERSIONS_KEPT`]).
    known: Vec<Arc<LoadedJob>>,
    runtime: Runtime,
    /// The store behind the seam: every write of the term, its reads of records, checkpoints
    /// and state (the heartbeat's reads of the state stay Redis's for now); fan-out tasks
    /// take its Redis connection ([`crate::coord::term_store::Store::redis_conn`]).
    store: crate::coord::term_store::Store,
    node: String,
    timing: Timing,
    data_dir: Option<PathBuf>,
    /// Reads the job's state in the host's heartbeat (an idle runner's safety poll, and every
    /// heartbeat during a run), instead of a round trip of its own.
    heartbeat: Heartbeat,
    /// The member that asks for the job, as last read.
    wanted: std::sync::Mutex<Option<Ask>>,
    keys: JobKeys,
    /// The pause flag as last read (every round, and at each fire time or heartbeat during a
    /// run): checked before each step without a round trip of its own.
    paused: AtomicBool,
    /// Hands the job to its preferred member between runs ([`crate::coord::balance`]).
    balance: Balance,
    /// Woken by the job's notices (a request, the pause flag, a member asking for the job), so
    /// an idle runner reads its state at once instead of at its next poll.
    notice: Arc<tokio::sync::Notify>,
}

/// What every runner of a host shares: the runtime, the Redis connection, the node id, the
/// timings.
pub(crate) struct RunnerHost {
    /// The WebAssembly runtime.
    pub runtime: Runtime,
    /// The store behind the seam: every write of a term, the runner's reads, guest reads (and
    /// the Redis connection fan-out tasks still take).
    pub store: crate::coord::term_store::Store,
    /// This node's id.
    pub node: String,
    /// Lease timings (the heartbeat paces the runner).
    pub timing: Timing,
    /// The host's heartbeat, through which runners read their state periodically.
    pub heartbeat: Heartbeat,
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
    /// The run was handed to the job's preferred member between two steps: the term ends and
    /// the new leader resumes the run from its checkpoint.
    HandedOver,
    /// A Redis error interrupted the run; it resumes from its last checkpoint.
    Interrupted(String),
    /// The run record is unreadable; the period is skipped (logged as an error).
    Broken,
    /// An operator asked (this request) to cancel the run while it ran: the step is dropped
    /// and the run recorded `cancelled`.
    Cancel(Request),
}

impl RunEnd {
    fn why(&self) -> String {
        match self {
            RunEnd::Interrupted(w) => w.clone(),
            RunEnd::Lost | RunEnd::HandedOver => "the term ended".into(),
            _ => String::new(),
        }
    }
}

impl Runner {
    /// A runner for the job whose versions arrive on `versions` (the current one first), with
    /// inputs from `data_dir` (`<data-dir>/<job>/`, when it exists), on the host described by
    /// `host`.
    pub(crate) fn new(
        mut versions: watch::Receiver<Arc<LoadedJob>>,
        host: RunnerHost,
        data_dir: Option<PathBuf>,
        balance: Balance,
        notice: Arc<tokio::sync::Notify>,
    ) -> Self {
        let RunnerHost {
            runtime,
            store,
            node,
            timing,
            heartbeat,
        } = host;
        let job = versions.borrow_and_update().clone();
        Runner {
            keys: JobKeys::new(&job.spec.name),
            known: vec![job.clone()],
            job,
            versions,
            runtime,
            store,
            node,
            timing,
            data_dir,
            paused: AtomicBool::new(false),
            balance,
            notice,
            heartbeat,
            wanted: std::sync::Mutex::new(None),
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

    /// Runs the job whenever `role` says this node leads, until `stop` is cancelled. Each term
    /// runs in a `term` span carrying its token.
    pub(crate) async fn run(mut self, mut role: watch::Receiver<Role>, stop: CancellationToken) {
        let mut done = HashSet::new();
        let mut not_before = HashMap::new();
        loop {
            let term = loop {
                if stop.is_cancelled() {
                    return;
                }
                if let Some(t) = role.borrow_and_update().term() {
                    break t.clone();
                }
                tokio::select! {
                    changed = role.changed() => if changed.is_err() { return },
                    _ = stop.cancelled() => return,
                }
            };
            // At ERROR level, like the job's span: enabled whenever any line of the term is.
            let span = error_span!("term", token = term.token());
            tokio::select! {
                _ = self.lead(&term, &mut done, &mut not_before).instrument(span) => {}
                _ = stop.cancelled() => {
                    info!(token = term.token(), "shutdown: running step stopped");
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
        let poll = self.timing.heartbeat;
        // Counted while this term lasts: the host's hand-over rate is a share of its terms.
        let _leading = self.balance.limiter.leading();
        let mut paused_logged = false;
        let mut published = None;
        // The state the heartbeat read for an idle runner, if that is what woke it.
        let mut polled: Option<JobState> = None;
        // Whether this term built the run index (once per job, for records written before it).
        let mut indexed = false;
        // Why the job was last kept from the member that asks for it (logged once per reason).
        let mut kept: Option<String> = None;
        while term.still_leader() {
            self.refresh();
            if let Err(RunEnd::Lost) = self.publish_schedule(term, &mut published).await {
                return;
            }
            let state = match polled.take() {
                Some(s) => s,
                None => {
                    match self
                        .in_term(term, runs::state_of(&self.store, &self.keys))
                        .await
                    {
                        Ok(s) => s,
                        Err(RunEnd::Lost) => return,
                        Err(e) => {
                            warn!("cannot read the job's state: {}", e.why());
                            self.pause_for(term, ERROR_RETRY).await;
                            continue;
                        }
                    }
                }
            };
            self.note(&state);
            if !state.indexed && !indexed {
                // A job that was never accounted for has no record to index (no SCAN).
                let fresh = state.cursor.is_none() && state.open.is_empty();
                match self.index_runs(term, fresh).await {
                    Ok(()) => indexed = true,
                    Err(RunEnd::Lost) => return,
                    Err(e) => warn!("cannot index the job's run records: {}", e.why()),
                }
            }
            // An operator's cancel is served first, paused or not: it runs no step.
            let cancel = state
                .requested
                .iter()
                .find(|(_, q)| q.seen == runs::Seen::Cancel)
                .map(|(p, _)| p.clone());
            if cancel.is_none()
                && let Some(why) = &state.paused
            {
                if !paused_logged {
                    info!(paused = %why, "job paused: no step starts until it is resumed; periods that fire meanwhile are handled by the catch-up policy on resume");
                    paused_logged = true;
                }
                polled = self.idle_for(term, IDLE_CAP, self.safety_poll()).await;
                continue;
            }
            if paused_logged && state.paused.is_none() {
                info!("job resumed");
                paused_logged = false;
            }
            let accounted = if cancel.is_some() {
                Vec::new()
            } else {
                match self.account(term, &state).await {
                    Ok(p) => p,
                    Err(RunEnd::Lost) => return,
                    Err(e) => {
                        warn!("cannot account for fired periods: {}", e.why());
                        Vec::new()
                    }
                }
            };
            let now = Instant::now();
            let asked: Vec<&String> = state.requested.keys().collect();
            let next = cancel.or_else(|| {
                decide::next_due(&state.open, &asked, &accounted, done, not_before, now)
            });
            let Some(id) = next else {
                // Between runs: the moment to hand the job to its preferred member, if it has
                // one. The elector ends the term and releases the lease at once.
                let wanted = self.wanted();
                let job = self.keys.job();
                if self.balance.asked_by_preferred(job, wanted.as_ref(), now) {
                    // Open runs that wait (inputs, a retry's back-off) are runs in progress:
                    // they go only to a member with their version.
                    let waiting: Vec<&String> =
                        state.open.iter().filter(|p| !done.contains(*p)).collect();
                    let rule = match self.open_runs_rule(term, &waiting).await {
                        Ok(rule) => rule,
                        Err(RunEnd::Lost) => return,
                        Err(e) => decide::HandOver::Keep(e.why()),
                    };
                    let version = match &rule {
                        decide::HandOver::Anyone => Some(None),
                        decide::HandOver::WithVersion { component, .. } => {
                            Some(Some(component.as_str()))
                        }
                        decide::HandOver::Keep(_) => None,
                    };
                    let to = version
                        .and_then(|v| self.balance.hand_over_to(job, wanted.as_ref(), v, now));
                    if let Some(to) = to {
                        info!(to = %to, "handing over to the job's preferred member between runs");
                        self.balance.ask(term.token());
                        let _ = tokio::time::timeout(poll * 2, term.ended()).await;
                        continue;
                    }
                    self.note_kept(&rule, wanted.as_ref(), &mut kept);
                }
                // Nothing due: wait for the next fire time, a request, a retry, or the term's end.
                // A member asks for the job but may not hand-over yet (not settled, the rate,
                // the back-off): look again next heartbeat rather than at the safety poll.
                let safety = if wanted.is_some_and(|w| w.node != self.node) {
                    poll
                } else {
                    self.safety_poll()
                };
                // The sleep is for fire times and retries only: the safety poll comes with the
                // heartbeat's read, so the runner makes no read of its own for it.
                let until_fire = self.until_next_fire(IDLE_CAP);
                let until_retry = not_before
                    .values()
                    .map(|t| t.saturating_duration_since(now))
                    .min()
                    .unwrap_or(until_fire);
                polled = self
                    .idle_for(term, until_fire.min(until_retry), safety)
                    .await;
                continue;
            };
            let mut request = state.requested.get(&id).cloned();
            let Some(period) = self.period_of(term, &id, request.as_ref()).await else {
                continue;
            };
            // Periods keep being accounted for at their fire times while the run goes on, so
            // the overlap and catch-up policies see them on time; every heartbeat the
            // heartbeat reads the job's state (pause, a member's ask) for the run.
            let end = {
                let run = self.run_period(term, &period, request.as_ref());
                tokio::pin!(run);
                loop {
                    let read = self.heartbeat.poll(self.keys.job(), Instant::now());
                    tokio::select! {
                        end = &mut run => break end,
                        read = read => {
                            // A failed read is only skipped: the next heartbeat reads again.
                            if let Some(Ok(state)) = read {
                                let state = JobState::from(state);
                                self.note(&state);
                                // An operator cancels this run: stop it now (its step is
                                // dropped, as at a term's end) and record it cancelled.
                                if let Some(q) = state.requested.get(&period.id)
                                    && q.seen == runs::Seen::Cancel
                                    && request.as_ref().map(|r| &r.id) != Some(&q.id)
                                {
                                    break RunEnd::Cancel(q.clone());
                                }
                                if state.paused.is_none()
                                    && let Err(e) = self.account(term, &state).await
                                {
                                    warn!("cannot account for fired periods during a run: {}", e.why());
                                }
                            } else {
                                self.pause_for(term, self.timing.heartbeat).await;
                            }
                        }
                        _ = tokio::time::sleep(self.until_next_fire(IDLE_CAP)) => {
                            if let Err(e) = self.account_now(term).await {
                                warn!("cannot account for fired periods during a run: {}", e.why());
                            }
                        }
                    }
                }
            };
            let end = match end {
                RunEnd::Cancel(q) => {
                    info!(period = %period.id, "stopped the run's step: an operator cancels the run");
                    let end = self.run_period(term, &period, Some(&q)).await;
                    request = Some(q);
                    end
                }
                end => end,
            };
            match end {
                RunEnd::Finished | RunEnd::Broken => {
                    if done.len() >= DONE_CACHE {
                        done.clear();
                    }
                    done.insert(period.id.clone());
                    not_before.remove(&period.id);
                    // Out of the open index, and the request served cleared (only if it is
                    // still the one served), in a fenced write.
                    match self.settle(term, &period.id, request.as_ref()).await {
                        Ok(()) => {}
                        Err(RunEnd::Lost) => return,
                        Err(e) => {
                            warn!(period = %period.id, "cannot clear the run's request or open mark: {}", e.why())
                        }
                    }
                }
                RunEnd::Later(at) => {
                    not_before.insert(period.id.clone(), at);
                }
                RunEnd::Paused | RunEnd::Cancel(_) => {}
                RunEnd::Lost => return,
                RunEnd::HandedOver => {
                    let _ = tokio::time::timeout(poll * 2, term.ended()).await;
                    return;
                }
                RunEnd::Interrupted(why) => {
                    warn!(period = %period.id, "run interrupted, resuming from its checkpoint: {why}");
                    not_before.insert(period.id.clone(), Instant::now() + ERROR_RETRY);
                }
            }
        }
    }

    /// The hand-over rule for the open runs `waiting` (see [`decide::hand_over_between_runs`]):
    /// reads their records, in `term`. A record that cannot be read keeps the job.
    async fn open_runs_rule(
        &self,
        term: &Term,
        waiting: &[&String],
    ) -> Result<decide::HandOver, RunEnd> {
        let mut records = Vec::with_capacity(waiting.len());
        for period in waiting {
            match term
                .bound(runs::read_from(&self.store, &self.keys, period))
                .await
            {
                None => return Err(RunEnd::Lost),
                Some(Ok(r)) => records.push(r),
                Some(Err(e)) => {
                    return Ok(decide::HandOver::Keep(format!(
                        "the record of the open run {period} cannot be read: {e}"
                    )));
                }
            }
        }
        Ok(decide::hand_over_between_runs(
            records.iter().map(Option::as_ref),
        ))
    }

    /// Logs (once per reason) why the job stays with this host although its preferred member
    /// asks for it: an open run needs a version the member does not have, or cannot move.
    fn note_kept(&self, rule: &decide::HandOver, wanted: Option<&Ask>, kept: &mut Option<String>) {
        let why = match (rule, wanted) {
            (decide::HandOver::WithVersion { period, component }, Some(ask))
                if ask.version.as_deref() != Some(component.as_str()) =>
            {
                format!(
                    "the open run of {period} continues with component {component}, and {} serves the job with {}",
                    ask.node,
                    ask.version.as_deref().unwrap_or("an unnamed version")
                )
            }
            (decide::HandOver::Keep(why), _) => why.clone(),
            // Held back by the rate, the back-off or settling: not worth a line.
            _ => return,
        };
        if kept.as_ref() != Some(&why) {
            info!(to = %wanted.map(|a| a.node.as_str()).unwrap_or(""), "keeping the job instead of handing it to its preferred member: {why}");
            *kept = Some(why);
        }
    }

    /// Takes note of what a state read says for the steps to come: the pause flag and the
    /// member asking for the job.
    pub(super) fn note(&self, state: &JobState) {
        self.paused.store(state.paused.is_some(), Ordering::Relaxed);
        *self.wanted.lock().expect("wanted") = state.wanted.as_deref().map(Ask::decode);
    }

    /// The member that asks for the job, as last read.
    pub(super) fn wanted(&self) -> Option<Ask> {
        self.wanted.lock().expect("wanted").clone()
    }

    /// Takes `period` out of the open index and clears `request` (if it is still the one
    /// served), in one fenced write of `term`.
    async fn settle(
        &self,
        term: &Term,
        period: &str,
        request: Option<&Request>,
    ) -> Result<(), RunEnd> {
        let open_remove = [period.to_string()];
        let clear: Vec<(String, String)> = request
            .map(|r| (period.to_string(), r.id.clone()))
            .into_iter()
            .collect();
        let book = Bookkeeping {
            open_remove: &open_remove,
            clear_requests: &clear,
            ..Bookkeeping::default()
        };
        self.fenced(term, TermWrite::new(&[], &[]).with(book)).await
    }

    /// One fenced write of `term`, its outcome as a [`RunEnd`] on failure.
    async fn fenced(&self, term: &Term, write: TermWrite<'_>) -> Result<(), RunEnd> {
        match fence::term_write(&self.store, &self.keys, term, write)
            .await
            .map(drop)
        {
            Ok(()) => Ok(()),
            Err(TermWriteError::Ended | TermWriteError::Refused(_)) => Err(RunEnd::Lost),
            // The runner's own records carry no quota; a refusal would be a host bug, and the
            // run is interrupted, not failed, if one ever came back.
            Err(
                e @ (TermWriteError::Store(_)
                | TermWriteError::NotReplicated { .. }
                | TermWriteError::QuotaExceeded(_)),
            ) => Err(RunEnd::Interrupted(e.to_string())),
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

    /// How long an idle runner waits at most without a notice: its safety poll, for a notice
    /// that was lost (pub/sub reconnecting).
    fn safety_poll(&self) -> Duration {
        self.timing.heartbeat * SAFETY_POLL_HEARTBEATS
    }

    /// Waits `d`, until the job's next notice, or until the term ends; and at the first
    /// heartbeat `safety` from now, the heartbeat reads the job's state, which wakes the
    /// runner with it (its safety poll, for a lost notice, at no round trip of its own).
    async fn idle_for(&self, term: &Term, d: Duration, safety: Duration) -> Option<JobState> {
        let read = self
            .heartbeat
            .poll(self.keys.job(), Instant::now() + safety);
        tokio::select! {
            _ = tokio::time::sleep(d) => None,
            _ = self.notice.notified() => None,
            _ = term.ended() => None,
            r = read => r.and_then(Result::ok).map(JobState::from),
        }
    }

    /// Waits `d` or until the term ends.
    async fn pause_for(&self, term: &Term, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = term.ended() => {}
        }
    }

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

/// Now, as run records write it (RFC 3339, UTC, milliseconds).
fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
