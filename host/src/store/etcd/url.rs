//! etcd URLs: `etcd://[user:password@]host:port[,host:port…]` names a cluster by its members'
//! client addresses, with the user etcd's authentication knows the host by
//! ([`EtcdTerms::connect_url`]). User and password are percent-decoded (`%40` for `@`, `%3A`
//! for `:`); messages show the password as `***`.
//!
//! **TLS:** `etcds://…` speaks TLS to every member and verifies each member's certificate and
//! name: against the system's CAs (as rustls-native-certs reads them: `SSL_CERT_FILE` or
//! `SSL_CERT_DIR` point at others, as for `rediss://`), or only against the CA file
//! `?cacert=PATH` names. `cert=PATH&key=PATH` offer a client certificate, for a cluster that
//! requires one (`--client-cert-auth`). The parameters are etcdctl's flags' names, their values
//! percent-decoded. Tested (`tests/integration/etcd.rs`): a cluster requiring client
//! certificates served through `cacert`, `cert` and `key`; refused without the client
//! certificate, without the CA, and over plain `etcd://`. Untested: the system's CAs through
//! `SSL_CERT_FILE` (the tests' process cannot set it for one test alone).
//!
//! A member's port must be given (etcd's usual one is 2379).
//!
//! **What the user needs.** Every key Leasehold writes is under `lh/`, so a role with
//! `readwrite` on the prefix `lh/` is all it needs (leases need no permission of their own);
//! tested against a cluster with authentication on (`tests/integration/etcd.rs`).

use std::time::Duration;

use std::path::PathBuf;

use etcd_client::{Certificate, ConnectOptions, GetOptions, Identity, TlsOptions};
use percent_encoding::percent_decode_str;

use super::{EtcdResult, EtcdTerms, bounded};
use crate::store::redact;

/// What an etcd URL names.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    /// Each member's client address, `http://host:port` (`https://` with TLS).
    pub endpoints: Vec<String>,
    /// The user and password to authenticate as, if any.
    pub user: Option<(String, String)>,
    /// TLS (`etcds://`), if asked for.
    pub tls: Option<EtcdTlsFiles>,
}

/// What an `etcds://` URL says of TLS: the files it names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdTlsFiles {
    /// The only CA to trust (`cacert=`); none: the system's CAs.
    pub ca: Option<PathBuf>,
    /// The client certificate and its key (`cert=`, `key=`), if one is offered.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl std::fmt::Debug for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUrl")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls)
            .finish()
    }
}

/// Reads `url`; the error says what is wrong with it (its password never shown).
pub fn parse(url: &str) -> Result<EtcdUrl, String> {
    let shown = redact(url);
    let (rest, tls) = if let Some(r) = url.strip_prefix("etcd://") {
        (r, false)
    } else if let Some(r) = url.strip_prefix("etcds://") {
        (r, true)
    } else {
        return Err(format!(
            "etcd url {shown}: expected etcd[s]://[user:password@]host:port[,host:port…]"
        ));
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
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
        let scheme = if tls { "https" } else { "http" };
        endpoints.push(format!("{scheme}://{host}:{port}"));
    }
    let tls = match (tls, query) {
        (false, Some(_)) => {
            return Err(format!(
                "etcd url {shown}: cacert, cert and key are TLS options: use etcds://"
            ));
        }
        (false, None) => None,
        (true, query) => Some(tls_files(query.unwrap_or(""), &shown)?),
    };
    Ok(EtcdUrl {
        endpoints,
        user,
        tls,
    })
}

/// The TLS files an `etcds://` URL's query names.
fn tls_files(query: &str, shown: &str) -> Result<EtcdTlsFiles, String> {
    let (mut ca, mut cert, mut key) = (None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| format!("etcd url {shown}: {name} is not UTF-8 once decoded"))?;
        if value.is_empty() {
            return Err(format!("etcd url {shown}: {name} needs a path"));
        }
        let slot = match name {
            "cacert" => &mut ca,
            "cert" => &mut cert,
            "key" => &mut key,
            _ => {
                return Err(format!(
                    "etcd url {shown}: unknown parameter {name:?} (etcds:// takes cacert, cert and key)"
                ));
            }
        };
        if slot.replace(PathBuf::from(value.as_ref())).is_some() {
            return Err(format!("etcd url {shown}: {name} is given twice"));
        }
    }
    let client = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => {
            return Err(format!(
                "etcd url {shown}: a client certificate needs both cert and key"
            ));
        }
    };
    Ok(EtcdTlsFiles { ca, client })
}

impl EtcdTlsFiles {
    /// The client's TLS settings: the files read now (a file that cannot be read is an error
    /// naming it).
    fn options(&self) -> Result<TlsOptions, String> {
        let read = |path: &PathBuf, what: &str| {
            std::fs::read(path)
                .map_err(|e| format!("etcds: cannot read the {what} {}: {e}", path.display()))
        };
        let mut tls = TlsOptions::new();
        tls = match &self.ca {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca, "CA file (cacert)")?)),
            None => tls.with_native_roots(),
        };
        if let Some((cert, key)) = &self.client {
            tls = tls.identity(Identity::from_pem(
                read(cert, "client certificate (cert)")?,
                read(key, "client key (key)")?,
            ));
        }
        Ok(tls)
    }
}

impl EtcdTerms {
    /// Connects to the cluster `url` names ([`parse`]), as its user when it names one, over
    /// TLS for `etcds://`; every request is answered within `timeout` or fails, and only by a
    /// member with a leader. A bad URL, a TLS file that cannot be read, a user etcd does not
    /// authenticate, or (with TLS) a cluster whose certificate is not trusted or that refuses
    /// the client's, is an error at once: the connection is tried with one read under `lh/`.
    pub async fn connect_url(url: &str, timeout: Duration) -> EtcdResult<Self> {
        let named = parse(url).map_err(etcd_client::Error::InvalidArgs)?;
        let mut options = ConnectOptions::new();
        if let Some((user, password)) = named.user {
            options = options.with_user(user, password);
        }
        if let Some(tls) = &named.tls {
            crate::store::install_tls_provider();
            options = options.with_tls(tls.options().map_err(etcd_client::Error::InvalidArgs)?);
        }
        let terms = Self::connect_with(&named.endpoints, timeout, options).await?;
        terms.probe().await?;
        Ok(terms)
    }

    /// One read under `lh/` (a count, no keys): the connection, its TLS and its user tried.
    async fn probe(&self) -> EtcdResult<()> {
        let mut c = self.client.clone();
        let options = GetOptions::new().with_prefix().with_count_only();
        bounded(self.timeout, c.get("lh/", Some(options))).await?;
        Ok(())
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
        assert_eq!(plain.tls, None);
    }

    #[test]
    fn etcds_names_https_members_and_its_tls_files() {
        let u =
            parse("etcds://h1:2379,h2:2379?cacert=/etc/etcd/ca%20file.pem&cert=/c.pem&key=/k.pem")
                .unwrap();
        assert_eq!(u.endpoints, vec!["https://h1:2379", "https://h2:2379"]);
        let tls = u.tls.unwrap();
        assert_eq!(tls.ca, Some(PathBuf::from("/etc/etcd/ca file.pem")));
        assert_eq!(
            tls.client,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        let system = parse("etcds://h1:2379").unwrap().tls.unwrap();
        assert_eq!(
            system,
            EtcdTlsFiles::default(),
            "the system's CAs, no client certificate"
        );
        let missing = EtcdTlsFiles {
            ca: Some(PathBuf::from("/nonexistent/ca.pem")),
            client: None,
        };
        let e = missing.options().unwrap_err();
        assert!(
            e.contains("/nonexistent/ca.pem") && e.contains("cacert"),
            "{e}"
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        for (url, says) in [
            ("redis://127.0.0.1:6379", "expected etcd[s]://"),
            ("etcd://u:secret@h:2379?cacert=/ca.pem", "use etcds://"),
            (
                "etcds://u:secret@h:2379?ca=/ca.pem",
                "unknown parameter \"ca\"",
            ),
            (
                "etcds://u:secret@h:2379?cert=/c.pem",
                "needs both cert and key",
            ),
            ("etcds://u:secret@h:2379?cacert=", "cacert needs a path"),
            ("etcds://u:secret@h:2379?cacert=/a&cacert=/b", "given twice"),
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
