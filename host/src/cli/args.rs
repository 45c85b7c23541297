//! The command line's shape: every command and flag, with its environment variable and default.
//! Values are only parsed here; their rules are checked in [`leasehold::node::config`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use leasehold::logging::LogFormat;
use leasehold::node::config::{RawConfig, RawLimits, parse_duration, parse_size};

/// Leasehold: singleton WebAssembly jobs across replicas, elected through Redis and fenced.
#[derive(Parser, Debug)]
#[command(name = "leasehold", version, about)]
pub(crate) struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "LEASEHOLD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run a replica: campaign for every job in the jobs directory and run the ones it leads.
    Run(Box<RunArgs>),
    /// Validate a job component against the `leasehold:job/job` world and print its spec.
    Check {
        /// The `.wasm` component to check.
        file: PathBuf,
        /// The host limits to check against (the same flags as `leasehold run`).
        #[command(flatten)]
        limits: LimitArgs,
        /// The compiled-code cache to read and fill, shared with `leasehold run` (same flag and
        /// default): a job checked here loads without compiling on a host using the same
        /// directory [default: $XDG_CACHE_HOME/leasehold or ~/.cache/leasehold].
        #[arg(long, env = "LEASEHOLD_CACHE_DIR")]
        cache_dir: Option<PathBuf>,
        /// Compile without reading or filling any cache.
        #[arg(long, conflicts_with = "cache_dir")]
        no_cache: bool,
    },
    /// Make a new job's project directory (Rust with the guest SDK, or Python with
    /// componentize-py) that builds and passes `leasehold check`.
    New {
        /// The job's name (1 to 64 of `a-z`, `0-9`, `-`, starting with a letter).
        name: String,
        /// The language of the job.
        #[arg(long, value_enum)]
        lang: Lang,
        /// A fan-out job (world `fan-out-job`): its runs hand tasks to every replica.
        #[arg(long)]
        fan_out: bool,
        /// Where to create the project [default: ./NAME]; must not exist.
        #[arg(long)]
        dir: Option<PathBuf>,
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
    /// Delete a job's stored keys by prefix and subtract them from its storage count
    /// (`--prefix`), or count what it keeps again (`--recount`): what to do when a run failed
    /// `quota-exceeded`, before triggering it again.
    Purge(PurgeArgs),
    /// Cancel a period's open run: its leader stops it within a heartbeat (a running step is
    /// stopped), ends its tasks and records it cancelled; a trigger runs it again.
    Cancel {
        /// The period whose run to cancel (e.g. 2026-11-27).
        #[arg(long)]
        period: String,
        #[command(flatten)]
        job: JobArgs,
    },
    /// Pause a job: its leader starts no step until it is resumed.
    Pause(JobArgs),
    /// Resume a paused job; periods that fired meanwhile follow its catch-up policy.
    Resume(JobArgs),
    /// Prepare a PostgreSQL database for jobs: `leasehold db init URL --role ROLE --job JOB`.
    #[command(subcommand)]
    Db(DbCommand),
    /// Run the reference scenario locally and narrate it: three replicas, the leader frozen
    /// mid-run, a successor with a higher token, the zombie fenced, one report for the day.
    Demo(DemoArgs),
}

/// `leasehold db …`.
#[derive(Subcommand, Debug, Clone)]
pub(crate) enum DbCommand {
    /// Create (or bring up to date) the fence in a database, idempotently, and say what was
    /// done: the `leasehold` schema, the `leasehold.fence` table, the `leasehold.raise_fence`
    /// function (SECURITY DEFINER, search_path pinned), TEMP revoked from PUBLIC and the role,
    /// the role (created if missing) allowed only to EXECUTE the function, and each job's fence
    /// row registered for the role. Run it as the database's owner (not as the jobs' role);
    /// grant the role its own tables yourself.
    Init {
        /// The database, as its owner: postgres://owner@host:5432/db.
        url: String,
        /// The role the hosts log in as for these jobs (their `--database` URL's user).
        #[arg(long)]
        role: String,
        /// A job that writes to this database as the role; repeat for more.
        #[arg(long = "job")]
        jobs: Vec<String>,
    },
}

/// The languages `leasehold new` scaffolds.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lang {
    /// A `cdylib` crate on the guest SDK, built with `cargo build --target wasm32-wasip2`.
    Rust,
    /// An `app.py`, built with componentize-py.
    Python,
}

/// Flags of `leasehold demo`.
#[derive(Args, Debug, Clone)]
pub(crate) struct DemoArgs {
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

/// Host limits (README, "Limits"). A job's `describe()` may ask for less than a maximum, never
/// more; a job that asks for nothing gets 64 MiB, 30 s and 1 MiB (or the maximum, if lower).
#[derive(Args, Debug, Clone)]
#[command(
    next_help_heading = "Job limits (the most a job may ask for; the defaults a job gets are lower)"
)]
pub(crate) struct LimitArgs {
    /// The most linear memory a job may ask for (all its memories together); a job that asks
    /// for nothing gets 64 MiB, or this when lower.
    #[arg(long, env = "LEASEHOLD_MAX_MEMORY", value_parser = parse_size, default_value = "512MiB")]
    pub max_memory: u64,
    /// The longest step time a job may ask for; a job that asks for nothing gets 30 s, or this
    /// when lower.
    #[arg(long, env = "LEASEHOLD_MAX_STEP_TIME", value_parser = parse_duration, default_value = "10m")]
    pub max_step_time: Duration,
    /// The largest write size a job may ask for (one store.write value, one checkpoint); a job
    /// that asks for nothing gets 1 MiB, or this when lower.
    #[arg(long, env = "LEASEHOLD_MAX_WRITE_SIZE", value_parser = parse_size, default_value = "16MiB")]
    pub max_write_size: u64,
    /// Largest component file the host reads; bigger files are refused unread.
    #[arg(long, env = "LEASEHOLD_MAX_COMPONENT_SIZE", value_parser = parse_size, default_value = "64MiB")]
    pub max_component_size: u64,
    /// Guest log lines kept per step; the rest are counted and dropped.
    #[arg(long, env = "LEASEHOLD_GUEST_LOG_LINES", default_value_t = 200)]
    pub guest_log_lines: u32,
    /// Largest storage quota a job may have, in keys (a job that asks for none gets 100,000).
    #[arg(long, env = "LEASEHOLD_MAX_STORED_KEYS", default_value_t = 1_000_000)]
    pub max_stored_keys: u64,
    /// Largest storage quota a job may have, in bytes of keys and values (a job that asks for
    /// none gets 256 MiB).
    #[arg(long, env = "LEASEHOLD_MAX_STORED_BYTES", value_parser = parse_size, default_value = "1GiB")]
    pub max_stored_bytes: u64,
    /// Most core WebAssembly instances one job may create (a componentize-py component has 14
    /// to 17).
    #[arg(long, env = "LEASEHOLD_MAX_INSTANCES", default_value_t = 64)]
    pub max_instances: u32,
    /// Most tables one job may create.
    #[arg(long, env = "LEASEHOLD_MAX_TABLES", default_value_t = 64)]
    pub max_tables: u32,
    /// Most linear memories one job may create (their sizes together stay within the job's
    /// memory limit).
    #[arg(long, env = "LEASEHOLD_MAX_MEMORIES", default_value_t = 64)]
    pub max_memories: u32,
    /// Guest instances live at once (steps running, `describe()` calls), kept in wasmtime's
    /// pooling allocator with copy-on-write memory images; a further step waits for a slot.
    /// 0 allocates every instance on demand instead.
    #[arg(long, env = "LEASEHOLD_INSTANCE_POOL", default_value_t = 64)]
    pub instance_pool: u32,
}

impl LimitArgs {
    /// The limits as given, for [`leasehold::node::config::RawLimits::validate`].
    pub(crate) fn raw(&self) -> RawLimits {
        RawLimits {
            max_memory: self.max_memory,
            max_step_time: self.max_step_time,
            max_write_size: self.max_write_size,
            max_component_size: self.max_component_size,
            guest_log_lines: self.guest_log_lines,
            max_stored_keys: self.max_stored_keys,
            max_stored_bytes: self.max_stored_bytes,
            max_instances: self.max_instances,
            max_tables: self.max_tables,
            max_memories: self.max_memories,
            instance_pool: self.instance_pool,
        }
    }
}

/// Flags of `leasehold run`.
#[derive(Args, Debug, Clone)]
pub(crate) struct RunArgs {
    /// The store's URL: Redis (redis://, rediss://, redis+sentinel://, redis+cluster://) or etcd.
    #[arg(
        long,
        visible_alias = "store",
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
    #[arg(long, env = "LEASEHOLD_LEASE_TTL", value_parser = parse_duration, default_value = "10s")]
    pub lease_ttl: Duration,
    /// Renewal interval; heartbeat × 3 must be less than the lease TTL.
    #[arg(long, env = "LEASEHOLD_HEARTBEAT", value_parser = parse_duration, default_value = "2s")]
    pub heartbeat: Duration,
    /// Safety margin: a leader stops acting this long before its lease could expire
    /// [default: lease-ttl / 10].
    #[arg(long, env = "LEASEHOLD_LEASE_MARGIN", value_parser = parse_duration)]
    pub lease_margin: Option<Duration>,
    /// Bound on every Redis call [default: heartbeat / 2].
    #[arg(long, env = "LEASEHOLD_REDIS_TIMEOUT", value_parser = parse_duration)]
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
    /// Start even when Redis may evict keys (its `maxmemory-policy` is not `noeviction`):
    /// leases, fences and run records could then be lost and a period run twice.
    #[arg(long, env = "LEASEHOLD_ALLOW_EVICTING_REDIS")]
    pub(crate) allow_evicting_redis: bool,
    /// Redis replicas that must acknowledge every write of a term (`WAIT`); a write they do not
    /// acknowledge in time fails as unavailable. 0: writes do not wait.
    #[arg(long, env = "LEASEHOLD_MIN_REPLICAS", default_value_t = 0)]
    pub(crate) min_replicas: u32,
    /// How long a write waits for the replicas [default: the Redis timeout].
    #[arg(long, env = "LEASEHOLD_REPLICA_TIMEOUT", value_parser = parse_duration)]
    pub(crate) replica_timeout: Option<Duration>,
    /// This replica's weight for leadership balancing: a replica with capacity 2 is preferred
    /// for about twice the jobs of one with capacity 1 (1 to 1000).
    #[arg(long, env = "LEASEHOLD_CAPACITY", default_value_t = 1)]
    pub(crate) capacity: u32,
    /// Tasks of fan-out jobs this replica runs at once, whichever replica leads them (0: it
    /// runs none) [default: one per CPU].
    #[arg(long, env = "LEASEHOLD_TASK_SLOTS")]
    pub(crate) task_slots: Option<u32>,
    /// A PostgreSQL database jobs may be granted, as NAME=URL (e.g.
    /// ledger=postgres://billing@db:5432/accounts?pool=4); repeat for more. The URL logs in as
    /// the jobs' restricted role (see `leasehold db init`); `pool` sets the connections kept
    /// (default 4); `sslmode=require` (or verify-full) connects over TLS, always verifying the
    /// server against the system's CAs or the CA file `sslrootcert=PATH` names. In the
    /// environment, several are separated by spaces.
    #[arg(
        long = "database",
        env = "LEASEHOLD_DATABASES",
        value_delimiter = ' ',
        hide_env_values = true
    )]
    pub databases: Vec<String>,
    /// The longest statement a job may ask for (a job that asks for nothing gets 5s).
    #[arg(long, env = "LEASEHOLD_MAX_STATEMENT_TIME", value_parser = parse_duration, default_value = "1m")]
    pub max_statement_time: Duration,
    /// The most rows one statement may return to a job (a job that asks for nothing gets 10000).
    #[arg(long, env = "LEASEHOLD_MAX_SQL_ROWS", default_value_t = 1_000_000)]
    pub max_sql_rows: u64,
    /// The most bytes one statement's rows may carry to a job (a job that asks for nothing gets
    /// 16MiB).
    #[arg(long, env = "LEASEHOLD_MAX_SQL_RESULT", value_parser = parse_size, default_value = "256MiB")]
    pub max_sql_result: u64,
    /// An HTTP destination jobs may be granted (`[http] allow` in a sidecar), as
    /// scheme://host[:port] (e.g. https://pay.example.com); repeat for more. A job granted one
    /// that is not listed here is refused. In the environment, separated by spaces.
    #[arg(
        long = "http-allow",
        env = "LEASEHOLD_HTTP_ALLOW",
        value_delimiter = ' '
    )]
    pub http_allow: Vec<String>,
    /// Lets jobs' requests reach loopback, private, link-local and other non-global addresses
    /// (by default a granted name that resolves to one is refused).
    #[arg(long, env = "LEASEHOLD_HTTP_ALLOW_PRIVATE")]
    pub http_allow_private: bool,
    /// The longest HTTP timeout a job may ask for (connect, first byte, between bytes, each; a
    /// job that asks for nothing gets 10s).
    #[arg(long, env = "LEASEHOLD_MAX_HTTP_TIMEOUT", value_parser = parse_duration, default_value = "1m")]
    pub max_http_timeout: Duration,
    /// The largest HTTP response body a job may ask for (a job that asks for nothing gets 1MiB).
    #[arg(long, env = "LEASEHOLD_MAX_HTTP_RESPONSE", value_parser = parse_size, default_value = "16MiB")]
    pub max_http_response: u64,
    /// Validate the configuration, print it and exit without connecting to anything.
    #[arg(long)]
    pub check_config: bool,
}

/// A job and the store it lives in.
#[derive(Args, Debug, Clone)]
pub(crate) struct JobArgs {
    /// The job's name.
    pub job: String,
    /// The store's URL: Redis (redis://, rediss://, redis+sentinel://, redis+cluster://) or,
    /// for pause, resume, cancel and runs, etcd (etcd://host:2379,…; `--store` names it
    /// too).
    #[arg(
        long,
        visible_alias = "store",
        env = "LEASEHOLD_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
}

/// Flags of `leasehold status`.
#[derive(Args, Debug, Clone)]
pub(crate) struct StatusArgs {
    /// Address of a node's HTTP API (its `--http`).
    #[arg(long, env = "LEASEHOLD_HTTP", default_value = "127.0.0.1:8080")]
    pub http: String,
    /// Print the JSON of `GET /v1/status` instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `leasehold health`.
#[derive(Args, Debug, Clone)]
pub(crate) struct HealthArgs {
    /// Address of the node's HTTP API.
    #[arg(long, env = "LEASEHOLD_HTTP", default_value = "127.0.0.1:8080")]
    pub http: String,
    /// Ask `/readyz` instead of `/healthz`.
    #[arg(long)]
    pub ready: bool,
}

/// Flags of `leasehold runs`.
#[derive(Args, Debug, Clone)]
pub(crate) struct RunsArgs {
    /// The job and Redis.
    #[command(flatten)]
    pub job: JobArgs,
    /// Most runs listed.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// One JSON record per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The job's terms instead (who led when, with which token, how each ended).
    #[arg(long)]
    pub terms: bool,
}

/// Flags of `leasehold purge`.
#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["prefix", "recount"])))]
pub(crate) struct PurgeArgs {
    /// The job and its store (Redis or etcd).
    #[command(flatten)]
    pub job: JobArgs,
    /// Delete the job's keys whose names (as the job writes them) start with this (`""`: every
    /// key the job stores), subtracting each from its storage count; then count again.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Only count again what the job keeps (after keys were deleted by hand), and set its
    /// storage count to that.
    #[arg(long)]
    pub recount: bool,
}

/// Flags of `leasehold trigger`.
#[derive(Args, Debug, Clone)]
pub(crate) struct TriggerArgs {
    /// The job's name.
    pub job: String,
    /// The period to run (e.g. 2026-11-27 for a daily job) [default: the current period of the
    /// schedule the job's leader published; without one, --period is required].
    #[arg(long)]
    pub period: Option<String>,
    /// The store's URL: Redis (redis://, rediss://, redis+sentinel://, redis+cluster://) or
    /// etcd (etcd://host:2379,…; `--store` names it too).
    #[arg(
        long,
        visible_alias = "store",
        env = "LEASEHOLD_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
}

impl RunArgs {
    /// The flags as given, for [`leasehold::node::config::NodeConfig::from_raw`].
    pub(crate) fn raw(&self) -> RawConfig {
        RawConfig {
            redis_url: self.redis_url.clone(),
            jobs_dir: self.jobs_dir.clone(),
            data_dir: self.data_dir.clone(),
            cache_dir: self.cache_dir.clone(),
            node_id: self.node_id.clone(),
            lease_ttl: self.lease_ttl,
            heartbeat: self.heartbeat,
            lease_margin: self.lease_margin,
            redis_timeout: self.redis_timeout,
            http: self.http,
            http_token: self.http_token.clone(),
            limits: self.limits.raw(),
            allow_evicting_redis: self.allow_evicting_redis,
            min_replicas: self.min_replicas,
            replica_timeout: self.replica_timeout,
            capacity: self.capacity,
            task_slots: self.task_slots,
            databases: self.databases.clone(),
            max_statement_time: self.max_statement_time,
            max_sql_rows: self.max_sql_rows,
            max_sql_result: self.max_sql_result,
            http_allow: self.http_allow.clone(),
            http_allow_private: self.http_allow_private,
            max_http_timeout: self.max_http_timeout,
            max_http_response: self.max_http_response,
        }
    }
}
