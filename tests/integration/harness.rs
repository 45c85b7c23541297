//! Test helpers. Each one documents what it waits for and how long.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs `test` with a whole-test deadline; panics with `name` when it is exceeded.
pub async fn deadline<F: Future<Output = ()>>(limit: Duration, test: F) {
    if tokio::time::timeout(limit, test).await.is_err() {
        panic!("test exceeded its deadline of {limit:?}");
    }
}

/// Polls `probe` every 20 ms until it returns `Some`, or panics after `limit` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; the caller binds it next).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` on a free port, killed on drop. Without persistence unless started with
/// [`RedisServer::start_with_aof`].
pub struct RedisServer {
    child: Child,
    /// Its port.
    pub port: u16,
    /// Working directory holding the append-only file, when persistent.
    aof_dir: Option<TempDir>,
}

impl RedisServer {
    /// Starts a server without persistence and waits (up to 10 s) until it answers PING.
    pub async fn start() -> Self {
        Self::start_on(None).await
    }

    /// Starts a server that fsyncs every write to an append-only file before answering.
    pub async fn start_with_aof() -> Self {
        Self::start_on(Some(TempDir::new("redis-aof"))).await
    }

    fn spawn(port: u16, aof_dir: Option<&TempDir>) -> Child {
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ]);
        match aof_dir {
            Some(dir) => cmd
                .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
                .arg(&dir.0),
            None => cmd.args(["--appendonly", "no"]),
        };
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server not found: install it (./dev test does) or put it on PATH")
    }

    async fn start_on(aof_dir: Option<TempDir>) -> Self {
        let mut aof_dir = aof_dir;
        for _ in 0..5 {
            let port = free_port();
            let child = Self::spawn(port, aof_dir.as_ref());
            let mut server = RedisServer {
                child,
                port,
                aof_dir: aof_dir.take(),
            };
            if server.wait_ready().await {
                return server;
            }
            let _ = server.child.kill();
            let _ = server.child.wait();
            aof_dir = server.aof_dir.take();
        }
        panic!("could not start redis-server");
    }

    /// Waits up to 10 s for PING; false if the process exited (port taken) or never answered.
    async fn wait_ready(&mut self) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut c) = self.client().get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Crashes the server (SIGKILL) and starts it again on the same port: with its append-only
    /// file when persistent, empty otherwise.
    pub async fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(self.port, self.aof_dir.as_ref());
        assert!(
            self.wait_ready().await,
            "redis-server did not come back on port {}",
            self.port
        );
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A client for this server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    /// A fresh multiplexed connection.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Paths of the guest components, built once per test binary from `guest-jobs/` with
/// `cargo build --target wasm32-wasip2` into `target/guests`.
pub struct Guests {
    dir: PathBuf,
}

impl Guests {
    /// The `.wasm` of guest crate `name`.
    pub fn wasm(&self, name: &str) -> PathBuf {
        let p = self.dir.join(format!("{name}.wasm"));
        assert!(p.exists(), "guest {name} was not built: {}", p.display());
        p
    }
}

/// Builds the guests (once per process; later calls return the same paths).
pub fn guests() -> &'static Guests {
    static GUESTS: OnceLock<Guests> = OnceLock::new();
    GUESTS.get_or_init(|| {
        let root = repo_root();
        let target = root.join("target").join("guests");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(root.join("guest-jobs"))
            .args(["build", "--target", "wasm32-wasip2", "--target-dir"])
            .arg(&target)
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("RUSTFLAGS")
            .output()
            .expect("running cargo to build the guests");
        assert!(
            out.status.success(),
            "building guest-jobs failed (is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Guests {
            dir: target.join("wasm32-wasip2").join("debug"),
        }
    })
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `…/leasehold-test-<name>-<random>`.
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("leasehold-test-{name}-{}", uuid_like()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    /// A path inside the directory.
    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        Instant::now().elapsed().as_nanos()
    )
}

/// A running `leasehold` process. Its stderr (the log) is collected line by line; the process
/// is killed on drop.
pub struct HostProcess {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

/// Starts `leasehold run` as node `node` against `redis_url` with the jobs directory `jobs`,
/// lease TTL and heartbeat `timing`, and any `extra` flags (e.g. `--data-dir`).
pub fn start_node(
    redis_url: &str,
    jobs: &Path,
    node: &str,
    (ttl, heartbeat): (&str, &str),
    extra: &[&str],
) -> HostProcess {
    let jobs = jobs.to_str().unwrap();
    let mut args = vec![
        "run",
        "--redis-url",
        redis_url,
        "--jobs-dir",
        jobs,
        "--node-id",
        node,
    ];
    args.extend(["--lease-ttl", ttl, "--heartbeat", heartbeat]);
    args.extend(extra);
    HostProcess::start(&args)
}

/// Runs `leasehold <args>` to completion (without `LEASEHOLD_REDIS_URL` from the
/// environment); the process must exit within 30 s. A blocking wait inside an async test would
/// stall the test's own deadline, so this one carries its own.
pub fn run_leasehold<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    let mut cmd = Command::new(leasehold_bin());
    cmd.args(args).env_remove("LEASEHOLD_REDIS_URL");
    output_within(cmd)
}

/// Runs a prepared command to completion; it must exit within 30 s.
pub fn output_within(mut cmd: Command) -> std::process::Output {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(cmd.output()));
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the command did not exit within 30 s")
        .expect("running the command")
}

/// The `leasehold` binary under test.
pub fn leasehold_bin() -> &'static str {
    env!("CARGO_BIN_EXE_leasehold")
}

impl HostProcess {
    /// Starts `leasehold <args…>` with logs in JSON, including leasehold's debug events
    /// (renewals and fenced writes with their monotonic send times and deadlines).
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    /// [`HostProcess::start`] with extra environment variables.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(leasehold_bin())
            .args(args)
            .envs(env.iter().copied())
            .env("LEASEHOLD_LOG_FORMAT", "json")
            .env("LEASEHOLD_LOG", "info,leasehold=debug")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting leasehold");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        HostProcess { child, log }
    }

    /// The process id (the benchmarks read its CPU time and memory).
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running (it has not exited or been killed).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Every log line so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Log lines containing `needle`.
    pub fn log_lines_with(&self, needle: &str) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| l.contains(needle))
            .collect()
    }

    /// Waits (up to `limit`) for a log line containing `needle`.
    pub async fn wait_for_log(&self, needle: &str, limit: Duration) -> String {
        let what = format!("a log line containing {needle:?}");
        let start = Instant::now();
        loop {
            if let Some(l) = self.log_lines_with(needle).into_iter().next() {
                return l;
            }
            if start.elapsed() > limit {
                panic!(
                    "timed out after {limit:?} waiting for {what}; log:\n{}",
                    self.log().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .map(|s| s.success());
        assert!(
            matches!(ok, Ok(true)),
            "kill {sig} {} failed",
            self.child.id()
        );
    }

    /// SIGKILL: the process dies at once, releasing nothing.
    pub fn kill(&mut self) {
        self.signal("-KILL");
        let _ = self.child.wait();
    }

    /// SIGSTOP: the whole process freezes (a long GC pause, a stalled VM).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT: the frozen process carries on where it stopped.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Sends SIGTERM and waits (up to `limit`) for the process to exit; returns its success.
    pub async fn terminate(&mut self, limit: Duration) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            if start.elapsed() > limit {
                panic!(
                    "leasehold did not exit within {limit:?} after SIGTERM; log:\n{}",
                    self.log().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `leasehold trigger JOB --period PERIOD` against `redis`; panics unless it succeeds, and
/// returns what it printed.
pub fn trigger(redis: &RedisServer, job: &str, period: &str) -> String {
    let out = run_leasehold(&[
        "trigger",
        job,
        "--period",
        period,
        "--redis-url",
        &redis.url(),
    ]);
    assert!(
        out.status.success(),
        "trigger failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The run record of `job`'s `period`, if there is one.
pub async fn run_record(redis: &RedisServer, job: &str, period: &str) -> Option<serde_json::Value> {
    let raw: Option<String> = redis::AsyncCommands::get(
        &mut redis.conn().await,
        format!("lh:{{{job}}}:run:{period}"),
    )
    .await
    .unwrap();
    raw.map(|r| serde_json::from_str(&r).unwrap())
}

/// Every run record of `job`, sorted by period.
pub async fn run_records(redis: &RedisServer, job: &str) -> Vec<serde_json::Value> {
    let mut c = redis.conn().await;
    let mut keys: Vec<String> = redis::AsyncCommands::keys(&mut c, format!("lh:{{{job}}}:run:*"))
        .await
        .unwrap();
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        let raw: String = redis::AsyncCommands::get(&mut c, &k).await.unwrap();
        out.push(serde_json::from_str(&raw).unwrap());
    }
    out
}

/// One HTTP/1.1 request to `addr` (`host:port`), with an optional JSON body; returns the
/// status and the JSON body of the answer. 10 s deadline.
pub async fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    http_with(addr, method, path, body, None).await
}

/// [`http`] with an `Authorization` header.
pub async fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    authorization: Option<&str>,
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        if let Some(a) = authorization {
            req.push_str(&format!("Authorization: {a}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            ));
        } else {
            req.push_str("Content-Length: 0\r\n\r\n");
        }
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        raw
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("HTTP request timed out");
    let text = String::from_utf8(raw).unwrap();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    let json = serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_string()));
    (status, json)
}
