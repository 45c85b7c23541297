//! Redis connections: one place that sets timeouts and hides passwords in messages.
//!
//! URLs: `redis://[user:password@]host:port[/db]`, `rediss://…` for TLS, and
//! `unix:///path/to/redis.sock` for a Unix socket (what `./dev sample` uses). TLS verifies the
//! server against the system's CA store; `SSL_CERT_FILE` (a PEM bundle) or `SSL_CERT_DIR`
//! point at other CAs, e.g. a private one.

use std::time::Duration;

use anyhow::Context as _;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Selects the TLS crypto provider (ring) for `rediss://` connections. Call once, before the
/// first connection; later calls do nothing.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The URL with any password replaced by `***`, for logs and errors.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
            } else {
                url.to_string()
            }
        }
        _ => url.to_string(),
    }
}

/// Opens a reconnecting connection: connecting fails after `timeout`, and each command after
/// `response_timeout` when one is given. Callers still bound calls where correctness needs it:
/// lease calls by the Redis timeout (I3), a term's writes by the term itself.
pub async fn connect(
    url: &str,
    timeout: Duration,
    response_timeout: Option<Duration>,
) -> anyhow::Result<ConnectionManager> {
    let client =
        redis::Client::open(url).with_context(|| format!("invalid redis url {}", redact(url)))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(response_timeout)
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    let conn = tokio::time::timeout(
        timeout * 4,
        ConnectionManager::new_with_config(client, config),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "cannot reach redis at {}: no answer within {}",
            redact(url),
            crate::config::show(timeout * 4)
        )
    })?
    .with_context(|| format!("cannot reach redis at {}", redact(url)))?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("rediss://app:s3cret@redis:6380/0"),
            "rediss://app:***@redis:6380/0"
        );
        assert_eq!(redact("redis://:pw@h"), "redis://:***@h");
    }
}
