//! The world versions a component may be built to, and one type over them ([`WorldPre`]).
//!
//! * **0.4.3** (`wit/job.wit`, the current version, [`super::bindings`]): two worlds, `job`
//!   (`describe`, `databases`, `run-step`; imports `leadership`, `store` with `write-many` and
//!   `delete`, `log`, `sql`) and `fan-out-job` (`job` plus the `tasks` import and the
//!   `run-task` export). The bindings are generated for `fan-out-job`; those of `job`
//!   ([`job_world`]) share its interfaces.
//! * **0.4.2** (`wit/v0.4.2/job.wit`, [`v0_4`]): 0.4.3 without the `databases` export (its
//!   databases are granted by its sidecar only); **0.4.1** (`wit/v0.4.1/job.wit`): 0.4.2
//!   without `sql`; **0.4.0** (`wit/v0.4.0/job.wit`): 0.4.1 without `store.delete`. Their
//!   imports are served by the 0.4.3 linker as they are (the component model links an import
//!   of `…@0.4.0` to `…@0.4.2` to the host's semver-compatible `…@0.4.3`, whose interfaces only
//!   add functions and an interface), and their exports through the 0.4.2 bindings, which share
//!   the 0.4.3 types.
//! * **0.3.0** (`wit/v0.3.0/job.wit`, [`v0_3`]): the world before batched writes and fan-out.
//! * **0.2.0** (`wit/v0.2.0/job.wit`, [`v0_2`]): the world before storage quotas. It has no
//!   `quota-exceeded` write error, so a 0.2.0 component's write beyond its quota stops the step
//!   (a trap the host records as `quota-exceeded`) instead of returning an error the guest
//!   cannot name; its quota is the host's default, or its sidecar's `[quota]`.
//!
//! Components built to an earlier world keep loading and running: their imports are served by
//! the same host code as the current ones, with types converted at the boundary. Which world a
//! component is built to is read from its imports (`leasehold:job/…@0.2.0`) and exports
//! (`run-task`) before it is type-checked, so an error names the world it was checked against.
//!
//! Length: the bindings of every world version the host still loads, and their conversions.

use wasmtime::Store;
use wasmtime::component::{InstancePre, Resource};

use super::HostState;
use super::bindings::{self, leasehold::job::types};
use super::error::StepError;
use crate::coord::term::Term;

/// Bindings of the 0.4.3 `job` world (no fan-out), sharing [`super::bindings`]' interfaces.
#[allow(missing_docs, unreachable_pub)] // generated from wit/job.wit
pub(super) mod job_world {
    wasmtime::component::bindgen!({
        world: "job",
        path: "../wit",
        imports: { default: async | trappable },
        exports: { default: async },
        with: { "leasehold:job": crate::exec::runtime::bindings::leasehold::job },
    });
}

/// Bindings of the 0.4.2 worlds (`job`, `fan-out-job`; also serving 0.4.1 and 0.4.0), whose
/// exports are 0.4.3's without `databases`: they share [`super::bindings`]' interfaces.
pub(super) mod v0_4 {
    /// The 0.4.2 `job` world.
    #[allow(missing_docs, unreachable_pub)] // generated from wit/v0.4.2/job.wit
    pub(in super::super) mod job {
        wasmtime::component::bindgen!({
            world: "job",
            path: "../wit/v0.4.2",
            imports: { default: async | trappable },
            exports: { default: async },
            with: { "leasehold:job": crate::exec::runtime::bindings::leasehold::job },
        });
    }

    /// The 0.4.2 `fan-out-job` world.
    #[allow(missing_docs, unreachable_pub)] // generated from wit/v0.4.2/job.wit
    pub(in super::super) mod fan_out {
        wasmtime::component::bindgen!({
            world: "fan-out-job",
            path: "../wit/v0.4.2",
            imports: { default: async | trappable },
            exports: { default: async },
            with: { "leasehold:job": crate::exec::runtime::bindings::leasehold::job },
        });
    }
}

/// Generated bindings for world 0.3.0.
#[allow(missing_docs, unreachable_pub)] // generated from wit/v0.3.0/job.wit
pub(super) mod v0_3 {
    wasmtime::component::bindgen!({
        world: "job",
        path: "../wit/v0.3.0",
        imports: { default: async | trappable },
        exports: { default: async },
        with: { "leasehold:job/leadership.term": crate::coord::term::Term },
    });
}

/// Generated bindings for world 0.2.0.
#[allow(missing_docs, unreachable_pub)] // generated from wit/v0.2.0/job.wit
pub(super) mod v0_2 {
    wasmtime::component::bindgen!({
        world: "job",
        path: "../wit/v0.2.0",
        imports: { default: async | trappable },
        exports: { default: async },
        with: { "leasehold:job/leadership.term": crate::coord::term::Term },
    });
}

use v0_2::leasehold::job as old2;
use v0_3::leasehold::job as old3;

/// A spec of an earlier world (module `$old`, value `$s`) as a current one, with `$limits`.
macro_rules! spec {
    ($old:ident, $s:ident, $limits:expr) => {{
        let p = $s.policies;
        types::JobSpec {
            name: $s.name,
            schedule: $s.schedule,
            time_zone: $s.time_zone,
            limits: $limits,
            policies: types::Policies {
                catch_up: match p.catch_up {
                    $old::types::CatchUp::Latest => types::CatchUp::Latest,
                    $old::types::CatchUp::Skip => types::CatchUp::Skip,
                    $old::types::CatchUp::All => types::CatchUp::All,
                },
                catch_up_window_millis: p.catch_up_window_millis,
                retry_attempts: p.retry_attempts,
                retry_backoff_millis: p.retry_backoff_millis,
                retry_max_backoff_millis: p.retry_max_backoff_millis,
                overlap: match p.overlap {
                    $old::types::Overlap::Queue => types::Overlap::Queue,
                    $old::types::Overlap::Skip => types::Overlap::Skip,
                },
                max_run_millis: p.max_run_millis,
            },
        }
    }};
}

/// A current run-info as an earlier world's.
macro_rules! run_info {
    ($old:ident, $run:ident) => {
        $old::types::RunInfo {
            period: $run.period.clone(),
            scheduled_at: $run.scheduled_at.clone(),
            attempt: $run.attempt,
        }
    };
}

/// An earlier world's step result as a current one.
macro_rules! outcome {
    ($old:ident, $out:ident) => {
        match $out {
            Ok($old::types::StepOutcome::Continue(s)) => Ok(types::StepOutcome::Continue(s)),
            Ok($old::types::StepOutcome::Done) => Ok(types::StepOutcome::Done),
            Err($old::types::JobError::Failed(m)) => Err(types::JobError::Failed(m)),
            Err($old::types::JobError::NotReady(m)) => Err(types::JobError::NotReady(m)),
            Err($old::types::JobError::LostLeadership) => Err(types::JobError::LostLeadership),
        }
    };
}

/// What a call into a job asks for: a step, or a task.
pub(super) enum Call<'a> {
    /// `run-step`.
    Step {
        run: &'a types::RunInfo,
        step: u32,
        state: Option<&'a [u8]>,
    },
    /// `run-task` (fan-out jobs only).
    Task {
        run: &'a types::RunInfo,
        task: &'a bindings::leasehold::job::tasks::Task,
    },
}

/// What a call returned.
pub(super) enum Returned {
    /// A step's outcome.
    Step(types::StepOutcome),
    /// A task's output.
    Task(Vec<u8>),
}

/// The version a component served by the 0.4.2 bindings was built to: `0.4.0`, `0.4.1` or
/// `0.4.2` (for what `check` and the status say it is built to).
pub(super) type Built = &'static str;

/// A pre-instantiated component of any world.
#[derive(Clone)]
pub(super) enum WorldPre {
    /// Built to 0.4.3 `fan-out-job`.
    FanOut(bindings::FanOutJobPre<HostState>),
    /// Built to 0.4.3 `job`.
    Current(job_world::JobPre<HostState>),
    /// Built to 0.4.0, 0.4.1 or 0.4.2 `fan-out-job` (the version it names): no `databases`.
    FanOut04(v0_4::fan_out::FanOutJobPre<HostState>, Built),
    /// Built to 0.4.0, 0.4.1 or 0.4.2 `job` (the version it names): no `databases`.
    Job04(v0_4::job::JobPre<HostState>, Built),
    /// Built to world 0.3.0.
    V0_3(v0_3::JobPre<HostState>),
    /// Built to world 0.2.0.
    V0_2(v0_2::JobPre<HostState>),
}

/// What `describe()` (and, from 0.4.3, `databases()`) told the host.
pub(super) struct Described {
    /// The job's spec, as the current world has it.
    pub spec: types::JobSpec,
    /// The databases the job declares (none before 0.4.3).
    pub databases: Vec<String>,
}

impl WorldPre {
    /// Type-checks `pre`'s exports against the world its imports and exports name.
    pub(super) fn new(
        pre: InstancePre<HostState>,
        engine: &wasmtime::Engine,
    ) -> Result<Self, String> {
        let ty = pre.component().component_type();
        let imports_version = |v: &str| {
            ty.imports(engine)
                .any(|(name, _)| name.starts_with("leasehold:job/") && name.ends_with(v))
        };
        let fan_out = ty.exports(engine).any(|(name, _)| name == "run-task");
        let declares = ty.exports(engine).any(|(name, _)| name == "databases");
        let world = |w: &'static str| {
            move |e: wasmtime::Error| format!("does not implement the {w} world: {e}")
        };
        let earlier = if imports_version("@0.2.0") {
            return v0_2::JobPre::new(pre)
                .map(WorldPre::V0_2)
                .map_err(world("leasehold:job/job@0.2.0"));
        } else if imports_version("@0.3.0") {
            return v0_3::JobPre::new(pre)
                .map(WorldPre::V0_3)
                .map_err(world("leasehold:job/job@0.3.0"));
        } else if imports_version("@0.4.0") {
            Some("0.4.0")
        } else if imports_version("@0.4.1") {
            Some("0.4.1")
        } else if imports_version("@0.4.2") || (!imports_version("@0.4.3") && !declares) {
            Some("0.4.2")
        } else {
            None
        };
        match (earlier, fan_out) {
            (Some(built), true) => v0_4::fan_out::FanOutJobPre::new(pre)
                .map(|p| WorldPre::FanOut04(p, built))
                .map_err(world("leasehold:job/fan-out-job@0.4.2")),
            (Some(built), false) => v0_4::job::JobPre::new(pre)
                .map(|p| WorldPre::Job04(p, built))
                .map_err(world("leasehold:job/job@0.4.2")),
            (None, true) => bindings::FanOutJobPre::new(pre)
                .map(WorldPre::FanOut)
                .map_err(world("leasehold:job/fan-out-job@0.4.3")),
            (None, false) => job_world::JobPre::new(pre)
                .map(WorldPre::Current)
                .map_err(world("leasehold:job/job@0.4.3")),
        }
    }

    /// The world the component is built to.
    pub(super) fn version(&self) -> &'static str {
        match self {
            WorldPre::FanOut(_) => "0.4.3 (fan-out-job)",
            WorldPre::Current(_) => "0.4.3",
            WorldPre::FanOut04(_, "0.4.0") => "0.4.0 (fan-out-job)",
            WorldPre::FanOut04(_, "0.4.1") => "0.4.1 (fan-out-job)",
            WorldPre::FanOut04(..) => "0.4.2 (fan-out-job)",
            WorldPre::Job04(_, v) => v,
            WorldPre::V0_3(_) => "0.3.0",
            WorldPre::V0_2(_) => "0.2.0",
        }
    }

    /// Whether the component exports `run-task` (it can fan out).
    pub(super) fn fans_out(&self) -> bool {
        matches!(self, WorldPre::FanOut(_) | WorldPre::FanOut04(..))
    }

    /// Instantiates without calling anything (what every step pays first).
    pub(super) async fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<()> {
        match self {
            WorldPre::FanOut(p) => p.instantiate_async(store).await.map(drop),
            WorldPre::Current(p) => p.instantiate_async(store).await.map(drop),
            WorldPre::FanOut04(p, _) => p.instantiate_async(store).await.map(drop),
            WorldPre::Job04(p, _) => p.instantiate_async(store).await.map(drop),
            WorldPre::V0_3(p) => p.instantiate_async(store).await.map(drop),
            WorldPre::V0_2(p) => p.instantiate_async(store).await.map(drop),
        }
    }

    /// Instantiates and calls `describe()`, then (from 0.4.3) `databases()`.
    pub(super) async fn describe(
        &self,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<Described> {
        // The spec alone, from a world without `databases`.
        let spec_only = |spec| Described {
            spec,
            databases: Vec::new(),
        };
        match self {
            WorldPre::FanOut(p) => {
                let job = p.instantiate_async(&mut *store).await?;
                let spec = job.call_describe(&mut *store).await?;
                let databases = job.call_databases(&mut *store).await?;
                Ok(Described { spec, databases })
            }
            WorldPre::Current(p) => {
                let job = p.instantiate_async(&mut *store).await?;
                let spec = job.call_describe(&mut *store).await?;
                let databases = job.call_databases(&mut *store).await?;
                Ok(Described { spec, databases })
            }
            WorldPre::FanOut04(p, _) => p
                .instantiate_async(&mut *store)
                .await?
                .call_describe(store)
                .await
                .map(spec_only),
            WorldPre::Job04(p, _) => p
                .instantiate_async(&mut *store)
                .await?
                .call_describe(store)
                .await
                .map(spec_only),
            WorldPre::V0_3(p) => {
                let s = p
                    .instantiate_async(&mut *store)
                    .await?
                    .call_describe(store)
                    .await?;
                let limits = types::Limits {
                    max_memory_bytes: s.limits.max_memory_bytes,
                    max_step_millis: s.limits.max_step_millis,
                    max_write_bytes: s.limits.max_write_bytes,
                    max_stored_keys: s.limits.max_stored_keys,
                    max_stored_bytes: s.limits.max_stored_bytes,
                };
                Ok(spec_only(spec!(old3, s, limits)))
            }
            WorldPre::V0_2(p) => {
                let s = p
                    .instantiate_async(&mut *store)
                    .await?
                    .call_describe(store)
                    .await?;
                // No quota asked for: the host's default applies.
                let limits = types::Limits {
                    max_memory_bytes: s.limits.max_memory_bytes,
                    max_step_millis: s.limits.max_step_millis,
                    max_write_bytes: s.limits.max_write_bytes,
                    max_stored_keys: 0,
                    max_stored_bytes: 0,
                };
                Ok(spec_only(spec!(old2, s, limits)))
            }
        }
    }

    /// Instantiates and makes `call` with `term` as the capability.
    pub(super) async fn call(
        &self,
        store: &mut Store<HostState>,
        term: Term,
        call: Call<'_>,
    ) -> wasmtime::Result<Result<Returned, types::JobError>> {
        // Instantiates `$pre`, then calls `run-step` with the term, the run info `$run` (as the
        // component's world has it) and the step, converting the result with `$out`.
        macro_rules! run_step {
            ($pre:expr, $run:expr, $step:expr, $state:expr, $out:expr) => {{
                let job = $pre.instantiate_async(&mut *store).await?;
                let res = store.data_mut().table.push(term)?;
                let out = job.call_run_step(store, res, $run, $step, $state).await?;
                Ok($out(out).map(Returned::Step))
            }};
        }
        match (self, call) {
            (WorldPre::FanOut(p), Call::Step { run, step, state }) => {
                run_step!(p, run, step, state, std::convert::identity)
            }
            (WorldPre::Current(p), Call::Step { run, step, state }) => {
                run_step!(p, run, step, state, std::convert::identity)
            }
            (WorldPre::FanOut04(p, _), Call::Step { run, step, state }) => {
                run_step!(p, run, step, state, std::convert::identity)
            }
            (WorldPre::Job04(p, _), Call::Step { run, step, state }) => {
                run_step!(p, run, step, state, std::convert::identity)
            }
            (WorldPre::V0_3(p), Call::Step { run, step, state }) => {
                run_step!(p, &run_info!(old3, run), step, state, |o| outcome!(old3, o))
            }
            (WorldPre::V0_2(p), Call::Step { run, step, state }) => {
                run_step!(p, &run_info!(old2, run), step, state, |o| outcome!(old2, o))
            }
            (WorldPre::FanOut(p), Call::Task { run, task }) => {
                let job = p.instantiate_async(&mut *store).await?;
                let res = store.data_mut().table.push(term)?;
                Ok(job
                    .call_run_task(store, res, run, task)
                    .await?
                    .map(Returned::Task))
            }
            (WorldPre::FanOut04(p, _), Call::Task { run, task }) => {
                let job = p.instantiate_async(&mut *store).await?;
                let res = store.data_mut().table.push(term)?;
                Ok(job
                    .call_run_task(store, res, run, task)
                    .await?
                    .map(Returned::Task))
            }
            (_, Call::Task { .. }) => wasmtime::bail!(
                "the component exports no run-task (built to world {}): it cannot run tasks",
                self.version()
            ),
        }
    }
}

/// The imports an earlier world shares with the current one, served by the same code:
/// `types`, `leadership` (the same [`Term`]), `log`, and `store.read`.
macro_rules! earlier_world_imports {
    ($old:ident) => {
        impl $old::types::Host for HostState {}

        impl $old::leadership::Host for HostState {}

        impl $old::leadership::HostTerm for HostState {
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

        impl $old::log::Host for HostState {
            async fn write(
                &mut self,
                level: $old::log::Level,
                message: String,
            ) -> wasmtime::Result<()> {
                use bindings::leasehold::job::log::Level;
                let level = match level {
                    $old::log::Level::Debug => Level::Debug,
                    $old::log::Level::Info => Level::Info,
                    $old::log::Level::Warn => Level::Warn,
                    $old::log::Level::Error => Level::Error,
                };
                self.log_write(level, message);
                Ok(())
            }
        }

        impl $old::store::Host for HostState {
            async fn write(
                &mut self,
                key: String,
                value: Vec<u8>,
            ) -> wasmtime::Result<Result<(), $old::store::WriteError>> {
                match self.store_write(key, value).await? {
                    Ok(()) => Ok(Ok(())),
                    Err(e) => Ok(Err(self.$old(e)?)),
                }
            }

            async fn create(
                &mut self,
                key: String,
                value: Vec<u8>,
            ) -> wasmtime::Result<Result<bool, $old::store::WriteError>> {
                match self.store_create(key, value).await? {
                    Ok(created) => Ok(Ok(created)),
                    Err(e) => Ok(Err(self.$old(e)?)),
                }
            }

            async fn read(
                &mut self,
                key: String,
            ) -> wasmtime::Result<Result<Option<Vec<u8>>, $old::store::ReadError>> {
                use bindings::leasehold::job::store::ReadError as New;
                Ok(self.store_read(key).await?.map_err(|e| match e {
                    New::InvalidKey(m) => $old::store::ReadError::InvalidKey(m),
                    New::Unavailable(m) => $old::store::ReadError::Unavailable(m),
                }))
            }
        }
    };
}

earlier_world_imports!(old3);
earlier_world_imports!(old2);

impl HostState {
    /// A current write error as 0.3.0 knows it (the same cases).
    fn old3(
        &mut self,
        e: bindings::leasehold::job::store::WriteError,
    ) -> wasmtime::Result<old3::store::WriteError> {
        use bindings::leasehold::job::store::WriteError as New;
        Ok(match e {
            New::Fenced(m) => old3::store::WriteError::Fenced(m),
            New::NotLeader => old3::store::WriteError::NotLeader,
            New::InvalidKey(m) => old3::store::WriteError::InvalidKey(m),
            New::TooLarge(n) => old3::store::WriteError::TooLarge(n),
            New::Unavailable(m) => old3::store::WriteError::Unavailable(m),
            New::QuotaExceeded(u) => {
                old3::store::WriteError::QuotaExceeded(old3::store::QuotaUsage {
                    keys: u.keys,
                    bytes: u.bytes,
                    max_keys: u.max_keys,
                    max_bytes: u.max_bytes,
                })
            }
        })
    }

    /// A current write error as 0.2.0 knows it; `quota-exceeded`, which 0.2.0 cannot name,
    /// stops the step (see the module doc).
    fn old2(
        &mut self,
        e: bindings::leasehold::job::store::WriteError,
    ) -> wasmtime::Result<old2::store::WriteError> {
        use bindings::leasehold::job::store::WriteError as New;
        Ok(match e {
            New::Fenced(m) => old2::store::WriteError::Fenced(m),
            New::NotLeader => old2::store::WriteError::NotLeader,
            New::InvalidKey(m) => old2::store::WriteError::InvalidKey(m),
            New::TooLarge(n) => old2::store::WriteError::TooLarge(n),
            New::Unavailable(m) => old2::store::WriteError::Unavailable(m),
            New::QuotaExceeded(_) => {
                let why = self
                    .quota_refused
                    .map(|u| u.to_string())
                    .unwrap_or_else(|| "storage quota exceeded".into());
                self.interrupt = Some(StepError::QuotaExceeded(why.clone()));
                wasmtime::bail!("{why}");
            }
        })
    }
}
