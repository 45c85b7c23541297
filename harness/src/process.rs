//! `leasehold` processes: started from a binary the caller names, logs (stderr, JSON)
//! collected in memory line by line, signals, and teardown on drop.
//!
//! The harness cannot know the binary: tests and benches pass `env!("CARGO_BIN_EXE_leasehold")`,
//! the demo its own executable.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The message of the line a host logs once its HTTP API listens; its `addr` field is the
/// bound address.
const HTTP_LISTENING: &str = "HTTP API listening";
/// How many of its last log lines (above debug) a host shows when a test panics.
const LAST_WORDS: usize = 40;

/// A running `leasehold` process. Its stderr (the log) is collected line by line; on drop it
/// is woken (SIGCONT, in case it was paused) and killed.
pub struct HostProcess {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl HostProcess {
    /// Starts `bin <args…>` with logs in JSON, including leasehold's debug events (renewals
    /// and fenced writes with their monotonic send times and deadlines), plus the environment
    /// variables `env` (which may override those two: `LEASEHOLD_LOG_FORMAT`,
    /// `LEASEHOLD_LOG`). Panics if the process cannot be started.
    pub fn start<S: AsRef<OsStr>>(bin: impl AsRef<Path>, args: &[S], env: &[(&str, &str)]) -> Self {
        let bin = bin.as_ref();
        Self::try_start(bin, args, env)
            .unwrap_or_else(|e| panic!("starting leasehold ({}): {e}", bin.display()))
    }

    /// [`HostProcess::start`], returning the error instead of panicking.
    pub fn try_start<S: AsRef<OsStr>>(
        bin: &Path,
        args: &[S],
        env: &[(&str, &str)],
    ) -> std::io::Result<Self> {
        let mut child = Command::new(bin)
            .args(args)
            .env("LEASEHOLD_LOG_FORMAT", "json")
            .env("LEASEHOLD_LOG", "info,leasehold=debug")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let log = collect_lines(child.stderr.take().expect("piped stderr"));
        Ok(HostProcess { child, log })
    }

    /// Starts `bin run` as node `node` against `redis_url` with the jobs directory `jobs`,
    /// lease TTL and heartbeat `timing`, and any `extra` flags (e.g. `--data-dir`).
    pub fn start_node(
        bin: impl AsRef<Path>,
        redis_url: &str,
        jobs: &Path,
        node: &str,
        (ttl, heartbeat): (&str, &str),
        extra: &[&str],
    ) -> Self {
        let jobs = jobs.to_str().expect("a UTF-8 jobs directory");
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
        Self::start(bin.as_ref(), &args, &[])
    }

    /// The process id (the benchmarks read its CPU time and memory).
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

    /// Waits (up to `limit`) for a log line containing `needle`; panics with the log after.
    pub async fn wait_for_log(&self, needle: &str, limit: Duration) -> String {
        let what = format!("a log line containing {needle:?}");
        self.wait_for_log_matching(&what, limit, |l| l.contains(needle))
            .await
    }

    /// Waits (up to `limit`) for a log line for which `matches` is true, and returns it; panics
    /// naming `what`, with the log.
    pub async fn wait_for_log_matching(
        &self,
        what: &str,
        limit: Duration,
        matches: impl Fn(&str) -> bool,
    ) -> String {
        self.wait_for_line(what, limit, |l| matches(l).then(|| l.to_string()))
            .await
    }

    /// The address (`127.0.0.1:PORT`) the host's HTTP API bound, for a host started with
    /// `--http 127.0.0.1:0`: waits (up to `limit`) for the JSON line whose message is
    /// `HTTP API listening` and returns its `addr` field.
    pub async fn http_addr(&self, limit: Duration) -> String {
        let what =
            format!("the HTTP API's bound address (a JSON line {HTTP_LISTENING:?} with an `addr`)");
        self.wait_for_line(&what, limit, |l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            if v["message"] != HTTP_LISTENING {
                return None;
            }
            v["addr"].as_str().map(str::to_string)
        })
        .await
    }

    /// Polls the log every 20 ms until `pick` finds something in a line; panics after `limit`
    /// naming `what`, with the log.
    async fn wait_for_line<T>(
        &self,
        what: &str,
        limit: Duration,
        mut pick: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let found = crate::wait::poll_until(what, limit, Duration::from_millis(20), || {
            std::future::ready(self.log().iter().find_map(|l| pick(l)))
        })
        .await;
        found.unwrap_or_else(|e| panic!("{e}; log:\n{}", self.log().join("\n")))
    }

    /// Sends signal `sig` (as `kill` spells it: `-STOP`, `-TERM`, …) to the process.
    pub fn signal(&self, sig: &str) -> std::io::Result<()> {
        let pid = self.child.id();
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("kill {sig} {pid} failed")))
        }
    }

    fn must_signal(&self, sig: &str) {
        if let Err(e) = self.signal(sig) {
            panic!("{e}");
        }
    }

    /// SIGKILL: the process dies at once, releasing nothing.
    pub fn kill(&mut self) {
        self.must_signal("-KILL");
        let _ = self.child.wait();
    }

    /// SIGSTOP: the whole process freezes (a long GC pause, a stalled VM).
    pub fn pause(&self) {
        self.must_signal("-STOP");
    }

    /// SIGCONT: the frozen process carries on where it stopped.
    pub fn resume(&self) {
        self.must_signal("-CONT");
    }

    /// Sends SIGTERM and waits (up to `limit`) for the process to exit; returns its success.
    /// Panics with the log if it does not exit in time.
    pub async fn terminate(&mut self, limit: Duration) -> bool {
        match self.stop(limit).await {
            Some(status) => status.success(),
            None => panic!(
                "leasehold did not exit within {limit:?} after SIGTERM; log:\n{}",
                self.log().join("\n")
            ),
        }
    }

    /// Waits (up to `limit`) for the process to exit on its own; panics naming `what` and the
    /// last log lines if it does not.
    pub async fn wait_exit(&mut self, what: &str, limit: Duration) -> ExitStatus {
        let child = &mut self.child;
        let exited = crate::wait::poll_until(what, limit, Duration::from_millis(20), || {
            std::future::ready(child.try_wait().ok().flatten())
        })
        .await;
        match exited {
            Ok(status) => status,
            Err(e) => panic!(
                "{e}; last lines: {:?}",
                self.log().iter().rev().take(10).collect::<Vec<_>>()
            ),
        }
    }

    /// Sends SIGTERM and waits (up to `limit`) for the process to exit: its exit status, or
    /// `None` when it had to be killed (SIGKILL) after the limit.
    pub async fn stop(&mut self, limit: Duration) -> Option<ExitStatus> {
        let _ = self.signal("-TERM");
        let child = &mut self.child;
        let exited = crate::wait::poll_until("exit", limit, Duration::from_millis(20), || {
            std::future::ready(child.try_wait().ok().flatten())
        })
        .await;
        match exited {
            Ok(status) => Some(status),
            Err(_) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                None
            }
        }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        // A failing test shows what each of its hosts said last (debug events left out).
        if std::thread::panicking() {
            let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            let said: Vec<&String> = log
                .iter()
                .filter(|l| !l.contains("\"level\":\"DEBUG\""))
                .collect();
            let from = said.len().saturating_sub(LAST_WORDS);
            eprintln!(
                "--- the last {} log lines of leasehold pid {} ---",
                said.len() - from,
                self.child.id()
            );
            for line in &said[from..] {
                eprintln!("{line}");
            }
            // All of it, debug events included, where the developer asked for it.
            if let Some(dir) = std::env::var_os("LEASEHOLD_TEST_LOG_DIR") {
                let path = Path::new(&dir).join(format!("leasehold-{}.log", self.child.id()));
                if std::fs::write(&path, log.join("\n")).is_ok() {
                    eprintln!("--- its whole log: {} ---", path.display());
                }
            }
        }
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Collects the lines `reader` yields (a child's piped stderr or stdout) on a thread of their
/// own, into a list that grows while the process runs.
pub(crate) fn collect_lines(
    reader: impl std::io::Read + Send + 'static,
) -> Arc<Mutex<Vec<String>>> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    log
}

/// Runs a prepared command to completion; it must exit within 30 s. A blocking wait inside an
/// async test would stall the test's own deadline, so this one carries its own.
pub fn output_within(cmd: Command) -> std::process::Output {
    output_in(cmd, Duration::from_secs(30))
}

/// [`output_within`] with another limit (commands that build or start containers).
pub fn output_in(mut cmd: Command, limit: Duration) -> std::process::Output {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(cmd.output()));
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{program} did not exit within {limit:?}"))
        .expect("running the command")
}

/// Runs `{binary} trigger JOB --period PERIOD --redis-url URL` (without `LEASEHOLD_REDIS_URL`
/// from the environment; within 30 s); panics unless it succeeds, and returns what it printed.
pub fn trigger(binary: &str, redis_url: &str, job: &str, period: &str) -> String {
    let mut cmd = Command::new(binary);
    cmd.args(["trigger", job, "--period", period, "--redis-url", redis_url])
        .env_remove("LEASEHOLD_REDIS_URL");
    let out = output_within(cmd);
    assert!(
        out.status.success(),
        "trigger failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("trigger prints UTF-8")
}
