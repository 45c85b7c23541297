//! The command line: `leasehold run`, `check`, `trigger`, `cancel`, `status`, `health`,
//! `runs`, `pause`, `resume`, `demo`. A module of the binary only: the library does the work.
//!
//! * [`args`] — the commands and flags (clap), with their environment variables;
//! * this file — what each command does;
//! * [`client`] — `status` and `health`, which ask a node's HTTP API;
//! * [`runs`] — `runs`, the run history with each period's earlier attempts and tasks.
//!
//! Exit codes: 0 success; 1 the command failed (bad configuration, unreachable Redis, a
//! component that is refused by `check`); 2 the command line itself is wrong (clap's usage
//! errors).

pub(crate) mod args;
mod client;
mod new;
mod runs;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::coord::term_store::{Store, TermStore as _};
use leasehold::exec::runs as records;
use leasehold::exec::runtime::{Compiled, Runtime};
use leasehold::exec::spec::validate_job_name;
use leasehold::node::config::{NodeConfig, hostname, show, show_size};
use leasehold::store::keys::JobKeys;
use leasehold::{node, store};

use args::{Cli, Command, DbCommand, JobArgs, LimitArgs, PurgeArgs, RunArgs, TriggerArgs};

/// Runs a parsed command line.
pub(crate) async fn main(cli: Cli) -> ExitCode {
    store::install_tls_provider();
    let result = match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Check {
            file,
            limits,
            cache_dir,
            no_cache,
        } => {
            let cache = if no_cache {
                None
            } else {
                cache_dir.or_else(leasehold::node::config::default_cache_dir)
            };
            check(file, limits, cache).await
        }
        Command::New {
            name,
            lang,
            fan_out,
            dir,
        } => new::new_job(lang, fan_out, &name, dir),
        Command::Trigger(args) => trigger(args).await,
        Command::Runs(args) => runs::list(args).await,
        Command::Purge(args) => purge(args).await,
        Command::Status(args) => client::status(args).await,
        Command::Db(DbCommand::Init { url, role, jobs }) => db_init(&url, &role, &jobs).await,
        Command::Health(args) => client::health(args).await,
        Command::Cancel { period, job } => cancel(job, &period).await,
        Command::Pause(args) => set_paused(args, true).await,
        Command::Resume(args) => set_paused(args, false).await,
        #[cfg(feature = "demo")]
        Command::Demo(args) => {
            crate::demo::run(crate::demo::DemoOptions {
                job: args.job,
                redis_url: args.redis_url,
                rows: args.rows as usize,
            })
            .await
        }
        #[cfg(not(feature = "demo"))]
        Command::Demo(_) => Err(anyhow::anyhow!(
            "this leasehold was built without the demo (cargo feature `demo`)"
        )),
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
    let cfg = NodeConfig::from_raw(args.raw())?;
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
        println!("redis-url:   {}", store::redact(&cfg.redis_url));
        println!("jobs-dir:    {}", cfg.jobs_dir.display());
        println!("data-dir:    {}", opt(&cfg.data_dir));
        println!("cache-dir:   {}", opt(&cfg.cache_dir));
        println!(
            "timings:     lease-ttl {}, heartbeat {}, lease-margin {}, redis-timeout {}",
            show(t.lease_ttl),
            show(t.heartbeat),
            show(t.margin),
            show(t.redis_timeout)
        );
        println!(
            "limits:      memory {}, step time {}, write {}, component {}, guest log lines {}, quota {} keys and {}",
            show_size(l.memory.1),
            show(l.step_time.1),
            show_size(l.write_bytes.1),
            show_size(l.component_bytes),
            l.log_lines,
            l.stored_keys.1,
            show_size(l.stored_bytes.1)
        );
        println!(
            "redis:       {}",
            if cfg.allow_evicting_redis {
                "any maxmemory-policy allowed (--allow-evicting-redis): evicted keys can make a period run twice"
            } else {
                "must be Redis 6.0+ with maxmemory-policy noeviction (checked at start-up)"
            }
        );
        println!(
            "balancing:   capacity {}, task slots {}",
            cfg.capacity, cfg.task_slots
        );
        println!(
            "replicas:    {}",
            match cfg.replicas {
                Some(r) => format!(
                    "every write of a term waits for {} replica(s), at most {}",
                    r.count,
                    show(r.timeout)
                ),
                None => "writes do not wait for replicas".into(),
            }
        );
        if cfg.databases.is_empty() {
            println!("databases:   none (jobs that ask for one are refused)");
        }
        for d in &cfg.databases {
            println!(
                "database:    {} = {} (pool {}, {})",
                d.name,
                d.shown,
                d.pool,
                match d.tls_roots() {
                    Some(roots) => format!("TLS, trusting {roots}"),
                    None => "plain text".into(),
                }
            );
        }
        let h = &cfg.http_caps;
        println!(
            "outbound:    {}; timeout up to {}, responses up to {}{}",
            if h.allow.is_empty() {
                "no HTTP destination allowed".to_string()
            } else {
                h.allow
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            show(h.timeout),
            show_size(h.max_response),
            if h.private {
                ", private addresses allowed"
            } else {
                ""
            }
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

async fn check(file: PathBuf, limits: LimitArgs, cache: Option<PathBuf>) -> anyhow::Result<()> {
    let runtime = Runtime::new(limits.raw().validate()?)?;
    let runtime = match &cache {
        Some(dir) => runtime.with_cache(dir)?,
        None => runtime,
    };
    let job = runtime
        .load(&file)
        .await
        .map_err(|e| anyhow::anyhow!("{} is refused: {}", e.path.display(), e.reason))?;
    println!("{} is a valid leasehold job", file.display());
    println!("{}", job.spec);
    println!("component:  {}", job.hash);
    println!(
        "compiled:   {}",
        match (&cache, job.compiled) {
            (Some(dir), Compiled::Cached) =>
                format!("no: loaded from the cache in {}", dir.display()),
            (Some(dir), _) => format!(
                "yes: compiled now and stored in the cache in {}",
                dir.display()
            ),
            (None, _) => "yes: compiled now (no cache)".to_string(),
        }
    );
    println!("world:      leasehold:job@{}", job.world());
    if let Some(hash) = &job.sidecar {
        println!(
            "sidecar:    {} ({hash})",
            leasehold::exec::runtime::sidecar_of(&file).display()
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

/// The store `url` names (Redis or etcd), each call answered within five seconds.
async fn open_store(url: &str) -> anyhow::Result<Store> {
    Store::open(url, Duration::from_secs(5)).await
}

async fn trigger(args: TriggerArgs) -> anyhow::Result<()> {
    validate_job_name(&args.job)?;
    let store = open_store(&args.redis_url).await?;
    let keys = JobKeys::new(&args.job);
    let served = store.served_jobs().await?;
    if let Some(why) = leasehold::coord::members::not_served(&args.job, &served) {
        anyhow::bail!("{why}: nothing was requested");
    }
    // Without --period: the current period of the schedule the job's leader published.
    let period = match args.period {
        Some(p) => p,
        None => match records::published_schedule(&store, &keys).await? {
            Some(schedule) => {
                schedule
                    .current(chrono::Utc::now())
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "{}'s schedule {:?} ({}) has no current period yet: give --period",
                            args.job,
                            schedule.expr(),
                            schedule.tz()
                        )
                    })?
                    .id
            }
            None => anyhow::bail!(
                "no leader has published {}'s schedule yet (none has led it), so there is no current period to default to: give --period (e.g. --period 2026-11-27)",
                args.job
            ),
        },
    };
    records::validate_period_shape(&period)?;
    match records::check_published_schedule(&store, &keys, &period).await? {
        records::ScheduleCheck::Unknown => eprintln!(
            "note: no schedule of {} published by a leader could be read (none has led it yet), so {period} is not checked against it",
            args.job
        ),
        records::ScheduleCheck::EarlierSchedule => eprintln!(
            "note: {period} is a period of an earlier schedule of {} (its run record is kept): it is carried on or run again under that period",
            args.job
        ),
        records::ScheduleCheck::Period => {}
    }
    let done = records::trigger(&store, &keys, &period).await?;
    println!("{}", done.describe(&args.job, &period));
    Ok(())
}

/// `leasehold cancel`: asks the leader to cancel the period's open run. Nothing to cancel (no
/// run, or a final one other than `cancelled`) is an error.
async fn cancel(args: JobArgs, period: &str) -> anyhow::Result<()> {
    validate_job_name(&args.job)?;
    records::validate_period_shape(period)?;
    let store = open_store(&args.redis_url).await?;
    let done = records::cancel(&store, &JobKeys::new(&args.job), period).await?;
    let said = done.describe(&args.job, period);
    match done {
        records::Cancel::Requested(_) | records::Cancel::AlreadyCancelled(_) => {
            println!("{said}");
            Ok(())
        }
        _ => anyhow::bail!("{said}"),
    }
}

async fn set_paused(args: JobArgs, paused: bool) -> anyhow::Result<()> {
    validate_job_name(&args.job)?;
    let store = open_store(&args.redis_url).await?;
    let reason = format!(
        "paused with the CLI on {} at {}",
        hostname(),
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    records::set_paused(
        &store,
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

async fn purge(args: PurgeArgs) -> anyhow::Result<()> {
    let job = &args.job.job;
    validate_job_name(job)?;
    let store = open_store(&args.job.redis_url).await?;
    let before = store.job_status(job).await?.usage;
    if let Some(prefix) = &args.prefix {
        let (keys, bytes) = store.purge(job, prefix).await?;
        println!(
            "deleted {keys} keys of {job} starting with {prefix:?} ({})",
            leasehold::units::show_size(bytes)
        );
    }
    let (k, b) = store.recount(job).await?;
    println!(
        "{job} keeps {k} keys and {} (its storage count was {} keys and {})",
        leasehold::units::show_size(b),
        before.0,
        leasehold::units::show_size(before.1)
    );
    Ok(())
}

/// `leasehold db init`: the fence in a database, for `role` and `jobs` (see [`DbCommand`]).
async fn db_init(url: &str, role: &str, jobs: &[String]) -> anyhow::Result<()> {
    for job in jobs {
        leasehold::exec::spec::validate_job_name(job)
            .map_err(|e| anyhow::anyhow!("--job {job}: {e}"))?;
    }
    if role.is_empty() {
        anyhow::bail!("--role must name a role");
    }
    let shown = leasehold::store::redact(url);
    let cfg = leasehold::exec::sql::parse_database(&format!("init={url}"))
        .map_err(|e| anyhow::anyhow!("{}", e.trim_start_matches("database init: ")))?;
    let client = cfg
        .connect(std::time::Duration::from_secs(10))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let done = leasehold::exec::sql::fence::init(&client, role, jobs)
        .await
        .map_err(|e| anyhow::anyhow!("preparing {shown}: {e}"))?;
    println!("{shown}:");
    for line in done {
        println!("  {line}");
    }
    Ok(())
}
