//! Host configuration, validated once at start-up (invariant I4).
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
//! | `heartbeat × 3 < lease-ttl` | at least two renewals can fail before the lease expires |
//! | `redis-timeout < heartbeat` | a renewal finishes (or gives up) before the next one is due |
//! | `0 < margin < lease-ttl / 2` | the local deadline `t_sent + ttl − margin` stays well inside the lease |
//! | `heartbeat + redis-timeout < lease-ttl − margin` | a renewal that times out still leaves time for another before the local deadline |

use std::fmt;
use std::time::Duration;

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

/// One or more violated configuration rules. `Display` lists every violation on its own line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Each violated rule, with the values that violate it.
    pub violations: Vec<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration:")?;
        for v in &self.violations {
            write!(f, "\n  - {v}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Formats a duration the way the CLI accepts it (`500ms`, `3s`, `1m 30s`).
pub fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
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
        let mut v = Vec::new();
        if ttl < Duration::from_millis(100) {
            v.push(format!(
                "lease-ttl must be at least 100ms (lease-ttl {})",
                show(ttl)
            ));
        }
        if hb.is_zero() {
            v.push("heartbeat must be greater than zero (heartbeat 0s)".to_string());
        }
        if hb * 3 >= ttl {
            v.push(format!(
                "heartbeat × 3 must be less than lease-ttl (heartbeat {} × 3 = {}, lease-ttl {})",
                show(hb),
                show(hb * 3),
                show(ttl)
            ));
        }
        if rt.is_zero() || rt >= hb {
            v.push(format!(
                "redis-timeout must be greater than zero and less than heartbeat (redis-timeout {}, heartbeat {})",
                show(rt),
                show(hb)
            ));
        }
        if margin.is_zero() || margin * 2 >= ttl {
            v.push(format!(
                "lease-margin must be greater than zero and less than lease-ttl / 2 (lease-margin {}, lease-ttl {})",
                show(margin),
                show(ttl)
            ));
        }
        if hb + rt >= ttl.saturating_sub(margin) {
            v.push(format!(
                "heartbeat + redis-timeout must be less than lease-ttl − lease-margin (heartbeat {} + redis-timeout {} = {}, lease-ttl {} − lease-margin {} = {})",
                show(hb),
                show(rt),
                show(hb + rt),
                show(ttl),
                show(margin),
                show(ttl.saturating_sub(margin))
            ));
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

/// Checks a node id: 1–64 characters from `A-Z a-z 0-9 . _ -`. The id appears in lease owners
/// (`node-id:uuid`), logs and status.
pub fn validate_node_id(id: &str) -> Result<(), ConfigError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError {
            violations: vec![format!(
                "node-id must be 1 to 64 characters from A-Z a-z 0-9 . _ - (node-id {id:?})"
            )],
        })
    }
}

/// Parses a size in bytes: a whole number with an optional unit, `B`, `KiB`, `MiB`, `GiB`
/// (powers of 1024) or `kB`, `MB`, `GB` (powers of 1000), e.g. `512MiB`, `64 KiB`, `1000`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(digits);
    let num: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (use e.g. 512MiB, 64KiB, 1000)"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use B, KiB, MiB, GiB, kB, MB or GB)"
            ));
        }
    };
    num.checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Formats a size for people: `512 MiB`, `64 KiB`, `1000 bytes`.
pub fn show_size(n: u64) -> String {
    for (unit, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= scale && n.is_multiple_of(scale) {
            return format!("{} {unit}", n / scale);
        }
    }
    format!("{n} bytes")
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
            e.violations.iter().any(|v| v
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
        assert!(e.violations[0].starts_with("heartbeat + redis-timeout must be less than lease-ttl − lease-margin (heartbeat 300ms + redis-timeout 299ms = 599ms, lease-ttl 1s − lease-margin 450ms = 550ms)"), "{e}");
    }

    #[test]
    fn node_ids_are_checked() {
        assert!(validate_node_id("node-a.1_x").is_ok());
        assert!(validate_node_id("").is_err());
        assert!(validate_node_id("a:b").is_err());
        assert!(validate_node_id(&"x".repeat(65)).is_err());
    }

    #[test]
    fn sizes_parse_with_units_and_name_bad_input() {
        use super::{parse_size, show_size};
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(
            parse_size("3 parsecs")
                .unwrap_err()
                .contains("unknown size unit")
        );
        assert!(
            parse_size("99999999999GiB")
                .unwrap_err()
                .contains("too large")
        );
        assert_eq!(show_size(512 << 20), "512 MiB");
        assert_eq!(show_size(1000), "1000 bytes");
    }
}
