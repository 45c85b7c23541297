//! The runner's decisions as pure functions: what a fired period becomes, what a period's
//! existing record means for a new pass, what follows a failed attempt, and which period runs
//! next. No I/O and no clock reads: the caller passes "now", so each rule is tested here alone.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::exec::runs::{FailureKind, Request, RunRecord, RunStatus, Seen};
use crate::exec::runtime::{StepError, StepOutcome};
use crate::exec::spec::{CatchUp, Overlap, Policies};

/// Longest error message kept in a run record.
pub(crate) const ERROR_MAX: usize = 4096;

/// `why`, cut to [`ERROR_MAX`] bytes on a character boundary.
pub(crate) fn clip(why: String) -> String {
    crate::logging::clip(why, ERROR_MAX)
}

/// What a period that fired (and has no record yet) becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fired {
    /// Run it: record it `pending`.
    Run,
    /// The catch-up policy does not run it: record it `missed`.
    Missed,
    /// An earlier run is open and the overlap policy is `skip`: record it `skipped`.
    Skipped,
}

/// Decides a fired period: `newest` says whether it is the newest of those fired since the
/// cursor, `late` how long ago it fired, `busy` whether a run is open (or an earlier period
/// of this pass was made pending).
pub(crate) fn on_fire(policies: &Policies, newest: bool, late: Duration, busy: bool) -> Fired {
    let run = match policies.catch_up {
        CatchUp::Latest => newest,
        CatchUp::Skip | CatchUp::All => late <= policies.catch_up_window,
    };
    if !run {
        Fired::Missed
    } else if busy && policies.overlap == Overlap::Skip {
        Fired::Skipped
    } else {
        Fired::Run
    }
}

/// What a pass over a due period starts from, given its record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Nothing to do: `done`, or final and not asked for again.
    Finished,
    /// A final record (not `done`) an operator asked to run again: a new attempt, from step 0.
    Rerun {
        /// The attempt number of the new run: the next one after a failure, 1 otherwise.
        attempt: u32,
    },
    /// An open record (`pending`, `running`, `waiting`): carry it on.
    Continue,
    /// No record yet: a new run.
    New,
    /// An open record an operator asked to cancel: record it `cancelled`, run nothing.
    Cancel,
}

/// Decides how a pass over a period begins, given its record and the operator's request for
/// it, if any. A final record other than `done` runs again only for a request that names that
/// very record (what the operator saw: its status and attempt), or for a request made before
/// there was a record when the period was then recorded missed or skipped: so a request made
/// while a run was open does not re-run it after it fails, and a request served already (its
/// record has moved on) is not served twice.
pub(crate) fn entry(existing: Option<&RunRecord>, request: Option<&Request>) -> Entry {
    let cancel = request.is_some_and(|q| q.seen == Seen::Cancel);
    let Some(r) = existing else {
        // A cancel starts nothing.
        return if cancel { Entry::Finished } else { Entry::New };
    };
    if r.status == RunStatus::Done {
        return Entry::Finished;
    }
    if !r.status.is_final() {
        return if cancel {
            Entry::Cancel
        } else {
            Entry::Continue
        };
    }
    let asked = match request.map(|q| q.seen) {
        Some(Seen::Final { status, attempt }) => status == r.status && attempt == r.attempt,
        Some(Seen::Nothing) => matches!(r.status, RunStatus::Missed | RunStatus::Skipped),
        Some(Seen::Open | Seen::Cancel) | None => false,
    };
    if !asked {
        return Entry::Finished;
    }
    Entry::Rerun {
        attempt: if matches!(r.status, RunStatus::Failed | RunStatus::Cancelled) {
            r.attempt + 1
        } else {
            1
        },
    }
}

/// What follows a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Try again from the checkpoint after `delay`.
    Retry {
        /// The backoff before the next attempt.
        delay: Duration,
    },
    /// The run is `failed`.
    Fail,
}

/// Decides what follows attempt `attempt` failing with `kind`: a retry while attempts are left
/// and the failure is worth retrying (a changed version, a run past its maximum run time or a
/// job over its storage quota is not: the next attempt would fail the same way), else the end
/// of the run.
pub(crate) fn after_failure(policies: &Policies, attempt: u32, kind: FailureKind) -> AfterFailure {
    let retryable = !matches!(
        kind,
        FailureKind::VersionChanged
            | FailureKind::RunTimeout
            | FailureKind::QuotaExceeded
            | FailureKind::TaskFailed
    );
    if retryable && attempt < policies.retry_attempts {
        AfterFailure::Retry {
            delay: policies.retry_delay(attempt + 1),
        }
    } else {
        AfterFailure::Fail
    }
}

/// The failure class a run record gets for a step error that fails the attempt.
pub(crate) fn failure_kind(e: &StepError) -> FailureKind {
    match e {
        StepError::Trap(_) => FailureKind::Trap,
        StepError::MemoryLimit(_) => FailureKind::MemoryLimit,
        StepError::Timeout(_) => FailureKind::Timeout,
        StepError::QuotaExceeded(_) => FailureKind::QuotaExceeded,
        _ => FailureKind::JobError,
    }
}

/// The word the `leasehold_steps_total` metric counts a step's outcome under.
pub(crate) fn outcome_word(outcome: &Result<StepOutcome, StepError>) -> &'static str {
    match outcome {
        Ok(StepOutcome::Continue(_)) => "continue",
        Ok(StepOutcome::Done) => "done",
        Ok(StepOutcome::AwaitTasks(_)) => "await-tasks",
        Err(StepError::Failed(_)) => "failed",
        Err(StepError::NotReady(_)) => "not-ready",
        Err(StepError::LostLeadership(_)) => "lost-leadership",
        Err(StepError::Timeout(_)) => "timeout",
        Err(StepError::Trap(_)) => "trap",
        Err(StepError::MemoryLimit(_)) => "memory-limit",
        Err(StepError::QuotaExceeded(_)) => "quota-exceeded",
        Err(StepError::Host(_)) => "host",
    }
}

/// Whether a run that started at `started_at` (RFC 3339) has run longer than `max` at `now`.
/// A start time that does not parse counts as not exceeded.
pub(crate) fn run_time_exceeded(
    started_at: &str,
    now: DateTime<Utc>,
    max: Option<Duration>,
) -> bool {
    let Some(max) = max else { return false };
    let Some(started) = parse_rfc3339(started_at) else {
        return false;
    };
    (now - started).to_std().unwrap_or_default() > max
}

/// The first period due now, in period order: open runs, requests, and the periods just
/// accounted as pending. A period finished on this node earlier (`done`) is due again only
/// when it is requested; one waiting for a retry or its inputs (`not_before`) only once its
/// time has come.
pub(crate) fn next_due<'a>(
    open: &'a [String],
    requested: &[&'a String],
    accounted: &'a [String],
    done: &HashSet<String>,
    not_before: &HashMap<String, Instant>,
    now: Instant,
) -> Option<String> {
    let mut due: Vec<&String> = open
        .iter()
        .chain(requested.iter().copied())
        .chain(accounted)
        .filter(|id| !done.contains(*id) || requested.contains(id))
        .collect();
    due.sort();
    due.dedup();
    due.into_iter()
        .find(|id| not_before.get(*id).is_none_or(|t| *t <= now))
        .cloned()
}

/// To whom a leader may hand its job *between runs* while some of its runs are open but
/// deferred (waiting for inputs or for a retry's back-off): an open run is still a run, and a
/// run never mixes component versions, so once it has completed a step (or waits for tasks)
/// it goes only to a member that has the version it started with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HandOver {
    /// No open run has completed a step: any member may take the job.
    Anyone,
    /// The open run of `period` continues with `component`: only a member that has it.
    WithVersion {
        /// The open run's period.
        period: String,
        /// The component version it started with.
        component: String,
    },
    /// Open runs continue with different versions: no member can take them all; keep the job.
    Keep(String),
}

/// Decides [`HandOver`] from the records of the open runs (`None`: the period has no record
/// yet, so its run starts with whatever version leads it). Final records are not open.
pub(crate) fn hand_over_between_runs<'a>(
    records: impl IntoIterator<Item = Option<&'a RunRecord>>,
) -> HandOver {
    let mut need: Option<(&str, &str)> = None;
    for r in records.into_iter().flatten() {
        if r.status.is_final() || (r.step == 0 && !r.awaiting_tasks) {
            continue;
        }
        match need {
            None => need = Some((&r.period, &r.component)),
            Some((period, component)) if component != r.component => {
                return HandOver::Keep(format!(
                    "open runs continue with different component versions ({period}: {component}, {}: {})",
                    r.period, r.component
                ));
            }
            Some(_) => {}
        }
    }
    match need {
        None => HandOver::Anyone,
        Some((period, component)) => HandOver::WithVersion {
            period: period.to_string(),
            component: component.to_string(),
        },
    }
}

/// An RFC 3339 time in UTC.
pub(crate) fn parse_rfc3339(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies(catch_up: CatchUp, overlap: Overlap) -> Policies {
        Policies {
            catch_up,
            overlap,
            catch_up_window: Duration::from_secs(3600),
            retry_attempts: 3,
            ..Policies::default()
        }
    }

    fn record(status: RunStatus, attempt: u32) -> RunRecord {
        let p = crate::exec::spec::Schedule::parse("0 0 2 * * *", "UTC")
            .unwrap()
            .period_by_id("2026-11-27")
            .unwrap();
        let mut r = RunRecord::new(&p, status, "2026-11-27T02:00:00.000Z");
        r.attempt = attempt;
        r
    }

    #[test]
    fn catch_up_latest_runs_only_the_newest_fired_period() {
        let p = policies(CatchUp::Latest, Overlap::Queue);
        let hour = Duration::from_secs(3600);
        assert_eq!(on_fire(&p, false, Duration::ZERO, false), Fired::Missed);
        assert_eq!(on_fire(&p, true, hour * 100, false), Fired::Run);
    }

    #[test]
    fn catch_up_skip_and_all_run_what_is_within_the_window() {
        for c in [CatchUp::Skip, CatchUp::All] {
            let p = policies(c, Overlap::Queue);
            assert_eq!(
                on_fire(&p, false, Duration::from_secs(3600), false),
                Fired::Run
            );
            assert_eq!(
                on_fire(&p, true, Duration::from_secs(3601), false),
                Fired::Missed
            );
        }
    }

    #[test]
    fn overlap_skip_skips_a_period_fired_during_an_open_run() {
        let skip = policies(CatchUp::Latest, Overlap::Skip);
        assert_eq!(on_fire(&skip, true, Duration::ZERO, true), Fired::Skipped);
        assert_eq!(on_fire(&skip, true, Duration::ZERO, false), Fired::Run);
        let queue = policies(CatchUp::Latest, Overlap::Queue);
        assert_eq!(on_fire(&queue, true, Duration::ZERO, true), Fired::Run);
        // A period the catch-up policy misses is missed, not skipped.
        assert_eq!(on_fire(&skip, false, Duration::ZERO, true), Fired::Missed);
    }

    fn asked(seen: Seen) -> Request {
        Request {
            id: "r1".into(),
            seen,
        }
    }

    fn saw(status: RunStatus, attempt: u32) -> Request {
        asked(Seen::Final { status, attempt })
    }

    #[test]
    fn a_done_period_is_never_entered_again() {
        let done = record(RunStatus::Done, 1);
        assert_eq!(
            entry(Some(&done), Some(&saw(RunStatus::Done, 1))),
            Entry::Finished
        );
        assert_eq!(entry(Some(&done), None), Entry::Finished);
    }

    #[test]
    fn a_request_that_names_the_final_record_is_a_new_attempt() {
        let failed = record(RunStatus::Failed, 2);
        assert_eq!(
            entry(Some(&failed), Some(&saw(RunStatus::Failed, 2))),
            Entry::Rerun { attempt: 3 }
        );
        for s in [RunStatus::Missed, RunStatus::Skipped] {
            let r = record(s, 4);
            assert_eq!(
                entry(Some(&r), Some(&saw(s, 4))),
                Entry::Rerun { attempt: 1 }
            );
            // Asked before the period had a record, then the scheduler missed or skipped it.
            assert_eq!(
                entry(Some(&r), Some(&asked(Seen::Nothing))),
                Entry::Rerun { attempt: 1 }
            );
            assert_eq!(entry(Some(&r), None), Entry::Finished);
        }
        for s in [RunStatus::Pending, RunStatus::Running, RunStatus::Waiting] {
            assert_eq!(
                entry(Some(&record(s, 1)), Some(&asked(Seen::Nothing))),
                Entry::Continue
            );
        }
        assert_eq!(entry(None, None), Entry::New);
    }

    #[test]
    fn a_cancel_ends_an_open_run_and_starts_nothing() {
        let cancel = asked(Seen::Cancel);
        for s in [RunStatus::Pending, RunStatus::Running, RunStatus::Waiting] {
            assert_eq!(entry(Some(&record(s, 2)), Some(&cancel)), Entry::Cancel);
        }
        // No run, or its run ended before the leader read the cancel: nothing to do.
        assert_eq!(entry(None, Some(&cancel)), Entry::Finished);
        for s in [RunStatus::Done, RunStatus::Failed, RunStatus::Cancelled] {
            assert_eq!(entry(Some(&record(s, 1)), Some(&cancel)), Entry::Finished);
        }
        // A cancelled run triggered again is the next attempt.
        assert_eq!(
            entry(
                Some(&record(RunStatus::Cancelled, 1)),
                Some(&saw(RunStatus::Cancelled, 1))
            ),
            Entry::Rerun { attempt: 2 }
        );
    }

    #[test]
    fn a_request_for_another_record_does_not_run_again() {
        let failed = record(RunStatus::Failed, 3);
        // Served already: the record moved on from what the operator saw.
        assert_eq!(
            entry(Some(&failed), Some(&saw(RunStatus::Failed, 2))),
            Entry::Finished
        );
        // Asked while the run was open ("it carries on"), and the run then failed.
        assert_eq!(
            entry(Some(&failed), Some(&asked(Seen::Open))),
            Entry::Finished
        );
        // Asked before there was a record; the run made for it failed.
        assert_eq!(
            entry(Some(&failed), Some(&asked(Seen::Nothing))),
            Entry::Finished
        );
    }

    #[test]
    fn failures_retry_with_backoff_until_attempts_run_out() {
        let p = Policies {
            retry_attempts: 3,
            retry_backoff: Duration::from_secs(10),
            ..Policies::default()
        };
        assert_eq!(
            after_failure(&p, 1, FailureKind::Trap),
            AfterFailure::Retry {
                delay: Duration::from_secs(10)
            }
        );
        assert_eq!(
            after_failure(&p, 2, FailureKind::JobError),
            AfterFailure::Retry {
                delay: Duration::from_secs(20)
            }
        );
        assert_eq!(after_failure(&p, 3, FailureKind::Trap), AfterFailure::Fail);
        assert_eq!(
            after_failure(&p, 1, FailureKind::VersionChanged),
            AfterFailure::Fail
        );
        assert_eq!(
            after_failure(&p, 1, FailureKind::RunTimeout),
            AfterFailure::Fail
        );
    }

    #[test]
    fn step_errors_map_to_failure_classes() {
        assert_eq!(
            failure_kind(&StepError::Trap("x".into())),
            FailureKind::Trap
        );
        assert_eq!(
            failure_kind(&StepError::MemoryLimit("x".into())),
            FailureKind::MemoryLimit
        );
        assert_eq!(
            failure_kind(&StepError::Timeout("1s".into())),
            FailureKind::Timeout
        );
        assert_eq!(
            failure_kind(&StepError::Failed("no".into())),
            FailureKind::JobError
        );
        assert_eq!(outcome_word(&Ok(StepOutcome::Done)), "done");
        assert_eq!(
            outcome_word(&Err(StepError::NotReady("later".into()))),
            "not-ready"
        );
    }

    #[test]
    fn the_maximum_run_time_counts_from_the_start() {
        let now = parse_rfc3339("2026-11-27T03:00:00Z").unwrap();
        let hour = Some(Duration::from_secs(3600));
        assert!(run_time_exceeded("2026-11-27T01:59:59Z", now, hour));
        assert!(!run_time_exceeded("2026-11-27T02:00:00Z", now, hour));
        assert!(!run_time_exceeded("2026-11-27T00:00:00Z", now, None));
    }

    #[test]
    fn the_next_due_period_is_the_oldest_ready_one() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let now = Instant::now();
        let mut done = HashSet::new();
        let mut not_before = HashMap::new();
        let open = ids(&["2026-11-27"]);
        let accounted = ids(&["2026-11-26"]);
        assert_eq!(
            next_due(&open, &[], &accounted, &done, &not_before, now).as_deref(),
            Some("2026-11-26")
        );
        not_before.insert("2026-11-26".to_string(), now + Duration::from_secs(30));
        assert_eq!(
            next_due(&open, &[], &accounted, &done, &not_before, now).as_deref(),
            Some("2026-11-27")
        );
        done.insert("2026-11-27".to_string());
        assert_eq!(
            next_due(&open, &[], &accounted, &done, &not_before, now),
            None
        );
        // A request brings a period finished here back.
        let asked = "2026-11-27".to_string();
        assert_eq!(
            next_due(&open, &[&asked], &accounted, &done, &not_before, now).as_deref(),
            Some("2026-11-27")
        );
    }

    #[test]
    fn long_errors_are_cut_on_a_character_boundary() {
        let long = "é".repeat(ERROR_MAX);
        let cut = clip(long);
        assert!(cut.ends_with(" [cut]"));
        assert!(cut.len() <= ERROR_MAX + " [cut]".len());
        assert_eq!(clip("short".into()), "short");
    }

    #[test]
    fn a_deferred_run_that_has_completed_steps_goes_only_with_its_version() {
        let with = |status, step, component: &str| {
            let mut r = record(status, 1);
            r.step = step;
            r.component = component.into();
            r
        };
        // Nothing open, or open runs that have not completed a step: anyone.
        assert_eq!(hand_over_between_runs([]), HandOver::Anyone);
        let fresh = with(RunStatus::Waiting, 0, "sha256:a");
        assert_eq!(
            hand_over_between_runs([None, Some(&fresh)]),
            HandOver::Anyone
        );
        // Waiting for inputs or a retry after a step: only with that run's version.
        let waiting = with(RunStatus::Waiting, 1, "sha256:a");
        let retrying = with(RunStatus::Pending, 2, "sha256:a");
        for r in [&waiting, &retrying] {
            assert_eq!(
                hand_over_between_runs([Some(r)]),
                HandOver::WithVersion {
                    period: "2026-11-27".into(),
                    component: "sha256:a".into()
                }
            );
        }
        // Waiting for its tasks, at step 0 or later: the same.
        let mut tasks = with(RunStatus::Running, 0, "sha256:a");
        tasks.awaiting_tasks = true;
        assert!(matches!(
            hand_over_between_runs([Some(&tasks)]),
            HandOver::WithVersion { .. }
        ));
        // Final records are not open.
        let failed = with(RunStatus::Failed, 3, "sha256:b");
        assert!(matches!(
            hand_over_between_runs([Some(&failed), Some(&waiting)]),
            HandOver::WithVersion { component, .. } if component == "sha256:a"
        ));
        // Two open runs of different versions: nobody can take both.
        let other = with(RunStatus::Waiting, 1, "sha256:b");
        assert!(matches!(
            hand_over_between_runs([Some(&waiting), Some(&other)]),
            HandOver::Keep(_)
        ));
    }
}
