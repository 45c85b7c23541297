//! A job's spec (from its `describe()` export), validated, and its schedule turned into periods.
//!
//! A **period** is one fire time of the job's cron schedule, read in the job's time zone. Its id
//! is the local date (`2026-11-27`) when the schedule fires at most once per local day, and the
//! local date-time (`2026-11-27T14:00:00`) otherwise. Exactly one run completes per period.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;

/// Host-wide limits: what a job gets when it asks for nothing (zero), the most it may ask, and
/// the limits that apply to every job alike. Set with `leasehold run`'s `--max-*` flags (see
/// README, "Limits"); [`HostLimits::default`] is what the flags default to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostLimits {
    /// Default and maximum linear memory per job (all memories of an instance together), in
    /// bytes.
    pub memory: (u64, u64),
    /// Default and maximum duration of one step.
    pub step_time: (Duration, Duration),
    /// Default and maximum size of one written value (and of a step's checkpoint), in bytes.
    pub write_bytes: (u64, u64),
    /// Largest component file the host reads, in bytes.
    pub component_bytes: u64,
    /// Guest log lines kept per step; later lines are counted and dropped.
    pub log_lines: u32,
}

/// What a job gets when it asks for nothing, if the host's maximum allows it.
const DEFAULT_MEMORY: u64 = 64 << 20;
const DEFAULT_STEP_TIME: Duration = Duration::from_secs(30);
const DEFAULT_WRITE_BYTES: u64 = 1 << 20;

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits::with_maxima(512 << 20, Duration::from_secs(600), 16 << 20, 64 << 20, 200)
    }
}

impl HostLimits {
    /// Limits with the given maxima; a job that asks for nothing gets the usual default, or the
    /// maximum when that is lower.
    pub fn with_maxima(
        memory: u64,
        step_time: Duration,
        write_bytes: u64,
        component_bytes: u64,
        log_lines: u32,
    ) -> Self {
        HostLimits {
            memory: (DEFAULT_MEMORY.min(memory), memory),
            step_time: (DEFAULT_STEP_TIME.min(step_time), step_time),
            write_bytes: (DEFAULT_WRITE_BYTES.min(write_bytes), write_bytes),
            component_bytes,
            log_lines,
        }
    }
}

/// The limits a job runs with after applying the host's defaults and caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Limits {
    /// Largest linear memory, in bytes.
    pub memory: u64,
    /// Longest one step may run.
    pub step_time: Duration,
    /// Largest value one write may carry, in bytes.
    pub write_bytes: u64,
}

/// A validated job spec.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// The job's name (also its key namespace).
    pub name: String,
    /// When periods start.
    pub schedule: Schedule,
    /// Effective limits.
    pub limits: Limits,
    /// Catch-up, retry, overlap and run-time policies.
    pub policies: Policies,
}

/// What to do with periods that fired while no replica ran the job (see `wit/job.wit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CatchUp {
    /// Run the newest, however late; record the others as missed.
    #[default]
    Latest,
    /// Run none that is later than the window; record those as missed.
    Skip,
    /// Run every one within the window, oldest first; record older ones as missed.
    All,
}

/// What to do with a period that fires while an earlier run is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overlap {
    /// Run it after the open run.
    #[default]
    Queue,
    /// Record it as skipped.
    Skip,
}

/// Validated policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policies {
    /// Missed periods.
    pub catch_up: CatchUp,
    /// The catch-up window.
    pub catch_up_window: Duration,
    /// Attempts per period, the first included (at least 1).
    pub retry_attempts: u32,
    /// Delay before the second attempt; doubles per attempt.
    pub retry_backoff: Duration,
    /// Longest delay between attempts.
    pub retry_max_backoff: Duration,
    /// Periods firing during an open run.
    pub overlap: Overlap,
    /// Longest a run may take, all attempts included.
    pub max_run_time: Option<Duration>,
}

impl Default for Policies {
    fn default() -> Self {
        Policies {
            catch_up: CatchUp::Latest,
            catch_up_window: Duration::from_secs(3600),
            retry_attempts: 1,
            retry_backoff: Duration::from_secs(30),
            retry_max_backoff: Duration::from_secs(600),
            overlap: Overlap::Queue,
            max_run_time: None,
        }
    }
}

impl Policies {
    /// The delay before attempt `next` (2 or more).
    pub fn retry_delay(&self, next: u32) -> Duration {
        let doublings = next.saturating_sub(2).min(30);
        self.retry_backoff
            .saturating_mul(1 << doublings)
            .min(self.retry_max_backoff)
    }
}

/// The spec fields a job describes, before validation. Zero numbers mean "the default".
#[derive(Clone, Debug, Default)]
pub struct RawSpec {
    /// Job name.
    pub name: String,
    /// Cron expression with seconds.
    pub schedule: String,
    /// IANA time zone.
    pub time_zone: String,
    /// Limits asked for.
    pub limits: Limits,
    /// Catch-up policy.
    pub catch_up: CatchUp,
    /// Catch-up window.
    pub catch_up_window: Duration,
    /// Attempts per period.
    pub retry_attempts: u32,
    /// First retry delay.
    pub retry_backoff: Duration,
    /// Longest retry delay.
    pub retry_max_backoff: Duration,
    /// Overlap policy.
    pub overlap: Overlap,
    /// Longest run; zero for none.
    pub max_run_time: Duration,
}

/// A deployment's overrides of a job's spec: a TOML file next to the component with the same
/// stem (`billing.toml` beside `billing.wasm`). Every field is optional; durations are strings
/// such as `30s`, `10m`, `7days`. See README, "Job spec".
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Sidecar {
    /// Job name: runs the component as a job of this name (one component can serve several
    /// jobs, each with its own sidecar, lease, fence, data folder and keys).
    pub name: Option<String>,
    /// Cron expression with seconds.
    pub schedule: Option<String>,
    /// IANA time zone.
    pub time_zone: Option<String>,
    /// `[catch-up]`: `policy` and `window`.
    pub catch_up: Option<SidecarCatchUp>,
    /// `[retry]`: `attempts`, `backoff`, `max-backoff`.
    pub retry: Option<SidecarRetry>,
    /// `queue` or `skip`.
    pub overlap: Option<Overlap>,
    /// Longest run, e.g. `2h`; `0s` for no limit.
    pub max_run_time: Option<String>,
}

/// `[catch-up]` in a sidecar.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SidecarCatchUp {
    /// `latest`, `skip` or `all`.
    pub policy: Option<CatchUp>,
    /// The window, e.g. `1h`, `7days`.
    pub window: Option<String>,
}

/// `[retry]` in a sidecar.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SidecarRetry {
    /// Attempts per period, the first included.
    pub attempts: Option<u32>,
    /// Delay before the second attempt.
    pub backoff: Option<String>,
    /// Longest delay.
    pub max_backoff: Option<String>,
}

impl Sidecar {
    /// Parses a sidecar's text; errors name the field (and the line, for TOML syntax).
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        toml::from_str(text).map_err(|e| SpecError(format!("sidecar: {}", e.to_string().trim())))
    }

    /// Applies the overrides to what the job described.
    pub fn apply(&self, raw: &mut RawSpec) -> Result<(), SpecError> {
        fn dur(field: &str, v: &str) -> Result<Duration, SpecError> {
            humantime::parse_duration(v).map_err(|e| {
                SpecError(format!(
                    "sidecar: {field} {v:?} is not a duration ({e}; use e.g. 30s, 10m, 7days)"
                ))
            })
        }
        if let Some(v) = &self.name {
            raw.name = v.clone();
        }
        if let Some(v) = &self.schedule {
            raw.schedule = v.clone();
        }
        if let Some(v) = &self.time_zone {
            raw.time_zone = v.clone();
        }
        if let Some(c) = &self.catch_up {
            if let Some(p) = c.policy {
                raw.catch_up = p;
            }
            if let Some(w) = &c.window {
                raw.catch_up_window = dur("catch-up.window", w)?;
            }
        }
        if let Some(r) = &self.retry {
            if let Some(a) = r.attempts {
                raw.retry_attempts = a;
            }
            if let Some(b) = &r.backoff {
                raw.retry_backoff = dur("retry.backoff", b)?;
            }
            if let Some(m) = &r.max_backoff {
                raw.retry_max_backoff = dur("retry.max-backoff", m)?;
            }
        }
        if let Some(o) = self.overlap {
            raw.overlap = o;
        }
        if let Some(m) = &self.max_run_time {
            raw.max_run_time = dur("max-run-time", m)?;
        }
        Ok(())
    }
}

/// A job spec that breaks a rule. The message names the field and the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid job spec: {0}")]
pub struct SpecError(pub String);

/// Checks a job name: 1 to 64 characters from `a-z 0-9 -`, starting with a letter.
pub fn validate_job_name(name: &str) -> Result<(), SpecError> {
    let ok = (1..=64).contains(&name.len())
        && name.as_bytes()[0].is_ascii_lowercase()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SpecError(format!(
            "name must be 1 to 64 characters from a-z, 0-9 and '-', starting with a letter (name {name:?})"
        )))
    }
}

impl JobSpec {
    /// Validates the raw fields a guest described (after a sidecar's overrides) and applies
    /// the host's limits.
    pub fn new(raw: &RawSpec, host: &HostLimits) -> Result<Self, SpecError> {
        validate_job_name(&raw.name)?;
        let schedule = Schedule::parse(&raw.schedule, &raw.time_zone)?;
        let asked = raw.limits;
        let policies = Policies::from_raw(raw)?;
        fn pick<T: PartialOrd + Copy + Default>(asked: T, (default, max): (T, T)) -> T {
            if asked == T::default() {
                default
            } else if asked > max {
                max
            } else {
                asked
            }
        }
        let limits = Limits {
            memory: pick(asked.memory, host.memory),
            step_time: pick(asked.step_time, host.step_time),
            write_bytes: pick(asked.write_bytes, host.write_bytes),
        };
        Ok(JobSpec {
            name: raw.name.clone(),
            schedule,
            limits,
            policies,
        })
    }
}

impl Policies {
    fn from_raw(raw: &RawSpec) -> Result<Self, SpecError> {
        let d = Policies::default();
        let or = |v: Duration, default: Duration| if v.is_zero() { default } else { v };
        let p = Policies {
            catch_up: raw.catch_up,
            catch_up_window: or(raw.catch_up_window, d.catch_up_window),
            retry_attempts: raw.retry_attempts.max(1),
            retry_backoff: or(raw.retry_backoff, d.retry_backoff),
            retry_max_backoff: or(raw.retry_max_backoff, d.retry_max_backoff),
            overlap: raw.overlap,
            max_run_time: (!raw.max_run_time.is_zero()).then_some(raw.max_run_time),
        };
        let show = crate::config::show;
        if p.retry_attempts > 100 {
            return Err(SpecError(format!(
                "retry-attempts must be at most 100 (retry-attempts {})",
                p.retry_attempts
            )));
        }
        if p.retry_backoff < Duration::from_millis(10) {
            return Err(SpecError(format!(
                "retry-backoff must be at least 10ms (retry-backoff {})",
                show(p.retry_backoff)
            )));
        }
        if p.retry_max_backoff < p.retry_backoff {
            return Err(SpecError(format!(
                "retry-max-backoff must not be less than retry-backoff (retry-max-backoff {}, retry-backoff {})",
                show(p.retry_max_backoff),
                show(p.retry_backoff)
            )));
        }
        if p.catch_up_window > Duration::from_secs(400 * 86_400) {
            return Err(SpecError(format!(
                "catch-up-window must be at most 400 days (catch-up-window {})",
                show(p.catch_up_window)
            )));
        }
        if p.max_run_time.is_some_and(|m| m < Duration::from_secs(1)) {
            return Err(SpecError(format!(
                "max-run-time must be at least 1s or 0 for none (max-run-time {})",
                show(raw.max_run_time)
            )));
        }
        Ok(p)
    }
}

impl fmt::Display for JobSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "name:       {}", self.name)?;
        writeln!(
            f,
            "schedule:   {} ({})",
            self.schedule.expr, self.schedule.tz
        )?;
        writeln!(
            f,
            "periods:    {}",
            if self.schedule.daily {
                "one per local day (id YYYY-MM-DD)"
            } else {
                "one per fire time (id YYYY-MM-DDTHH:MM:SS)"
            }
        )?;
        writeln!(
            f,
            "memory:     {}",
            crate::config::show_size(self.limits.memory)
        )?;
        writeln!(
            f,
            "step time:  {}",
            crate::config::show(self.limits.step_time)
        )?;
        writeln!(
            f,
            "write size: {}",
            crate::config::show_size(self.limits.write_bytes)
        )?;
        let p = &self.policies;
        let show = crate::config::show;
        writeln!(
            f,
            "catch-up:   {} (window {})",
            match p.catch_up {
                CatchUp::Latest => "latest",
                CatchUp::Skip => "skip",
                CatchUp::All => "all",
            },
            show(p.catch_up_window)
        )?;
        if p.retry_attempts > 1 {
            writeln!(
                f,
                "retry:      {} attempts, backoff {} doubling to at most {}",
                p.retry_attempts,
                show(p.retry_backoff),
                show(p.retry_max_backoff)
            )?;
        } else {
            writeln!(f, "retry:      none (1 attempt)")?;
        }
        writeln!(
            f,
            "overlap:    {}",
            match p.overlap {
                Overlap::Queue => "queue",
                Overlap::Skip => "skip",
            }
        )?;
        write!(
            f,
            "max run:    {}",
            p.max_run_time
                .map(show)
                .unwrap_or_else(|| "no limit".into())
        )
    }
}

/// A cron schedule in a time zone, read on the zone's wall clock.
///
/// Fire times are the wall-clock times the cron expression names, each mapped to one instant:
/// a time that occurs twice (a DST fold) fires once, at its first occurrence; a time that does
/// not occur (a DST gap) fires at the instant it would have had under the offset in force before
/// the gap (02:30 in a gap of 02:00–03:00 fires at 03:30). So a daily job fires exactly once per
/// local day, whatever the transitions.
#[derive(Clone, Debug)]
pub struct Schedule {
    expr: String,
    cron: cron::Schedule,
    tz: Tz,
    /// Fires at most once per local day: period ids are dates.
    daily: bool,
}

/// One period: its id and its fire time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Period {
    /// `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM:SS`, local to the schedule's zone.
    pub id: String,
    /// The instant the period starts.
    pub fire: DateTime<Tz>,
    /// The wall-clock fire time the cron expression names (what the cursor records).
    pub local: NaiveDateTime,
}

/// Wall-clock times stand in for UTC inside the cron iterator: the zone is applied afterwards.
fn as_utc(local: NaiveDateTime) -> DateTime<Utc> {
    Utc.from_utc_datetime(&local)
}

impl Schedule {
    /// Parses a cron expression with seconds (`sec min hour dom month dow [year]`) in an IANA
    /// time zone.
    pub fn parse(expr: &str, time_zone: &str) -> Result<Self, SpecError> {
        let cron = cron::Schedule::from_str(expr)
            .map_err(|e| SpecError(format!("schedule {expr:?} is not a valid cron expression with seconds (sec min hour day-of-month month day-of-week): {e}")))?;
        let tz = Tz::from_str(time_zone).map_err(|_| {
            SpecError(format!(
                "time-zone {time_zone:?} is not an IANA time zone name (e.g. Europe/London, UTC)"
            ))
        })?;
        let start = NaiveDate::from_ymd_opt(2000, 1, 1).unwrap().into();
        let fires: Vec<_> = cron.after(&as_utc(start)).take(64).collect();
        if fires.is_empty() {
            return Err(SpecError(format!("schedule {expr:?} never fires")));
        }
        let daily = fires
            .windows(2)
            .all(|w| w[0].date_naive() != w[1].date_naive());
        Ok(Schedule {
            expr: expr.to_string(),
            cron,
            tz,
            daily,
        })
    }

    /// The cron expression.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The time zone.
    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// Whether periods are local days.
    pub fn is_daily(&self) -> bool {
        self.daily
    }

    /// The instant at which the wall-clock time `local` fires (see [`Schedule`]).
    pub fn instant(&self, local: NaiveDateTime) -> DateTime<Tz> {
        match self.tz.from_local_datetime(&local) {
            LocalResult::Single(t) => t,
            LocalResult::Ambiguous(first, _) => first,
            LocalResult::None => {
                // In a gap: read `local` with the offset in force before the gap.
                let before = (1..=48)
                    .find_map(|h| {
                        self.tz
                            .from_local_datetime(&(local - chrono::Duration::hours(h)))
                            .earliest()
                    })
                    .map(|t| t.offset().fix().local_minus_utc())
                    .unwrap_or(0);
                self.tz
                    .from_utc_datetime(&(local - chrono::Duration::seconds(i64::from(before))))
            }
        }
    }

    fn period(&self, local: NaiveDateTime) -> Period {
        let id = if self.daily {
            local.format("%Y-%m-%d").to_string()
        } else {
            local.format("%Y-%m-%dT%H:%M:%S").to_string()
        };
        Period {
            id,
            fire: self.instant(local),
            local,
        }
    }

    fn local_now(&self, now: DateTime<Utc>) -> NaiveDateTime {
        now.with_timezone(&self.tz).naive_local()
    }

    /// The latest period that has started at or before `now`.
    pub fn current(&self, now: DateTime<Utc>) -> Option<Period> {
        let from = as_utc(self.local_now(now) + chrono::Duration::seconds(1));
        let mut back = self.cron.after(&from);
        (0..10_000)
            .map_while(|_| back.next_back())
            .map(|f| self.period(f.naive_utc()))
            .find(|p| p.fire <= now)
    }

    /// The first period that starts after `now`.
    pub fn next(&self, now: DateTime<Utc>) -> Option<Period> {
        // A fire time in a gap that has just passed starts later than its wall-clock time
        // suggests: look back across the gap when the offset changed in the last hours.
        let earlier = now - chrono::Duration::hours(3);
        let offset = |t: DateTime<Utc>| t.with_timezone(&self.tz).offset().fix();
        let start = if offset(earlier) == offset(now) {
            self.local_now(now)
        } else {
            self.local_now(earlier)
        };
        let from = as_utc(start - chrono::Duration::seconds(1));
        self.cron
            .after(&from)
            .take(100_000)
            .map(|f| self.period(f.naive_utc()))
            .find(|p| p.fire > now)
    }

    /// The periods that started after the wall-clock fire time `cursor` and at or before
    /// `now`, oldest first: the newest `cap` of them, and whether older ones were left out.
    /// Without a cursor, only the current period.
    pub fn since(
        &self,
        cursor: Option<NaiveDateTime>,
        now: DateTime<Utc>,
        cap: usize,
    ) -> (Vec<Period>, bool) {
        let Some(cursor) = cursor else {
            return (self.current(now).into_iter().collect(), false);
        };
        let from = as_utc(self.local_now(now) + chrono::Duration::seconds(1));
        let mut back = self.cron.after(&from);
        let mut out = Vec::new();
        let mut truncated = false;
        while let Some(f) = back.next_back() {
            let local = f.naive_utc();
            if local <= cursor {
                break;
            }
            let p = self.period(local);
            if p.fire > now {
                continue;
            }
            if out.len() == cap {
                truncated = true;
                break;
            }
            out.push(p);
        }
        out.reverse();
        (out, truncated)
    }

    /// The period with id `id`, if the schedule has one.
    pub fn period_by_id(&self, id: &str) -> Option<Period> {
        if self.daily {
            let date = NaiveDate::parse_from_str(id, "%Y-%m-%d").ok()?;
            let fire = self
                .cron
                .after(&as_utc(
                    date.and_hms_opt(0, 0, 0)? - chrono::Duration::seconds(1),
                ))
                .next()?;
            (fire.date_naive() == date).then(|| self.period(fire.naive_utc()))
        } else {
            let local = NaiveDateTime::parse_from_str(id, "%Y-%m-%dT%H:%M:%S").ok()?;
            self.cron
                .includes(as_utc(local))
                .then(|| self.period(local))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_daily_schedule_has_date_periods() {
        let s = Schedule::parse("0 30 2 * * *", "Europe/London").unwrap();
        let p = s.current(utc("2026-11-29T11:57:00Z")).unwrap();
        assert_eq!(p.id, "2026-11-29");
        assert_eq!(p.fire.to_rfc3339(), "2026-11-29T02:30:00+00:00");
        let before = s.current(utc("2026-11-29T02:29:59Z")).unwrap();
        assert_eq!(before.id, "2026-11-28");
        assert_eq!(
            s.next(utc("2026-11-29T11:57:00Z")).unwrap().id,
            "2026-11-30"
        );
    }

    #[test]
    fn the_next_period_starts_after_now() {
        let s = Schedule::parse("* * * * * *", "UTC").unwrap();
        let now = utc("2026-11-29T14:31:49.300Z");
        assert_eq!(s.current(now).unwrap().id, "2026-11-29T14:31:49");
        assert_eq!(s.next(now).unwrap().id, "2026-11-29T14:31:50");
    }

    #[test]
    fn a_fire_time_is_its_own_current_period() {
        let s = Schedule::parse("0 30 2 * * *", "UTC").unwrap();
        assert_eq!(
            s.current(utc("2026-11-29T02:30:00Z")).unwrap().id,
            "2026-11-29"
        );
    }

    #[test]
    fn an_hourly_schedule_has_date_time_periods() {
        let s = Schedule::parse("0 0 * * * *", "America/New_York").unwrap();
        let p = s.current(utc("2026-11-29T15:20:00Z")).unwrap();
        assert_eq!(p.id, "2026-11-29T10:00:00");
    }

    #[test]
    fn periods_are_found_by_id() {
        let s = Schedule::parse("0 30 2 * * *", "Asia/Tokyo").unwrap();
        let p = s.period_by_id("2026-11-27").unwrap();
        assert_eq!(p.fire.to_rfc3339(), "2026-11-27T02:30:00+09:00");
        assert!(s.period_by_id("2026-11-31").is_none());
        assert!(s.period_by_id("yesterday").is_none());
        let h = Schedule::parse("0 0 */6 * * *", "UTC").unwrap();
        assert!(h.period_by_id("2026-11-27T06:00:00").is_some());
        assert!(h.period_by_id("2026-11-27T07:00:00").is_none());
    }

    #[test]
    fn bad_specs_name_the_field() {
        let host = HostLimits::default();
        let none = Limits {
            memory: 0,
            step_time: Duration::ZERO,
            write_bytes: 0,
        };
        let raw = |name: &str, schedule: &str, tz: &str| RawSpec {
            name: name.into(),
            schedule: schedule.into(),
            time_zone: tz.into(),
            limits: none,
            ..RawSpec::default()
        };
        let e = JobSpec::new(&raw("Recon", "0 0 2 * * *", "UTC"), &host).unwrap_err();
        assert!(e.to_string().contains("name must be"), "{e}");
        let e = JobSpec::new(&raw("recon", "every day", "UTC"), &host).unwrap_err();
        assert!(e.to_string().contains("schedule \"every day\""), "{e}");
        let e = JobSpec::new(&raw("recon", "0 0 2 * * *", "Mars/Olympus"), &host).unwrap_err();
        assert!(e.to_string().contains("time-zone \"Mars/Olympus\""), "{e}");
        let mut bad = raw("recon", "0 0 2 * * *", "UTC");
        bad.retry_attempts = 1000;
        let e = JobSpec::new(&bad, &host).unwrap_err();
        assert!(
            e.to_string().contains("retry-attempts must be at most 100"),
            "{e}"
        );
    }

    #[test]
    fn limits_take_defaults_and_caps() {
        let host = HostLimits::default();
        let asked = Limits {
            memory: 8 << 30,
            step_time: Duration::ZERO,
            write_bytes: 1000,
        };
        let raw = RawSpec {
            name: "recon".into(),
            schedule: "0 0 2 * * *".into(),
            time_zone: "UTC".into(),
            limits: asked,
            ..RawSpec::default()
        };
        let spec = JobSpec::new(&raw, &host).unwrap();
        assert_eq!(spec.policies, Policies::default());
        assert_eq!(spec.limits.memory, host.memory.1);
        assert_eq!(spec.limits.step_time, host.step_time.0);
        assert_eq!(spec.limits.write_bytes, 1000);
    }

    /// Every period of `s` from `from` to `to` (RFC 3339), oldest first.
    fn periods(s: &Schedule, from: &str, to: &str) -> Vec<Period> {
        let start = s.current(utc(from)).unwrap();
        s.since(Some(start.local), utc(to), 10_000).0
    }

    #[test]
    fn a_daily_fire_in_a_dst_gap_fires_once_after_the_gap() {
        // Europe/Berlin springs forward on 2026-03-29 from 02:00 to 03:00: 02:30 does not exist.
        let s = Schedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap();
        let got: Vec<(String, String)> =
            periods(&s, "2026-03-27T12:00:00Z", "2026-03-31T12:00:00Z")
                .into_iter()
                .map(|p| (p.id, p.fire.to_rfc3339()))
                .collect();
        assert_eq!(
            got,
            vec![
                ("2026-03-28".into(), "2026-03-28T02:30:00+01:00".into()),
                ("2026-03-29".into(), "2026-03-29T03:30:00+02:00".into()),
                ("2026-03-30".into(), "2026-03-30T02:30:00+02:00".into()),
                ("2026-03-31".into(), "2026-03-31T02:30:00+02:00".into()),
            ]
        );
        // Between 03:00 and 03:30 local on the day of the gap, the day's period has not begun.
        assert_eq!(
            s.current(utc("2026-03-29T01:10:00Z")).unwrap().id,
            "2026-03-28"
        );
        assert_eq!(
            s.next(utc("2026-03-29T01:10:00Z"))
                .unwrap()
                .fire
                .to_rfc3339(),
            "2026-03-29T03:30:00+02:00"
        );
        assert_eq!(
            s.current(utc("2026-03-29T01:30:00Z")).unwrap().id,
            "2026-03-29"
        );
    }

    #[test]
    fn a_daily_fire_in_a_dst_fold_fires_once_at_its_first_occurrence() {
        // Europe/Berlin falls back on 2026-10-25 from 03:00 to 02:00: 02:30 happens twice.
        let s = Schedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap();
        let got: Vec<(String, String)> =
            periods(&s, "2026-10-23T12:00:00Z", "2026-10-27T12:00:00Z")
                .into_iter()
                .map(|p| (p.id, p.fire.to_rfc3339()))
                .collect();
        assert_eq!(
            got,
            vec![
                ("2026-10-24".into(), "2026-10-24T02:30:00+02:00".into()),
                ("2026-10-25".into(), "2026-10-25T02:30:00+02:00".into()),
                ("2026-10-26".into(), "2026-10-26T02:30:00+01:00".into()),
                ("2026-10-27".into(), "2026-10-27T02:30:00+01:00".into()),
            ]
        );
        // At the second 02:30 (01:30 UTC) nothing new has started: the cursor is at today's.
        let first = s.period_by_id("2026-10-25").unwrap();
        let (again, _) = s.since(Some(first.local), utc("2026-10-25T01:45:00Z"), 10);
        assert!(again.is_empty(), "{again:?}");
    }

    #[test]
    fn an_hourly_schedule_runs_the_repeated_hour_once() {
        let s = Schedule::parse("0 30 * * * *", "Europe/Berlin").unwrap();
        let ids: Vec<String> = periods(&s, "2026-10-24T22:00:00Z", "2026-10-25T03:00:00Z")
            .into_iter()
            .map(|p| p.id)
            .collect();
        // Local 01:30 (CEST), 02:30 (CEST; the CET repeat is the same wall time), 03:30 (CET).
        assert_eq!(
            ids,
            vec![
                "2026-10-25T00:30:00",
                "2026-10-25T01:30:00",
                "2026-10-25T02:30:00",
                "2026-10-25T03:30:00"
            ]
        );
    }

    #[test]
    fn periods_since_a_cursor_are_capped_to_the_newest() {
        let s = Schedule::parse("0 0 * * * *", "UTC").unwrap();
        let cursor = s.period_by_id("2026-11-29T00:00:00").unwrap().local;
        let (ps, truncated) = s.since(Some(cursor), utc("2026-11-29T10:30:00Z"), 3);
        assert!(truncated);
        let ids: Vec<&str> = ps.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                "2026-11-29T08:00:00",
                "2026-11-29T09:00:00",
                "2026-11-29T10:00:00"
            ]
        );
        let (all, truncated) = s.since(Some(cursor), utc("2026-11-29T10:30:00Z"), 100);
        assert!(!truncated);
        assert_eq!(all.len(), 10);
    }

    #[test]
    fn a_sidecar_overrides_the_described_spec_and_names_bad_fields() {
        let sidecar = Sidecar::parse(
            r#"
name = "billing-eu"
schedule = "0 0 6 * * *"
time-zone = "Europe/Berlin"
overlap = "skip"
max-run-time = "2h"

[catch-up]
policy = "all"
window = "7days"

[retry]
attempts = 3
backoff = "10s"
max-backoff = "1m"
"#,
        )
        .unwrap();
        let mut raw = RawSpec {
            name: "billing".into(),
            schedule: "0 30 2 * * *".into(),
            time_zone: "UTC".into(),
            ..RawSpec::default()
        };
        sidecar.apply(&mut raw).unwrap();
        let spec = JobSpec::new(&raw, &HostLimits::default()).unwrap();
        assert_eq!(spec.name, "billing-eu");
        assert_eq!(spec.schedule.expr(), "0 0 6 * * *");
        assert_eq!(spec.schedule.tz(), chrono_tz::Europe::Berlin);
        let p = spec.policies;
        assert_eq!((p.catch_up, p.overlap), (CatchUp::All, Overlap::Skip));
        assert_eq!(p.catch_up_window, Duration::from_secs(7 * 86_400));
        assert_eq!(p.retry_attempts, 3);
        assert_eq!(p.retry_delay(2), Duration::from_secs(10));
        assert_eq!(p.retry_delay(3), Duration::from_secs(20));
        assert_eq!(p.retry_delay(9), Duration::from_secs(60));
        assert_eq!(p.max_run_time, Some(Duration::from_secs(7200)));

        let e = Sidecar::parse("schedul = \"x\"").unwrap_err();
        assert!(e.to_string().contains("unknown field `schedul`"), "{e}");
        let e = Sidecar::parse("[retry]\nbackoff = \"soon\"")
            .unwrap()
            .apply(&mut raw)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("retry.backoff \"soon\" is not a duration"),
            "{e}"
        );
        let e = Sidecar::parse("overlap = \"parallel\"").unwrap_err();
        assert!(e.to_string().contains("parallel"), "{e}");
    }
}
