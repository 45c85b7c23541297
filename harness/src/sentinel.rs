//! Redis Sentinel processes owned by the harness: a set of sentinels monitoring one primary
//! under a service name, on ports the harness picks, killed on drop.
//!
//! Each sentinel gets a directory of its own with the configuration file it rewrites as it
//! learns the replicas, the other sentinels and the failovers. They are started with Debian's
//! `redis-sentinel` (`redis-server --sentinel` where only the server is installed), and count
//! as ready once they answer `SENTINEL MASTERS` with the service. Timings are short, for tests:
//! the primary is judged down after `down_after` without an answer, and a failover may take
//! `failover_timeout`.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::temp::TempDir;
use crate::wait::wait_for;

/// A set of sentinels monitoring one service.
pub struct Sentinels {
    procs: Vec<(Child, u16, TempDir)>,
    /// The service name (`sentinel monitor <service> …`).
    pub service: String,
}

impl Sentinels {
    /// Starts `n` sentinels (quorum: a majority of them) monitoring the primary on
    /// `primary_port` as `service`, which is judged down after `down_after`; waits (up to 30 s)
    /// until each answers for the service and knows the others.
    pub async fn start(primary_port: u16, service: &str, n: usize, down_after: Duration) -> Self {
        let quorum = n / 2 + 1;
        let mut procs = Vec::new();
        for _ in 0..n {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let dir = TempDir::create("leasehold-test-sentinel").expect("sentinel dir");
            let conf = dir.0.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\nsentinel down-after-milliseconds {service} {}\nsentinel failover-timeout {service} 10000\nsentinel parallel-syncs {service} 1\n",
                    dir.0.display(),
                    down_after.as_millis()
                ),
            )
            .expect("sentinel.conf");
            let log = std::fs::File::create(dir.0.join("sentinel.log")).expect("sentinel log");
            let mut cmd = if which("redis-sentinel") {
                let mut c = Command::new("redis-sentinel");
                c.arg(&conf);
                c
            } else {
                let mut c = Command::new("redis-server");
                c.arg(&conf).arg("--sentinel");
                c
            };
            let child = cmd
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("starting redis-sentinel");
            procs.push((child, port, dir));
        }
        let set = Sentinels {
            procs,
            service: service.to_string(),
        };
        for port in set.ports() {
            wait_for(
                &format!("sentinel {port} to monitor {service} and know the others"),
                Duration::from_secs(30),
                || async move {
                    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
                    let mut c = client.get_multiplexed_async_connection().await.ok()?;
                    let info: Vec<std::collections::HashMap<String, String>> =
                        ::redis::cmd("SENTINEL")
                            .arg("MASTERS")
                            .query_async(&mut c)
                            .await
                            .ok()?;
                    let m = info
                        .iter()
                        .find(|m| m.get("name") == Some(&service.to_string()))?;
                    let others: usize = m.get("num-other-sentinels")?.parse().ok()?;
                    (others + 1 >= n).then_some(())
                },
            )
            .await;
        }
        set
    }

    /// The sentinels' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.procs.iter().map(|p| p.1).collect()
    }

    /// The URL a host is given: `redis+sentinel://127.0.0.1:p1,…/service`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.service)
    }

    /// The port of the primary the sentinels name now (asked of the first that answers).
    pub async fn primary_port(&self) -> Option<u16> {
        for port in self.ports() {
            let Ok(client) = ::redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
                continue;
            };
            let Ok(mut c) = client.get_multiplexed_async_connection().await else {
                continue;
            };
            let addr: Result<Vec<String>, _> = ::redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.service)
                .query_async(&mut c)
                .await;
            if let Some(p) = addr.ok().and_then(|a| a.get(1)?.parse().ok()) {
                return Some(p);
            }
        }
        None
    }

    /// What each sentinel logged, for failure messages.
    pub fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|(_, port, dir)| {
                format!(
                    "sentinel {port}:\n{}",
                    std::fs::read_to_string(dir.0.join("sentinel.log")).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for (child, _, _) in &mut self.procs {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}
