//! A job's spec (from its `describe()` export), validated, and its schedule turned into periods.
//!
//! A **period** is one fire time of the job's cron schedule, read in the job's time zone. Its id
//! is the local date (`2026-11-27`) when the schedule fires at most once per local day, and the
//! local date-time (`2026-11-27T14:00:00`) otherwise. Exactly one run completes per period.
//!
//! This module owns the spec as a whole: the raw fields a job describes ([`RawSpec`]), their
//! validation into a [`JobSpec`], job names ([`validate_job_name`]) and [`SpecError`]. The parts:
//!
//! - `limits`: host-wide defaults and caps ([`HostLimits`]) and a job's effective [`Limits`].
//! - `policies`: catch-up, overlap, retry and run-time [`Policies`], and their rules.
//! - `sidecar`: a deployment's TOML overrides ([`Sidecar`]), parsed and applied.
//! - `schedule`: the cron [`Schedule`] in a time zone and its [`Period`]s, DST included.

use std::fmt;
use std::time::Duration;

mod limits;
mod policies;
mod schedule;
mod sidecar;

pub use limits::{Counts, DEFAULT_COUNT, HostLimits, Limits};
pub use policies::{CatchUp, Overlap, Policies};
pub use schedule::{Period, Schedule};
pub use sidecar::{Sidecar, SidecarCatchUp, SidecarRetry};

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
    /// The databases the job is granted and its statement limits (sidecar `[sql]`).
    pub sql: crate::exec::sql::SqlAsk,
    /// The HTTP destinations the job is granted and its limits (sidecar `[http]`).
    pub http: crate::exec::http::HttpAsk,
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
    /// Databases and statement limits (sidecar `[sql]`).
    pub sql: crate::exec::sql::SqlAsk,
    /// HTTP destinations and limits (sidecar `[http]`).
    pub http: crate::exec::http::HttpAsk,
}

/// The spec field a rule is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecField {
    /// The job name.
    Name,
    /// The cron expression.
    Schedule,
    /// The IANA time zone.
    TimeZone,
    /// Attempts per period.
    RetryAttempts,
    /// The first retry delay.
    RetryBackoff,
    /// The longest retry delay.
    RetryMaxBackoff,
    /// The catch-up window.
    CatchUpWindow,
    /// The longest run.
    MaxRunTime,
}

/// A job spec that breaks a rule. The message names the field and the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A field breaks a rule; `message` names the field and its value.
    #[error("invalid job spec: {message}")]
    Field {
        /// The field the rule is about.
        field: SpecField,
        /// What is wrong, naming the field and its value.
        message: String,
    },
    /// The sidecar file is not valid TOML of the sidecar's shape, or a value in it does not
    /// parse.
    #[error("invalid job spec: sidecar: {message}")]
    Sidecar {
        /// The sidecar key (e.g. `retry.backoff`), when known.
        field: Option<String>,
        /// What is wrong (the TOML error, or the key, its value and why it does not parse).
        message: String,
    },
}

impl SpecError {
    /// A [`SpecError::Field`].
    fn field(field: SpecField, message: String) -> Self {
        SpecError::Field { field, message }
    }
}

/// Checks a job name: 1 to 64 characters from `a-z 0-9 -`, starting with a letter, and not
/// [`RESERVED_NAME`].
pub fn validate_job_name(name: &str) -> Result<(), SpecError> {
    let ok = (1..=64).contains(&name.len())
        && name.as_bytes()[0].is_ascii_lowercase()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if name == RESERVED_NAME {
        return Err(SpecError::field(
            SpecField::Name,
            format!("name {name:?} is reserved: the hosts' membership uses its keys"),
        ));
    }
    if ok {
        Ok(())
    } else {
        Err(SpecError::field(
            SpecField::Name,
            format!(
                "name must be 1 to 64 characters from a-z, 0-9 and '-', starting with a letter (name {name:?})"
            ),
        ))
    }
}

/// The one name no job may take: the membership's keys and notice channel (`lh:{members}:…`,
/// see [`crate::coord::members`]) use it.
pub const RESERVED_NAME: &str = "members";

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
            stored_keys: pick(asked.stored_keys, host.stored_keys),
            stored_bytes: pick(asked.stored_bytes, host.stored_bytes),
        };
        Ok(JobSpec {
            name: raw.name.clone(),
            schedule,
            limits,
            policies,
            sql: raw.sql.clone(),
            http: raw.http.clone(),
        })
    }
}

impl fmt::Display for JobSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "name:       {}", self.name)?;
        writeln!(
            f,
            "schedule:   {} ({})",
            self.schedule.expr(),
            self.schedule.tz()
        )?;
        writeln!(
            f,
            "periods:    {}",
            if self.schedule.is_daily() {
                "one per local day (id YYYY-MM-DD)"
            } else {
                "one per fire time (id YYYY-MM-DDTHH:MM:SS)"
            }
        )?;
        writeln!(
            f,
            "memory:     {}",
            crate::units::show_size(self.limits.memory)
        )?;
        writeln!(
            f,
            "step time:  {}",
            crate::units::show(self.limits.step_time)
        )?;
        writeln!(
            f,
            "write size: {}",
            crate::units::show_size(self.limits.write_bytes)
        )?;
        writeln!(
            f,
            "quota:      {} keys, {}",
            self.limits.stored_keys,
            crate::units::show_size(self.limits.stored_bytes)
        )?;
        let p = &self.policies;
        let show = crate::units::show;
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
        )?;
        if !self.sql.databases.is_empty() {
            let dbs: Vec<String> = self
                .sql
                .databases
                .iter()
                .map(|(job, host)| {
                    if job == host {
                        job.clone()
                    } else {
                        format!("{job} (the host's {host})")
                    }
                })
                .collect();
            write!(f, "\ndatabases:  {}", dbs.join(", "))?;
        }
        if !self.http.allow.is_empty() {
            let dests: Vec<String> = self.http.allow.iter().map(|d| d.to_string()).collect();
            write!(f, "\nhttp:       {}", dests.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_specs_name_the_field() {
        let host = HostLimits::default();
        let none = Limits::default();
        let raw = |name: &str, schedule: &str, tz: &str| RawSpec {
            name: name.into(),
            schedule: schedule.into(),
            time_zone: tz.into(),
            limits: none,
            ..RawSpec::default()
        };
        let field = |e: &SpecError| match e {
            SpecError::Field { field, .. } => Some(*field),
            SpecError::Sidecar { .. } => None,
        };
        let e = JobSpec::new(&raw("Recon", "0 0 2 * * *", "UTC"), &host).unwrap_err();
        assert!(e.to_string().contains("name must be"), "{e}");
        assert_eq!(field(&e), Some(SpecField::Name));
        let e = JobSpec::new(&raw("members", "0 0 2 * * *", "UTC"), &host).unwrap_err();
        assert!(e.to_string().contains("\"members\" is reserved"), "{e}");
        assert_eq!(field(&e), Some(SpecField::Name));
        let e = JobSpec::new(&raw("recon", "every day", "UTC"), &host).unwrap_err();
        assert!(e.to_string().contains("schedule \"every day\""), "{e}");
        assert_eq!(field(&e), Some(SpecField::Schedule));
        let e = JobSpec::new(&raw("recon", "0 0 2 * * *", "Mars/Olympus"), &host).unwrap_err();
        assert!(e.to_string().contains("time-zone \"Mars/Olympus\""), "{e}");
        assert_eq!(field(&e), Some(SpecField::TimeZone));
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
            stored_keys: 10,
            stored_bytes: u64::MAX,
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
        assert_eq!(spec.limits.stored_keys, 10);
        assert_eq!(spec.limits.stored_bytes, host.stored_bytes.1);
    }
}
