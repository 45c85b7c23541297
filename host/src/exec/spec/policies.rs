//! Run policies: catch-up ([`CatchUp`]), overlap ([`Overlap`]), retry and run time, validated
//! together as [`Policies`].

use std::time::Duration;

use super::{RawSpec, SpecError, SpecField};

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

    /// The policies `raw` asks for, zeros replaced by the defaults, checked against the rules.
    pub(super) fn from_raw(raw: &RawSpec) -> Result<Self, SpecError> {
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
        let show = crate::units::show;
        if p.retry_attempts > 100 {
            return Err(SpecError::field(
                SpecField::RetryAttempts,
                format!(
                    "retry-attempts must be at most 100 (retry-attempts {})",
                    p.retry_attempts
                ),
            ));
        }
        if p.retry_backoff < Duration::from_millis(10) {
            return Err(SpecError::field(
                SpecField::RetryBackoff,
                format!(
                    "retry-backoff must be at least 10ms (retry-backoff {})",
                    show(p.retry_backoff)
                ),
            ));
        }
        if p.retry_max_backoff < p.retry_backoff {
            return Err(SpecError::field(
                SpecField::RetryMaxBackoff,
                format!(
                    "retry-max-backoff must not be less than retry-backoff (retry-max-backoff {}, retry-backoff {})",
                    show(p.retry_max_backoff),
                    show(p.retry_backoff)
                ),
            ));
        }
        if p.catch_up_window > Duration::from_secs(400 * 86_400) {
            return Err(SpecError::field(
                SpecField::CatchUpWindow,
                format!(
                    "catch-up-window must be at most 400 days (catch-up-window {})",
                    show(p.catch_up_window)
                ),
            ));
        }
        if p.max_run_time.is_some_and(|m| m < Duration::from_secs(1)) {
            return Err(SpecError::field(
                SpecField::MaxRunTime,
                format!(
                    "max-run-time must be at least 1s or 0 for none (max-run-time {})",
                    show(raw.max_run_time)
                ),
            ));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_policy_names_its_field() {
        let raw = RawSpec {
            retry_attempts: 1000,
            ..RawSpec::default()
        };
        let e = Policies::from_raw(&raw).unwrap_err();
        assert!(
            matches!(
                e,
                SpecError::Field {
                    field: SpecField::RetryAttempts,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "invalid job spec: retry-attempts must be at most 100 (retry-attempts 1000)"
        );
    }
}
