//! What the host depends on in Redis, checked when it starts instead of assumed.
//!
//! * **Version**: Redis 6.0 or newer (ACL users, the script commands the lease and fence use).
//! * **Eviction**: `maxmemory-policy` must be `noeviction`. Under any other policy Redis may
//!   evict a lease, a fence, the cursor, a `done` run record or a guest's idempotency key when
//!   memory runs short, and a period could then run twice or an effect be recorded twice. The
//!   host refuses to start against such a Redis unless the operator says otherwise
//!   (`--allow-evicting-redis`), and then warns.
//!
//! Both are read from `INFO` (allowed where `CONFIG` often is not, e.g. on managed Redis), on
//! every primary of a Redis Cluster: one primary that may evict is enough to lose a lease. An
//! `INFO` that cannot be read is an error too: the host does not guess.

use crate::store::Conn;

/// The oldest Redis the host runs against.
const MIN_VERSION: (u32, u32) = (6, 0);

/// What the host learned about its Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Deployment {
    /// `redis_version`.
    pub version: String,
    /// `maxmemory_policy`.
    pub maxmemory_policy: String,
}

/// Redis is not set up the way the host needs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DeploymentError {
    /// The eviction policy lets Redis drop keys.
    #[error(
        "redis maxmemory-policy is {policy}: Redis may evict leases, fences, cursors and run records when memory runs short, and a period could then run twice; set `maxmemory-policy noeviction` (in redis.conf, or CONFIG SET maxmemory-policy noeviction), or start with --allow-evicting-redis to run anyway"
    )]
    Evicting {
        /// The policy in force.
        policy: String,
    },
    /// Redis is older than [`MIN_VERSION`].
    #[error("redis {version} is too old: leasehold needs Redis 6.0 or newer")]
    TooOld {
        /// `redis_version`.
        version: String,
    },
    /// `INFO` did not say what the host needs to know.
    #[error("cannot tell how redis is set up: {0}")]
    Unknown(String),
}

/// Reads `INFO` on every primary and checks each (see the module doc). With `allow_evicting`,
/// an evicting policy is returned as the deployment (the caller warns) instead of an error.
/// On a cluster, an error names the primary.
pub(crate) async fn check(
    conn: &mut Conn,
    allow_evicting: bool,
) -> Result<Deployment, DeploymentError> {
    let infos = conn
        .on_every_primary(&redis::cmd("INFO"))
        .await
        .map_err(|e| DeploymentError::Unknown(format!("INFO failed: {e}")))?;
    let mut found = None;
    for (node, info) in infos {
        let info: String = redis::from_redis_value(info)
            .map_err(|e| DeploymentError::Unknown(format!("INFO of {node} did not read: {e}")))?;
        let d = judge(&info, allow_evicting).map_err(|e| match e {
            _ if node.is_empty() => e,
            DeploymentError::Evicting { policy } => DeploymentError::Evicting {
                policy: format!("{policy} on primary {node}"),
            },
            DeploymentError::TooOld { version } => DeploymentError::TooOld {
                version: format!("{version} on primary {node}"),
            },
            DeploymentError::Unknown(why) => {
                DeploymentError::Unknown(format!("{why} (primary {node})"))
            }
        })?;
        // The weakest answer counts: an evicting policy anywhere is the deployment's.
        if found
            .as_ref()
            .is_none_or(|f: &Deployment| f.maxmemory_policy == "noeviction")
        {
            found = Some(d);
        }
    }
    found.ok_or_else(|| DeploymentError::Unknown("no primary answered INFO".into()))
}

/// The rules, on `INFO`'s text.
fn judge(info: &str, allow_evicting: bool) -> Result<Deployment, DeploymentError> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    };
    let version = field("redis_version")
        .ok_or_else(|| DeploymentError::Unknown("INFO has no redis_version".into()))?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < MIN_VERSION {
        return Err(DeploymentError::TooOld { version });
    }
    let policy = field("maxmemory_policy")
        .ok_or_else(|| DeploymentError::Unknown("INFO has no maxmemory_policy".into()))?;
    if policy != "noeviction" && !allow_evicting {
        return Err(DeploymentError::Evicting { policy });
    }
    Ok(Deployment {
        version,
        maxmemory_policy: policy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(version: &str, policy: &str) -> String {
        format!(
            "# Server\r\nredis_version:{version}\r\nredis_mode:standalone\r\n\r\n# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:{policy}\r\n"
        )
    }

    #[test]
    fn noeviction_on_a_recent_redis_passes() {
        let d = judge(&info("7.0.15", "noeviction"), false).unwrap();
        assert_eq!(d.version, "7.0.15");
        assert_eq!(d.maxmemory_policy, "noeviction");
    }

    #[test]
    fn an_evicting_policy_is_refused_unless_allowed() {
        let e = judge(&info("7.2.4", "allkeys-lru"), false).unwrap_err();
        assert_eq!(
            e,
            DeploymentError::Evicting {
                policy: "allkeys-lru".into()
            }
        );
        assert!(e.to_string().contains("--allow-evicting-redis"), "{e}");
        let d = judge(&info("7.2.4", "volatile-ttl"), true).unwrap();
        assert_eq!(d.maxmemory_policy, "volatile-ttl");
    }

    #[test]
    fn an_old_or_silent_redis_is_refused() {
        assert!(matches!(
            judge(&info("5.0.7", "noeviction"), false),
            Err(DeploymentError::TooOld { .. })
        ));
        assert!(matches!(
            judge("# Server\r\nredis_version:7.0.0\r\n", false),
            Err(DeploymentError::Unknown(_))
        ));
    }
}
