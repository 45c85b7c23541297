//! etcd clusters of Debian's `etcd` (3.4), started on loopback ports the harness picks, each
//! member in a directory of its own, killed on drop.
//!
//! Members run with `--heartbeat-interval 50 --election-timeout 500`, so a member that loses its
//! leader elects another within about a second, and a lease's smallest TTL is 1 s (etcd raises a
//! TTL under ⌈1.5 × election timeout⌉ to that). Their data directories are in `/dev/shm` where
//! there is one (etcd syncs its log on every write: a slow disk under a loaded machine would
//! make leaders change). A member can be killed (SIGKILL), paused and resumed (SIGSTOP, SIGCONT:
//! pausing two of three leaves the third a minority without a leader).

use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::temp::TempDir;

/// How long a new cluster may take to have a leader.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// Whole-cluster start attempts (a port picked free may be taken before etcd binds it).
const ATTEMPTS: usize = 3;

/// One member of an [`EtcdCluster`].
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain HTTP `/health` and `/metrics`, whatever the client port speaks.
    metrics_port: u16,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A running etcd cluster; every member is killed when it is dropped.
pub struct EtcdCluster {
    members: Vec<Member>,
    token: String,
    tls: Option<EtcdTls>,
    dir: TempDir,
}

/// TLS on the members' client ports ([`EtcdCluster::start_tls`]).
#[derive(Clone)]
struct EtcdTls {
    cert: PathBuf,
    key: PathBuf,
    /// The CA whose client certificates are required (`--client-cert-auth`).
    client_ca: PathBuf,
}

impl EtcdCluster {
    /// Starts `n` members and waits until each serves with a leader; panics (with the members'
    /// logs) if it cannot.
    pub async fn start(n: usize) -> Self {
        Self::start_with(n, None).await
    }

    /// Starts `n` members whose client ports speak only TLS, with `ca`'s server certificate
    /// (for `127.0.0.1`), and require a client certificate `ca` signed
    /// (`--client-cert-auth`; see [`TestCa::client`](crate::tls::TestCa::client)); peers talk
    /// plain HTTP. Their endpoints are `https://` URLs.
    pub async fn start_tls(n: usize, ca: &crate::tls::TestCa) -> Self {
        let tls = EtcdTls {
            cert: ca.cert.clone(),
            key: ca.key.clone(),
            client_ca: ca.ca.clone(),
        };
        Self::start_with(n, Some(tls)).await
    }

    async fn start_with(n: usize, tls: Option<EtcdTls>) -> Self {
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            let dir = match std::fs::metadata("/dev/shm") {
                Ok(m) if m.is_dir() => TempDir::create("/dev/shm/leasehold-test-etcd")
                    .unwrap_or_else(|_| TempDir::new("etcd")),
                _ => TempDir::new("etcd"),
            };
            let token = format!("lh-{}-{attempt}", std::process::id());
            // Every port is picked while the others are still held, so no two are the same.
            let held: Vec<TcpListener> = (0..3 * n)
                .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
                .collect();
            let port = |i: usize| held[i].local_addr().expect("a bound port").port();
            let mut members = Vec::with_capacity(n);
            for i in 0..n {
                let data = dir.join(&format!("m{i}"));
                members.push(Member {
                    name: format!("m{i}"),
                    client_port: port(3 * i),
                    peer_port: port(3 * i + 1),
                    metrics_port: port(3 * i + 2),
                    log: dir.join(&format!("m{i}.log")),
                    data,
                    child: None,
                });
            }
            drop(held);
            let mut cluster = EtcdCluster {
                members,
                token,
                tls: tls.clone(),
                dir,
            };
            for i in 0..n {
                cluster.spawn(i);
            }
            if cluster.wait_healthy(READY_WITHIN).await {
                return cluster;
            }
            last = cluster.logs();
        }
        panic!(
            "could not start an etcd cluster of {n} in {ATTEMPTS} attempts (etcd must be on PATH: ./dev setup installs etcd-server); the last logs:\n{last}"
        );
    }

    fn spawn(&mut self, i: usize) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let client = self.endpoint(i);
        let m = &self.members[i];
        let metrics = format!("http://127.0.0.1:{}", m.metrics_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&m.log)
            .expect("an etcd member's log file");
        let mut etcd = Command::new("etcd");
        if let Some(tls) = &self.tls {
            etcd.arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(&tls.client_ca);
        }
        let child = etcd
            .args(["--name", &m.name, "--data-dir"])
            .arg(&m.data)
            .args([
                "--listen-metrics-urls",
                &metrics,
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &initial.join(","),
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                &self.token,
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
                "--logger",
                "zap",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting etcd ({e}): install Debian's etcd-server (./dev setup does)")
            });
        self.members[i].child = Some(child);
    }

    /// Each member's client URL (`http://127.0.0.1:PORT`, `https://` with TLS), in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The cluster as a Leasehold store URL: `etcd://127.0.0.1:PORT,…` (plain members only:
    /// a TLS cluster's URL needs its certificates' paths).
    pub fn url(&self) -> String {
        assert!(
            self.tls.is_none(),
            "a TLS cluster's URL names its certificates"
        );
        let members: Vec<String> = (0..self.members.len())
            .map(|i| format!("127.0.0.1:{}", self.members[i].client_port))
            .collect();
        format!("etcd://{}", members.join(","))
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client_port)
    }

    /// SIGKILLs member `i` (the others go on as a smaller cluster).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again after [`EtcdCluster::kill`], on its ports and its data (it
    /// rejoins the cluster), and waits up to `within` until every running member is healthy;
    /// panics with the logs if they are not.
    pub async fn restart(&mut self, i: usize, within: Duration) {
        assert!(
            self.members[i].child.is_none(),
            "etcd member {i} is running"
        );
        self.spawn(i);
        assert!(
            self.wait_healthy(within).await,
            "etcd member {i} did not rejoin within {within:?}:\n{}",
            self.logs()
        );
    }

    /// Freezes member `i` (SIGSTOP): its peers see it gone, its clients get no answer.
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Thaws a member [`EtcdCluster::pause`] froze.
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, sig: &str) {
        if let Some(c) = &self.members[i].child {
            let _ = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
        }
    }

    /// Member `i`'s answer to `GET path` on its metrics port (HTTP/1.0, headers included),
    /// within `limit`; `None` when it does not answer.
    async fn get(&self, i: usize, path: &str, limit: Duration) -> Option<String> {
        let addr = format!("127.0.0.1:{}", self.members[i].metrics_port);
        let ask = async {
            let mut s = tokio::net::TcpStream::connect(&addr).await.ok()?;
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: etcd\r\n\r\n").as_bytes())
                .await
                .ok()?;
            let mut got = String::new();
            s.read_to_string(&mut got).await.ok()?;
            Some(got)
        };
        tokio::time::timeout(limit, ask).await.ok().flatten()
    }

    /// Whether member `i` answers `GET /health` with `"health":"true"` (it has a leader).
    pub async fn healthy(&self, i: usize) -> bool {
        self.get(i, "/health", Duration::from_secs(2))
            .await
            .is_some_and(|got| got.contains("\"health\":\"true\""))
    }

    /// The gRPC requests the running members have begun serving since they started (each
    /// member's `grpc_server_started_total` in its `/metrics`, summed over methods and members):
    /// a unary call counts once, a stream (a watch, a lease keep-alive) once as it opens. What a
    /// client costs the cluster, counted by etcd.
    pub async fn requests_served(&self) -> u64 {
        let mut total = 0;
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            let got = self
                .get(i, "/metrics", Duration::from_secs(5))
                .await
                .unwrap_or_else(|| panic!("etcd member {i} did not serve its metrics"));
            total += got
                .lines()
                .filter(|l| l.starts_with("grpc_server_started_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64;
        }
        total
    }

    /// The running member that is etcd's leader now (`etcd_server_is_leader 1` in its
    /// `/metrics`), if one says so.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            let Some(got) = self.get(i, "/metrics", Duration::from_secs(5)).await else {
                continue;
            };
            if got.lines().any(|l| l.trim() == "etcd_server_is_leader 1") {
                return Some(i);
            }
        }
        None
    }

    /// Waits up to `within` until every running member is healthy; false at once when a member
    /// exited (a port taken by another process meanwhile).
    pub async fn wait_healthy(&mut self, within: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < within {
            let mut all = true;
            for i in 0..self.members.len() {
                let Some(child) = self.members[i].child.as_mut() else {
                    continue;
                };
                if !matches!(child.try_wait(), Ok(None)) {
                    return false;
                }
                if !self.healthy(i).await {
                    all = false;
                    break;
                }
            }
            if all {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Every member's log, for a failure message.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let text = std::fs::read_to_string(&m.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!(
                    "--- {} ({})\n{}",
                    m.name,
                    self.dir.0.display(),
                    tail.join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            // A paused member is thawed first, so that it dies at once.
            self.resume(i);
            self.kill(i);
        }
    }
}
