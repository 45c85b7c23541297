//! Lease timings, validated once at start-up (invariant I4).
//!
//! Every timing relation the lease protocol relies on is checked here, and *all* violations are
//! reported together, each naming the values involved and the rule they break. A host never
//! starts with timings that could let it act as leader after its lease may have expired.
//!
//! The relations (with `margin` the local safety margin of I3):
//!
//! | rule | why |
//! | --- | --- |
//! | `lease-ttl ≥ 100ms` | Redis `PX` resolution and scheduling noise make shorter leases meaningless |
//! | `lease-ttl ≤ 1 day` | a longer lease only delays failover, and deadlines stay far from overflow |
//! | `heartbeat × 3 < lease-ttl` | at least two renewals can fail before the lease expires |
//! | `redis-timeout < heartbeat` | a renewal finishes (or gives up) before the next one is due |
//! | `0 < margin < lease-ttl / 2` | the local deadline `t_sent + ttl − margin` stays well inside the lease |
//! | `heartbeat + redis-timeout < lease-ttl − margin` | a renewal that times out still leaves time for another before the local deadline |

use std::time::Duration;

use crate::setting::{ConfigError, Setting, Violation};
use crate::units::show;

/// Timings of the lease protocol. Build with [`Timing::new`], which derives the defaults for
/// `margin` and `redis_timeout` and validates everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease lasts in Redis without renewal.
    pub lease_ttl: Duration,
    /// How often the leader renews its lease.
    pub heartbeat: Duration,
    /// Safety margin: a leader acts only until `t_sent + lease_ttl − margin` (I3).
    pub margin: Duration,
    /// Upper bound on every Redis call made by the host.
    pub redis_timeout: Duration,
}

impl Timing {
    /// Builds and validates the timings. `margin` defaults to a tenth of the TTL and
    /// `redis_timeout` to half the heartbeat.
    pub fn new(
        lease_ttl: Duration,
        heartbeat: Duration,
        margin: Option<Duration>,
        redis_timeout: Option<Duration>,
    ) -> Result<Self, ConfigError> {
        let timing = Timing {
            lease_ttl,
            heartbeat,
            margin: margin.unwrap_or(lease_ttl / 10),
            redis_timeout: redis_timeout.unwrap_or(heartbeat / 2),
        };
        timing.validate()?;
        Ok(timing)
    }

    /// Checks every rule of the module doc; returns all violations at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let Timing {
            lease_ttl: ttl,
            heartbeat: hb,
            margin,
            redis_timeout: rt,
        } = *self;
        let mut v: Vec<Violation> = Vec::new();
        if ttl < Duration::from_millis(100) {
            v.push(Violation::new(
                Setting::LeaseTtl,
                format!("lease-ttl must be at least 100ms (lease-ttl {})", show(ttl)),
            ));
        }
        if ttl > Duration::from_secs(86_400) {
            v.push(Violation::new(
                Setting::LeaseTtl,
                format!("lease-ttl must be at most 1 day (lease-ttl {})", show(ttl)),
            ));
        }
        if hb.is_zero() {
            v.push(Violation::new(
                Setting::Heartbeat,
                "heartbeat must be greater than zero (heartbeat 0s)".to_string(),
            ));
        }
        if hb.saturating_mul(3) >= ttl {
            v.push(Violation::new(Setting::Heartbeat, format!(
                "heartbeat × 3 must be less than lease-ttl (heartbeat {} × 3 = {}, lease-ttl {})",
                show(hb),
                show(hb.saturating_mul(3)),
                show(ttl)
            )));
        }
        if rt.is_zero() || rt >= hb {
            v.push(Violation::new(Setting::RedisTimeout, format!(
                "redis-timeout must be greater than zero and less than heartbeat (redis-timeout {}, heartbeat {})",
                show(rt),
                show(hb)
            )));
        }
        if margin.is_zero() || margin * 2 >= ttl {
            v.push(Violation::new(Setting::LeaseMargin, format!(
                "lease-margin must be greater than zero and less than lease-ttl / 2 (lease-margin {}, lease-ttl {})",
                show(margin),
                show(ttl)
            )));
        }
        if hb.saturating_add(rt) >= ttl.saturating_sub(margin) {
            v.push(Violation::new(Setting::RedisTimeout, format!(
                "heartbeat + redis-timeout must be less than lease-ttl − lease-margin (heartbeat {} + redis-timeout {} = {}, lease-ttl {} − lease-margin {} = {})",
                show(hb),
                show(rt),
                show(hb.saturating_add(rt)),
                show(ttl),
                show(margin),
                show(ttl.saturating_sub(margin))
            )));
        }
        if v.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { violations: v })
        }
    }

    /// How long after sending a successful acquire/renew this node may act as leader (I3).
    pub fn leader_window(&self) -> Duration {
        self.lease_ttl - self.margin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn defaults_derive_margin_and_timeout() {
        let t = Timing::new(ms(10_000), ms(2_000), None, None).unwrap();
        assert_eq!(t.margin, ms(1_000));
        assert_eq!(t.redis_timeout, ms(1_000));
        assert_eq!(t.leader_window(), ms(9_000));
    }

    #[test]
    fn heartbeat_times_three_must_be_below_ttl() {
        let e = Timing::new(ms(10_000), ms(4_000), None, None).unwrap_err();
        assert!(
            e.violations.iter().any(|v| v.message
                == "heartbeat × 3 must be less than lease-ttl (heartbeat 4s × 3 = 12s, lease-ttl 10s)"),
            "{e}"
        );
    }

    #[test]
    fn every_violation_is_reported_with_its_values() {
        let e = Timing::new(ms(50), ms(40), Some(ms(30)), Some(ms(60))).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("lease-ttl must be at least 100ms (lease-ttl 50ms)"),
            "{text}"
        );
        assert!(
            text.contains("heartbeat 40ms × 3 = 120ms, lease-ttl 50ms"),
            "{text}"
        );
        assert!(
            text.contains("(redis-timeout 60ms, heartbeat 40ms)"),
            "{text}"
        );
        assert!(
            text.contains("(lease-margin 30ms, lease-ttl 50ms)"),
            "{text}"
        );
        assert!(
            text.contains("heartbeat 40ms + redis-timeout 60ms = 100ms"),
            "{text}"
        );
        assert_eq!(e.violations.len(), 5);
    }

    #[test]
    fn redis_timeout_must_leave_room_for_a_second_renewal() {
        let e = Timing::new(ms(1_000), ms(300), Some(ms(450)), Some(ms(299))).unwrap_err();
        assert_eq!(e.violations.len(), 1, "{e}");
        assert!(e.violations[0].message.starts_with("heartbeat + redis-timeout must be less than lease-ttl − lease-margin (heartbeat 300ms + redis-timeout 299ms = 599ms, lease-ttl 1s − lease-margin 450ms = 550ms)"), "{e}");
    }

    #[test]
    fn huge_values_are_violations_not_overflows() {
        let huge = Duration::from_secs(u64::MAX / 2);
        let e = Timing::new(ms(10_000), huge, None, None).unwrap_err();
        assert!(
            e.violations.iter().any(|v| v
                .message
                .starts_with("heartbeat × 3 must be less than lease-ttl")),
            "{e}"
        );
    }
}
