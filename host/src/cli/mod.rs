//! The command line (DESIGN §5): `leasehold run`, `check`, `trigger`, `runs`, `pause`,
//! `resume`, `demo`.
//!
//! Exit codes: 0 success; 1 the command failed (bad configuration, unreachable Redis, a
//! component that is refused by `check`); 2 the command line itself is wrong (clap's usage
//! errors).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Timing, parse_size, show_size, validate_node_id};
use crate::keys::JobKeys;
use crate::node::{self, NodeConfig};
use crate::runtime::Runtime;
use crate::spec::{HostLimits, validate_job_name};
use crate::{redis_conn, runs};

/// Leasehold: singleton WebAssembly jobs across replicas, elected through Redis and fenced.
#[derive(Parser, Debug)]
#[command(name = "leasehold", version, about)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "LEASEHOLD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Human,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a replica: campaign for every job in the jobs directory and run the ones it leads.
    Run(Box<RunArgs>),
    /// Validate a job component against the `leasehold:job/job` world and print its spec.
    Check {
        /// The `.wasm` component to check.
        file: PathBuf,
        /// The host limits to check against (the same flags as `leasehold run`).
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Ask for a run of a period now (a period that is already done is not run again; a
    /// failed, missed or skipped one gets a new attempt).
    Trigger(TriggerArgs),
    /// Show who leads each job, the token, lease time left, last and next run (asks a node's
    /// HTTP API).
    Status(StatusArgs),
    /// Exit 0 if a node's `/healthz` (or with `--ready`, `/readyz`) answers 200: for container
    /// health checks without curl.
    Health(HealthArgs),
    /// List a job's runs, newest period first.
    Runs(RunsArgs),
    /// Pause a job: its leader starts no step until it is resumed.
    Pause(JobArgs),
    /// Resume a paused job; periods that fired meanwhile follow its catch-up policy.
    Resume(JobArgs),
    /// Run the reference scenario locally and narrate it: three replicas, the leader frozen
    /// mid-run, a successor with a higher token, the zombie fenced, one report for the day.
    Demo(DemoArgs),
}

/// Flags of `leasehold demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// The reconciliation component (built by `./dev demo`).
    #[arg(
        long,
        default_value = "target/guests/wasm32-wasip2/debug/reconciliation.wasm"
    )]
    pub job: PathBuf,
    /// Use this Redis instead of starting a local `redis-server` (it must not already hold the
    /// demo day).
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Statement lines of the generated day.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=2_000_000))]
    pub rows: u64,
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 500ms, 3s, 1m)"))
}

/// Host limits (README, "Limits"). A job's `describe()` may ask for less than a maximum, never
/// more; a job that asks for nothing gets 64 MiB, 30 s and 1 MiB (or the maximum, if lower).
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Most linear memory a job may use (all its memories together).
    #[arg(long, env = "LEASEHOLD_MAX_MEMORY", value_parser = parse_size, default_value = "512MiB")]
    pub max_memory: u64,
    /// Longest a job's step may run.
    #[arg(long, env = "LEASEHOLD_MAX_STEP_TIME", value_parser = duration, default_value = "10m")]
    pub max_step_time: Duration,
    /// Largest value a job may write in one store.write, and largest checkpoint a step may return.
    #[arg(long, env = "LEASEHOLD_MAX_WRITE_SIZE", value_parser = parse_size, default_value = "16MiB")]
    pub max_write_size: u64,
    /// Largest component file the host reads; bigger files are refused unread.
    #[arg(long, env = "LEASEHOLD_MAX_COMPONENT_SIZE", value_parser = parse_size, default_value = "64MiB")]
    pub max_component_size: u64,
    /// Guest log lines kept per step; the rest are counted and dropped.
    #[arg(long, env = "LEASEHOLD_GUEST_LOG_LINES", default_value_t = 200)]
    pub guest_log_lines: u32,
}

impl LimitArgs {
    /// Validates the limits; every violation is reported at once, naming the flag.
    pub fn host_limits(&self) -> anyhow::Result<HostLimits> {
        let mut bad = Vec::new();
        if self.max_memory < 1 << 20 {
            bad.push(format!(
                "max-memory ({}) must be at least 1 MiB: no component starts in less",
                show_size(self.max_memory)
            ));
        }
        if self.max_step_time < Duration::from_millis(100) {
            bad.push(format!(
                "max-step-time ({}) must be at least 100ms",
                crate::config::show(self.max_step_time)
            ));
        }
        if self.max_write_size < 1 << 10 {
            bad.push(format!(
                "max-write-size ({}) must be at least 1 KiB",
                show_size(self.max_write_size)
            ));
        }
        if self.max_component_size < 64 << 10 {
            bad.push(format!(
                "max-component-size ({}) must be at least 64 KiB",
                show_size(self.max_component_size)
            ));
        }
        if !bad.is_empty() {
            return Err(crate::config::ConfigError { violations: bad }.into());
        }
        Ok(HostLimits::with_maxima(
            self.max_memory,
            self.max_step_time,
            self.max_write_size,
            self.max_component_size,
            self.guest_log_lines,
        ))
    }
}

/// Flags of `leasehold run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Redis URL, e.g. redis://127.0.0.1:6379 or rediss://user:password@host:6380.
    #[arg(
        long,
        env = "LEASEHOLD_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// Directory of job components (`*.wasm`).
    #[arg(long, env = "LEASEHOLD_JOBS_DIR", default_value = "jobs")]
    pub jobs_dir: PathBuf,
    /// Directory of read-only job inputs, one subfolder per job (mounted at /data in the job).
    #[arg(long, env = "LEASEHOLD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// This node's id (A-Z a-z 0-9 . _ -); defaults to the host name.
    #[arg(long, env = "LEASEHOLD_NODE_ID")]
    pub node_id: Option<String>,
    /// Lease time-to-live.
    #[arg(long, env = "LEASEHOLD_LEASE_TTL", value_parser = duration, default_value = "10s")]
    pub lease_ttl: Duration,
    /// Renewal interval; heartbeat × 3 must be less than the lease TTL.
    #[arg(long, env = "LEASEHOLD_HEARTBEAT", value_parser = duration, default_value = "2s")]
    pub heartbeat: Duration,
    /// Safety margin: a leader stops acting this long before its lease could expire
    /// [default: lease-ttl / 10].
    #[arg(long, env = "LEASEHOLD_LEASE_MARGIN", value_parser = duration)]
    pub lease_margin: Option<Duration>,
    /// Bound on every Redis call [default: heartbeat / 2].
    #[arg(long, env = "LEASEHOLD_REDIS_TIMEOUT", value_parser = duration)]
    pub redis_timeout: Option<Duration>,
    /// Directory for compiled job code, owned by the host; must not be inside the jobs
    /// directory [default: $XDG_CACHE_HOME/leasehold or ~/.cache/leasehold].
    #[arg(long, env = "LEASEHOLD_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Address of the HTTP API (e.g. 127.0.0.1:8080) [default: none].
    #[arg(long, env = "LEASEHOLD_HTTP")]
    pub http: Option<std::net::SocketAddr>,
    /// Bearer token that the HTTP API's POST endpoints (trigger, pause, resume) require. Prefer
    /// the environment variable: a flag shows in the process list.
    #[arg(long, env = "LEASEHOLD_HTTP_TOKEN", hide_env_values = true)]
    pub http_token: Option<String>,
    /// Host limits.
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Validate the configuration, print it and exit without connecting to anything.
    #[arg(long)]
    pub check_config: bool,
}

/// A job and the Redis it lives in.
#[derive(Args, Debug, Clone)]
pub struct JobArgs {
    /// The job's name.
    pub job: String,
    /// Redis URL.
    #[arg(
        long,
        env = "LEASEHOLD_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
}

/// Flags of `leasehold status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// Address of a node's HTTP API (its `--http`).
    #[arg(long, env = "LEASEHOLD_HTTP", default_value = "127.0.0.1:8080")]
    pub http: String,
    /// Print the JSON of `GET /v1/status` instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `leasehold health`.
#[derive(Args, Debug, Clone)]
pub struct HealthArgs {
    /// Address of the node's HTTP API.
    #[arg(long, env = "LEASEHOLD_HTTP", default_value = "127.0.0.1:8080")]
    pub http: String,
    /// Ask `/readyz` instead of `/healthz`.
    #[arg(long)]
    pub ready: bool,
}

/// Flags of `leasehold runs`.
#[derive(Args, Debug, Clone)]
pub struct RunsArgs {
    /// The job and Redis.
    #[command(flatten)]
    pub job: JobArgs,
    /// Most runs listed.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// One JSON record per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `leasehold trigger`.
#[derive(Args, Debug, Clone)]
pub struct TriggerArgs {
    /// The job's name.
    pub job: String,
    /// The period to run (e.g. 2026-11-27 for a daily job) [default: the current period].
    #[arg(long)]
    pub period: Option<String>,
    /// Redis URL.
    #[arg(
        long,
        env = "LEASEHOLD_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
}

impl RunArgs {
    /// Validates the flags into a [`NodeConfig`]; every timing violation is reported at once.
    pub fn config(&self) -> anyhow::Result<NodeConfig> {
        let node_id = match &self.node_id {
            Some(id) => id.clone(),
            None => hostname(),
        };
        validate_node_id(&node_id)?;
        let timing = Timing::new(
            self.lease_ttl,
            self.heartbeat,
            self.lease_margin,
            self.redis_timeout,
        )?;
        let limits = self.limits.host_limits()?;
        let cache_dir = self.cache_dir.clone().or_else(default_cache_dir);
        if let Some(cache) = &cache_dir {
            let abs =
                |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
            if abs(cache).starts_with(abs(&self.jobs_dir)) {
                anyhow::bail!(
                    "cache-dir {} must not be inside jobs-dir {}: whoever can drop a job there could plant compiled code",
                    cache.display(),
                    self.jobs_dir.display()
                );
            }
        }
        Ok(NodeConfig {
            redis_url: self.redis_url.clone(),
            jobs_dir: self.jobs_dir.clone(),
            data_dir: self.data_dir.clone(),
            cache_dir,
            node_id,
            timing,
            limits,
            http: self.http,
            http_token: match self.http_token.as_deref() {
                Some("") => anyhow::bail!("http-token is empty: set a token or leave it unset"),
                t => t.map(str::to_string),
            },
        })
    }
}

fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("leasehold"))
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_string())
}

/// Installs the tracing subscriber: human or JSON, filtered by `LEASEHOLD_LOG` or `RUST_LOG`
/// (default `info`).
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("LEASEHOLD_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Runs a parsed command line.
pub async fn main(cli: Cli) -> ExitCode {
    crate::redis_conn::install_tls_provider();
    let result = match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Check { file, limits } => check(file, limits).await,
        Command::Trigger(args) => trigger(args).await,
        Command::Runs(args) => list_runs(args).await,
        Command::Status(args) => status(args).await,
        Command::Health(args) => health(args).await,
        Command::Pause(args) => set_paused(args, true).await,
        Command::Resume(args) => set_paused(args, false).await,
        Command::Demo(args) => {
            crate::demo::run(crate::demo::DemoOptions {
                job: args.job,
                redis_url: args.redis_url,
                rows: args.rows as usize,
            })
            .await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let cfg = args.config()?;
    if args.check_config {
        let opt = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "none".into())
        };
        let t = &cfg.timing;
        let l = &cfg.limits;
        println!("configuration ok");
        println!("node-id:     {}", cfg.node_id);
        println!("redis-url:   {}", redis_conn::redact(&cfg.redis_url));
        println!("jobs-dir:    {}", cfg.jobs_dir.display());
        println!("data-dir:    {}", opt(&cfg.data_dir));
        println!("cache-dir:   {}", opt(&cfg.cache_dir));
        println!(
            "timings:     lease-ttl {}, heartbeat {}, lease-margin {}, redis-timeout {}",
            crate::config::show(t.lease_ttl),
            crate::config::show(t.heartbeat),
            crate::config::show(t.margin),
            crate::config::show(t.redis_timeout)
        );
        println!(
            "limits:      memory {}, step time {}, write {}, component {}, guest log lines {}",
            show_size(l.memory.1),
            crate::config::show(l.step_time.1),
            show_size(l.write_bytes.1),
            show_size(l.component_bytes),
            l.log_lines
        );
        println!(
            "http:        {}{}",
            cfg.http
                .map(|a| a.to_string())
                .unwrap_or_else(|| "off".into()),
            if cfg.http_token.is_some() {
                " (POST endpoints need the bearer token)"
            } else {
                ""
            }
        );
        return Ok(());
    }
    node::run(cfg, shutdown_signal()?).await
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed at once (not when the future is
/// first polled), so a signal during start-up still shuts down in order instead of killing the
/// process.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

async fn check(file: PathBuf, limits: LimitArgs) -> anyhow::Result<()> {
    let runtime = Runtime::new(limits.host_limits()?)?;
    let job = runtime
        .load(&file)
        .await
        .map_err(|e| anyhow::anyhow!("{} is refused: {}", e.path.display(), e.reason))?;
    println!("{} is a valid leasehold job", file.display());
    println!("{}", job.spec);
    println!("component:  {}", job.hash);
    if let Some(hash) = &job.sidecar {
        println!(
            "sidecar:    {} ({hash})",
            crate::runtime::sidecar_of(&file).display()
        );
    }
    let now = chrono::Utc::now();
    if let Some(p) = job.spec.schedule.current(now) {
        println!(
            "current:    period {} (fired {})",
            p.id,
            p.fire.to_rfc3339()
        );
    }
    if let Some(p) = job.spec.schedule.next(now) {
        println!("next:       period {} at {}", p.id, p.fire.to_rfc3339());
    }
    Ok(())
}

async fn connect_cli(url: &str) -> anyhow::Result<redis::aio::ConnectionManager> {
    redis_conn::connect(url, Duration::from_secs(2), Some(Duration::from_secs(5))).await
}

async fn trigger(args: TriggerArgs) -> anyhow::Result<()> {
    validate_job_name(&args.job)?;
    let Some(period) = args.period else {
        anyhow::bail!(
            "--period is required (e.g. --period 2026-11-27); POST /v1/jobs/{}/runs without a period asks for the current one",
            args.job
        );
    };
    runs::validate_period_shape(&period)?;
    let mut conn = connect_cli(&args.redis_url).await?;
    let keys = JobKeys::new(&args.job);
    let done = runs::trigger(&mut conn, &keys, &period).await?;
    println!("{}", done.describe(&args.job, &period));
    Ok(())
}

async fn set_paused(args: JobArgs, paused: bool) -> anyhow::Result<()> {
    validate_job_name(&args.job)?;
    let mut conn = connect_cli(&args.redis_url).await?;
    let reason = format!(
        "paused with the CLI on {} at {}",
        hostname(),
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    runs::set_paused(
        &mut conn,
        &JobKeys::new(&args.job),
        paused.then_some(reason.as_str()),
    )
    .await?;
    if paused {
        println!(
            "{} paused: its leader starts no step until `leasehold resume {}`",
            args.job, args.job
        );
    } else {
        println!("{} resumed", args.job);
    }
    Ok(())
}

async fn list_runs(args: RunsArgs) -> anyhow::Result<()> {
    let job = &args.job.job;
    validate_job_name(job)?;
    let mut conn = connect_cli(&args.job.redis_url).await?;
    let records = runs::history(&mut conn, &JobKeys::new(job), args.limit.max(1)).await?;
    if args.json {
        for r in &records {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(());
    }
    if records.is_empty() {
        println!("{job} has no runs");
        return Ok(());
    }
    println!(
        "{:<20} {:<8} {:>4} {:>7} {:<12} {:<24} {:<24} ERROR",
        "PERIOD", "STATUS", "STEP", "ATTEMPT", "NODE", "STARTED", "FINISHED"
    );
    for r in records {
        let error = match (&r.failure, &r.error) {
            (Some(kind), Some(e)) => format!("{kind:?}: {e}"),
            (None, Some(e)) => e.clone(),
            _ => String::new(),
        };
        let mut error: String = error.chars().take(80).collect();
        if let Some(at) = &r.retry_at {
            error = format!("retry at {at}; {error}");
        }
        println!(
            "{:<20} {:<8} {:>4} {:>7} {:<12} {:<24} {:<24} {}",
            r.period,
            r.status.as_str(),
            r.step,
            r.attempt,
            r.node,
            r.started_at,
            r.finished_at.as_deref().unwrap_or("-"),
            error
        );
    }
    Ok(())
}

/// `GET path` on a node's HTTP API (plain HTTP/1.1): the status code and the body.
async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| anyhow::anyhow!("{addr} did not answer within 10s"))?
        .map_err(|e| anyhow::anyhow!("cannot reach the node's HTTP API at {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("{addr} sent no HTTP answer"))?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{addr} sent no HTTP status"))?;
    Ok((code, body.to_string()))
}

async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let (code, body) = http_get(&args.http, "/v1/status").await?;
    anyhow::ensure!(
        code == 200,
        "GET /v1/status on {} answered {code}: {body}",
        args.http
    );
    if args.json {
        println!("{body}");
        return Ok(());
    }
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    println!("node {}", s(&v["node"]));
    println!(
        "{:<24} {:<10} {:<16} {:<18} {:>10}  {:<30} NEXT RUN",
        "JOB", "STATE", "LEADER", "TOKEN", "LEASE LEFT", "LAST RUN"
    );
    for j in v["jobs"].as_array().into_iter().flatten() {
        let left = j["lease_ms_left"]
            .as_u64()
            .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
            .unwrap_or_else(|| "-".into());
        let last = match &j["last_run"] {
            serde_json::Value::Null => "-".to_string(),
            r => format!("{} {}", s(&r["period"]), s(&r["status"])),
        };
        let next = match &j["next_run"] {
            serde_json::Value::Null => "-".to_string(),
            r => format!("{} at {}", s(&r["period"]), s(&r["at"])),
        };
        let state = if j["paused"] == true {
            format!("{} (paused)", s(&j["state"]))
        } else {
            s(&j["state"])
        };
        println!(
            "{:<24} {:<10} {:<16} {:<18} {:>10}  {:<30} {}",
            s(&j["job"]),
            state,
            s(&j["leader"]),
            s(&j["token"]),
            left,
            last,
            next
        );
    }
    let refused = v["refused"].as_array().cloned().unwrap_or_default();
    if !refused.is_empty() {
        println!("refused files:");
        for r in refused {
            println!("  {}: {}", s(&r["file"]), s(&r["reason"]));
        }
    }
    Ok(())
}

async fn health(args: HealthArgs) -> anyhow::Result<()> {
    // A listen address of 0.0.0.0 is reached on the loopback address.
    let addr = args.http.replace("0.0.0.0", "127.0.0.1");
    let path = if args.ready { "/readyz" } else { "/healthz" };
    let (code, body) = http_get(&addr, path).await?;
    anyhow::ensure!(code == 200, "{path} answered {code}: {}", body.trim());
    println!("{}", body.trim());
    Ok(())
}
