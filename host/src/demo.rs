//! `leasehold demo`: the reference scenario (README, first lines), run locally and narrated.
//!
//! Three replicas of the reconciliation service (real `leasehold run` processes started from
//! this binary) share one Redis. One leads the daily reconciliation of a generated day; the demo
//! freezes it mid-run (SIGSTOP), a follower takes over with a higher token and resumes from the
//! last checkpoint, the frozen leader wakes and steps down, a write carrying its old token is
//! refused by the fence, and exactly one report exists for the day. The fence beyond Redis
//! ([`effects`]): where PostgreSQL is installed, the demo starts one of its own, the successor's
//! term books the report there and the frozen leader's late transaction is refused by the
//! database's own fence; and a fenced HTTP receiver (a payment provider's stand-in) accepts the
//! successor's request and refuses the frozen leader's late one by its token.
//!
//! The demo reads the replicas' JSON logs to follow what happens; it never sleeps a fixed time
//! to "let things settle": every wait is for an event, with a deadline.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use leasehold_harness::fixtures::{self, Totals};
use leasehold_harness::{HostProcess, RedisConfig, RedisServer, TempDir, poll_until};
use redis::AsyncCommands;
use serde_json::Value;

use leasehold::coord::fence::{self, FenceError};
use leasehold::coord::term_store::Store;
use leasehold::exec::runs::{self, RunStatus};
use leasehold::store::keys::JobKeys;

mod effects;

/// The day the demo reconciles.
pub(crate) const DEMO_PERIOD: &str = "2026-11-27";
const JOB: &str = "reconciliation";
const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
const TTL: &str = "2s";
const HEARTBEAT: &str = "500ms";
const WAIT: Duration = Duration::from_secs(120);

/// Options of `leasehold demo`.
#[derive(Clone, Debug)]
pub(crate) struct DemoOptions {
    /// The reconciliation component.
    pub job: PathBuf,
    /// Use this Redis instead of starting one (it must not hold the demo day already).
    pub redis_url: Option<String>,
    /// Statement lines of the generated day.
    pub rows: usize,
}

/// One replica: a `leasehold run` process (the harness's [`HostProcess`]: JSON logs kept in
/// memory, signals, woken and killed on drop).
struct Replica {
    node: &'static str,
    host: HostProcess,
}

impl Replica {
    fn events(&self) -> Vec<Value> {
        self.host
            .log()
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
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
}

/// The demo's processes and files; dropped in this order: the replicas (woken and killed), the
/// Redis the demo started, then the working directory.
struct Demo {
    started: Instant,
    replicas: Vec<Replica>,
    redis: Option<RedisServer>,
    dir: TempDir,
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
        let found = poll_until(what, WAIT, Duration::from_millis(20), || {
            std::future::ready(probe(self))
        })
        .await?;
        Ok(found)
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

/// Runs the demo; prints the narration on stdout.
pub(crate) async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    if !opts.job.is_file() {
        bail!(
            "the reconciliation component {} does not exist: build the guests first (`./dev demo` does), or pass --job",
            opts.job.display()
        );
    }
    let mut demo = Demo {
        started: Instant::now(),
        replicas: Vec::new(),
        redis: None,
        dir: TempDir::create("leasehold-demo")?,
    };
    let (jobs, data) = (demo.dir.join("jobs"), demo.dir.join("data"));
    std::fs::create_dir_all(&jobs)?;
    std::fs::copy(&opts.job, jobs.join("reconciliation.wasm"))
        .with_context(|| format!("copying {}", opts.job.display()))?;

    let generated = fixtures::write_generated_day(&data, JOB, DEMO_PERIOD, opts.rows, 2026)?;

    let url = match &opts.redis_url {
        Some(u) => u.clone(),
        None => {
            let redis = RedisServer::try_start_with(RedisConfig::new().dir(demo.dir.path()))
                .await
                .context("cannot start redis-server (install it, or pass --redis-url)")?;
            let url = redis.url();
            demo.redis = Some(redis);
            url
        }
    };
    let mut conn = leasehold::store::Conn::connect(
        &url,
        Duration::from_secs(2),
        Some(Duration::from_secs(10)),
    )
    .await?;
    // Operators' writes (the demo's trigger) go through the store, as the CLI's do.
    let store = Store::open(&url, Duration::from_secs(10)).await?;
    let keys = JobKeys::new(JOB);
    if runs::read(&mut conn, &keys, DEMO_PERIOD).await?.is_some() {
        bail!(
            "{} already has a run of {JOB} for {DEMO_PERIOD}; give the demo an empty database",
            leasehold::store::redact(&url)
        );
    }
    demo.say(&format!("Redis at {}. The day to reconcile: {DEMO_PERIOD}, a generated bank statement of {} lines against a ledger of {}.",
        leasehold::store::redact(&url), generated.expected.bank_lines, generated.expected.ledger_lines));

    let exe = std::env::current_exe().context("locating the leasehold binary")?;
    for node in NODES {
        let mut args: Vec<OsString> = [
            "run",
            "--redis-url",
            &url,
            "--node-id",
            node,
            "--lease-ttl",
            TTL,
            "--heartbeat",
            HEARTBEAT,
            "--jobs-dir",
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        args.push(jobs.clone().into());
        args.push("--data-dir".into());
        args.push(data.clone().into());
        let host = HostProcess::try_start(&exe, &args, &[("LEASEHOLD_LOG", "info")])
            .context("starting a replica")?;
        demo.replicas.push(Replica { node, host });
    }
    demo.say(&format!("Started three replicas of the reconciliation service: {}. Lease {TTL}, renewed every {HEARTBEAT}.", NODES.join(", ")));

    let (a, token_a, owner_a) = demo.until("a leader", |d| d.leader(None)).await?;
    let name_a = demo.replicas[a].node;
    demo.say(&format!("{name_a} won the election: it leads `{JOB}` with fencing token {token_a}. The others follow."));

    let requested = runs::request(&store, &keys, DEMO_PERIOD).await?;
    debug_assert!(requested);
    demo.say(&format!("Asked for the reconciliation of {DEMO_PERIOD} (what `leasehold trigger {JOB} --period {DEMO_PERIOD}` does)."));

    demo.until("three steps on the leader", |d| {
        (d.replicas[a].count("step done") >= 3).then_some(())
    })
    .await?;
    demo.say(&format!("{name_a} finished steps 0 to 2; after each one the host saved the run's state as a fenced checkpoint."));
    demo.replicas[a].host.signal("-STOP")?;
    demo.say(&format!("Freezing {name_a} with SIGSTOP in the middle of its next step, as a long GC pause or a stalled VM would."));

    let (b, token_b, owner_b) = demo.until("a new leader", |d| d.leader(Some(a))).await?;
    let name_b = demo.replicas[b].node;
    demo.say(&format!("{name_a}'s lease expired; {name_b} took over with token {token_b} (> {token_a}). Taking the lease raised the fence to {token_b}: from now on Redis refuses any write of an older term."));
    let resumed = demo
        .until("the successor to resume", |d| {
            d.replicas[b].find("resuming run from its checkpoint")
        })
        .await?;
    demo.say(&format!("{name_b} resumes the run at step {} from the checkpoint {name_a} wrote with token {token_a}; nothing done is redone.", resumed["step"]));

    demo.replicas[a].host.signal("-CONT")?;
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
    let zombie_write = fence::unchecked::write(
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

    if leasehold_harness::postgres::available() {
        effects::postgres_scene(
            &demo,
            (name_a, token_a, &owner_a),
            (name_b, token_b, &owner_b),
        )
        .await?;
    } else {
        demo.say("PostgreSQL is not installed here, so the scene of the fence inside a database is skipped (`./dev setup` installs it).");
    }
    effects::http_scene(
        &demo,
        (name_a, token_a, &owner_a),
        (name_b, token_b, &owner_b),
    )
    .await?;

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
    let done_node = leasehold::coord::elector::owner_node(&done.node).to_string();
    demo.say(&format!(
        "{done_node} finished the run: {} steps, run record `done` written with token {}.",
        done.step, done.token
    ));

    let summary: Option<String> = conn
        .get(keys.data(&format!("report/{DEMO_PERIOD}")))
        .await?;
    let summary: Value =
        serde_json::from_str(&summary.ok_or_else(|| anyhow!("no report for {DEMO_PERIOD}"))?)?;
    let totals: Totals = serde_json::from_value(summary["totals"].clone())?;
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
        let _ = r.host.signal("-TERM");
    }
    for r in &mut demo.replicas {
        r.host.stop(WAIT).await;
    }
    Ok(())
}
