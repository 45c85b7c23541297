//! A private certificate authority for TLS tests, made with `openssl` in a temporary directory:
//! a CA and one server certificate for `127.0.0.1` and `localhost`, signed by it (valid two
//! days), and client certificates on demand. Redis's and PostgreSQL's TLS tests trust the CA through `SSL_CERT_FILE` or a URL's
//! `sslrootcert`.

use std::path::PathBuf;

use crate::temp::TempDir;

/// A CA and a server certificate it signed; removed on drop.
pub struct TestCa {
    /// The CA's certificate (PEM): what a client must trust.
    pub ca: PathBuf,
    /// The server's certificate (PEM), for `127.0.0.1` and `localhost`.
    pub cert: PathBuf,
    /// The server's private key (PEM, unencrypted).
    pub key: PathBuf,
    /// The directory holding them (and `openssl`'s working files).
    pub dir: TempDir,
}

impl TestCa {
    /// Makes the CA and the server certificate; panics with `openssl`'s message if it fails.
    pub fn make() -> Self {
        let dir = TempDir::new("tls");
        let openssl = |args: &[&str]| openssl(&dir, args);
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=leasehold-test-ca",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        sign(&dir, "server.csr", "server.crt", "san.ext");
        TestCa {
            ca: dir.join("ca.crt"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
            dir,
        }
    }

    /// Makes a client certificate for `name` (its common name) signed by this CA: the paths of
    /// the certificate and its private key (PEM, unencrypted).
    pub fn client(&self, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key, csr) = (
            format!("client-{name}.crt"),
            format!("client-{name}.key"),
            format!("client-{name}.csr"),
        );
        let subject = format!("/CN={name}");
        openssl(
            &self.dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                &subject,
            ],
        );
        std::fs::write(self.dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        sign(&self.dir, &csr, &cert, "client.ext");
        (self.dir.join(&cert), self.dir.join(&key))
    }
}

/// Signs the request `csr` with the CA in `dir` (valid two days, with the extensions in
/// `ext`) into `cert`.
fn sign(dir: &TempDir, csr: &str, cert: &str, ext: &str) {
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "2",
            "-extfile",
            ext,
        ],
    );
}

/// Runs `openssl args` in `dir`; panics with its message if it fails.
fn openssl(dir: &TempDir, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(&dir.0)
        .output()
        .expect("running openssl (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
