//! The WebAssembly runtime: one narrow wrapper that fixes every engine choice.
//!
//! * One [`Engine`] per process: component model, async calls, epoch interruption driven by a
//!   10 ms ticker thread. Every [`Store`] gets an epoch deadline, so no guest runs unchecked.
//! * Components are compiled once and pre-instantiated ([`bindings::JobPre`]): the import and
//!   export types are checked at load time, and a run pays only for instantiation.
//! * A **fresh store per step**, with a [`JobLimiter`] (memory in total, tables, instances) and the job's
//!   step deadline; a store is dropped after every step, so a trap or an interruption can never
//!   leave a half-run instance behind.
//! * WASI p2 with no network (the default `WasiCtx` denies sockets and name lookup), no
//!   environment, no arguments, stdout discarded, stderr captured into the host's log, and at
//!   most one preopen: `<data-dir>/<job>/`, read-only, at `/data`.
//! * The guest's only effects are the host imports of the `job` world (`wit/job.wit`): the
//!   `term` capability, the fenced `store`, and `log`. No import takes or returns a token.
//!
//! A running step stops when its term ends ([`Term::still_leader`] turns false, checked on every
//! epoch tick and by the caller's `select!` for time spent inside host imports) or when it
//! exceeds its time limit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sha2::{Digest, Sha256};
use tracing::{Level, debug, warn};
use wasmtime::component::{Component, HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Config, Engine, Store, UpdateDeadline};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use crate::cache::{CodeCache, Compiled};
use crate::fence::{self, Refusal, TermWriteError};
use crate::keys::JobKeys;
use crate::sandbox::{GuestOutput, JobLimiter};
use crate::spec::{CatchUp, HostLimits, JobSpec, Limits, Overlap, RawSpec, Sidecar};
use crate::term::Term;

/// Generated bindings for the `job` world.
pub mod bindings {
    wasmtime::component::bindgen!({
        world: "job",
        path: "../wit",
        imports: { default: async | trappable },
        exports: { default: async },
        with: { "leasehold:job/leadership.term": crate::term::Term },
    });
}

use bindings::leasehold::job::{leadership, log as guest_log, store, types};
pub use types::{JobError, RunInfo, StepOutcome};

/// How often the epoch advances; the granularity of step interruption.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Most bytes of a guest's stderr kept per step.
const STDERR_CAPACITY: usize = 64 * 1024;
/// Longest log line kept, in bytes.
const LOG_LINE_MAX: usize = 4096;
/// Longest key a guest may use, in bytes.
pub const KEY_MAX: usize = 256;

/// The process's WebAssembly engine and linker.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<HostState>>,
    host_limits: HostLimits,
    cache: Option<Arc<CodeCache>>,
    /// Components loaded in this process by content hash: jobs that share a component (one
    /// file under several names, see the sidecar's `name`) share its code in memory.
    loaded: Arc<std::sync::Mutex<std::collections::HashMap<String, Component>>>,
}

/// A compiled, type-checked, described job component.
#[derive(Clone)]
pub struct LoadedJob {
    /// The validated spec from `describe()`.
    pub spec: JobSpec,
    /// `sha256:` of the component's bytes: names the version in run records.
    pub hash: String,
    /// Where it was loaded from.
    pub path: PathBuf,
    /// Whether its code came from the compiled-code cache.
    pub compiled: Compiled,
    /// `sha256:` of the sidecar file applied to the spec, if there was one.
    pub sidecar: Option<String>,
    pre: bindings::JobPre<HostState>,
}

/// Why a component could not be loaded. The message names the file and the reason.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct LoadError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// What ended a step that did not return normally.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The guest returned `job-error.failed`.
    #[error("job failed: {0}")]
    Failed(String),
    /// The guest returned `job-error.not-ready`.
    #[error("inputs not ready: {0}")]
    NotReady(String),
    /// The term ended (deadline, lost lease, or a refused write) before or during the step.
    #[error("leadership lost{}", .0.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    LostLeadership(Option<String>),
    /// The step ran longer than the job's step time limit.
    #[error("step exceeded its time limit of {0}")]
    Timeout(String),
    /// The guest trapped (panic, unreachable, stack overflow, table limit, ...).
    #[error("guest trapped: {0}")]
    Trap(String),
    /// The guest tried to grow its memory past the job's memory limit.
    #[error("memory limit exceeded: {0}")]
    MemoryLimit(String),
    /// The host could not run the step (e.g. the data directory could not be opened). Not the
    /// job's fault: the run is retried, not failed.
    #[error("host could not run the step: {0}")]
    Host(String),
}

/// Everything a step's host imports need. Absent while `describe()` runs.
pub struct StepContext {
    /// Job name (log field).
    pub job: String,
    /// Node id (log field).
    pub node: String,
    /// The job's keys.
    pub keys: JobKeys,
    /// The term the step runs in.
    pub term: Term,
    /// Connection for guest reads and fenced writes. Calls are bounded by the term: a call
    /// still pending when the term ends is abandoned.
    pub conn: redis::aio::ConnectionManager,
    /// `<data-dir>/<job>/`, preopened read-only at `/data` when it exists.
    pub data_dir: Option<PathBuf>,
}

/// The data of every store: WASI state, resources, limits and the step's context.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: JobLimiter,
    step: Option<StepContext>,
    max_write: u64,
    deadline: Instant,
    interrupt: Option<StepError>,
    refusal: Option<Refusal>,
    log_lines: u32,
    max_log_lines: u32,
    log_dropped: u32,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The sidecar file of a component: the same path with the extension `.toml`.
pub fn sidecar_of(component: &Path) -> PathBuf {
    component.with_extension("toml")
}

/// Checks a guest key (see `wit/job.wit`, interface `store`).
pub fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("key is empty".into());
    }
    if key.len() > KEY_MAX {
        return Err(format!("key is {} bytes, more than {KEY_MAX}", key.len()));
    }
    if let Some(b) = key.bytes().find(|b| !(b'!'..=b'~').contains(b)) {
        return Err(format!(
            "key contains byte 0x{b:02x}; only printable ASCII without spaces is allowed"
        ));
    }
    if key.starts_with('/') {
        return Err("key starts with '/'".into());
    }
    if key.split('/').any(|seg| seg == "..") {
        return Err("key contains a '..' segment".into());
    }
    Ok(())
}

impl HostState {
    fn new(
        limits: &Limits,
        max_log_lines: u32,
        step: Option<StepContext>,
    ) -> anyhow::Result<(Self, GuestOutput)> {
        let stderr = GuestOutput::new(STDERR_CAPACITY);
        let mut wasi = WasiCtx::builder();
        wasi.stderr(stderr.clone());
        if let Some(dir) = step.as_ref().and_then(|s| s.data_dir.as_ref()) {
            wasi.preopened_dir(dir, "/data", FsPerms::ReadOnly)
                .map_err(|e| {
                    anyhow::anyhow!("cannot open data directory {}: {e}", dir.display())
                })?;
        }
        let state = HostState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits: JobLimiter::new(limits.memory),
            step,
            max_write: limits.write_bytes,
            deadline: Instant::now() + limits.step_time,
            interrupt: None,
            refusal: None,
            log_lines: 0,
            max_log_lines,
            log_dropped: 0,
        };
        Ok((state, stderr))
    }

    fn step(&mut self) -> wasmtime::Result<&mut StepContext> {
        self.step
            .as_mut()
            .ok_or_else(|| wasmtime::format_err!("describe() must not call host imports"))
    }
}

impl HostState {
    /// The checks every guest write passes before it is sent: a valid key, a value within the
    /// job's write limit.
    fn check_write(&self, key: &str, value: &[u8]) -> Result<(), store::WriteError> {
        validate_key(key).map_err(store::WriteError::InvalidKey)?;
        if value.len() as u64 > self.max_write {
            return Err(store::WriteError::TooLarge(self.max_write));
        }
        Ok(())
    }

    /// A fenced write's outcome as the guest sees it; a refusal is kept to explain the step's end.
    fn write_result<T>(&mut self, res: Result<T, TermWriteError>) -> Result<T, store::WriteError> {
        match res {
            Ok(v) => Ok(v),
            Err(TermWriteError::Refused(refusal)) => {
                let text = refusal.to_string();
                self.refusal = Some(refusal);
                Err(store::WriteError::Fenced(text))
            }
            Err(TermWriteError::Redis(e)) => Err(store::WriteError::Unavailable(e.to_string())),
            Err(TermWriteError::Ended) => Err(store::WriteError::NotLeader),
        }
    }
}

impl types::Host for HostState {}

impl leadership::Host for HostState {}

impl leadership::HostTerm for HostState {
    async fn still_leader(&mut self, term: Resource<Term>) -> wasmtime::Result<bool> {
        Ok(self.table.get(&term)?.still_leader())
    }

    async fn token(&mut self, term: Resource<Term>) -> wasmtime::Result<u64> {
        Ok(self.table.get(&term)?.token())
    }

    async fn drop(&mut self, term: Resource<Term>) -> wasmtime::Result<()> {
        self.table.delete(term)?;
        Ok(())
    }
}

impl store::Host for HostState {
    async fn write(
        &mut self,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), store::WriteError>> {
        if let Err(e) = self.check_write(&key, &value) {
            return Ok(Err(e));
        }
        let ctx = self.step()?;
        let writes = [(ctx.keys.data(&key), value.as_slice())];
        let who = (ctx.job.as_str(), ctx.node.as_str());
        let res =
            fence::write_in_term(&mut ctx.conn, &ctx.keys, &ctx.term, who, &writes, &[]).await;
        Ok(self.write_result(res))
    }

    async fn create(
        &mut self,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<bool, store::WriteError>> {
        if let Err(e) = self.check_write(&key, &value) {
            return Ok(Err(e));
        }
        let ctx = self.step()?;
        let who = (ctx.job.as_str(), ctx.node.as_str());
        let key = ctx.keys.data(&key);
        let res =
            fence::create_in_term(&mut ctx.conn, &ctx.keys, &ctx.term, who, key, &value).await;
        Ok(self.write_result(res))
    }

    async fn read(
        &mut self,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, store::ReadError>> {
        let ctx = self.step()?;
        if let Err(reason) = validate_key(&key) {
            return Ok(Err(store::ReadError::InvalidKey(reason)));
        }
        let cmd = redis::cmd("GET").arg(ctx.keys.data(&key)).clone();
        let res = ctx
            .term
            .bound(cmd.query_async::<Option<Vec<u8>>>(&mut ctx.conn))
            .await;
        Ok(match res {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(store::ReadError::Unavailable(e.to_string())),
            None => Err(store::ReadError::Unavailable("the term ended".into())),
        })
    }
}

impl guest_log::Host for HostState {
    async fn write(&mut self, level: guest_log::Level, message: String) -> wasmtime::Result<()> {
        if self.log_lines >= self.max_log_lines {
            self.log_dropped += 1;
            return Ok(());
        }
        self.log_lines += 1;
        let mut message = message;
        if message.len() > LOG_LINE_MAX {
            let mut cut = LOG_LINE_MAX;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str(" [cut]");
        }
        let (job, node, token) = match &self.step {
            Some(s) => (s.job.as_str(), s.node.as_str(), s.term.token()),
            None => ("?", "?", 0),
        };
        match level {
            guest_log::Level::Debug => tracing::debug!(job, node, token, guest = true, "{message}"),
            guest_log::Level::Info => tracing::info!(job, node, token, guest = true, "{message}"),
            guest_log::Level::Warn => tracing::warn!(job, node, token, guest = true, "{message}"),
            guest_log::Level::Error => tracing::error!(job, node, token, guest = true, "{message}"),
        }
        Ok(())
    }
}

impl Runtime {
    /// Builds the engine and linker and starts the epoch ticker.
    pub fn new(host_limits: HostLimits) -> anyhow::Result<Self> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.wasm_component_model(true);
        let engine =
            Engine::new(&config).map_err(|e| anyhow::anyhow!("creating the wasm engine: {e}"))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| anyhow::anyhow!("linking WASI: {e}"))?;
        bindings::Job::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| anyhow::anyhow!("linking the job world: {e}"))?;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("epoch-ticker".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })
            .context("starting the epoch ticker")?;
        Ok(Runtime {
            engine,
            linker: Arc::new(linker),
            host_limits,
            cache: None,
            loaded: Arc::default(),
        })
    }

    /// Keeps compiled code in `dir` (see [`crate::cache`]).
    pub fn with_cache(mut self, dir: &Path) -> anyhow::Result<Self> {
        let cache = CodeCache::open(dir, &self.engine)
            .map_err(|e| anyhow::anyhow!("cannot use cache-dir {}: {e}", dir.display()))?;
        self.cache = Some(Arc::new(cache));
        Ok(self)
    }

    /// Reads, compiles, type-checks and describes a component. A file larger than the host's
    /// `component_bytes` limit is refused without being read whole. Compilation runs on a
    /// blocking thread.
    pub async fn load(&self, path: &Path) -> Result<LoadedJob, LoadError> {
        let fail = |reason: String| LoadError {
            path: path.to_path_buf(),
            reason,
        };
        let max = self.host_limits.component_bytes;
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| fail(format!("cannot read: {e}")))?;
        let mut bytes = Vec::new();
        use tokio::io::AsyncReadExt as _;
        file.take(max + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| fail(format!("cannot read: {e}")))?;
        if bytes.len() as u64 > max {
            return Err(fail(format!(
                "larger than the host's max-component-size of {}",
                crate::config::show_size(max)
            )));
        }
        let sidecar_path = sidecar_of(path);
        let sidecar =
            match tokio::fs::read(&sidecar_path).await {
                Ok(b) if b.len() > 64 * 1024 => {
                    return Err(fail(format!(
                        "sidecar {} is larger than 64 KiB",
                        sidecar_path.display()
                    )));
                }
                Ok(b) => Some(String::from_utf8(b).map_err(|_| {
                    fail(format!("sidecar {} is not UTF-8", sidecar_path.display()))
                })?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    return Err(fail(format!(
                        "cannot read sidecar {}: {e}",
                        sidecar_path.display()
                    )));
                }
            };
        self.load_parts(path, bytes, sidecar.as_deref()).await
    }

    /// [`Runtime::load`] for bytes already read, without a sidecar; `path` only names them in
    /// errors. This is the whole load path after reading (the fuzz target in `host/fuzz`
    /// drives it).
    pub async fn load_bytes(&self, path: &Path, bytes: Vec<u8>) -> Result<LoadedJob, LoadError> {
        self.load_parts(path, bytes, None).await
    }

    async fn load_parts(
        &self,
        path: &Path,
        bytes: Vec<u8>,
        sidecar: Option<&str>,
    ) -> Result<LoadedJob, LoadError> {
        let fail = |reason: String| LoadError {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() as u64 > self.host_limits.component_bytes {
            return Err(fail(format!(
                "larger than the host's max-component-size of {}",
                crate::config::show_size(self.host_limits.component_bytes)
            )));
        }
        if !bytes.starts_with(b"\0asm") {
            return Err(fail("not a WebAssembly file (no \\0asm header)".into()));
        }
        if bytes.get(4..8) == Some(&[1, 0, 0, 0]) {
            return Err(fail(
                "a core WebAssembly module, not a component: build the job with --target wasm32-wasip2".into(),
            ));
        }
        let content = hex::encode(Sha256::digest(&bytes));
        let hash = format!("sha256:{content}");
        let engine = self.engine.clone();
        let cache = self.cache.clone();
        let in_memory = self
            .loaded
            .lock()
            .expect("loaded components")
            .get(&hash)
            .cloned();
        let (component, compiled) = match in_memory {
            Some(c) => (c, Compiled::Shared),
            None => {
                let key = content.clone();
                let (c, compiled) = tokio::task::spawn_blocking(move || match cache {
                    Some(cache) => cache.load_or_compile(&engine, &key, &bytes),
                    None => Component::new(&engine, &bytes).map(|c| (c, Compiled::Fresh)),
                })
                .await
                .map_err(|e| fail(format!("compiler task failed: {e}")))?
                .map_err(|e| fail(format!("not a valid component: {e}")))?;
                let mut loaded = self.loaded.lock().expect("loaded components");
                if loaded.len() >= 256 {
                    loaded.clear();
                }
                loaded.insert(hash.clone(), c.clone());
                (c, compiled)
            }
        };
        let ty = component.component_type();
        let network: Vec<&str> = ty
            .imports(&self.engine)
            .map(|(name, _)| name)
            .filter(|name| name.starts_with("wasi:sockets/") || name.starts_with("wasi:http/"))
            .collect();
        if !network.is_empty() {
            return Err(fail(format!(
                "imports {}, which the host does not offer: jobs have no network; their only way out is the fenced store",
                network.join(", ")
            )));
        }
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| fail(format!("needs an import the host does not offer: {e}")))?;
        let pre = bindings::JobPre::new(pre).map_err(|e| {
            fail(format!(
                "does not implement the leasehold:job/job world: {e}"
            ))
        })?;
        let described = self
            .describe(&pre)
            .await
            .map_err(|e| fail(format!("describe() failed: {e}")))?;
        let p = &described.policies;
        let mut raw = RawSpec {
            name: described.name,
            schedule: described.schedule,
            time_zone: described.time_zone,
            limits: Limits {
                memory: described.limits.max_memory_bytes,
                step_time: Duration::from_millis(described.limits.max_step_millis),
                write_bytes: described.limits.max_write_bytes,
            },
            catch_up: match p.catch_up {
                types::CatchUp::Latest => CatchUp::Latest,
                types::CatchUp::Skip => CatchUp::Skip,
                types::CatchUp::All => CatchUp::All,
            },
            catch_up_window: Duration::from_millis(p.catch_up_window_millis),
            retry_attempts: p.retry_attempts,
            retry_backoff: Duration::from_millis(p.retry_backoff_millis),
            retry_max_backoff: Duration::from_millis(p.retry_max_backoff_millis),
            overlap: match p.overlap {
                types::Overlap::Queue => Overlap::Queue,
                types::Overlap::Skip => Overlap::Skip,
            },
            max_run_time: Duration::from_millis(p.max_run_millis),
        };
        let sidecar_hash = match sidecar {
            Some(text) => {
                Sidecar::parse(text)
                    .and_then(|s| s.apply(&mut raw))
                    .map_err(|e| fail(e.to_string()))?;
                Some(format!("sha256:{}", hex::encode(Sha256::digest(text))))
            }
            None => None,
        };
        let spec = JobSpec::new(&raw, &self.host_limits).map_err(|e| fail(e.to_string()))?;
        Ok(LoadedJob {
            spec,
            hash,
            sidecar: sidecar_hash,
            path: path.to_path_buf(),
            compiled,
            pre,
        })
    }

    async fn describe(&self, pre: &bindings::JobPre<HostState>) -> anyhow::Result<types::JobSpec> {
        let limits = Limits {
            // The most any job may ask for: its own limit is not known before describe().
            memory: self.host_limits.memory.1,
            step_time: Duration::from_secs(5),
            write_bytes: 0,
        };
        let (state, _stderr) = HostState::new(&limits, 0, None)?;
        let mut store = self.store(state);
        let call = async {
            let job = pre.instantiate_async(&mut store).await?;
            job.call_describe(&mut store).await
        };
        match tokio::time::timeout(limits.step_time, call).await {
            Ok(r) => Ok(r?),
            Err(_) => anyhow::bail!(
                "did not return within {}",
                crate::config::show(limits.step_time)
            ),
        }
    }

    /// Creates a store and instantiates `job` without calling it: what every step pays before
    /// the guest runs (the benchmarks in `host/benches` measure it).
    pub async fn instantiate(&self, job: &LoadedJob) -> anyhow::Result<()> {
        let (state, _stderr) = HostState::new(&job.spec.limits, 0, None)?;
        let mut store = self.store(state);
        job.pre.instantiate_async(&mut store).await?;
        Ok(())
    }

    fn store(&self, state: HostState) -> Store<HostState> {
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            let st = ctx.data_mut();
            if let Some(step) = &st.step
                && !step.term.still_leader()
            {
                st.interrupt = Some(StepError::LostLeadership(None));
                wasmtime::bail!("interrupted: leadership lost");
            }
            if Instant::now() >= st.deadline {
                st.interrupt = Some(StepError::Timeout(String::new()));
                wasmtime::bail!("interrupted: step time limit reached");
            }
            Ok(UpdateDeadline::Yield(1))
        });
        store
    }

    /// Runs one step of `job` in a fresh store. Never panics on guest misbehaviour: every way a
    /// step can end is a value.
    pub async fn run_step(
        &self,
        job: &LoadedJob,
        ctx: StepContext,
        run: &RunInfo,
        step: u32,
        state: Option<&[u8]>,
    ) -> Result<StepOutcome, StepError> {
        let term = ctx.term.clone();
        let (job_name, node) = (ctx.job.clone(), ctx.node.clone());
        let limits = job.spec.limits;
        let (host_state, stderr) = HostState::new(&limits, self.host_limits.log_lines, Some(ctx))
            .map_err(|e| StepError::Host(format!("{e:#}")))?;
        let mut store = self.store(host_state);
        let hard_deadline = Instant::now() + limits.step_time + EPOCH_TICK * 5;
        let result = {
            let call = async {
                let instance = job.pre.instantiate_async(&mut store).await?;
                let res = store.data_mut().table.push(term.clone())?;
                instance
                    .call_run_step(&mut store, res, run, step, state)
                    .await
            };
            tokio::select! {
                r = call => Some(r),
                _ = term.ended() => None,
                _ = tokio::time::sleep_until(hard_deadline.into()) => None,
            }
        };
        let data = store.data();
        // Whatever noticed first (the guest, the epoch callback, or the select), a lost term
        // carries the fence's refusal when a refused write is what ended it.
        let lost = || StepError::LostLeadership(data.refusal.as_ref().map(|r| r.to_string()));
        let outcome = match result {
            Some(Ok(Ok(outcome))) => Ok(outcome),
            Some(Ok(Err(JobError::Failed(m)))) => Err(StepError::Failed(m)),
            Some(Ok(Err(JobError::NotReady(m)))) => Err(StepError::NotReady(m)),
            Some(Ok(Err(JobError::LostLeadership))) => Err(lost()),
            Some(Err(trap)) => Err(match &data.interrupt {
                Some(StepError::Timeout(_)) => {
                    StepError::Timeout(crate::config::show(limits.step_time))
                }
                Some(StepError::LostLeadership(_)) => lost(),
                Some(i) => i.clone(),
                None if data.limits.memory_exceeded => StepError::MemoryLimit(trap_message(&trap)),
                None => StepError::Trap(trap_message(&trap)),
            }),
            None if !term.still_leader() => Err(lost()),
            None => Err(StepError::Timeout(crate::config::show(limits.step_time))),
        };
        if data.log_dropped > 0 {
            warn!(job = %job_name, node = %node, token = term.token(), dropped = data.log_dropped, "guest log lines dropped (more than {} in one step)", self.host_limits.log_lines);
        }
        let (err_bytes, err_dropped) = stderr.take();
        for line in String::from_utf8_lossy(&err_bytes)
            .lines()
            .filter(|l| !l.trim().is_empty())
        {
            tracing::event!(Level::WARN, job = %job_name, node = %node, token = term.token(), stderr = true, "guest: {line}");
        }
        if err_dropped > 0 {
            warn!(job = %job_name, node = %node, token = term.token(), dropped = err_dropped, "guest stderr cut: more than {STDERR_CAPACITY} bytes in one step");
        }
        debug!(job = %job_name, node = %node, token = term.token(), step, "step finished");
        outcome
    }
}

/// One line naming what went wrong: the trap (`unreachable` after a panic, call stack
/// exhausted, …) or the root cause (a memory grow refused by the limits). A panic's message
/// comes through the guest's stderr, which is logged with the step.
fn trap_message(e: &wasmtime::Error) -> String {
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => e.root_cause().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::validate_key;

    #[test]
    fn keys_outside_the_namespace_are_refused() {
        assert!(validate_key("report/2026-11-27").is_ok());
        for bad in ["", "../x", "a/../b", "/abs", "a b", "nul\0", "é"] {
            assert!(validate_key(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_key(&"k".repeat(257)).is_err());
        assert!(validate_key(&"k".repeat(256)).is_ok());
    }
}
