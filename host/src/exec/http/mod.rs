//! Outbound HTTP for jobs (`wasi:http/outgoing-handler`), to the destinations a job is granted,
//! with the term's token on every request.
//!
//! **Guarantees.** A request leaves the host only if its destination (scheme, host, port) is
//! granted to the job by its sidecar (`[http] allow`) *and* allowed by the host
//! (`--http-allow`; a job granted more is refused at load, naming the destination), only while
//! the term leads by its local deadline, and only to addresses the host permits: a name is
//! resolved by the host and every address checked, so a granted name that resolves to a
//! loopback, private, link-local or otherwise non-global address is refused unless the host
//! runs with `--http-allow-private` ([`addr`]). Every request carries `Leasehold-Job`,
//! `Leasehold-Period` and `Leasehold-Token` (the term's fencing token), set by the host after
//! the guest is done with the request; a guest cannot set, change or remove them (they are
//! forbidden header names for it, like `Host`). A request still in flight when the term ends
//! is cancelled (its connection closed), and so is the reading of its response. HTTPS always
//! verifies the server against the system's CAs (`SSL_CERT_FILE`/`SSL_CERT_DIR` name others,
//! as for `rediss://`).
//!
//! **Non-guarantees.** A request sent before the term ended may still be applied by its
//! receiver after a successor's: only a receiver that keeps the highest token per job and
//! refuses a lower one (README, "Receiving fenced requests") makes a stale leader harmless. A
//! request whose response is lost may or may not have been applied: send an idempotency key.
//! The host does not follow redirects: a guest's client that does sends a new request, which
//! is checked like the first.
//!
//! Limits: each job gets one timeout (connect, first response byte, and between response
//! bytes, each; default [`DEFAULT_TIMEOUT`]) and a response size cap (default
//! [`DEFAULT_MAX_RESPONSE`]), capped by `--max-http-timeout` and `--max-http-response`.
//!
//! Files: this file (destinations, what a job asks for, the host's caps), [`addr`] (which
//! addresses are forbidden), `send` (the sender every request goes through).

pub mod addr;
mod send;

use std::sync::Arc;
use std::time::Duration;

pub use send::HttpHooks;

/// The header naming the job a request is sent for.
pub const JOB_HEADER: &str = "leasehold-job";
/// The header naming the period of the run (or task) that sends it.
pub const PERIOD_HEADER: &str = "leasehold-period";
/// The header carrying the term's fencing token, in decimal.
pub const TOKEN_HEADER: &str = "leasehold-token";

/// A job that asks for no timeout gets this one (connect, first byte, between bytes).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// A job that asks for no response cap gets this one.
pub const DEFAULT_MAX_RESPONSE: u64 = 1 << 20;

/// `http` or `https`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scheme {
    /// Plain text.
    Http,
    /// TLS, verified.
    Https,
}

/// Where a request may go: a scheme, a host (a name, or an IP address) and a port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Destination {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// The host, lower-case (an IPv6 address without brackets).
    pub host: String,
    /// The port (the scheme's default when the text gives none).
    pub port: u16,
}

impl Destination {
    /// Reads `scheme://host[:port]` (no path, no user, no wildcard).
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "{text:?} is not a destination ({why}; use e.g. https://api.example.com or http://10.0.0.5:8080)"
            )
        };
        let (scheme, rest) = match text.split_once("://") {
            Some(("http", r)) => (Scheme::Http, r),
            Some(("https", r)) => (Scheme::Https, r),
            Some((s, _)) => return Err(bad(&format!("scheme {s:?} is not http or https"))),
            None => return Err(bad("no scheme")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('?') || rest.contains('#') {
            return Err(bad("a destination has no path"));
        }
        if rest.contains('@') {
            return Err(bad("a destination has no user"));
        }
        if rest.contains('*') {
            return Err(bad("wildcards are not supported"));
        }
        Self::from_authority(scheme, rest).map_err(|why| bad(&why))
    }

    /// The destination of `authority` (`host[:port]`, `[v6][:port]`) under `scheme`.
    pub fn from_authority(scheme: Scheme, authority: &str) -> Result<Self, String> {
        let default = match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or("an unclosed [")?;
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err("text after ]".into()),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err("no host".into());
        }
        if !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b':')
        {
            return Err(format!("host {host:?} has characters a host name cannot"));
        }
        let port = match port {
            None => default,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| format!("port {p:?} is not a port"))?,
        };
        Ok(Destination {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

/// What a job's sidecar asks for (`[http]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpAsk {
    /// `allow`: the destinations granted.
    pub allow: Vec<Destination>,
    /// `timeout` (zero: the default).
    pub timeout: Duration,
    /// `max-response` in bytes (zero: the default).
    pub max_response: u64,
}

/// The host's caps (`--http-allow`, `--max-http-timeout`, `--max-http-response`,
/// `--http-allow-private`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpCaps {
    /// The destinations any job may be granted.
    pub allow: Vec<Destination>,
    /// The longest timeout a job may ask for.
    pub timeout: Duration,
    /// The largest response a job may ask for.
    pub max_response: u64,
    /// Whether loopback, private and other non-global addresses may be reached.
    pub private: bool,
}

impl Default for HttpCaps {
    fn default() -> Self {
        HttpCaps {
            allow: Vec::new(),
            timeout: Duration::from_secs(60),
            max_response: 16 << 20,
            private: false,
        }
    }
}

/// A job's effective limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connect, first response byte, between response bytes: each within this.
    pub timeout: Duration,
    /// Most response body bytes.
    pub max_response: u64,
}

/// The host's outbound HTTP: its caps and its TLS settings.
#[derive(Clone)]
pub struct Outbound {
    caps: HttpCaps,
    /// TLS verified against the system's CAs, or why there is none.
    tls: Result<Arc<rustls::ClientConfig>, String>,
    /// A host's (not `leasehold check`'s): a job granted a destination the host does not allow
    /// is refused.
    enforced: bool,
}

impl Default for Outbound {
    fn default() -> Self {
        Outbound {
            caps: HttpCaps::default(),
            tls: Err("no outbound HTTP configured".into()),
            enforced: false,
        }
    }
}

impl Outbound {
    /// A host's outbound HTTP with `caps`; the system's CAs are read now.
    pub fn new(caps: HttpCaps) -> Self {
        let tls = crate::exec::sql::system_roots().and_then(|roots| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
                .map_err(|e| format!("TLS settings: {e}"))
        });
        Outbound {
            caps,
            tls,
            enforced: true,
        }
    }

    /// The host's caps.
    pub fn caps(&self) -> &HttpCaps {
        &self.caps
    }

    /// The destinations `ask` is granted that this host does not allow.
    pub fn missing(&self, ask: &HttpAsk) -> Vec<Destination> {
        if !self.enforced {
            return Vec::new();
        }
        ask.allow
            .iter()
            .filter(|d| !self.caps.allow.contains(d))
            .cloned()
            .collect()
    }

    /// A job's grants and limits, as its sidecar asks, capped.
    pub fn for_job(&self, ask: &HttpAsk) -> JobHttp {
        let timeout = if ask.timeout.is_zero() {
            DEFAULT_TIMEOUT
        } else {
            ask.timeout
        }
        .min(self.caps.timeout);
        let max_response = if ask.max_response == 0 {
            DEFAULT_MAX_RESPONSE
        } else {
            ask.max_response
        }
        .min(self.caps.max_response);
        JobHttp {
            allow: ask
                .allow
                .iter()
                .filter(|d| !self.enforced || self.caps.allow.contains(d))
                .cloned()
                .collect(),
            limits: HttpLimits {
                timeout,
                max_response,
            },
            private: self.caps.private,
            tls: self.tls.clone(),
        }
    }
}

/// What one job may reach, and how.
#[derive(Clone)]
pub struct JobHttp {
    /// The destinations granted (and allowed by the host).
    pub allow: Vec<Destination>,
    /// Its limits.
    pub limits: HttpLimits,
    /// Whether non-global addresses may be reached.
    pub private: bool,
    tls: Result<Arc<rustls::ClientConfig>, String>,
}

impl JobHttp {
    /// A job granted nothing (`describe()`, and jobs without `[http]`).
    pub fn none() -> Self {
        JobHttp {
            allow: Vec::new(),
            limits: HttpLimits {
                timeout: DEFAULT_TIMEOUT,
                max_response: DEFAULT_MAX_RESPONSE,
            },
            private: false,
            tls: Err("no outbound HTTP".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_read_scheme_host_and_port() {
        let d = Destination::parse("https://Pay.Example.com").unwrap();
        assert_eq!(
            (d.scheme, d.host.as_str(), d.port),
            (Scheme::Https, "pay.example.com", 443)
        );
        assert_eq!(d.to_string(), "https://pay.example.com:443");
        let d = Destination::parse("http://127.0.0.1:8080/").unwrap();
        assert_eq!((d.host.as_str(), d.port), ("127.0.0.1", 8080));
        let d = Destination::parse("http://[::1]:9000").unwrap();
        assert_eq!(d.host, "::1");
        assert_eq!(d.to_string(), "http://[::1]:9000");
        for (bad, why) in [
            ("pay.example.com", "no scheme"),
            ("ftp://x", "is not http or https"),
            ("https://x/charge", "no path"),
            ("https://user@x", "no user"),
            ("https://*.x.com", "wildcards"),
            ("https://x:0", "is not a port"),
            ("https://x:99999", "is not a port"),
            ("https://", "no host"),
            ("https://a b", "characters"),
        ] {
            let err = Destination::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn a_job_gets_what_it_asks_capped_and_only_what_the_host_allows() {
        let a = Destination::parse("https://a.example").unwrap();
        let b = Destination::parse("https://b.example").unwrap();
        let out = Outbound::new(HttpCaps {
            allow: vec![a.clone()],
            timeout: Duration::from_secs(5),
            max_response: 1000,
            private: false,
        });
        let ask = HttpAsk {
            allow: vec![a.clone(), b.clone()],
            timeout: Duration::from_secs(30),
            max_response: 0,
        };
        assert_eq!(out.missing(&ask), vec![b]);
        let job = out.for_job(&ask);
        assert_eq!(job.allow, vec![a]);
        assert_eq!(job.limits.timeout, Duration::from_secs(5));
        assert_eq!(job.limits.max_response, 1000);
        let default = out.for_job(&HttpAsk::default());
        assert!(default.allow.is_empty());
    }
}
