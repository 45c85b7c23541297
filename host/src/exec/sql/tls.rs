//! TLS to PostgreSQL: how a URL's `sslmode` and `sslrootcert` become a connector, and the one
//! place that connects (and cancels) with it.
//!
//! Leasehold never speaks TLS without verifying the server: whenever TLS is used, the server's
//! certificate chain is checked against the trusted CAs and its name (or IP address) against
//! the URL's host. That is stricter than libpq, whose `require` checks nothing.
//!
//! | `sslmode` | what the host does |
//! |---|---|
//! | absent, `disable` | plain text (a local or tunnelled connection) |
//! | `prefer` | TLS when the server offers it (verified), plain text when it does not |
//! | `require`, `verify-ca`, `verify-full` | TLS, verified; no connection otherwise |
//!
//! Trusted CAs: the file `sslrootcert=PATH` names (PEM; only those CAs), or else the system's
//! store, where `SSL_CERT_FILE` (a PEM bundle) or `SSL_CERT_DIR` point at others, as for
//! `rediss://` URLs. Client certificates are not offered.

use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use tokio_postgres::config::SslMode;
use tokio_postgres::{CancelToken, Client, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How a database's connections are made.
#[derive(Clone)]
pub(super) enum Tls {
    /// Plain text.
    Off,
    /// TLS, verified against these roots (`where` says which, for messages).
    Verified {
        connector: MakeRustlsConnect,
        roots: String,
    },
}

impl Tls {
    /// The connector for `mode`, trusting `root_cert` (a PEM file) or the system's CAs.
    pub(super) fn for_mode(mode: SslMode, root_cert: Option<&str>) -> Result<Tls, String> {
        if mode == SslMode::Disable {
            return Ok(Tls::Off);
        }
        let (store, roots) = match root_cert {
            Some(path) => (file_roots(path)?, format!("the CA in {path}")),
            None => (system_roots()?, "the system's CAs".to_string()),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS settings: {e}"))?
            .with_root_certificates(store)
            .with_no_client_auth();
        Ok(Tls::Verified {
            connector: MakeRustlsConnect::new(config),
            roots,
        })
    }

    /// Which CAs are trusted, or `None` for plain text.
    pub(super) fn roots(&self) -> Option<&str> {
        match self {
            Tls::Off => None,
            Tls::Verified { roots, .. } => Some(roots),
        }
    }

    /// Connects with `pg` within `wait` and drives the connection in a task of its own.
    pub(super) async fn connect(
        &self,
        pg: &tokio_postgres::Config,
        wait: Duration,
        shown: &str,
    ) -> Result<Client, String> {
        let late = || format!("connecting to {shown} took longer than {wait:?}");
        let failed = |e: tokio_postgres::Error| match self.roots() {
            // The error's source chain holds the TLS failure (an unknown issuer, a wrong name).
            Some(roots) => format!(
                "connecting to {shown} (TLS, trusting {roots}): {}",
                chain(&e)
            ),
            None => format!("connecting to {shown}: {}", chain(&e)),
        };
        let mut pg = pg.clone();
        pg.connect_timeout(wait);
        match self {
            Tls::Off => {
                let (client, connection) = tokio::time::timeout(wait, pg.connect(NoTls))
                    .await
                    .map_err(|_| late())?
                    .map_err(failed)?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(client)
            }
            Tls::Verified { connector, .. } => {
                let (client, connection) =
                    tokio::time::timeout(wait, pg.connect(connector.clone()))
                        .await
                        .map_err(|_| late())?
                        .map_err(failed)?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(client)
            }
        }
    }

    /// Asks the server to cancel what `token`'s connection runs (in the background: nothing
    /// waits for the answer).
    pub(super) fn cancel(&self, token: CancelToken) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let tls = self.clone();
        rt.spawn(async move {
            let _ = match tls {
                Tls::Off => token.cancel_query(NoTls).await,
                Tls::Verified { connector, .. } => token.cancel_query(connector).await,
            };
        });
    }
}

/// An error with its sources, `: `-separated (tokio-postgres keeps the TLS cause in a source).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The CAs of a PEM file.
fn file_roots(path: &str) -> Result<RootCertStore, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("sslrootcert={path}: {e}"))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("sslrootcert={path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("sslrootcert={path}: no certificate in the file"));
    }
    let mut store = RootCertStore::empty();
    let (_, bad) = store.add_parsable_certificates(certs);
    if store.is_empty() {
        return Err(format!(
            "sslrootcert={path}: none of its {bad} certificates can be used as a CA"
        ));
    }
    Ok(store)
}

/// The system's CAs (with `SSL_CERT_FILE`/`SSL_CERT_DIR`, as rustls-native-certs reads them).
pub(crate) fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    store.add_parsable_certificates(found.certs);
    if store.is_empty() {
        let why = found
            .errors
            .first()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        return Err(format!(
            "no trusted CA certificates found (the system's store, SSL_CERT_FILE, SSL_CERT_DIR){why}; name one with sslrootcert=PATH"
        ));
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_needs_no_roots_and_a_missing_root_file_is_named() {
        assert!(
            Tls::for_mode(SslMode::Disable, Some("/nonexistent"))
                .unwrap()
                .roots()
                .is_none()
        );
        let err = Tls::for_mode(SslMode::Require, Some("/nonexistent/ca.pem"))
            .err()
            .unwrap();
        assert!(
            err.starts_with("sslrootcert=/nonexistent/ca.pem: "),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("lh-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = Tls::for_mode(SslMode::Require, empty.to_str())
            .err()
            .unwrap();
        assert!(err.contains("no certificate in the file"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
