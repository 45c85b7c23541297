//! Sidecar files: a deployment's TOML overrides of a job's spec ([`Sidecar`], with its
//! `[catch-up]` and `[retry]` tables), parsed and applied to the [`RawSpec`] a job described.

use std::time::Duration;

use super::{CatchUp, Overlap, RawSpec, SpecError};

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
    /// `[quota]`: `keys` and `bytes`, the job's storage quota (capped by the host's
    /// `--max-stored-keys` and `--max-stored-bytes`).
    pub quota: Option<SidecarQuota>,
    /// `[sql]`: `databases` (the job's names for the host's databases), `statement-time`,
    /// `max-rows`, `max-result`.
    pub sql: Option<SidecarSql>,
    /// `[http]`: `allow` (the destinations the job may send requests to), `timeout`,
    /// `max-response`.
    pub http: Option<SidecarHttp>,
}

/// `[http]` in a sidecar.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SidecarHttp {
    /// Destinations, `scheme://host[:port]` (`https://pay.example.com`).
    pub allow: Option<Vec<String>>,
    /// Connect, first response byte and between response bytes, each, e.g. `10s` (capped by
    /// the host's `--max-http-timeout`).
    pub timeout: Option<String>,
    /// Most response body bytes, e.g. `1MiB` (capped by `--max-http-response`).
    pub max_response: Option<String>,
}

/// `[sql]` in a sidecar.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SidecarSql {
    /// `[sql.databases]`: the job's name for a database = the host's name for it (`ledger =
    /// "ledger"` grants the host's `ledger` under the same name; `ledger = "books"` maps a
    /// database the job declares to the host's `books`).
    pub databases: Option<std::collections::BTreeMap<String, String>>,
    /// Longest statement, e.g. `2s` (capped by the host's `--max-statement-time`).
    pub statement_time: Option<String>,
    /// Most rows one statement returns.
    pub max_rows: Option<u64>,
    /// Most bytes one statement's rows carry, e.g. `4MiB`.
    pub max_result: Option<String>,
}

/// `[quota]` in a sidecar.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SidecarQuota {
    /// Most keys the job may keep.
    pub keys: Option<u64>,
    /// Most bytes (keys and values) the job may keep, e.g. `64MiB`.
    pub bytes: Option<String>,
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
        toml::from_str(text).map_err(|e| SpecError::Sidecar {
            field: None,
            message: e.to_string().trim().to_string(),
        })
    }

    /// Applies the overrides to what the job described.
    pub fn apply(&self, raw: &mut RawSpec) -> Result<(), SpecError> {
        fn dur(field: &str, v: &str) -> Result<Duration, SpecError> {
            humantime::parse_duration(v).map_err(|e| SpecError::Sidecar {
                field: Some(field.to_string()),
                message: format!("{field} {v:?} is not a duration ({e}; use e.g. 30s, 10m, 7days)"),
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
        if let Some(s) = &self.sql {
            if let Some(d) = &s.databases {
                // Over what the job declares: a name the job uses mapped to another of the
                // host's databases, or one more granted.
                for (job_name, host_name) in d {
                    for n in [job_name, host_name] {
                        crate::exec::sql::check_name(n).map_err(|message| SpecError::Sidecar {
                            field: Some("sql.databases".into()),
                            message,
                        })?;
                    }
                    raw.sql
                        .databases
                        .insert(job_name.clone(), host_name.clone());
                }
            }
            if let Some(t) = &s.statement_time {
                raw.sql.statement_time = dur("sql.statement-time", t)?;
            }
            if let Some(r) = s.max_rows {
                raw.sql.rows = r;
            }
            if let Some(b) = &s.max_result {
                raw.sql.result_bytes =
                    crate::units::parse_size(b).map_err(|e| SpecError::Sidecar {
                        field: Some("sql.max-result".into()),
                        message: format!("sql.max-result {b:?} is not a size ({e}; use e.g. 4MiB)"),
                    })?;
            }
        }
        if let Some(h) = &self.http {
            if let Some(allow) = &h.allow {
                raw.http.allow = allow
                    .iter()
                    .map(|d| crate::exec::http::Destination::parse(d))
                    .collect::<Result<_, _>>()
                    .map_err(|message| SpecError::Sidecar {
                        field: Some("http.allow".into()),
                        message: format!("http.allow: {message}"),
                    })?;
            }
            if let Some(t) = &h.timeout {
                raw.http.timeout = dur("http.timeout", t)?;
            }
            if let Some(b) = &h.max_response {
                raw.http.max_response =
                    crate::units::parse_size(b).map_err(|e| SpecError::Sidecar {
                        field: Some("http.max-response".into()),
                        message: format!(
                            "http.max-response {b:?} is not a size ({e}; use e.g. 1MiB)"
                        ),
                    })?;
            }
        }
        if let Some(q) = &self.quota {
            let positive = |field: &str, n: u64| {
                if n == 0 {
                    Err(SpecError::Sidecar {
                        field: Some(field.to_string()),
                        message: format!(
                            "{field} must be at least 1 (leave it out for the host's default)"
                        ),
                    })
                } else {
                    Ok(n)
                }
            };
            if let Some(k) = q.keys {
                raw.limits.stored_keys = positive("quota.keys", k)?;
            }
            if let Some(b) = &q.bytes {
                let n = crate::units::parse_size(b).map_err(|e| SpecError::Sidecar {
                    field: Some("quota.bytes".into()),
                    message: format!("quota.bytes {b:?} is not a size ({e}; use e.g. 64MiB)"),
                })?;
                raw.limits.stored_bytes = positive("quota.bytes", n)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::spec::{HostLimits, JobSpec};

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

[quota]
keys = 500
bytes = "2MiB"
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
        assert_eq!(
            (spec.limits.stored_keys, spec.limits.stored_bytes),
            (500, 2 << 20)
        );
        let e = Sidecar::parse("[quota]\nbytes = \"lots\"")
            .unwrap()
            .apply(&mut raw)
            .unwrap_err();
        assert!(e.to_string().contains("quota.bytes \"lots\""), "{e}");
        let e = Sidecar::parse("[quota]\nkeys = 0")
            .unwrap()
            .apply(&mut raw)
            .unwrap_err();
        assert!(
            e.to_string().contains("quota.keys must be at least 1"),
            "{e}"
        );

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

    #[test]
    fn a_bad_sidecar_duration_names_its_key() {
        let e = Sidecar::parse("[retry]\nbackoff = \"soon\"")
            .unwrap()
            .apply(&mut RawSpec::default())
            .unwrap_err();
        assert!(
            matches!(&e, SpecError::Sidecar { field: Some(f), .. } if f == "retry.backoff"),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with(
                "invalid job spec: sidecar: retry.backoff \"soon\" is not a duration ("
            ),
            "{e}"
        );
    }
}
