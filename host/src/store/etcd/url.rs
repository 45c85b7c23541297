//! etcd URLs: `etcd://[user:password@]host:port[,host:port…]` names a cluster by its members'
//! client addresses, with the user etcd's authentication knows the host by
//! ([`EtcdTerms::connect_url`]). User and password are percent-decoded (`%40` for `@`, `%3A`
//! for `:`); messages show the password as `***`.
//!
//! **Not yet:** TLS to etcd (`etcds://`) is refused with a message saying so (the client's TLS
//! feature is not built in); a member's port must be given (etcd's usual one is 2379).
//!
//! **What the user needs.** Every key Leasehold writes is under `lh/`, so a role with
//! `readwrite` on the prefix `lh/` is all it needs (leases need no permission of their own);
//! tested against a cluster with authentication on (`tests/integration/etcd.rs`).

use std::time::Duration;

use etcd_client::ConnectOptions;
use percent_encoding::percent_decode_str;

use super::{EtcdResult, EtcdTerms};
use crate::store::redact;

/// What an etcd URL names.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    /// Each member's client address, `http://host:port`.
    pub endpoints: Vec<String>,
    /// The user and password to authenticate as, if any.
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUrl")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish()
    }
}

/// Reads `url`; the error says what is wrong with it (its password never shown).
pub fn parse(url: &str) -> Result<EtcdUrl, String> {
    let shown = redact(url);
    let rest = if let Some(r) = url.strip_prefix("etcd://") {
        r
    } else if url.starts_with("etcds://") {
        return Err(format!(
            "etcd url {shown}: TLS to etcd (etcds://) is not supported yet; use etcd:// on a trusted network"
        ));
    } else {
        return Err(format!(
            "etcd url {shown}: expected etcd://[user:password@]host:port[,host:port…]"
        ));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (userinfo, hosts) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let decode = |part: &str, what: &str| {
        percent_decode_str(part)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| format!("etcd url {shown}: the {what} is not UTF-8 once decoded"))
    };
    let user = match userinfo {
        None => None,
        Some(info) => {
            let Some((name, password)) = info.split_once(':') else {
                return Err(format!(
                    "etcd url {shown}: a user needs a password (user:password@)"
                ));
            };
            let name = decode(name, "user")?;
            if name.is_empty() {
                return Err(format!("etcd url {shown}: the user is empty"));
            }
            Some((name, decode(password, "password")?))
        }
    };
    if hosts.contains('/') {
        return Err(format!(
            "etcd url {shown}: nothing may follow the members (no path)"
        ));
    }
    let mut endpoints = Vec::new();
    for member in hosts.split(',') {
        let (host, port) = member.rsplit_once(':').ok_or_else(|| {
            format!("etcd url {shown}: member {member:?} has no port (etcd's usual is 2379)")
        })?;
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!(
                "etcd url {shown}: member {member:?} is not host:port"
            ));
        }
        endpoints.push(format!("http://{host}:{port}"));
    }
    Ok(EtcdUrl { endpoints, user })
}

impl EtcdTerms {
    /// Connects to the cluster `url` names ([`parse`]), as its user when it names one; every
    /// request is answered within `timeout` or fails, and only by a member with a leader. A
    /// bad URL, or a user etcd does not authenticate, is an error at once.
    pub async fn connect_url(url: &str, timeout: Duration) -> EtcdResult<Self> {
        let named = parse(url).map_err(etcd_client::Error::InvalidArgs)?;
        let mut options = ConnectOptions::new();
        if let Some((user, password)) = named.user {
            options = options.with_user(user, password);
        }
        Self::connect_with(&named.endpoints, timeout, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_a_user_are_read_from_the_url() {
        let u = parse("etcd://leasehold:p%40ss%3Aword@10.0.0.1:2379,10.0.0.2:2379/").unwrap();
        assert_eq!(
            u.endpoints,
            vec!["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(u.user, Some(("leasehold".into(), "p@ss:word".into())));
        assert!(
            !format!("{u:?}").contains("p@ss"),
            "Debug hides the password"
        );
        let plain = parse("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(plain.user, None);
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        for (url, says) in [
            ("redis://127.0.0.1:6379", "expected etcd://"),
            ("etcds://u:secret@h:2379", "TLS to etcd"),
            ("etcd://h", "has no port"),
            ("etcd://h:0", "is not host:port"),
            ("etcd://:2379", "is not host:port"),
            ("etcd://u@h:2379", "needs a password"),
            ("etcd://:secret@h:2379", "the user is empty"),
            ("etcd://u:secret@h:2379/db", "no path"),
            ("etcd://h:2379,", "has no port"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
            assert!(!e.contains("secret"), "{url}: the password shown: {e}");
        }
    }
}
