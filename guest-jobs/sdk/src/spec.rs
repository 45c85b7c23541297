//! The [`JobSpec`] builder.

use std::time::Duration;

use crate::{CatchUp, JobSpec, Limits, Overlap, Policies};

/// The schedule of a spec that does not set one: every day at 00:00:00.
pub const DEFAULT_SCHEDULE: &str = "0 0 0 * * *";
/// The time zone of a spec that does not set one.
pub const DEFAULT_TIME_ZONE: &str = "UTC";

/// Starts the spec of the job named `name` (1 to 64 characters from `a-z`, `0-9` and `-`,
/// starting with a letter; the host checks it when it loads the component).
///
/// Unless set, the spec fires every day at midnight ([`DEFAULT_SCHEDULE`]) in
/// [`DEFAULT_TIME_ZONE`], and every limit and policy is the host's default: each number is zero
/// (which the WIT defines as "the default"), catch-up is [`CatchUp::Latest`] and overlap is
/// [`Overlap::Queue`]. That is: the host's memory, step-time, write-size and storage limits; the
/// newest missed period run, with a window of one hour; no retry (and, once retries are set, a
/// backoff of 30 s doubling up to 10 min); no limit on a run's time.
///
/// ```
/// use std::time::Duration;
/// use leasehold_guest::{CatchUp, spec};
///
/// let billing = spec("billing")
///     .schedule("0 0 3 * * *")
///     .time_zone("Europe/London")
///     .catch_up(CatchUp::All, Duration::from_secs(7 * 86_400))
///     .retry(3, Duration::from_secs(60))
///     .build();
/// assert_eq!(billing.policies.retry_attempts, 3);
/// assert_eq!(billing.policies.retry_backoff_millis, 60_000);
/// assert_eq!(billing.limits.max_memory_bytes, 0); // the host's default
/// ```
pub fn spec(name: impl Into<String>) -> SpecBuilder {
    SpecBuilder {
        spec: JobSpec {
            name: name.into(),
            schedule: DEFAULT_SCHEDULE.into(),
            time_zone: DEFAULT_TIME_ZONE.into(),
            limits: Limits {
                max_memory_bytes: 0,
                max_step_millis: 0,
                max_write_bytes: 0,
                max_stored_keys: 0,
                max_stored_bytes: 0,
            },
            policies: Policies {
                catch_up: CatchUp::Latest,
                catch_up_window_millis: 0,
                retry_attempts: 0,
                retry_backoff_millis: 0,
                retry_max_backoff_millis: 0,
                overlap: Overlap::Queue,
                max_run_millis: 0,
            },
        },
    }
}

/// A [`JobSpec`] being built: made by [`spec`], finished by [`SpecBuilder::build`]. Each method
/// sets one field (or two that belong together) and returns the builder. The host caps every
/// limit at its own maximum and may override every field with a sidecar file.
#[derive(Clone, Debug, PartialEq)]
#[must_use = "a spec builder does nothing until `build` is called"]
pub struct SpecBuilder {
    spec: JobSpec,
}

impl SpecBuilder {
    /// The cron expression with seconds: `sec min hour day-of-month month day-of-week`, e.g.
    /// `0 30 2 * * *` for 02:30:00 every day.
    pub fn schedule(mut self, cron: impl Into<String>) -> Self {
        self.spec.schedule = cron.into();
        self
    }

    /// The IANA time zone the schedule is read in, e.g. `Europe/London`.
    pub fn time_zone(mut self, zone: impl Into<String>) -> Self {
        self.spec.time_zone = zone.into();
        self
    }

    /// The largest linear memory the job may grow to, in bytes.
    pub fn max_memory_bytes(mut self, bytes: u64) -> Self {
        self.spec.limits.max_memory_bytes = bytes;
        self
    }

    /// The longest one step may run before the host stops it.
    pub fn max_step_time(mut self, time: Duration) -> Self {
        self.spec.limits.max_step_millis = millis(time);
        self
    }

    /// The largest value one `store.write` (or one step's state) may carry, in bytes.
    pub fn max_write_bytes(mut self, bytes: u64) -> Self {
        self.spec.limits.max_write_bytes = bytes;
        self
    }

    /// The storage quota: the most keys, and the most bytes (keys and values), the job may keep
    /// in its store. Zero leaves either at the host's default.
    pub fn quota(mut self, keys: u64, bytes: u64) -> Self {
        self.spec.limits.max_stored_keys = keys;
        self.spec.limits.max_stored_bytes = bytes;
        self
    }

    /// What to do with periods that fired while no replica ran the job, and the window (zero:
    /// one hour) that [`CatchUp::Skip`] and [`CatchUp::All`] use.
    pub fn catch_up(mut self, policy: CatchUp, window: Duration) -> Self {
        self.spec.policies.catch_up = policy;
        self.spec.policies.catch_up_window_millis = millis(window);
        self
    }

    /// Attempts per period, the first included (0 or 1: no retry), and the delay before the
    /// second attempt (zero: 30 s), doubling for each further attempt.
    pub fn retry(mut self, attempts: u32, backoff: Duration) -> Self {
        self.spec.policies.retry_attempts = attempts;
        self.spec.policies.retry_backoff_millis = millis(backoff);
        self
    }

    /// The longest delay between two attempts (zero: 10 min).
    pub fn retry_max_backoff(mut self, max: Duration) -> Self {
        self.spec.policies.retry_max_backoff_millis = millis(max);
        self
    }

    /// What to do with a period that fires while an earlier run is still open.
    pub fn overlap(mut self, policy: Overlap) -> Self {
        self.spec.policies.overlap = policy;
        self
    }

    /// The longest a run may take from its start, every attempt included (zero: no limit).
    pub fn max_run_time(mut self, time: Duration) -> Self {
        self.spec.policies.max_run_millis = millis(time);
        self
    }

    /// The spec, for `describe()` to return.
    pub fn build(self) -> JobSpec {
        self.spec
    }
}

/// `d` in the WIT's milliseconds: a duration under a millisecond but not zero is one millisecond
/// (zero means "the host's default"), one too long for a `u64` is the largest.
fn millis(d: Duration) -> u64 {
    if d.is_zero() {
        return 0;
    }
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl From<SpecBuilder> for JobSpec {
    fn from(builder: SpecBuilder) -> Self {
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_the_wits_milliseconds_and_never_turn_into_the_default() {
        assert_eq!(millis(Duration::ZERO), 0);
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_secs(90)), 90_000);
        assert_eq!(millis(Duration::MAX), u64::MAX);
        let s = spec("j")
            .max_step_time(Duration::from_secs(2))
            .max_run_time(Duration::from_secs(3600))
            .retry_max_backoff(Duration::from_secs(600))
            .build();
        assert_eq!(s.limits.max_step_millis, 2_000);
        assert_eq!(s.policies.max_run_millis, 3_600_000);
        assert_eq!(s.policies.retry_max_backoff_millis, 600_000);
    }

    #[test]
    fn an_unset_spec_is_the_hosts_default_daily_at_midnight_utc() {
        let s = spec("nightly").build();
        assert_eq!(s.name, "nightly");
        assert_eq!(s.schedule, "0 0 0 * * *");
        assert_eq!(s.time_zone, "UTC");
        assert_eq!(
            s.limits,
            Limits {
                max_memory_bytes: 0,
                max_step_millis: 0,
                max_write_bytes: 0,
                max_stored_keys: 0,
                max_stored_bytes: 0,
            }
        );
        assert_eq!(
            s.policies,
            Policies {
                catch_up: CatchUp::Latest,
                catch_up_window_millis: 0,
                retry_attempts: 0,
                retry_backoff_millis: 0,
                retry_max_backoff_millis: 0,
                overlap: Overlap::Queue,
                max_run_millis: 0,
            }
        );
    }

    #[test]
    fn every_setter_sets_its_field_and_only_it() {
        let s = spec("billing")
            .schedule("0 0 2 * * *")
            .time_zone("Europe/London")
            .max_memory_bytes(1)
            .max_step_time(Duration::from_millis(2))
            .max_write_bytes(3)
            .quota(4, 5)
            .catch_up(CatchUp::All, Duration::from_millis(6))
            .retry(7, Duration::from_millis(8))
            .retry_max_backoff(Duration::from_millis(9))
            .overlap(Overlap::Skip)
            .max_run_time(Duration::from_millis(10))
            .build();
        assert_eq!(s.schedule, "0 0 2 * * *");
        assert_eq!(s.time_zone, "Europe/London");
        assert_eq!(
            s.limits,
            Limits {
                max_memory_bytes: 1,
                max_step_millis: 2,
                max_write_bytes: 3,
                max_stored_keys: 4,
                max_stored_bytes: 5,
            }
        );
        assert_eq!(
            s.policies,
            Policies {
                catch_up: CatchUp::All,
                catch_up_window_millis: 6,
                retry_attempts: 7,
                retry_backoff_millis: 8,
                retry_max_backoff_millis: 9,
                overlap: Overlap::Skip,
                max_run_millis: 10,
            }
        );
    }

    #[test]
    fn a_builder_converts_into_its_spec() {
        let s: JobSpec = spec("x").overlap(Overlap::Skip).into();
        assert_eq!(s, spec("x").overlap(Overlap::Skip).build());
    }
}
