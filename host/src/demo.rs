//! `leasehold demo`: the reference scenario of the design brief, run locally and narrated.
//!
//! Three replicas of the reconciliation service (real `leasehold run` processes started from
//! this binary) share one Redis. One leads the daily reconciliation of a generated day; the demo
//! freezes it mid-run (SIGSTOP), a follower takes over with a higher token and resumes from the
//! last checkpoint, the frozen leader wakes and steps down, a write carrying its old token is
//! refused by the fence, and exactly one report exists for the day.
//!
//! The demo reads the replicas' JSON logs to follow what happens; it never sleeps a fixed time
//! to "let things settle": every wait is for an event, with a deadline.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use redis::AsyncCommands;
use serde_json::Value;

use crate::fence::{self, FenceError};
use crate::keys::JobKeys;
use crate::runs::{self, RunStatus};

/// The day the demo reconciles.
pub const DEMO_PERIOD: &str = "2026-11-27";
const JOB: &str = "reconciliation";
const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
const TTL: &str = "2s";
const HEARTBEAT: &str = "500ms";
const WAIT: Duration = Duration::from_secs(120);

/// Options of `leasehold demo`.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// The reconciliation component.
    pub job: PathBuf,
    /// Use this Redis instead of starting one (it must not hold the demo day already).
    pub redis_url: Option<String>,
    /// Statement lines of the generated day.
    pub rows: usize,
}

struct Replica {
    node: &'static str,
    child: Child,
    log: PathBuf,
}

impl Replica {
    fn events(&self) -> Vec<Value> {
        let Ok(f) = File::open(&self.log) else {
            return Vec::new();
        };
        BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str(&l).ok())
            .collect()
    }

    /// The first event whose message starts with `prefix`.
    fn find(&self, prefix: &str) -> Option<Value> {
        self.events()
            .into_iter()
            .find(|e| e["message"].as_str().is_some_and(|m| m.starts_with(prefix)))
    }

    fn count(&self, message: &str) -> usize {
        self.events()
            .iter()
            .filter(|e| e["message"] == message)
            .count()
    }

    fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill {sig} {} failed", self.child.id());
        }
        Ok(())
    }
}

struct Demo {
    started: Instant,
    dir: PathBuf,
    replicas: Vec<Replica>,
    redis: Option<Child>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        for r in &mut self.replicas {
            let _ = Command::new("kill")
                .args(["-CONT", &r.child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
        if let Some(redis) = &mut self.redis {
            let _ = redis.kill();
            let _ = redis.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Demo {
    fn say(&self, text: &str) {
        let t = self.started.elapsed().as_secs_f64();
        println!("[{t:6.2}s] {text}");
    }

    /// Waits until `probe` finds something, or fails naming `what`.
    async fn until<T>(
        &self,
        what: &str,
        mut probe: impl FnMut(&Self) -> Option<T>,
    ) -> anyhow::Result<T> {
        let start = Instant::now();
        loop {
            if let Some(v) = probe(self) {
                return Ok(v);
            }
            if start.elapsed() > WAIT {
                bail!("timed out after {}s waiting for {what}", WAIT.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn leader(&self, except: Option<usize>) -> Option<(usize, u64, String)> {
        self.replicas
            .iter()
            .enumerate()
            .rev()
            .filter(|(i, _)| Some(*i) != except)
            .find_map(|(i, r)| {
                r.events()
                    .into_iter()
                    .rfind(|e| e["message"] == "became leader")
                    .map(|e| {
                        (
                            i,
                            e["token"].as_u64().unwrap_or(0),
                            e["owner"].as_str().unwrap_or("").to_string(),
                        )
                    })
            })
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn start_redis(dir: &Path) -> anyhow::Result<(Child, String)> {
    let port = free_port()?;
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start redis-server (install it, or pass --redis-url)")?;
    let url = format!("redis://127.0.0.1:{port}");
    let client = redis::Client::open(url.as_str())?;
    let start = Instant::now();
    loop {
        if let Ok(mut c) = client.get_multiplexed_async_connection().await
            && redis::cmd("PING")
                .query_async::<String>(&mut c)
                .await
                .is_ok()
        {
            return Ok((child, url));
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("redis-server on port {port} did not answer within 10s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the demo; prints the narration on stdout.
pub async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    if !opts.job.is_file() {
        bail!(
            "the reconciliation component {} does not exist: build the guests first (`./dev demo` does), or pass --job",
            opts.job.display()
        );
    }
    let dir = std::env::temp_dir().join(format!("leasehold-demo-{}", uuid::Uuid::new_v4()));
    let day = dir.join("data").join(JOB).join(DEMO_PERIOD);
    std::fs::create_dir_all(&day)?;
    std::fs::create_dir_all(dir.join("jobs"))?;
    let mut demo = Demo {
        started: Instant::now(),
        dir: dir.clone(),
        replicas: Vec::new(),
        redis: None,
    };
    std::fs::copy(&opts.job, dir.join("jobs").join("reconciliation.wasm"))
        .with_context(|| format!("copying {}", opts.job.display()))?;

    let date = recon_core::parse_date(DEMO_PERIOD).expect("valid demo date");
    let generated = recon_core::generate_on(opts.rows, 2026, date);
    std::fs::write(day.join("bank.csv"), &generated.bank_csv)?;
    std::fs::write(day.join("ledger.csv"), &generated.ledger_csv)?;

    let url = match &opts.redis_url {
        Some(u) => u.clone(),
        None => {
            let (child, url) = start_redis(&dir).await?;
            demo.redis = Some(child);
            url
        }
    };
    let mut conn =
        crate::redis_conn::connect(&url, Duration::from_secs(2), Some(Duration::from_secs(10)))
            .await?;
    let keys = JobKeys::new(JOB);
    if runs::read(&mut conn, &keys, DEMO_PERIOD).await?.is_some() {
        bail!(
            "{} already has a run of {JOB} for {DEMO_PERIOD}; give the demo an empty database",
            crate::redis_conn::redact(&url)
        );
    }
    demo.say(&format!("Redis at {}. The day to reconcile: {DEMO_PERIOD}, a generated bank statement of {} lines against a ledger of {}.",
        crate::redis_conn::redact(&url), generated.expected.bank_lines, generated.expected.ledger_lines));

    let exe = std::env::current_exe().context("locating the leasehold binary")?;
    for node in NODES {
        let log = dir.join(format!("{node}.log"));
        let child = Command::new(&exe)
            .args([
                "run",
                "--redis-url",
                &url,
                "--node-id",
                node,
                "--lease-ttl",
                TTL,
                "--heartbeat",
                HEARTBEAT,
            ])
            .arg("--jobs-dir")
            .arg(dir.join("jobs"))
            .arg("--data-dir")
            .arg(dir.join("data"))
            .env("LEASEHOLD_LOG_FORMAT", "json")
            .env("LEASEHOLD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()
            .context("starting a replica")?;
        demo.replicas.push(Replica { node, child, log });
    }
    demo.say(&format!("Started three replicas of the reconciliation service: {}. Lease {TTL}, renewed every {HEARTBEAT}.", NODES.join(", ")));

    let (a, token_a, owner_a) = demo.until("a leader", |d| d.leader(None)).await?;
    let name_a = demo.replicas[a].node;
    demo.say(&format!("{name_a} won the election: it leads `{JOB}` with fencing token {token_a}. The others follow."));

    let requested = runs::request(&mut conn, &keys, DEMO_PERIOD).await?;
    debug_assert!(requested);
    demo.say(&format!("Asked for the reconciliation of {DEMO_PERIOD} (what `leasehold trigger {JOB} --period {DEMO_PERIOD}` does)."));

    demo.until("three steps on the leader", |d| {
        (d.replicas[a].count("step done") >= 3).then_some(())
    })
    .await?;
    demo.say(&format!("{name_a} finished steps 0 to 2; after each one the host saved the run's state as a fenced checkpoint."));
    demo.replicas[a].signal("-STOP")?;
    demo.say(&format!("Freezing {name_a} with SIGSTOP in the middle of its next step, as a long GC pause or a stalled VM would."));

    let (b, token_b, _) = demo.until("a new leader", |d| d.leader(Some(a))).await?;
    let name_b = demo.replicas[b].node;
    demo.say(&format!("{name_a}'s lease expired; {name_b} took over with token {token_b} (> {token_a}). Taking the lease raised the fence to {token_b}: from now on Redis refuses any write of an older term."));
    let resumed = demo
        .until("the successor to resume", |d| {
            d.replicas[b].find("resuming run from its checkpoint")
        })
        .await?;
    demo.say(&format!("{name_b} resumes the run at step {} from the checkpoint {name_a} wrote with token {token_a}; nothing done is redone.", resumed["step"]));

    demo.replicas[a].signal("-CONT")?;
    demo.say(&format!(
        "Waking {name_a}. It still believes it is running a step of term {token_a}."
    ));
    let stopped = demo
        .until("the zombie to step down", |d| {
            d.replicas[a].find("stopped leading")
        })
        .await?;
    let abandoned = demo.replicas[a].find("step abandoned").is_some();
    demo.say(&format!(
        "{name_a} checked its local lease deadline on waking and found it passed: {}it wrote nothing and stepped down ({}).",
        if abandoned { "the host interrupted the guest mid-step, " } else { "" },
        stopped["message"].as_str().unwrap_or("stopped leading")
    ));

    // The last line of defence: a zombie whose clock did not tell it (a clock jump, a pause
    // between its check and its write) reaches Redis with its old token.
    let zombie_write = fence::write(
        &mut conn,
        &keys,
        &owner_a,
        token_a,
        &[(
            keys.data(&format!("report/{DEMO_PERIOD}")),
            b"stale result from the zombie".as_slice(),
        )],
    )
    .await;
    match zombie_write {
        Err(FenceError::Refused(r)) => demo.say(&format!(
            "Had {name_a} not noticed (a clock that jumped, a pause between its check and its write), its write would carry token {token_a}. Sending exactly that write to Redis: refused — {r}."
        )),
        Ok(()) => bail!("the fence accepted a write with the old token {token_a}: this is a bug"),
        Err(e) => return Err(anyhow!(e).context("sending the zombie's write")),
    }

    let start = Instant::now();
    let done = loop {
        if let Some(r) = runs::read(&mut conn, &keys, DEMO_PERIOD).await?
            && r.status == RunStatus::Done
        {
            break r;
        }
        if start.elapsed() > WAIT {
            bail!("the run did not finish within {}s", WAIT.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let done_node = crate::elector::owner_node(&done.node).to_string();
    demo.say(&format!(
        "{done_node} finished the run: {} steps, run record `done` written with token {}.",
        done.step, done.token
    ));

    let summary: Option<String> = conn
        .get(keys.data(&format!("report/{DEMO_PERIOD}")))
        .await?;
    let summary: Value =
        serde_json::from_str(&summary.ok_or_else(|| anyhow!("no report for {DEMO_PERIOD}"))?)?;
    let totals: recon_core::Totals = serde_json::from_value(summary["totals"].clone())?;
    let text: Option<String> = conn
        .get(keys.data(&format!("report/{DEMO_PERIOD}/text")))
        .await?;
    println!();
    for line in text.unwrap_or_default().lines().take(14) {
        println!("    {line}");
    }
    println!();
    if totals != generated.expected {
        bail!("the report's totals differ from the generated day's expected totals");
    }
    demo.say(&format!(
        "Summary: {name_a} led with token {token_a} and was frozen; {name_b} took over with token {token_b} and resumed from the checkpoint; the zombie's write was refused by the fence. Exactly one report exists for {DEMO_PERIOD}, and its totals match the expected ones."
    ));

    for r in &demo.replicas {
        let _ = r.signal("-TERM");
    }
    for r in &mut demo.replicas {
        let _ = r.child.wait();
    }
    Ok(())
}
