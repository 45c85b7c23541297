//! A job's spec (from its `describe()` export), validated, and its schedule turned into periods.
//!
//! A **period** is one fire time of the job's cron schedule, read in the job's time zone. Its id
//! is the local date (`2026-11-27`) when the schedule fires at most once per local day, and the
//! local date-time (`2026-11-27T14:00:00`) otherwise. Exactly one run completes per period.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeZone, Utc};
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// Validates the raw fields a guest described and applies the host's limits.
    pub fn new(
        name: &str,
        schedule: &str,
        time_zone: &str,
        asked: Limits,
        host: &HostLimits,
    ) -> Result<Self, SpecError> {
        validate_job_name(name)?;
        let schedule = Schedule::parse(schedule, time_zone)?;
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
            name: name.to_string(),
            schedule,
            limits,
        })
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
        write!(
            f,
            "write size: {}",
            crate::config::show_size(self.limits.write_bytes)
        )
    }
}

/// A cron schedule in a time zone.
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
    /// The fire time that starts the period.
    pub fire: DateTime<Tz>,
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
        let start = tz.from_utc_datetime(&NaiveDate::from_ymd_opt(2000, 1, 1).unwrap().into());
        let fires: Vec<_> = cron.after(&start).take(64).collect();
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

    fn period(&self, fire: DateTime<Tz>) -> Period {
        let id = if self.daily {
            fire.format("%Y-%m-%d").to_string()
        } else {
            fire.format("%Y-%m-%dT%H:%M:%S").to_string()
        };
        Period { id, fire }
    }

    /// The latest period that has started at or before `now`.
    pub fn current(&self, now: DateTime<Utc>) -> Option<Period> {
        let after = (now + chrono::Duration::seconds(1)).with_timezone(&self.tz);
        self.cron.after(&after).next_back().map(|f| self.period(f))
    }

    /// The first period that starts after `now`.
    pub fn next(&self, now: DateTime<Utc>) -> Option<Period> {
        // `cron` compares whole seconds: skip a fire time equal to `now` truncated.
        self.cron
            .after(&now.with_timezone(&self.tz))
            .find(|f| *f > now)
            .map(|f| self.period(f))
    }

    /// The period with id `id`, if the schedule has one.
    pub fn period_by_id(&self, id: &str) -> Option<Period> {
        if self.daily {
            let date = NaiveDate::parse_from_str(id, "%Y-%m-%d").ok()?;
            // Start just before the local day begins (UTC offsets never exceed ±26h).
            let from =
                Utc.from_utc_datetime(&date.and_hms_opt(0, 0, 0)?) - chrono::Duration::days(2);
            let fire = self
                .cron
                .after(&from.with_timezone(&self.tz))
                .find(|f| f.date_naive() >= date)?;
            (fire.date_naive() == date).then(|| self.period(fire))
        } else {
            let local = NaiveDateTime::parse_from_str(id, "%Y-%m-%dT%H:%M:%S").ok()?;
            let from = Utc.from_utc_datetime(&local) - chrono::Duration::days(2);
            let fire = self
                .cron
                .after(&from.with_timezone(&self.tz))
                .find(|f| f.naive_local() >= local)?;
            (fire.naive_local() == local).then(|| self.period(fire))
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
        let e = JobSpec::new("Recon", "0 0 2 * * *", "UTC", none, &host).unwrap_err();
        assert!(e.to_string().contains("name must be"), "{e}");
        let e = JobSpec::new("recon", "every day", "UTC", none, &host).unwrap_err();
        assert!(e.to_string().contains("schedule \"every day\""), "{e}");
        let e = JobSpec::new("recon", "0 0 2 * * *", "Mars/Olympus", none, &host).unwrap_err();
        assert!(e.to_string().contains("time-zone \"Mars/Olympus\""), "{e}");
    }

    #[test]
    fn limits_take_defaults_and_caps() {
        let host = HostLimits::default();
        let asked = Limits {
            memory: 8 << 30,
            step_time: Duration::ZERO,
            write_bytes: 1000,
        };
        let spec = JobSpec::new("recon", "0 0 2 * * *", "UTC", asked, &host).unwrap();
        assert_eq!(spec.limits.memory, host.memory.1);
        assert_eq!(spec.limits.step_time, host.step_time.0);
        assert_eq!(spec.limits.write_bytes, 1000);
    }
}
