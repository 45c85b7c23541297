//! `redis-server` processes owned by the harness.
//!
//! Redis cannot bind port 0 and report the port it got, so the harness picks the port: it asks
//! the kernel for a free one ([`port_for_own_server`]), releases it and starts `redis-server`
//! on it. Another process may take the port in between; then `redis-server` fails to bind and
//! exits, and the harness starts it again on another port. A server counts as ready only once
//! its own log says it accepts connections, so a lost race is never mistaken for readiness by
//! reaching somebody else's server on the same port.
//!
//! Leasehold hosts are never given a port this way: they bind `--http 127.0.0.1:0` and report
//! the bound address ([`crate::HostProcess::http_addr`]).

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::temp::TempDir;

/// Attempts at starting a server on a fresh port before giving up.
const ATTEMPTS: usize = 5;
/// How long a started server may take to become ready.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// The line `redis-server` logs once it listens (and has loaded its append-only file).
const READY_LINE: &str = "Ready to accept connections";

/// How to start a [`RedisServer`]. The default: no persistence, plain TCP on 127.0.0.1, the
/// caller's working directory.
#[derive(Clone, Debug, Default)]
pub struct RedisConfig {
    dir: Option<PathBuf>,
    args: Vec<OsString>,
    aof: bool,
    tls: bool,
    cluster: bool,
}

impl RedisConfig {
    /// The default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the server in `dir`: relative paths in [`RedisConfig::args`] resolve there, and
    /// with [`RedisConfig::aof`] the append-only file is kept there (the directory is the
    /// caller's and is left in place).
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Extra `redis-server` arguments, after the harness's own (so they can override them).
    /// Do not pass `--logfile`: readiness is read from the server's log on its stdout.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Persistence: every write is fsynced to an append-only file before Redis answers, so
    /// [`RedisServer::crash_and_restart`] comes back with the data. Without
    /// [`RedisConfig::dir`], the file lives in a temporary directory the server owns.
    pub fn aof(mut self) -> Self {
        self.aof = true;
        self
    }

    /// TLS only: the port is `--tls-port` and plain TCP is off (`--port 0`). The caller passes
    /// the certificate arguments with [`RedisConfig::args`]. [`RedisServer::url`] is then
    /// `rediss://…`; this crate's client does not speak TLS, so [`RedisServer::client`] and
    /// [`RedisServer::conn`] are for plain servers only.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// A Redis Cluster node (`cluster-enabled`), with its cluster bus on a second port the
    /// harness picks ([`RedisServer::bus_port`]); [`crate::cluster::RedisCluster`] joins such
    /// nodes into a cluster.
    pub fn cluster(mut self) -> Self {
        self.cluster = true;
        self
    }
}

/// A `redis-server` the harness started on a port it picked, killed on drop. Its log (stdout)
/// is collected in memory for failure messages.
pub struct RedisServer {
    child: Child,
    /// Its port (the TLS port for a TLS server).
    pub port: u16,
    /// Its cluster bus port, for a cluster node.
    pub bus_port: Option<u16>,
    config: RedisConfig,
    log: Arc<Mutex<Vec<String>>>,
    /// The server's working directory, when it owns it.
    _own_dir: Option<TempDir>,
}

impl RedisServer {
    /// Starts a server without persistence and waits (up to 10 s) until it is ready.
    pub async fn start() -> Self {
        Self::start_with(RedisConfig::new()).await
    }

    /// Starts a server that fsyncs every write to an append-only file before answering.
    pub async fn start_with_aof() -> Self {
        Self::start_with(RedisConfig::new().aof()).await
    }

    /// Starts a server as `config` says; panics if it cannot.
    pub async fn start_with(config: RedisConfig) -> Self {
        Self::try_start_with(config).await.unwrap_or_else(|e| {
            panic!("{e} (redis-server must be on PATH: install it, ./dev test does)")
        })
    }

    /// Starts a server as `config` says, on a port of its own: up to five ports are tried
    /// when another process takes the picked one first. Errors when `redis-server` cannot be
    /// run or never becomes ready.
    pub async fn try_start_with(mut config: RedisConfig) -> std::io::Result<Self> {
        // A directory of its own unless the caller gives one: Redis writes files there (an
        // append-only file, or the RDB a replica receives at its first sync) and loads them at
        // start, so a shared working directory would carry one test's data into the next.
        let own_dir = if config.dir.is_none() {
            let dir = TempDir::create("leasehold-test-redis")?;
            config.dir = Some(dir.0.clone());
            Some(dir)
        } else {
            None
        };
        let mut last_log = Vec::new();
        for _ in 0..ATTEMPTS {
            let port = port_for_own_server()?;
            let bus_port = if config.cluster {
                Some(port_for_own_server()?)
            } else {
                None
            };
            let (child, log) = spawn(&config, port, bus_port)?;
            let mut server = RedisServer {
                child,
                port,
                bus_port,
                config: config.clone(),
                log,
                _own_dir: None,
            };
            if server.wait_ready().await {
                server._own_dir = own_dir;
                return Ok(server);
            }
            last_log = server.log();
            // Dropping the server kills it.
        }
        Err(std::io::Error::other(format!(
            "could not start redis-server in {ATTEMPTS} attempts; its last log:\n{}",
            last_log.join("\n")
        )))
    }

    /// Waits up to 10 s for the server's own "ready" log line (and, for a plain server, a
    /// PING answer); false if the process exited (the port was taken) or it never got ready.
    async fn wait_ready(&mut self) -> bool {
        let start = Instant::now();
        while start.elapsed() < READY_WITHIN {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let logged = self
                .log
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(READY_LINE));
            if logged && (self.config.tls || self.ping().await) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    async fn ping(&self) -> bool {
        let Ok(client) = ::redis::Client::open(self.url()) else {
            return false;
        };
        match client.get_multiplexed_async_connection().await {
            Ok(mut c) => ::redis::cmd("PING")
                .query_async::<String>(&mut c)
                .await
                .is_ok(),
            Err(_) => false,
        }
    }

    /// Stops the server gracefully (`CLIENT PAUSE` for writes, so that every command executed
    /// has reached `MONITOR` clients, then SIGTERM: an append-only file is fsynced) and starts
    /// it again on the same port.
    pub async fn restart(&mut self) {
        if let Ok(client) = ::redis::Client::open(self.url())
            && let Ok(mut c) = client.get_multiplexed_async_connection().await
        {
            let _: Result<(), _> = ::redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(5_000)
                .arg("WRITE")
                .query_async(&mut c)
                .await;
            // What was executed before the pause is sent to every client within an event-loop
            // turn; give it a few.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        self.start_again().await;
    }

    /// Freezes the server (SIGSTOP): it answers nothing, and its connections stay open (a
    /// replica that stops acknowledging while its primary still counts it connected).
    pub fn pause(&self) {
        let _ = Command::new("kill")
            .args(["-STOP", &self.child.id().to_string()])
            .status();
    }

    /// Thaws a server frozen by [`RedisServer::pause`] (SIGCONT).
    pub fn resume(&self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
    }

    /// Kills the server (SIGKILL) and leaves it dead (a cluster's primary lost, say).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Crashes the server (SIGKILL) and starts it again on the same port: with its append-only
    /// file when persistent, empty otherwise.
    pub async fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.start_again().await;
    }

    async fn start_again(&mut self) {
        let (child, log) = spawn(&self.config, self.port, self.bus_port)
            .unwrap_or_else(|e| panic!("restarting redis-server: {e}"));
        self.child = child;
        self.log = log;
        assert!(
            self.wait_ready().await,
            "redis-server did not come back on port {}; its log:\n{}",
            self.port,
            self.log().join("\n")
        );
    }

    /// `redis://127.0.0.1:<port>`, or `rediss://…` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.config.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// A client for this (plain) server.
    pub fn client(&self) -> ::redis::Client {
        ::redis::Client::open(self.url()).unwrap()
    }

    /// A fresh multiplexed connection to this (plain) server.
    pub async fn conn(&self) -> ::redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// The server's log so far (since its last start).
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free TCP port on 127.0.0.1, bound and released at once. Only for the harness's own
/// `redis-server`s, which cannot bind port 0 and report it: their start detects a port taken
/// in between and tries another. Nothing else should pick a port it does not own; a
/// `leasehold` host binds port 0 instead.
fn port_for_own_server() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts `redis-server` on `port` with its stdout collected line by line.
fn spawn(
    config: &RedisConfig,
    port: u16,
    bus_port: Option<u16>,
) -> std::io::Result<(Child, Arc<Mutex<Vec<String>>>)> {
    let port = port.to_string();
    let mut cmd = Command::new("redis-server");
    if config.tls {
        cmd.args(["--port", "0", "--tls-port", &port]);
    } else {
        cmd.args(["--port", &port]);
    }
    cmd.args(["--bind", "127.0.0.1", "--save", ""]);
    if config.aof {
        cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
    } else {
        cmd.args(["--appendonly", "no"]);
    }
    if let Some(dir) = &config.dir {
        cmd.arg("--dir").arg(dir);
    }
    if let Some(bus) = bus_port {
        // The node's cluster state lives in its own directory (`--dir`), so a restart on the
        // same ports rejoins the cluster.
        cmd.args([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ])
        .args([
            "--cluster-node-timeout",
            "2000",
            "--cluster-port",
            &bus.to_string(),
        ])
        // A replica's first sync at once (not after the default 5 s): a replica that never
        // synced cannot be promoted.
        .args(["--repl-diskless-sync-delay", "0"]);
    }
    cmd.args(&config.args);
    if let Some(dir) = &config.dir {
        cmd.current_dir(dir);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run redis-server: {e}")))?;
    let log = crate::process::collect_lines(child.stdout.take().expect("piped stdout"));
    Ok((child, log))
}
