//! The WebAssembly runtime: one narrow wrapper that fixes every engine choice.
//!
//! * One [`Engine`] per process: component model, async calls, epoch interruption driven by a
//!   10 ms ticker thread. Every [`Store`] gets an epoch deadline, so no guest runs unchecked.
//! * Components are compiled once and pre-instantiated (`world::WorldPre`: the `job` or
//!   `fan-out-job` world of 0.4.3, or a 0.4.2, 0.4.1, 0.4.0, 0.3.0 or 0.2.0 twin): the import and export types are checked at load time, and a run pays only for
//!   instantiation.
//! * A **fresh store per step**, with a [`JobLimiter`] (memory in total, tables, instances) and the job's
//!   step deadline; a store is dropped after every step, so a trap or an interruption can never
//!   leave a half-run instance behind. Instances come from wasmtime's pooling allocator
//!   (`--instance-pool` slots, memories initialised from copy-on-write images and reset on
//!   reuse); a store is created only while holding one of the slots' permits ([`Runtime::slot`]),
//!   so a step waits for a slot rather than failing on an exhausted pool.
//! * WASI p2 with no network (`wasi:sockets` is linked and refuses every operation before a
//!   socket exists; `wasi:http` imports get functions that trap), no
//!   environment, no arguments, stdout discarded, stderr captured into the host's log, and at
//!   most one preopen: `<data-dir>/<job>/`, read-only, at `/data`.
//! * The guest's only effects are the host imports of the `job` world (`wit/job.wit`): the
//!   `term` capability, the fenced `store`, and `log`. No import takes or returns a token.
//!
//! A running step stops when its term ends ([`Term::still_leader`] turns false, checked on every
//! epoch tick and by the caller's `select!` for time spent inside host imports) or when it
//! exceeds its time limit.
//!
//! Submodules:
//!
//! * this file — the engine, the linker, the epoch ticker and [`Runtime`]'s stores;
//! * `inspect` — a component's imports, exports and instance, table and memory counts, read
//!   without compiling: what can never run is refused in milliseconds;
//! * `load` — [`Runtime::load`]: read, inspect, compile, type-check and describe a component
//!   ([`LoadedJob`], [`LoadError`]);
//! * `imports` — [`HostState`], [`StepContext`] and the host imports a guest calls
//!   (`types`, `leadership`, `store`, `log`, key checks);
//! * `step` — [`Runtime::run_step`] and [`StepError`];
//! * `world` — the world versions a component may be built to (0.3.0, and 0.2.0 still
//!   loaded), one type over both;
//! * [`sandbox`] — the memory budget and the guest's stderr; [`cache`] — compiled code kept.
//!
//! [`JobLimiter`]: sandbox::JobLimiter
//! [`Term::still_leader`]: crate::coord::term::Term::still_leader

pub(crate) mod cache;
mod error;
mod imports;
mod inspect;
mod load;
pub(crate) mod sandbox;
mod sql_import;
mod step;
mod world;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline,
};

use crate::exec::spec::HostLimits;
use cache::CodeCache;

pub use bindings::leasehold::job::tasks::Task;
pub use bindings::leasehold::job::types::{JobError, RunInfo, StepOutcome};
pub use cache::Compiled;
pub use error::StepError;
pub use imports::{
    BATCH_BYTES, BATCH_ENTRIES, HostState, KEY_MAX, StderrTail, StepContext, Work, validate_key,
};
pub use load::{LoadError, LoadedJob, sidecar_of};

/// Generated bindings for the current worlds (`wit/job.wit`): those of `fan-out-job`, whose
/// interfaces are every interface of the package (the `job` world's bindings share them, see
/// `world`).
#[allow(missing_docs)] // generated from wit/job.wit, whose `///` docs it carries
pub mod bindings {
    wasmtime::component::bindgen!({
        world: "fan-out-job",
        path: "../wit",
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "leasehold:job/leadership.term": crate::coord::term::Term,
            "leasehold:job/sql.transaction": crate::exec::sql::Tx,
        },
    });
}

/// A component's code, compiled once per process however many loads ask for it at once.
type CompiledOnce = Arc<tokio::sync::OnceCell<Component>>;

/// How often the epoch advances; the granularity of step interruption.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The process's WebAssembly engine and linker.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<HostState>>,
    host_limits: HostLimits,
    cache: Option<Arc<CodeCache>>,
    /// One permit per slot of the pooling allocator (`None`: instances allocated on demand):
    /// a store is created only with a permit, so the pool is never exhausted by instances.
    slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Components loaded in this process by content hash: jobs that share a component (one
    /// file under several names, see the sidecar's `name`) share its code in memory.
    loaded: Arc<std::sync::Mutex<std::collections::HashMap<String, CompiledOnce>>>,
    /// The databases jobs may be granted (`--database`).
    databases: crate::exec::sql::Databases,
    /// Outbound HTTP (`--http-allow` and its caps).
    outbound: crate::exec::http::Outbound,
}

impl Runtime {
    /// Builds the engine and linker and starts the epoch ticker.
    pub fn new(host_limits: HostLimits) -> anyhow::Result<Self> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.wasm_component_model(true);
        let slots = match host_limits.instance_pool {
            0 => None,
            n => {
                config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(
                    n,
                    &host_limits,
                )));
                Some(Arc::new(tokio::sync::Semaphore::new(n as usize)))
            }
        };
        let engine =
            Engine::new(&config).map_err(|e| anyhow::anyhow!("creating the wasm engine: {e}"))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| anyhow::anyhow!("linking WASI: {e}"))?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| anyhow::anyhow!("linking wasi:http: {e}"))?;
        bindings::FanOutJob::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| anyhow::anyhow!("linking the job worlds: {e}"))?;
        world::v0_3::Job::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| anyhow::anyhow!("linking the job world 0.3.0: {e}"))?;
        world::v0_2::Job::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| anyhow::anyhow!("linking the job world 0.2.0: {e}"))?;
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
            slots,
            loaded: Arc::default(),
            databases: crate::exec::sql::Databases::default(),
            outbound: crate::exec::http::Outbound::default(),
        })
    }

    /// Waits for a slot in the instance pool (at once when instances are allocated on demand);
    /// the slot is free again when the returned permit is dropped, after the store.
    pub(crate) async fn slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match &self.slots {
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        }
    }

    /// Offers `databases` to the jobs granted them (the `sql` import).
    pub fn with_databases(mut self, databases: crate::exec::sql::Databases) -> Self {
        self.databases = databases;
        self
    }

    /// Offers outbound HTTP to the destinations `outbound` allows (`wasi:http`).
    pub fn with_outbound(mut self, outbound: crate::exec::http::Outbound) -> Self {
        self.outbound = outbound;
        self
    }

    /// The databases jobs may be granted.
    pub fn databases(&self) -> &crate::exec::sql::Databases {
        &self.databases
    }

    /// Keeps compiled code in `dir` (see [`crate::exec::runtime::cache`]).
    pub fn with_cache(mut self, dir: &Path) -> anyhow::Result<Self> {
        let cache = CodeCache::open(dir, &self.engine)
            .map_err(|e| anyhow::anyhow!("cannot use cache-dir {}: {e}", dir.display()))?;
        self.cache = Some(Arc::new(cache));
        Ok(self)
    }

    /// Creates a store and instantiates `job` without calling it: what every step pays before
    /// the guest runs (the benchmarks in `host/benches` measure it).
    pub async fn instantiate(&self, job: &LoadedJob) -> anyhow::Result<()> {
        let (state, _stderr) = HostState::new(&job.spec.limits, self.host_limits.counts, 0, None)?;
        let _slot = self.slot().await;
        let mut store = self.store(state);
        job.pre.instantiate(&mut store).await?;
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
}

/// Bytes of each table slot reset by `memset` when a store is dropped, instead of being given
/// back to the kernel with `madvise` (a Rust job's tables hold a few hundred entries): a
/// quarter of the cost of store + instantiate. At most 16 KiB per table slot stays resident.
/// Batching the memories' decommits (`decommit_batch_size`) would save as much again, but
/// keeps the pages of several dropped stores resident until the batch is flushed, which a
/// job using hundreds of MiB per step would turn into that many times its memory.
const TABLE_KEEP_RESIDENT: usize = 16 << 10;

/// The pooling allocator for `n` live instances: each may use what the host's counts allow
/// (`--max-instances`, `--max-tables`, `--max-memories`) and memories up to `--max-memory`;
/// together they share 16 core instances, 4 memories and 4 tables per slot (a Rust job uses 1
/// to 3 of each, a componentize-py job 14 instances, 1 memory and 1 table per instance it
/// links), so address space is reserved for `4n` memories, not for `n × --max-memories`.
/// Memories start from copy-on-write images of their initial data and are reset, not
/// freed, when a store is dropped.
fn pooling(n: u32, limits: &HostLimits) -> PoolingAllocationConfig {
    let counts = limits.counts;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(n)
        .total_stacks(n)
        .total_core_instances(n.saturating_mul(16).max(counts.instances))
        .total_memories(n.saturating_mul(4).max(counts.memories))
        .total_tables(n.saturating_mul(4).max(counts.tables))
        .max_core_instances_per_component(counts.instances)
        .max_memories_per_component(counts.memories)
        .max_tables_per_component(counts.tables)
        .max_memories_per_module(counts.memories)
        .max_tables_per_module(counts.tables)
        .table_elements(sandbox::TABLE_ELEMENTS)
        .max_memory_size(usize::try_from(limits.memory.1).unwrap_or(usize::MAX))
        .table_keep_resident(TABLE_KEEP_RESIDENT);
    pool
}
