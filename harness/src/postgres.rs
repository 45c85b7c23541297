//! A PostgreSQL server of the harness's own: `initdb` into a temporary directory, `postgres` on
//! a port it picks (loopback only, its socket in that directory), stopped (immediate shutdown)
//! and removed on drop. Debian's binaries live in `/usr/lib/postgresql/<version>/bin`, which is
//! not on `PATH`; they refuse to run as root, so as root the server runs as the `postgres` user
//! (Debian's package creates it).
//!
//! The server runs with `fsync=off` (tests need no durability) and `track_commit_timestamp=on`,
//! so a test can order what the database committed (`pg_xact_commit_timestamp(xmin)`).
//! Authentication is `trust`: any role the test creates logs in without a password.

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::temp::TempDir;

/// How long a started server may take to accept connections.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A running PostgreSQL server, stopped on drop.
pub struct PgServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Child,
    dir: TempDir,
}

/// Whether PostgreSQL's server binaries are installed (see [`bin_dir`]).
pub fn available() -> bool {
    std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.path().join("bin/initdb").exists())
}

/// The directory of PostgreSQL's server binaries (`initdb`, `postgres`).
pub fn bin_dir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin: install Debian's postgresql (./dev setup does)")
    })
}

/// The uid and gid to run the server as: the `postgres` user when running as root.
fn run_as() -> Option<(u32, u32)> {
    let id = |flag: &str, user: &str| -> Option<u32> {
        let mut cmd = Command::new("id");
        cmd.arg(flag);
        if !user.is_empty() {
            cmd.arg(user);
        }
        let out = cmd.output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    if id("-u", "")? != 0 {
        return None;
    }
    Some((
        id("-u", "postgres").expect(
            "running as root needs a postgres user (Debian's postgresql package creates it)",
        ),
        id("-g", "postgres").expect("the postgres user's group"),
    ))
}

impl PgServer {
    /// Initialises a cluster and starts it; panics with the server's log if it does not come up.
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// As [`start`](Self::start), the server also speaking TLS with `ca`'s server certificate
    /// (plain connections are still accepted: the harness's own admin connections are plain).
    pub async fn start_tls(ca: &crate::tls::TestCa) -> Self {
        Self::start_with(Some(ca)).await
    }

    async fn start_with(tls: Option<&crate::tls::TestCa>) -> Self {
        let dir = TempDir::new("postgres");
        let mut ssl_args = Vec::new();
        if let Some(ca) = tls {
            // The server insists that its key is its own and private.
            for (from, to) in [(&ca.cert, "server.crt"), (&ca.key, "server.key")] {
                let to = dir.join(to);
                std::fs::copy(from, &to).expect("copying the server's certificate");
                std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .unwrap();
                ssl_args.push(format!("{}", to.display()));
            }
            ssl_args = vec![
                "-c".to_string(),
                "ssl=on".to_string(),
                "-c".to_string(),
                format!("ssl_cert_file={}", ssl_args[0]),
                "-c".to_string(),
                format!("ssl_key_file={}", ssl_args[1]),
            ];
        }
        let data = dir.join("data");
        let user = run_as();
        if let Some((uid, gid)) = user {
            let chown = Command::new("chown")
                .arg("-R")
                .arg(format!("{uid}:{gid}"))
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(chown.success(), "chown of {}", dir.path().display());
        }
        let bin = bin_dir();
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = user {
            initdb.uid(uid).gid(gid);
        }
        let out = initdb.output().expect("running initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let log = dir.join("server.log");
        let mut last = String::new();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let log_file = std::fs::File::create(&log).expect("server log");
            if let Some((uid, gid)) = user {
                let _ = std::os::unix::fs::chown(&log, Some(uid), Some(gid));
            }
            let mut cmd = Command::new(bin.join("postgres"));
            cmd.arg("-D")
                .arg(&data)
                .args(["-p", &port.to_string(), "-k"])
                .arg(dir.path())
                .args([
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "track_commit_timestamp=on",
                    "-c",
                    "max_connections=200",
                ])
                .args(&ssl_args)
                .stdout(Stdio::null())
                .stderr(log_file);
            if let Some((uid, gid)) = user {
                cmd.uid(uid).gid(gid);
            }
            let mut child = cmd.spawn().expect("starting postgres");
            let since = Instant::now();
            let mut ready = false;
            while since.elapsed() < READY_WITHIN {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                if connect(&url_of(port, "postgres")).await.is_ok() {
                    ready = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if ready {
                return PgServer { port, child, dir };
            }
            // Another process took the port, or the server failed: try again on another one.
            last = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("postgres did not start: {last}");
    }

    /// A URL logging in as `user` to database `postgres`.
    pub fn url(&self, user: &str) -> String {
        url_of(self.port, user)
    }

    /// The superuser's URL.
    pub fn admin_url(&self) -> String {
        self.url("postgres")
    }

    /// A connection as `user`.
    pub async fn connect(
        &self,
        user: &str,
    ) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        connect(&self.url(user)).await
    }

    /// A connection as the superuser.
    pub async fn admin(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        self.connect("postgres").await
    }

    /// Runs `sql` (several statements allowed) as the superuser; panics on error.
    pub async fn exec(&self, sql: &str) {
        self.admin()
            .await
            .expect("connecting as postgres")
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

fn url_of(port: u16, user: &str) -> String {
    format!("postgres://{user}@127.0.0.1:{port}/postgres")
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Immediate shutdown: the postmaster stops its backends and exits.
        let _ = Command::new("kill")
            .args(["-QUIT", &self.child.id().to_string()])
            .status();
        let since = Instant::now();
        while since.elapsed() < Duration::from_secs(10) {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
