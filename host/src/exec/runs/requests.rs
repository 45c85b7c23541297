//! Operator requests: `leasehold trigger` and `POST /v1/jobs/{job}/runs` ask the leader to run
//! a period now; `leasehold cancel` and `POST /v1/jobs/{job}/runs/{period}/cancel` ask it to
//! cancel the period's open run (a request that saw `cancel`).
//!
//! A request is one field of the hash `lh:{job}:requested`: period → `<id> <seen>`, where the
//! id is fresh for every request that is written and `seen` is what the operator saw when
//! asking: `none` (no record yet), `open` (a run in progress, which carries on), or
//! `<status>#<attempt>` for a final record (`failed#2`, `missed#1`). The leader decides with
//! it ([`crate::exec::runs::Request`]): a final record runs again only when the request names that
//! very record, so a request made during a run does not re-run what then fails, and a request
//! made after the failure is never mistaken for one the leader already served. A leader clears
//! a request only inside its fenced write and only if the request still has the id it served:
//! an operator's newer request survives any leader's late clearing.
//!
//! Requests and the pause flag are written by operators, not by terms, so they are not fenced;
//! no leader writes them except to clear a request it served.

use super::{RunRecord, RunStatus, read_from};
use crate::coord::term_store::{Store, TermStore as _};
use crate::store::keys::JobKeys;

/// What the operator saw when asking for a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The period had no record.
    Nothing,
    /// The period's run was open (pending, running, waiting).
    Open,
    /// Not a run: the operator asks the leader to cancel the period's open run (it records it
    /// `cancelled`); with no open run when the leader reads it, nothing is done.
    Cancel,
    /// The period's record was final, with this status and attempt.
    Final {
        /// The record's status (`failed`, `missed`, `skipped`).
        status: RunStatus,
        /// The record's attempt.
        attempt: u32,
    },
}

/// One operator request for a period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Fresh for every request written; a leader clears a request only by this id.
    pub id: String,
    /// What the operator saw.
    pub seen: Seen,
}

impl Request {
    /// A new request (fresh id) made on seeing `record`.
    pub fn on_seeing(record: Option<&RunRecord>) -> Self {
        let seen = match record {
            None => Seen::Nothing,
            Some(r) if !r.status.is_final() => Seen::Open,
            Some(r) => Seen::Final {
                status: r.status,
                attempt: r.attempt,
            },
        };
        Request {
            id: uuid::Uuid::new_v4().simple().to_string(),
            seen,
        }
    }

    /// The hash value: `<id> <seen>`.
    pub fn encode(&self) -> String {
        let seen = match self.seen {
            Seen::Nothing => "none".to_string(),
            Seen::Open => "open".to_string(),
            Seen::Cancel => "cancel".to_string(),
            Seen::Final { status, attempt } => format!("{}#{attempt}", status.as_str()),
        };
        format!("{} {seen}", self.id)
    }

    /// Reads a hash value. A value of another shape (written by hand) is a request that saw
    /// nothing, with the whole value as its id.
    pub fn decode(value: &str) -> Self {
        let parse = || {
            let (id, seen) = value.split_once(' ')?;
            let seen = match seen {
                "none" => Seen::Nothing,
                "open" => Seen::Open,
                "cancel" => Seen::Cancel,
                other => {
                    let (status, attempt) = other.split_once('#')?;
                    let status: RunStatus =
                        serde_json::from_value(serde_json::Value::String(status.into())).ok()?;
                    Seen::Final {
                        status,
                        attempt: attempt.parse().ok()?,
                    }
                }
            };
            Some(Request {
                id: id.to_string(),
                seen,
            })
        };
        parse().unwrap_or_else(|| Request {
            id: value.to_string(),
            seen: Seen::Nothing,
        })
    }
}

/// What a trigger did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Triggered {
    /// A run of the period was requested.
    Requested,
    /// A run was already requested and not yet taken up.
    AlreadyRequested,
    /// The period is done; it is never run again.
    AlreadyDone(Box<RunRecord>),
    /// The period's run is open (pending, running, waiting); it goes on (the request makes sure
    /// the leader looks at it).
    AlreadyOpen(Box<RunRecord>),
    /// The period had failed, been missed or skipped: a new attempt was requested.
    Rerun(Box<RunRecord>),
}

impl Triggered {
    /// One line for people.
    pub fn describe(&self, job: &str, period: &str) -> String {
        match self {
            Triggered::Requested => format!("requested a run of {job} for period {period}"),
            Triggered::AlreadyRequested => {
                format!("a run of {job} for period {period} was already requested")
            }
            Triggered::AlreadyDone(r) => format!(
                "{job} period {period} is already done (token {}, node {}); not run again",
                r.token, r.node
            ),
            Triggered::AlreadyOpen(r) => format!(
                "{job} period {period} is already {} (step {}, attempt {}); the leader carries it on",
                r.status.as_str(),
                r.step,
                r.attempt
            ),
            Triggered::Rerun(r) => format!(
                "requested a new run of {job} for period {period}, which was {}{}",
                r.status.as_str(),
                r.error
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ),
        }
    }

    /// A short status word for the HTTP API.
    pub fn word(&self) -> &'static str {
        match self {
            Triggered::Requested => "requested",
            Triggered::AlreadyRequested => "already-requested",
            Triggered::AlreadyDone(_) => "already-done",
            Triggered::AlreadyOpen(_) => "already-open",
            Triggered::Rerun(_) => "rerun-requested",
        }
    }
}

/// Asks for a run of `period` now (CLI and HTTP), deduplicated with the schedule: a done
/// period is never run again, an open run is left alone, and a failed, missed or skipped
/// period gets a new attempt. The caller validates the period against the schedule when it
/// knows it.
pub async fn trigger(store: &Store, keys: &JobKeys, period: &str) -> anyhow::Result<Triggered> {
    let existing = read_from(store, keys, period).await?;
    let request = Request::on_seeing(existing.as_ref());
    Ok(match existing {
        Some(r) if r.status == RunStatus::Done => Triggered::AlreadyDone(Box::new(r)),
        Some(r) if !r.status.is_final() => {
            // Also a request: the leader finds the run even if it is not in the open index.
            put(store, keys, period, &request, false).await?;
            Triggered::AlreadyOpen(Box::new(r))
        }
        Some(r) => {
            // Always a fresh id: a leader that is clearing the request it served for an
            // earlier record cannot clear this one.
            put(store, keys, period, &request, true).await?;
            Triggered::Rerun(Box::new(r))
        }
        None if put(store, keys, period, &request, false).await? => Triggered::Requested,
        None => Triggered::AlreadyRequested,
    })
}

/// What a cancel did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cancel {
    /// The leader was asked to cancel this open run.
    Requested(Box<RunRecord>),
    /// The period's run was cancelled already.
    AlreadyCancelled(Box<RunRecord>),
    /// The period's record is final: there is no run to cancel.
    NotOpen(Box<RunRecord>),
    /// The period has no run record.
    NoRun,
}

impl Cancel {
    /// One line for people.
    pub fn describe(&self, job: &str, period: &str) -> String {
        match self {
            Cancel::Requested(r) => format!(
                "asked the leader to cancel {job} period {period} ({}, step {}, attempt {}): it stops the run within a heartbeat and records it cancelled",
                r.status.as_str(),
                r.step,
                r.attempt
            ),
            Cancel::AlreadyCancelled(_) => format!("{job} period {period} is already cancelled"),
            Cancel::NotOpen(r) => format!(
                "{job} period {period} is {}: there is no open run to cancel",
                r.status.as_str()
            ),
            Cancel::NoRun => format!("{job} has no run of period {period} to cancel"),
        }
    }

    /// A short status word for the HTTP API.
    pub fn word(&self) -> &'static str {
        match self {
            Cancel::Requested(_) => "cancel-requested",
            Cancel::AlreadyCancelled(_) => "already-cancelled",
            Cancel::NotOpen(_) => "not-open",
            Cancel::NoRun => "no-run",
        }
    }
}

/// Asks the leader to cancel `period`'s open run (CLI and HTTP). The request replaces any
/// trigger of the period not yet taken up; a later trigger does not replace it.
pub async fn cancel(store: &Store, keys: &JobKeys, period: &str) -> anyhow::Result<Cancel> {
    Ok(match read_from(store, keys, period).await? {
        None => Cancel::NoRun,
        Some(r) if r.status == RunStatus::Cancelled => Cancel::AlreadyCancelled(Box::new(r)),
        Some(r) if r.status.is_final() => Cancel::NotOpen(Box::new(r)),
        Some(r) => {
            let request = Request {
                id: uuid::Uuid::new_v4().simple().to_string(),
                seen: Seen::Cancel,
            };
            put(store, keys, period, &request, true).await?;
            Cancel::Requested(Box::new(r))
        }
    })
}

/// What [`check_published_schedule`] could say about a period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScheduleCheck {
    /// The period is one of the schedule's.
    Period,
    /// No leader has published the job's schedule yet: the period could not be checked.
    Unknown,
    /// Not a period of the schedule, but it has a run record: a period of an earlier schedule,
    /// which is carried on (open) or run again (failed) under the period it fired for.
    EarlierSchedule,
}

/// The schedule the job's leader published (`lh:{job}:schedule`), if one did (and it reads).
pub async fn published_schedule(
    store: &Store,
    keys: &JobKeys,
) -> anyhow::Result<Option<crate::exec::spec::Schedule>> {
    let raw = store.read_key(keys.job(), JobKeys::SCHEDULE_REST).await?;
    let Some(published) = raw
        .as_deref()
        .and_then(|r| serde_json::from_slice::<serde_json::Value>(r).ok())
    else {
        return Ok(None);
    };
    let (Some(expr), Some(tz)) = (
        published["schedule"].as_str(),
        published["time_zone"].as_str(),
    ) else {
        return Ok(None);
    };
    Ok(crate::exec::spec::Schedule::parse(expr, tz).ok())
}

/// Checks `period` against the schedule the job's leader published (`lh:{job}:schedule`):
/// an error names the schedule when the period is not one of it and has no run record (a
/// period with a record is one of an earlier schedule: [`ScheduleCheck::EarlierSchedule`]).
pub async fn check_published_schedule(
    store: &Store,
    keys: &JobKeys,
    period: &str,
) -> anyhow::Result<ScheduleCheck> {
    let Some(schedule) = published_schedule(store, keys).await? else {
        return Ok(ScheduleCheck::Unknown);
    };
    let (expr, tz) = (schedule.expr(), schedule.tz());
    if let Some(p) = schedule.period_by_id(period) {
        anyhow::ensure!(
            p.fire.with_timezone(&chrono::Utc) <= chrono::Utc::now(),
            "{period} of {} fires at {}, in the future: a period runs at or after its fire time",
            keys.job(),
            p.fire.to_rfc3339()
        );
        return Ok(ScheduleCheck::Period);
    }
    let recorded = store
        .read_key(keys.job(), &JobKeys::run_rest(period))
        .await?
        .is_some();
    if recorded {
        return Ok(ScheduleCheck::EarlierSchedule);
    }
    anyhow::bail!(
        "{period} is not a period of {}: its schedule is {expr:?} in {tz} (as its leader runs it), whose periods are {}",
        keys.job(),
        if schedule.is_daily() {
            "local dates (YYYY-MM-DD) of its fire days"
        } else {
            "local fire times (YYYY-MM-DDTHH:MM:SS)"
        }
    );
}

/// Checks the shape of a period id (`YYYY-MM-DD` or `YYYY-MM-DDTHH:MM:SS`).
pub fn validate_period_shape(period: &str) -> anyhow::Result<()> {
    let ok = chrono::NaiveDate::parse_from_str(period, "%Y-%m-%d").is_ok()
        || chrono::NaiveDateTime::parse_from_str(period, "%Y-%m-%dT%H:%M:%S").is_ok();
    anyhow::ensure!(
        ok,
        "period {period:?} is not a period id (YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS)"
    );
    Ok(())
}

/// Asks for a run of `period`, which has no record. Returns false if it was already requested
/// and not yet taken up.
pub async fn request(store: &Store, keys: &JobKeys, period: &str) -> anyhow::Result<bool> {
    put(store, keys, period, &Request::on_seeing(None), false).await
}

/// Writes `request` for `period`, with the notice that wakes the leader's runner (without it,
/// the runner finds the request at its next poll): replacing any request there (`replace`), or
/// only if there is none. Returns whether it was written.
async fn put(
    store: &Store,
    keys: &JobKeys,
    period: &str,
    request: &Request,
    replace: bool,
) -> anyhow::Result<bool> {
    store
        .request(keys.job(), period, &request.encode(), replace)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_tolerate_hand_written_values() {
        for seen in [
            Seen::Nothing,
            Seen::Open,
            Seen::Cancel,
            Seen::Final {
                status: RunStatus::Failed,
                attempt: 3,
            },
        ] {
            let r = Request {
                id: "abc".into(),
                seen,
            };
            assert_eq!(Request::decode(&r.encode()), r);
        }
        assert_eq!(
            Request::decode("by-hand"),
            Request {
                id: "by-hand".into(),
                seen: Seen::Nothing
            }
        );
    }
}
