//! Leasehold's benchmarks (the targets and the table: BENCHMARKS.md). One command, one table:
//!
//! ```text
//! cargo bench --bench leasehold                      # everything, about an hour and a half
//! cargo bench --bench leasehold -- --only failover   # one section (failover, handover,
//!                                                    # write, batch, guest, recon, scale,
//!                                                    # fast, scale10k, cluster, tasks,
//!                                                    # fanout, cold, python, sql, stores,
//!                                                    # etcd, http, console)
//! cargo bench --bench leasehold -- --trials 5 --rows 200000 --jobs 300 --quiet-secs 60
//! ```
//!
//! It starts what it needs through the `leasehold-harness` crate, as the integration tests do:
//! `redis-server`s of its own, real `leasehold` processes (the release binary), and, as its
//! first step, the job components built with `--release` for wasm32-wasip2. Every row puts our
//! figure beside its target and, where one can be measured in the same run, its reference.
//! Figures are wall-clock times on the machine that runs it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use leasehold::coord::term::Term;
use leasehold::exec::runtime::{RunInfo, Runtime, StepContext, StepOutcome};
use leasehold::exec::spec::HostLimits;
use leasehold::store::keys::JobKeys;
use leasehold_harness::guests::Profile;
use leasehold_harness::{HostProcess, RedisServer, TempDir, fixtures, poll_until};
use redis::AsyncCommands;

#[path = "leasehold/cluster.rs"]
mod cluster;
#[path = "leasehold/console.rs"]
mod console;
#[path = "leasehold/fanout.rs"]
mod fanout;
#[path = "leasehold/outbound.rs"]
mod outbound;
#[path = "leasehold/scale.rs"]
mod scale;
#[path = "leasehold/sql.rs"]
mod sql;
#[path = "leasehold/stores.rs"]
mod stores;

/// The `leasehold` binary built with this benchmark (the release profile under `cargo bench`).
const LEASEHOLD: &str = env!("CARGO_BIN_EXE_leasehold");

/// One row of the table.
struct Row {
    what: String,
    ours: String,
    reference: String,
    target: String,
    met: Option<bool>,
}

fn row(what: &str, ours: String, reference: &str, target: &str, met: Option<bool>) -> Row {
    let r = Row {
        what: what.into(),
        ours,
        reference: reference.into(),
        target: target.into(),
        met,
    };
    eprintln!(
        "  {} | {} | {} | {} | {}",
        r.what,
        r.ours,
        r.reference,
        r.target,
        verdict(r.met)
    );
    r
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "-",
    }
}

struct Options {
    only: Option<String>,
    trials: usize,
    rows: usize,
    jobs: usize,
    quiet: Duration,
}

fn options() -> Options {
    let mut o = Options {
        only: None,
        trials: 20,
        rows: 1_000_000,
        jobs: 1000,
        quiet: Duration::from_secs(600),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = |i: usize| args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--only" => o.only = Some(value(i)),
            "--trials" => o.trials = value(i).parse().expect("--trials N"),
            "--rows" => o.rows = value(i).parse().expect("--rows N"),
            "--jobs" => o.jobs = value(i).parse().expect("--jobs N"),
            "--quiet-secs" => {
                o.quiet = Duration::from_secs(value(i).parse().expect("--quiet-secs N"))
            }
            // `cargo bench` passes `--bench`.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    o
}

/// The release guests, built once, before anything is measured.
fn guests() -> PathBuf {
    leasehold_harness::guests::build(Profile::Release)
        .dir()
        .to_path_buf()
}

/// Copies `src` to `dst` with a modification time in the past, so the host loads it at once.
fn place(src: &Path, dst: &Path) {
    std::fs::copy(src, dst).unwrap();
    let f = std::fs::File::options().write(true).open(dst).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(60))
        .unwrap();
}

/// Minimum, median and 99th percentile (nearest rank) of `v`.
fn summary(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (v[0], rank(0.5), rank(0.99))
}

/// The wall-clock time of a JSON log line.
fn timestamp(line: &str) -> SystemTime {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let t = chrono::DateTime::parse_from_rfc3339(v["timestamp"].as_str().unwrap()).unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_micros(t.timestamp_micros() as u64)
}

/// Polls the async `probe` every 50 ms until it returns `Some`; panics after `limit`.
async fn wait_async<T, F, Fut>(what: &str, limit: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll_until(what, limit, Duration::from_millis(50), probe)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn wait<T, F: FnMut() -> Option<T>>(what: &str, limit: Duration, mut f: F) -> T {
    // Polled every 2 ms: the benchmarks time what they wait for.
    poll_until(what, limit, Duration::from_millis(2), || {
        std::future::ready(f())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Three replicas of the `pulse` job (a run that never ends, one 5 ms step after another).
struct Pulse {
    url: String,
    /// The store the replicas use, as a host reads it (who holds the job).
    store: leasehold::coord::term_store::Store,
    /// The Redis (a server or a cluster) or the etcd cluster the replicas use, kept alive.
    _store: Box<dyn std::any::Any>,
    dir: TempDir,
    hosts: Vec<HostProcess>,
    ttl: &'static str,
    heartbeat: &'static str,
}

impl Pulse {
    async fn start(guests: &Path, ttl: &'static str, heartbeat: &'static str) -> Self {
        let redis = RedisServer::start().await;
        let url = redis.url();
        Self::start_on(guests, url, Box::new(redis), ttl, heartbeat).await
    }

    /// The same on a 3-member etcd cluster of the harness's (`--store etcd://…`).
    async fn start_etcd(guests: &Path, ttl: &'static str, heartbeat: &'static str) -> Self {
        let etcd = leasehold_harness::EtcdCluster::start(3).await;
        let url = etcd.url();
        Self::start_on(guests, url, Box::new(etcd), ttl, heartbeat).await
    }

    /// Three replicas against `url` (`store` keeps its Redis or etcd alive).
    async fn start_on(
        guests: &Path,
        url: String,
        store: Box<dyn std::any::Any>,
        ttl: &'static str,
        heartbeat: &'static str,
    ) -> Self {
        let dir = TempDir::new("bench-pulse");
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::create_dir_all(dir.join("data/benchjob")).unwrap();
        std::fs::write(dir.join("data/benchjob/mode"), "pulse").unwrap();
        place(
            &guests.join("benchjob.wasm"),
            &dir.join("jobs/benchjob.wasm"),
        );
        let seam = leasehold::coord::term_store::Store::open(&url, Duration::from_secs(5))
            .await
            .unwrap();
        let mut p = Pulse {
            url,
            store: seam,
            _store: store,
            dir,
            hosts: Vec::new(),
            ttl,
            heartbeat,
        };
        for i in 0..3 {
            let h = p.host(i);
            p.hosts.push(h);
        }
        // The trials start once every replica serves the job (jobs load in the background).
        for i in 0..3 {
            p.serving(i).await;
        }
        p
    }

    /// Waits until host `i` follows or leads the job: a release notice then finds it
    /// campaigning.
    async fn serving(&self, i: usize) {
        let h = &self.hosts[i];
        wait("a host serving the job", Duration::from_secs(60), || {
            (!h.log_lines_with("\"following\"").is_empty()
                || !h.log_lines_with("became leader").is_empty())
            .then_some(())
        })
        .await;
    }

    fn host(&self, i: usize) -> HostProcess {
        let data = self.dir.join("data");
        let cache = self.dir.join("cache");
        HostProcess::start_node(
            LEASEHOLD,
            &self.url,
            &self.dir.join("jobs"),
            &format!("n{i}"),
            (self.ttl, self.heartbeat),
            &[
                "--data-dir",
                data.to_str().unwrap(),
                "--cache-dir",
                cache.to_str().unwrap(),
            ],
        )
    }

    /// The leading host, once it has completed a step in its term.
    async fn leader(&self) -> usize {
        let start = Instant::now();
        loop {
            let owner = leasehold::coord::term_store::TermStore::holder(&self.store, "benchjob")
                .await
                .ok()
                .flatten();
            if let Some(i) = owner
                .and_then(|o| o.strip_prefix('n').map(|r| r.to_string()))
                .and_then(|r| r.split(':').next().and_then(|n| n.parse::<usize>().ok()))
            {
                let h = &self.hosts[i];
                let led = h
                    .log_lines_with("became leader")
                    .last()
                    .map(|l| timestamp(l));
                let stepped = h
                    .log_lines_with("\"step done\"")
                    .last()
                    .map(|l| timestamp(l));
                if let (Some(l), Some(s)) = (led, stepped)
                    && s > l
                {
                    return i;
                }
            }
            assert!(start.elapsed() < Duration::from_secs(120), "no leader");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Hand-overs to preferred members logged so far (balancing moves the pulse run too).
    fn hand_overs(&self) -> usize {
        self.hosts
            .iter()
            .map(|h| {
                h.log_lines_with("handing over to the job's preferred member")
                    .len()
            })
            .sum()
    }

    /// Stops the leader (SIGKILL, or SIGTERM when `graceful`) and returns the time until
    /// another host starts its first step (logged just before it: "resuming run"); `None`
    /// when a balancing hand-over moved the run meanwhile (the trial is not a failover).
    async fn trial(&mut self, graceful: bool) -> Option<f64> {
        let handed = self.hand_overs();
        let i = self.leader().await;
        let before: Vec<usize> = self
            .hosts
            .iter()
            .map(|h| h.log_lines_with("resuming run from its checkpoint").len())
            .collect();
        let t0 = SystemTime::now();
        if graceful {
            self.hosts[i].terminate(Duration::from_secs(30)).await;
        } else {
            self.hosts[i].kill();
        }
        let limit = Duration::from_secs(60);
        let resumed = wait("the new leader's first step", limit, || {
            self.hosts.iter().enumerate().find_map(|(j, h)| {
                let lines = h.log_lines_with("resuming run from its checkpoint");
                (j != i && lines.len() > before[j]).then(|| timestamp(lines.last().unwrap()))
            })
        })
        .await;
        let ms = resumed.duration_since(t0).unwrap_or_default().as_secs_f64() * 1e3;
        let moved = self.hand_overs() > handed;
        if graceful && ms > 50.0 {
            // What the hosts said around a slow hand-over (steps and writes left out).
            for (j, h) in self.hosts.iter().enumerate() {
                for l in h.log_lines_with("\"timestamp\"") {
                    let at = timestamp(&l);
                    if at + Duration::from_secs(3) > t0
                        && at < resumed + Duration::from_millis(100)
                        && !l.contains("step done")
                        && !l.contains("fenced write")
                        && !l.contains("call finished")
                    {
                        eprintln!("  slow trial, host {j}: {l}");
                    }
                }
            }
        }
        self.hosts[i] = self.host(i);
        self.serving(i).await;
        (!moved).then_some(ms)
    }

    /// `n` trials that were failovers (trials a hand-over disturbed are run again).
    async fn trials(&mut self, n: usize, graceful: bool) -> Vec<f64> {
        let mut v = Vec::new();
        while v.len() < n {
            if let Some(ms) = self.trial(graceful).await {
                v.push(ms);
            }
        }
        v
    }
}

async fn failover(guests: &Path, o: &Options, rows: &mut Vec<Row>) {
    for (ttl, hb, ttl_ms) in [("1s", "200ms", 1000.0), ("10s", "2s", 10_000.0)] {
        eprintln!("crash failover, ttl {ttl}: {} trials", o.trials);
        let mut p = Pulse::start(guests, ttl, hb).await;
        let mut v = p.trials(o.trials, false).await;
        let (min, med, p99) = summary(&mut v);
        rows.push(row(
            &format!(
                "crash failover, ttl {ttl} (SIGKILL → first step), {} trials",
                o.trials
            ),
            format!("min {min:.0} / median {med:.0} / p99 {p99:.0} ms"),
            "client-go 15–24 s; Redisson 30 s; etcd 60 s (defaults)",
            &format!("≤ ttl + 100 ms = {:.0} ms p99", ttl_ms + 100.0),
            Some(p99 <= ttl_ms + 100.0),
        ));
    }
}

/// The crash failover at etcd's smallest practical TTL (1 s as the harness's members grant it)
/// and the graceful hand-over, with three hosts on a 3-member etcd (`--only etcd`): the rows
/// beside the Redis ones above.
async fn etcd_pulse(guests: &Path, o: &Options, rows: &mut Vec<Row>) {
    eprintln!("crash failover on etcd, ttl 1s: {} trials", o.trials);
    let mut p = Pulse::start_etcd(guests, "1s", "200ms").await;
    let mut v = p.trials(o.trials, false).await;
    let (min, med, p99) = summary(&mut v);
    rows.push(row(
        &format!(
            "etcd: crash failover, ttl 1s (SIGKILL → first step), {} trials",
            o.trials
        ),
        format!("min {min:.0} / median {med:.0} / p99 {p99:.0} ms"),
        "Redis, ttl 1s: the row above",
        "stated (etcd revokes a lapsed lease in a loop, about every 500 ms)",
        None,
    ));
    drop(p);
    eprintln!("graceful handover on etcd: {} trials", o.trials);
    let mut p = Pulse::start_etcd(guests, "10s", "2s").await;
    let mut v = p.trials(o.trials, true).await;
    let (min, med, p99) = summary(&mut v);
    rows.push(row(
        &format!(
            "etcd: graceful handover, ttl 10s (SIGTERM → first step), {} trials",
            o.trials
        ),
        format!("min {min:.1} / median {med:.1} / p99 {p99:.1} ms"),
        "Redis: the handover row",
        "stated (no TTL wait)",
        None,
    ));
}

async fn handover(guests: &Path, o: &Options, rows: &mut Vec<Row>) {
    eprintln!("graceful handover: {} trials", o.trials);
    let mut p = Pulse::start(guests, "10s", "2s").await;
    let mut v = p.trials(o.trials, true).await;
    let (min, med, p99) = summary(&mut v);
    rows.push(row(
        &format!(
            "graceful handover, ttl 10s (SIGTERM → first step), {} trials",
            o.trials
        ),
        format!("min {min:.1} / median {med:.1} / p99 {p99:.1} ms"),
        "client-go ReleaseOnCancel 2–4.4 s",
        "≤ 50 ms p99, no TTL wait",
        Some(p99 <= 50.0),
    ));
}

/// One-at-a-time latencies (µs) of plain `SET`s and of fenced writes, 100 B each, to one job's
/// slot, and the rate of each (per second).
pub(crate) struct WriteSamples {
    pub(crate) set: Vec<f64>,
    pub(crate) fenced: Vec<f64>,
    pub(crate) set_rate: f64,
    pub(crate) fenced_rate: f64,
}

/// Takes `job`'s lease over `conn`, then makes `n` plain `SET`s and `n` fenced writes.
pub(crate) async fn write_samples<C>(conn: &mut C, job: &str, n: usize) -> WriteSamples
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    let keys = JobKeys::new(job);
    let leasehold::coord::lease::Acquired::Granted { token } =
        leasehold::coord::lease::acquire(conn, &keys, "bench:1", Duration::from_secs(600))
            .await
            .unwrap()
    else {
        panic!("lease")
    };
    let value = vec![b'x'; 100];
    let mut set = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let _: () = conn.set(keys.data("plain"), &value).await.unwrap();
        set.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let set_rate = n as f64 / start.elapsed().as_secs_f64();
    let key = keys.data("k");
    let mut fenced = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        leasehold::coord::fence::unchecked::write(
            conn,
            &keys,
            "bench:1",
            token,
            &[(key.clone(), value.as_slice())],
        )
        .await
        .unwrap();
        fenced.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let fenced_rate = n as f64 / start.elapsed().as_secs_f64();
    WriteSamples {
        set,
        fenced,
        set_rate,
        fenced_rate,
    }
}

async fn writes(rows: &mut Vec<Row>) {
    eprintln!("fenced write vs SET");
    let redis = RedisServer::start().await;
    let mut c = redis.conn().await;
    let n = 20_000;
    let WriteSamples {
        mut set,
        mut fenced,
        set_rate,
        fenced_rate,
    } = write_samples(&mut c, "bench", n).await;
    let value = vec![b'x'; 100];
    let start = Instant::now();
    for _ in 0..n / 100 {
        let mut pipe = redis::pipe();
        for _ in 0..100 {
            pipe.set("bench:piped", &value).ignore();
        }
        let _: () = pipe.query_async(&mut c).await.unwrap();
    }
    let piped_rate = n as f64 / start.elapsed().as_secs_f64();
    let (_, set_med, set_p99) = summary(&mut set);
    let (_, f_med, f_p99) = summary(&mut fenced);
    rows.push(row(
        "fenced write latency (100 B, one at a time)",
        format!(
            "median {f_med:.0} / p99 {f_p99:.0} µs ({:.2}× SET)",
            f_med / set_med
        ),
        &format!("plain SET median {set_med:.0} / p99 {set_p99:.0} µs"),
        "≤ 1.3 × SET",
        Some(f_med <= 1.3 * set_med),
    ));
    rows.push(row(
        "fenced write throughput (one at a time)",
        format!("{fenced_rate:.0}/s"),
        &format!("SET {set_rate:.0}/s; pipelined SET ×100 {piped_rate:.0}/s"),
        "-",
        None,
    ));
}

/// A step writing 10,000 keys of 100 bytes: one `store.write` each, or one `store.write-many`,
/// beside 10,000 `SET`s in one pipeline.
async fn batch(guests: &Path, rows: &mut Vec<Row>) {
    eprintln!("a step writing 10,000 keys");
    let (redis, runtime, job, ctx) = benchjob(guests).await;
    let rate = |mode: &'static str| {
        let (runtime, job, ctx) = (&runtime, &job, &ctx);
        async move {
            let mut v = Vec::new();
            for _ in 0..5 {
                let t = Instant::now();
                let out = runtime
                    .run_step(job, ctx_clone(ctx, None), &run_info(mode), 0, None)
                    .await;
                assert!(matches!(out, Ok(StepOutcome::Done)), "{mode}: {out:?}");
                v.push(10_000.0 / t.elapsed().as_secs_f64());
            }
            summary(&mut v).1
        }
    };
    let one = rate("write-one").await;
    let many = rate("write-many").await;
    let mut c = redis.conn().await;
    let value = vec![b'x'; 100];
    let mut piped = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut pipe = redis::pipe();
        for i in 0..10_000 {
            pipe.set(format!("bench:piped:{i}"), &value).ignore();
        }
        let _: () = pipe.query_async(&mut c).await.unwrap();
        piped.push(10_000.0 / t.elapsed().as_secs_f64());
    }
    let (_, piped, _) = summary(&mut piped);
    rows.push(row(
        "a step writing 10,000 keys of 100 B (keys per second, median of 5)",
        format!(
            "store.write-many {many:.0}/s ({:.0}× one at a time); store.write one at a time {one:.0}/s",
            many / one
        ),
        &format!("pipelined SET ({:.0}/s, unfenced)", piped),
        "batched ≥ 20 × one at a time",
        Some(many >= 20.0 * one),
    ));
}

/// A Redis, a runtime with the default limits, `benchjob` loaded into it, and a step context
/// for it in a ten-minute term.
async fn benchjob(
    guests: &Path,
) -> (
    RedisServer,
    Runtime,
    leasehold::exec::runtime::LoadedJob,
    StepContext,
) {
    let redis = RedisServer::start().await;
    let runtime = Runtime::new(HostLimits::default()).unwrap();
    let job = runtime
        .load(&guests.join("benchjob.wasm"))
        .await
        .expect("benchjob loads");
    let (ctx, _term) = step_context(&redis, "benchjob").await;
    (redis, runtime, job, ctx)
}

/// A step context for `job` in a term that lasts ten minutes (its writes go to `redis`).
async fn step_context(redis: &RedisServer, job: &str) -> (StepContext, Term) {
    let mut c = redis.conn().await;
    let keys = JobKeys::new(job);
    let leasehold::coord::lease::Acquired::Granted { token } =
        leasehold::coord::lease::acquire(&mut c, &keys, "bench:1", Duration::from_secs(900))
            .await
            .unwrap()
    else {
        panic!("lease")
    };
    let term = Term::new(
        token,
        "bench:1".into(),
        Instant::now() + Duration::from_secs(600),
    );
    let conn = leasehold::store::Conn::connect(
        &redis.url(),
        Duration::from_secs(2),
        Some(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let store =
        leasehold::coord::term_store::Store::redis(leasehold::coord::term_store::RedisTerms::new(
            conn,
            leasehold::store::pubsub_clients(&redis.url()).unwrap(),
            Duration::from_secs(2),
        ));
    let ctx = StepContext::for_step(keys, term.clone(), store, None, "bench");
    (ctx, term)
}

fn ctx_clone(ctx: &StepContext, data_dir: Option<PathBuf>) -> StepContext {
    StepContext {
        keys: ctx.keys.clone(),
        term: ctx.term.clone(),
        store: ctx.store.clone(),
        data_dir,
        work: ctx.work.clone(),
        stderr: Default::default(),
    }
}

fn run_info(period: &str) -> RunInfo {
    RunInfo {
        period: period.into(),
        scheduled_at: String::new(),
        attempt: 1,
    }
}

async fn guest(guests: &Path, rows: &mut Vec<Row>) {
    eprintln!("guest side");
    let (_redis, runtime, job, ctx) = benchjob(guests).await;
    let n = 2000;
    let mut inst = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        runtime.instantiate(&job).await.unwrap();
        inst.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut empty = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let out = runtime
            .run_step(&job, ctx_clone(&ctx, None), &run_info("empty"), 0, None)
            .await;
        assert!(matches!(out, Ok(StepOutcome::Done)), "{out:?}");
        empty.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let on_demand = Runtime::new(HostLimits::default().with_instance_pool(0)).unwrap();
    let job_on_demand = on_demand
        .load(&guests.join("benchjob.wasm"))
        .await
        .expect("benchjob loads");
    let mut inst_on_demand = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        on_demand.instantiate(&job_on_demand).await.unwrap();
        inst_on_demand.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (_, od_med, od_p99) = summary(&mut inst_on_demand);
    let (_, inst_med, inst_p99) = summary(&mut inst);
    let (_, empty_med, empty_p99) = summary(&mut empty);
    let mut loops = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let out = runtime
            .run_step(
                &job,
                ctx_clone(&ctx, None),
                &run_info("still-leader"),
                0,
                None,
            )
            .await;
        assert!(matches!(out, Ok(StepOutcome::Done)), "{out:?}");
        loops.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (_, loop_med, _) = summary(&mut loops);
    let per_call_ns = (loop_med - empty_med) * 1e3 / 1e6;
    rows.push(row(
        "still-leader() from a guest (1,000,000 calls in one step)",
        format!("{per_call_ns:.0} ns per call"),
        "local state, no round trip",
        "< 1 µs",
        Some(per_call_ns < 1000.0),
    ));
    rows.push(row(
        "store + instantiate a job (pre-instantiated, pooling allocator: the default)",
        format!("median {inst_med:.1} / p99 {inst_p99:.1} µs"),
        &format!(
            "on demand (`--instance-pool 0`): median {od_med:.1} / p99 {od_p99:.1} µs; wasmtime pooling: a few µs"
        ),
        "< 10 µs median",
        Some(inst_med < 10.0),
    ));
    rows.push(row(
        "empty step (store, instantiate, call, return)",
        format!("median {empty_med:.0} / p99 {empty_p99:.0} µs"),
        "-",
        "-",
        None,
    ));
}

async fn recon(guests: &Path, o: &Options, rows: &mut Vec<Row>) {
    use recon_core::{
        DEFAULT_TOLERANCE_DAYS, Matcher, Progress, input_fingerprint, missing_in_bank,
        parse_entries, reconcile_chunk,
    };
    eprintln!("reconciliation of {} statement lines", o.rows);
    let period = "2026-11-27";
    let dir = TempDir::new("bench-recon");
    let generated =
        fixtures::write_generated_day(&dir.0, "reconciliation", period, o.rows, 7).unwrap();
    let day = dir.join(&format!("reconciliation/{period}"));
    let redis = RedisServer::start().await;

    // The job's own step budget (the fixture asks for one chunk per step).
    std::fs::remove_file(dir.join("reconciliation/step-budget")).unwrap();
    // Native: one pass over the day with the same recon-core code and the same writes (a part
    // per chunk, then what the bank never showed; plain SET).
    let mut c = redis.conn().await;
    let start = Instant::now();
    {
        let bank_csv = std::fs::read_to_string(day.join("bank.csv")).unwrap();
        let ledger_csv = std::fs::read_to_string(day.join("ledger.csv")).unwrap();
        let bank = parse_entries(&bank_csv, "bank.csv").unwrap();
        let ledger = parse_entries(&ledger_csv, "ledger.csv").unwrap();
        let mut progress = Progress::new(ledger.len());
        progress.fingerprint = input_fingerprint(&bank_csv, &ledger_csv, DEFAULT_TOLERANCE_DAYS);
        let lines = (bank.len() / 16).clamp(4, 20_000);
        let mut matcher = Matcher::new(&ledger, DEFAULT_TOLERANCE_DAYS);
        let mut part = 0;
        while !progress.bank_done(bank.len()) {
            let chunk = reconcile_chunk(&bank, &ledger, &mut matcher, &mut progress, lines);
            let json = serde_json::to_vec(&chunk).unwrap();
            let _: () = c.set(format!("native:part-{part}"), json).await.unwrap();
            part += 1;
        }
        let totals = progress.final_totals(&ledger);
        let missing = missing_in_bank(&ledger, &progress);
        let _: () = c
            .set("native:missing", serde_json::to_vec(&missing).unwrap())
            .await
            .unwrap();
        assert_eq!(totals, generated.expected);
    }
    let native = start.elapsed().as_secs_f64();

    let runtime = Runtime::new(HostLimits::default()).unwrap();
    let job = runtime
        .load(&guests.join("reconciliation.wasm"))
        .await
        .expect("reconciliation loads");
    let (ctx, _term) = step_context(&redis, "reconciliation").await;
    let data = Some(dir.join("reconciliation"));
    let start = Instant::now();
    let mut state: Option<Vec<u8>> = None;
    let mut step = 0u32;
    let wasm_result = loop {
        let out = runtime
            .run_step(
                &job,
                ctx_clone(&ctx, data.clone()),
                &run_info(period),
                step,
                state.as_deref(),
            )
            .await;
        match out {
            Ok(StepOutcome::Continue(s) | StepOutcome::AwaitTasks(s)) => {
                state = Some(s);
                step += 1;
            }
            Ok(StepOutcome::Done) => break Ok(step + 1),
            Err(e) => break Err(e),
        }
    };
    let wasm = start.elapsed().as_secs_f64();
    // The guest's peak linear memory, as the host's metric records it for each step.
    let peak = leasehold::metrics::encode()
        .lines()
        .find(|l| l.starts_with("leasehold_guest_memory_peak_bytes{job=\"reconciliation\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    match wasm_result {
        Ok(steps) => {
            rows.push(row(
                &format!(
                    "reconciliation of {} statement lines end to end on one worker ({steps} steps)",
                    o.rows
                ),
                format!(
                    "wasm {wasm:.1} s ({:.2}× native); peak guest memory {:.0} MiB",
                    wasm / native,
                    peak / f64::from(1u32 << 20)
                ),
                &format!("one native pass (same recon-core code: parse, match, write the parts and what the bank never showed; not the text report) {native:.1} s"),
                "≤ 1.5 × one native pass and ≤ 10 s",
                Some(wasm <= 1.5 * native && wasm <= 10.0),
            ));
        }
        Err(e) => rows.push(row(
            &format!("reconciliation of {} statement lines", o.rows),
            format!("wasm failed at step {step}: {e}"),
            &format!("one native pass {native:.1} s"),
            "≤ 1.5 × one native pass and ≤ 10 s",
            Some(false),
        )),
    }
}

async fn cold(guests: &Path, rows: &mut Vec<Row>) {
    eprintln!("cold start");
    let names = [
        "reconciliation",
        "billing",
        "probe",
        "ticker",
        "stepper",
        "spinner",
        "benchjob",
    ];
    let redis = RedisServer::start().await;
    let dir = TempDir::new("bench-cold");
    let jobs = dir.join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    for n in names {
        place(
            &guests.join(format!("{n}.wasm")),
            &jobs.join(format!("{n}.wasm")),
        );
    }
    let cache = dir.join("cache");
    let mut startup = Vec::new();
    for attempt in 0..3 {
        let t0 = SystemTime::now();
        let mut h = HostProcess::start_node(
            LEASEHOLD,
            &redis.url(),
            &jobs,
            "n1",
            ("10s", "2s"),
            &["--cache-dir", cache.to_str().unwrap()],
        );
        // Jobs load in the background: the node is warm once the last one has loaded.
        let loaded = wait("every job loaded", Duration::from_secs(120), || {
            let lines = h.log_lines_with("loaded job");
            (lines.len() == names.len()).then_some(lines)
        })
        .await;
        let ms = loaded
            .iter()
            .map(|l| timestamp(l).duration_since(t0).unwrap().as_secs_f64() * 1e3)
            .fold(0.0, f64::max);
        let fresh = loaded
            .iter()
            .filter(|l| l.contains("\"compiled\":\"fresh\""))
            .count();
        assert_eq!(fresh, if attempt == 0 { names.len() } else { 0 });
        startup.push(ms);
        h.terminate(Duration::from_secs(30)).await;
    }
    let per_job = |ms: f64| ms / names.len() as f64;
    let cached = startup[1].min(startup[2]);
    rows.push(row(
        &format!(
            "restart with {} cached jobs (process start → the last job loaded)",
            names.len()
        ),
        format!("{cached:.0} ms ({:.0} ms per job)", per_job(cached)),
        &format!(
            "first start, compiling: {:.0} ms ({:.0} ms per job)",
            startup[0],
            per_job(startup[0])
        ),
        "< 50 ms per job",
        Some(per_job(cached) < 50.0),
    ));
}

/// The median time of 30 runs of step 0 of `job` with `data_dir` as its `/data`; each must
/// succeed (`ready`) or fail.
async fn median_step(
    runtime: &Runtime,
    job: &leasehold::exec::runtime::LoadedJob,
    ctx: &StepContext,
    data_dir: &Path,
    ready: bool,
) -> f64 {
    let mut v = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let out = runtime
            .run_step(
                job,
                ctx_clone(ctx, Some(data_dir.to_path_buf())),
                &run_info("2026-12-01"),
                0,
                None,
            )
            .await;
        v.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(out.is_ok(), ready, "{out:?}");
    }
    summary(&mut v).1
}

/// The Python settlement job (componentize-py) beside its Rust twin: size, build, compile,
/// cached load, a step's time, and a refusal before compiling.
async fn python(guests: &Path, rows: &mut Vec<Row>) {
    eprintln!("python");
    let dir = TempDir::new("bench-python");
    let wasm = dir.join("settlement.wasm");
    let t = Instant::now();
    let status = std::process::Command::new(leasehold_harness::componentize_py())
        .current_dir(leasehold_harness::repo_root())
        .args([
            "--quiet",
            "-d",
            "wit/job.wit",
            "-w",
            "job",
            "componentize",
            "app",
        ])
        .args(["-p", "guest-jobs/settlement-py", "-o"])
        .arg(&wasm)
        .status()
        .expect("running componentize-py");
    assert!(status.success(), "componentize-py failed");
    let build_s = t.elapsed().as_secs_f64();
    let size = std::fs::metadata(&wasm).unwrap().len();
    let rust_wasm = guests.join("settlement_rs.wasm");
    let rust_size = std::fs::metadata(&rust_wasm).unwrap().len();
    rows.push(row(
        "Python job (componentize-py 0.25.1): component size, build",
        format!("{:.1} MB, built in {build_s:.1} s", size as f64 / 1e6),
        &format!("the same job in Rust: {:.0} kB", rust_size as f64 / 1e3),
        "-",
        None,
    ));

    // First compile (no cache), then a cache filled and read by a second runtime.
    let cache = dir.join("cache");
    let t = Instant::now();
    let filling = Runtime::new(HostLimits::default())
        .unwrap()
        .with_cache(&cache)
        .unwrap();
    filling.load(&wasm).await.expect("the Python job loads");
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut cached = Vec::new();
    for _ in 0..5 {
        let runtime = Runtime::new(HostLimits::default())
            .unwrap()
            .with_cache(&cache)
            .unwrap();
        let t = Instant::now();
        let job = runtime.load(&wasm).await.expect("the Python job loads");
        cached.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(job.compiled, leasehold::exec::runtime::Compiled::Cached);
    }
    let (_, cached_med, _) = summary(&mut cached);
    rows.push(row(
        "Python job: load from the compiled-code cache (read, describe)",
        format!("median {cached_med:.0} ms"),
        &format!("first compile in this (release) host: {compile_ms:.0} ms"),
        "< 100 ms",
        Some(cached_med < 100.0),
    ));

    // A wrong component is refused before compiling: here, more core instances than allowed.
    let strict = Runtime::new(HostLimits::default().with_counts(4, 64, 64)).unwrap();
    let mut refusals = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let err = strict.load(&wasm).await.err().expect("refused");
        refusals.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(err.reason.contains("--max-instances"), "{}", err.reason);
    }
    let (_, refuse_med, _) = summary(&mut refusals);
    rows.push(row(
        "Python job: refusal of a wrong component (over --max-instances)",
        format!("median {refuse_med:.0} ms, before compiling"),
        &format!(
            "before this release: after the compile, {compile_ms:.0} ms (and 18–28 s in a debug host)"
        ),
        "< 100 ms",
        Some(refuse_med < 100.0),
    ));

    // A step of each: 25 payments settled (step 0), and a step with no input (not-ready:
    // instantiate, call, return an error) for the fixed cost.
    let redis = RedisServer::start().await;
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut csv = String::from("payment_id,merchant,amount_cents\n");
    for i in 0..120 {
        csv.push_str(&format!("p{i:04},m{},{}\n", i % 4, 1000 + i));
    }
    std::fs::write(data.join("payments.csv"), csv).unwrap();
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let runtime = Runtime::new(HostLimits::default())
        .unwrap()
        .with_cache(&cache)
        .unwrap();
    let mut figures = Vec::new();
    for (job_name, file) in [("settlement", &wasm), ("settlement-rs", &rust_wasm)] {
        let job = runtime.load(file).await.expect("loads");
        let (ctx, _term) = step_context(&redis, job_name).await;
        let step = median_step(&runtime, &job, &ctx, &data, true).await;
        let not_ready = median_step(&runtime, &job, &ctx, &empty, false).await;
        figures.push((step, not_ready));
    }
    let [(py_step, py_empty), (rs_step, rs_empty)] = figures[..] else {
        unreachable!()
    };
    rows.push(row(
        "Python job: a step (25 payments settled) / an empty step (no input: not-ready)",
        format!("median {py_step:.1} / {py_empty:.1} ms"),
        &format!("the same job in Rust: {rs_step:.2} / {rs_empty:.2} ms"),
        "-",
        None,
    ));
}

#[tokio::main]
async fn main() {
    let o = options();
    leasehold::store::install_tls_provider();
    let want = |name: &str| o.only.as_deref().is_none_or(|only| only == name);
    // The sql and stores rows need no guest: `--only sql` or `--only stores` builds none.
    let guests = if matches!(o.only.as_deref(), Some("sql" | "stores")) {
        PathBuf::new()
    } else {
        guests()
    };
    let mut rows = Vec::new();
    let started = Instant::now();
    if want("failover") {
        failover(&guests, &o, &mut rows).await;
    }
    if want("handover") {
        handover(&guests, &o, &mut rows).await;
    }
    if want("etcd") {
        etcd_pulse(&guests, &o, &mut rows).await;
    }
    if want("write") {
        writes(&mut rows).await;
    }
    if want("guest") {
        guest(&guests, &mut rows).await;
    }
    if want("recon") {
        recon(&guests, &o, &mut rows).await;
        fanout::reconciliation_failover(&guests, &o, &mut rows).await;
    }
    if want("scale") {
        scale::scale(&guests, o.jobs, &mut rows).await;
    }
    if want("fast") {
        scale::fast(&guests, o.jobs, o.quiet, &mut rows).await;
    }
    if want("scale10k") {
        scale::scale(&guests, 10_000, &mut rows).await;
    }
    if want("batch") {
        batch(&guests, &mut rows).await;
    }
    if want("cluster") {
        cluster::cluster(&guests, &o, &mut rows).await;
    }
    if want("tasks") {
        fanout::tasks(&guests, &mut rows).await;
    }
    if want("fanout") {
        fanout::reconciliation(&guests, &o, &mut rows).await;
    }
    if want("cold") {
        cold(&guests, &mut rows).await;
    }
    if want("python") {
        python(&guests, &mut rows).await;
    }
    if want("sql") {
        sql::sql(&mut rows).await;
    }
    if want("stores") {
        stores::stores(&mut rows).await;
    }
    if want("http") {
        outbound::outbound(&guests, &mut rows).await;
    }
    if want("console") {
        console::console(&guests, &mut rows).await;
    }
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "leasehold benchmarks: {cpus} cores, {} s in all, {}",
        started.elapsed().as_secs(),
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    println!();
    println!("| what | ours | reference (same run) | target | |");
    println!("| --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            r.what,
            r.ours,
            r.reference,
            r.target,
            verdict(r.met)
        );
    }
}
