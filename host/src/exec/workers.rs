//! Task workers (fan-out): every host runs the tasks of the fan-out jobs it serves, whoever
//! leads them, with at most `--task-slots` tasks at once across its jobs.
//!
//! A worker takes a task from the job's stream ([`crate::exec::tasks::fetch`]): a new one, or one
//! whose worker stopped refreshing its claim for a lease TTL (`XAUTOCLAIM`: it crashed, froze
//! or lost Redis). It runs the task with the job's `run-task` in a fresh sandbox with the job's
//! limits ([`crate::exec::runtime::Runtime::run_task`]), under a [`Term`] for the term that submitted
//! the task, whose deadline is the claim's: `t_sent + ttl − margin` from the last claim refresh
//! it sent (every heartbeat, [`crate::exec::tasks::refresh`]), exactly the lease rule (I3). A claim
//! that lapses, or is found taken over, ends that term: the guest sees `still-leader() ==
//! false`, its writes are refused, and its output is dropped here without being sent. An
//! output that is sent is recorded only if Redis still finds the claim and the submitting
//! term valid ([`crate::exec::tasks::complete`]), so a zombie worker's result is never seen.
//!
//! Workers wake on the job's work notices (`lh:{job}:work`: tasks submitted or queued again)
//! and look for lapsed claims at least every lease TTL.
//!
//! **Stopping.** A host that stops drops the tasks it runs and gives each back
//! ([`crate::exec::tasks::give_back`]): another worker takes it at once, not after a lease TTL,
//! and the delivery is not counted.
//!
//! **Deliveries.** A task taken over more than [`crate::exec::tasks::MOST_DELIVERIES`] times
//! (each worker that took it stopped answering) is not run again by that delivery: it counts
//! as a failed attempt, retried under the job's attempts like any other, so a task that kills
//! its workers fails its run, naming it, instead of being delivered forever.
//!
//! **Versions.** A task runs with the component version its run runs with (the entry names
//! it); a worker that does not have that version leaves the task, and its claim lapses to a
//! worker that has it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, warn};

use crate::coord::members::WorkerStats;
use crate::coord::term::Term;
use crate::coord::timing::Timing;
use crate::exec::runtime::{LoadedJob, RunInfo, Runtime, StepContext, StepError, Task, Work};
use crate::exec::tasks::{self, Attempt, Completed, Fetched, Held};
use crate::store::Conn;
use crate::store::keys::JobKeys;

/// Component versions of one job a worker keeps, newest last (as a runner does).
const VERSIONS_KEPT: usize = 8;

/// What a host's workers did since it started, reported with its membership.
#[derive(Default)]
pub struct Counters {
    slots: AtomicU32,
    running: AtomicU32,
    done: AtomicU64,
    failed: AtomicU64,
    not_ready: AtomicU64,
    reclaimed: AtomicU64,
    refused: AtomicU64,
}

impl Counters {
    /// Counters for a host with `slots` task slots.
    pub fn new(slots: u32) -> Self {
        let c = Counters::default();
        c.slots.store(slots, Ordering::Relaxed);
        c
    }

    /// The figures now.
    pub fn snapshot(&self) -> WorkerStats {
        WorkerStats {
            slots: self.slots.load(Ordering::Relaxed),
            running: self.running.load(Ordering::Relaxed),
            done: self.done.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            not_ready: self.not_ready.load(Ordering::Relaxed),
            reclaimed: self.reclaimed.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// What every job's worker of a host shares.
pub(crate) struct Workers {
    /// The WebAssembly runtime.
    pub runtime: Runtime,
    /// Redis (tasks live only there yet).
    pub conn: Conn,
    /// The store behind the seam: a task's guest reads and fenced writes.
    pub store: crate::coord::term_store::Store,
    /// This host's consumer name in every job's group: `node:<8 hex>`, fresh per process.
    pub consumer: String,
    /// One permit per task slot.
    pub slots: Arc<Semaphore>,
    /// What the workers did.
    pub counters: Arc<Counters>,
    /// Lease timings: a claim lapses after the lease TTL, and is refreshed every heartbeat.
    pub timing: Timing,
}

impl Workers {
    /// Works the tasks of one job (its versions arrive on `versions`) until `stop` is
    /// cancelled, woken by `wake` (the job's work notices).
    pub(crate) async fn work(
        self: Arc<Self>,
        mut versions: watch::Receiver<Arc<LoadedJob>>,
        data_dir: Option<std::path::PathBuf>,
        wake: Arc<Notify>,
        stop: CancellationToken,
    ) {
        let mut known: Vec<Arc<LoadedJob>> = vec![versions.borrow_and_update().clone()];
        let keys = JobKeys::new(&known[0].spec.name);
        let running = tokio_util::task::TaskTracker::new();
        let mut warned = false;
        loop {
            if versions.has_changed().unwrap_or(false) {
                let job = versions.borrow_and_update().clone();
                known.retain(|k| k.hash != job.hash);
                known.push(job);
                if known.len() > VERSIONS_KEPT {
                    known.remove(0);
                }
            }
            let latest = known.last().expect("a version").clone();
            if !latest.fans_out() {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    r = versions.changed() => if r.is_err() { break },
                }
                continue;
            }
            let permit = tokio::select! {
                p = self.slots.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = stop.cancelled() => break,
            };
            let sent = Instant::now();
            let mut conn = self.conn.clone();
            let fetched = tokio::time::timeout(
                self.timing.redis_timeout,
                tasks::fetch(&mut conn, &keys, &self.consumer, self.timing.lease_ttl, 1),
            )
            .await;
            match fetched {
                Ok(Ok(mut found)) if !found.is_empty() => {
                    warned = false;
                    let task = found.remove(0);
                    let Some(version) = known.iter().find(|k| k.hash == task.component).cloned()
                    else {
                        warn!(task = %task.id, period = %task.period, component = %task.component, "this host does not have the task's component version; its claim lapses to a worker that has it");
                        drop(permit);
                        continue;
                    };
                    let me = self.clone();
                    let (keys, data_dir, stop) = (keys.clone(), data_dir.clone(), stop.clone());
                    let span = tracing::error_span!("task", task = %task.id, token = task.token);
                    let claim = task.claim.clone();
                    running.spawn(
                        async move {
                            // Stopping drops the task (its guest with it) and gives it back.
                            tokio::select! {
                                () = me.run_one(&version, &keys, data_dir, task, sent) => {}
                                () = stop.cancelled() => me.give_back(&keys, &claim).await,
                            }
                            drop(permit);
                        }
                        .instrument(span),
                    );
                    continue;
                }
                Ok(Err(e)) if !warned => {
                    warn!("cannot fetch tasks: {e}");
                    warned = true;
                }
                _ => {}
            }
            drop(permit);
            // Nothing to do: wait for a notice, or look for lapsed claims after a lease TTL.
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(self.timing.lease_ttl) => {}
                _ = stop.cancelled() => break,
                r = versions.changed() => if r.is_err() { break },
            }
        }
        // Stopping: the running tasks drop their guests (their claims lapse to other workers).
        running.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), running.wait()).await;
    }

    /// Runs one task and records its outcome (see the module doc). `sent`: when the fetch that
    /// claimed it was sent (the claim's deadline counts from there).
    async fn run_one(
        &self,
        job: &LoadedJob,
        keys: &JobKeys,
        data_dir: Option<std::path::PathBuf>,
        task: Fetched,
        sent: Instant,
    ) {
        let name = keys.job();
        let metrics = crate::metrics::get();
        let c = &self.counters;
        if task.reclaimed {
            info!(period = %task.period, attempt = task.attempt, deliveries = task.claim.deliveries, "took over a task whose worker stopped answering (or gave it back as it stopped)");
            c.reclaimed.fetch_add(1, Ordering::Relaxed);
            metrics.task(name, "reclaimed", None);
        }
        if task.claim.deliveries > tasks::MOST_DELIVERIES {
            // Every worker that took it before stopped answering: its process was killed, froze
            // or ran out of memory each time. Counted as a failed attempt, so that a task that
            // kills its workers fails its run instead of being delivered forever.
            let why = format!(
                "the task was delivered {} times and every worker that took it stopped answering before it finished (killed, frozen or out of memory): counted as a failed attempt",
                task.claim.deliveries - 1
            );
            warn!(period = %task.period, attempt = task.attempt, deliveries = task.claim.deliveries, "{why}");
            self.record(job, keys, &task, Attempt::Failed(why), Duration::ZERO)
                .await;
            return;
        }
        let mut conn = self.conn.clone();
        let payload = match tokio::time::timeout(
            self.timing.redis_timeout,
            tasks::payload(&mut conn, keys, &task),
        )
        .await
        {
            Ok(Ok(Some(p))) => p,
            Ok(Ok(None)) => {
                info!(period = %task.period, "dropped a task entry that is no longer its task's current attempt");
                return;
            }
            _ => {
                warn!(period = %task.period, "cannot read the task's payload; its claim lapses to another worker");
                return;
            }
        };
        let term = Term::new(
            task.token,
            task.owner.clone(),
            sent + self.timing.leader_window(),
        );
        if !task.wait.is_zero() {
            // What is left of its back-off: the claim is held (refreshed) while it waits.
            info!(period = %task.period, attempt = task.attempt, wait_ms = task.wait.as_millis() as u64, "task waits out its back-off before it runs");
            tokio::select! {
                () = tokio::time::sleep(task.wait) => {}
                why = self.keep_claim(keys, &task, &term) => {
                    info!(period = %task.period, "task stopped while waiting: {why}");
                    return;
                }
            }
        }
        c.running.fetch_add(1, Ordering::Relaxed);
        info!(period = %task.period, attempt = task.attempt, "task started");
        let started = Instant::now();
        let ctx = StepContext {
            keys: keys.clone(),
            term: term.clone(),
            store: self.store.clone(),
            data_dir,
            work: Work::Task(task.claim.clone()),
            stderr: Default::default(),
        };
        let run = RunInfo {
            period: task.period.clone(),
            scheduled_at: task.scheduled_at.clone(),
            attempt: task.attempt,
        };
        let guest_task = Task {
            id: task.id.clone(),
            payload,
        };
        let out = tokio::select! {
            out = self.runtime.run_task(job, ctx, &run, &guest_task) => out,
            why = self.keep_claim(keys, &task, &term) => Err(StepError::LostLeadership(Some(why))),
        };
        c.running.fetch_sub(1, Ordering::Relaxed);
        let took = started.elapsed();
        let attempt = match out {
            _ if !term.still_leader() => {
                // Why, when it is known: the fence's refusal of one of its writes, or what the
                // claim's refresh found; else the claim's deadline passed unrefreshed.
                let why = match &out {
                    Err(StepError::LostLeadership(Some(why))) => why.as_str(),
                    _ => "this worker's claim lapsed unrefreshed (another worker runs the task)",
                };
                info!(period = %task.period, "task stopped, its output dropped: {why}");
                c.refused.fetch_add(1, Ordering::Relaxed);
                metrics.task(name, "dropped", Some(took));
                return;
            }
            Ok(o) if o.len() as u64 > job.spec.limits.write_bytes => Attempt::Failed(format!(
                "the task's output is {} bytes, more than the job's write limit of {} bytes",
                o.len(),
                job.spec.limits.write_bytes
            )),
            Ok(o) => Attempt::Output(o),
            Err(StepError::NotReady(why)) => Attempt::NotReady(why),
            Err(e) => Attempt::Failed(e.to_string()),
        };
        self.record(job, keys, &task, attempt, took).await;
    }

    /// Gives a task this stopping host was running back to the other workers at once, instead
    /// of letting its claim lapse for a lease TTL (its guest has been dropped).
    async fn give_back(&self, keys: &JobKeys, claim: &tasks::Claim) {
        let mut conn = self.conn.clone();
        let given = tokio::time::timeout(
            self.timing.redis_timeout,
            tasks::give_back(&mut conn, keys, claim),
        )
        .await;
        match given {
            Ok(Ok(true)) => {
                info!(period = %claim.period, "gave the task back as this host stops: another worker takes it now")
            }
            Ok(Ok(false)) => {}
            _ => {
                warn!(period = %claim.period, "could not give the task back as this host stops; its claim lapses after a lease TTL")
            }
        }
    }

    /// Records `attempt`'s outcome of `task` ([`tasks::complete`]) and counts it.
    async fn record(
        &self,
        job: &LoadedJob,
        keys: &JobKeys,
        task: &Fetched,
        attempt: Attempt,
        took: Duration,
    ) {
        let (name, metrics, c) = (keys.job(), crate::metrics::get(), &self.counters);
        let mut conn = self.conn.clone();
        let attempts = tasks::attempts(&job.spec.policies);
        let delay = tasks::backoff(&job.spec.policies, task.attempt + 1);
        // Bounded by the claim's lapse (a lease TTL), as the term's own writes are, not by the
        // Redis timeout of renewals: an output of megabytes on a loaded host may take longer
        // than half a heartbeat, and an answer given up on costs the task a run again (or a
        // warning, when it was recorded after all). The script checks the claim and the term.
        let completed = tokio::time::timeout(
            self.timing.lease_ttl,
            tasks::complete(
                &mut conn,
                keys,
                task,
                &attempt,
                attempts,
                delay,
                job.spec.limits.stored_bytes,
            ),
        )
        .await;
        let again = crate::units::show(delay);
        let took_ms = format!("{:.1}", took.as_secs_f64() * 1e3);
        let (outcome, counter) = match completed {
            Ok(Ok(Completed::Done)) => {
                info!(period = %task.period, attempt = task.attempt, took_ms, "task done");
                ("done", &c.done)
            }
            Ok(Ok(Completed::Retried)) => {
                warn!(period = %task.period, attempt = task.attempt, took_ms, error = %failure(&attempt), "task attempt failed; queued again, to run in {again}");
                ("retried", &c.failed)
            }
            Ok(Ok(Completed::Waiting)) => {
                info!(period = %task.period, attempt = task.attempt, took_ms, why = %failure(&attempt), "task not ready; queued again as the same attempt, to run in {again}");
                ("not-ready", &c.not_ready)
            }
            Ok(Ok(Completed::Failed)) => {
                warn!(period = %task.period, attempt = task.attempt, took_ms, error = %failure(&attempt), "task failed on its last attempt");
                ("failed", &c.failed)
            }
            Ok(Ok(Completed::Refused(r))) => {
                warn!(period = %task.period, attempt = task.attempt, "task result refused: {r}");
                ("refused", &c.refused)
            }
            Ok(Err(e)) => {
                warn!(period = %task.period, "cannot record the task's outcome ({e}); its claim lapses and it runs again");
                ("unrecorded", &c.refused)
            }
            Err(_) => {
                warn!(period = %task.period, "no answer recording the task's outcome; its claim lapses and it runs again if it was not recorded");
                ("unrecorded", &c.refused)
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics.task(name, outcome, Some(took));
    }

    /// Refreshes the claim every heartbeat, moving `term`'s deadline to `t_sent + ttl − margin`
    /// of each refresh Redis confirmed; ends `term` and returns why when the claim is found
    /// taken over or the task's run has ended. A refresh that fails leaves the deadline where
    /// it was.
    async fn keep_claim(&self, keys: &JobKeys, task: &Fetched, term: &Term) -> String {
        let mut conn = self.conn.clone();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.timing.heartbeat) => {}
                _ = term.ended() => {
                    // Ended elsewhere (a refused write, the deadline): the guest is stopped
                    // by the term's end, and its outcome says why.
                    std::future::pending::<()>().await;
                }
            }
            let sent = Instant::now();
            match tokio::time::timeout(
                self.timing.redis_timeout,
                tasks::refresh(&mut conn, keys, &task.claim),
            )
            .await
            {
                Ok(Ok(Held::Yes)) => term.extend(sent + self.timing.leader_window()),
                Ok(Ok(Held::TakenOver)) => {
                    term.end();
                    return "this worker's claim on the task was taken over by another worker (or the task was queued again)".into();
                }
                Ok(Ok(Held::RunEnded)) => {
                    term.end();
                    return "the task's run has ended (done, failed, or run again as a new attempt)".into();
                }
                _ => {}
            }
        }
    }
}

fn failure(a: &Attempt) -> &str {
    match a {
        Attempt::Failed(e) | Attempt::NotReady(e) => e,
        Attempt::Output(_) => "",
    }
}
