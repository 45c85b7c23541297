//! The world versions a component may be built to, and one type over them ([`WorldPre`]).
//!
//! * **0.3.0** (`wit/job.wit`, the current world, [`super::bindings`]): what jobs are built to.
//! * **0.2.0** (`wit/v0.2.0/job.wit`, [`v0_2`]): the world before storage quotas. Components
//!   built to it keep loading and running: its imports are served by the same host code as
//!   0.3.0's, and its types converted at the boundary. It has no `quota-exceeded` write error,
//!   so a 0.2.0 component's write beyond its quota stops the step (a trap the host records as
//!   `quota-exceeded`) instead of returning an error the guest cannot name; its quota is the
//!   host's default, or its sidecar's `[quota]`.
//!
//! Which world a component is built to is read from its imports (`leasehold:job/…@0.2.0`)
//! before it is type-checked, so an error names the world it was checked against.

use wasmtime::Store;
use wasmtime::component::{InstancePre, Resource};

use super::HostState;
use super::bindings::{self, leasehold::job::types};
use super::error::StepError;
use crate::term::Term;

/// Generated bindings for world 0.2.0.
#[allow(missing_docs, unreachable_pub)] // generated from wit/v0.2.0/job.wit
pub(super) mod v0_2 {
    wasmtime::component::bindgen!({
        world: "job",
        path: "../wit/v0.2.0",
        imports: { default: async | trappable },
        exports: { default: async },
        with: { "leasehold:job/leadership.term": crate::term::Term },
    });
}

use v0_2::leasehold::job as old;

/// A pre-instantiated component of either world.
#[derive(Clone)]
pub(super) enum WorldPre {
    /// Built to the current world (0.3.0).
    Current(bindings::JobPre<HostState>),
    /// Built to world 0.2.0.
    V0_2(v0_2::JobPre<HostState>),
}

impl WorldPre {
    /// Type-checks `pre`'s exports against the world its imports name.
    pub(super) fn new(
        pre: InstancePre<HostState>,
        engine: &wasmtime::Engine,
    ) -> Result<Self, String> {
        let v0_2 = pre
            .component()
            .component_type()
            .imports(engine)
            .any(|(name, _)| name.starts_with("leasehold:job/") && name.ends_with("@0.2.0"));
        if v0_2 {
            v0_2::JobPre::new(pre)
                .map(WorldPre::V0_2)
                .map_err(|e| format!("does not implement the leasehold:job/job@0.2.0 world: {e}"))
        } else {
            bindings::JobPre::new(pre)
                .map(WorldPre::Current)
                .map_err(|e| format!("does not implement the leasehold:job/job@0.3.0 world: {e}"))
        }
    }

    /// The world version the component is built to.
    pub(super) fn version(&self) -> &'static str {
        match self {
            WorldPre::Current(_) => "0.3.0",
            WorldPre::V0_2(_) => "0.2.0",
        }
    }

    /// Instantiates without calling anything (what every step pays first).
    pub(super) async fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<()> {
        match self {
            WorldPre::Current(p) => p.instantiate_async(store).await.map(drop),
            WorldPre::V0_2(p) => p.instantiate_async(store).await.map(drop),
        }
    }

    /// Instantiates and calls `describe()`.
    pub(super) async fn describe(
        &self,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<types::JobSpec> {
        match self {
            WorldPre::Current(p) => {
                p.instantiate_async(&mut *store)
                    .await?
                    .call_describe(store)
                    .await
            }
            WorldPre::V0_2(p) => {
                let spec = p
                    .instantiate_async(&mut *store)
                    .await?
                    .call_describe(store)
                    .await?;
                Ok(spec_from_v0_2(spec))
            }
        }
    }

    /// Instantiates and calls `run-step` with `term` as the capability.
    pub(super) async fn run_step(
        &self,
        store: &mut Store<HostState>,
        term: Term,
        run: &types::RunInfo,
        step: u32,
        state: Option<&[u8]>,
    ) -> wasmtime::Result<Result<types::StepOutcome, types::JobError>> {
        match self {
            WorldPre::Current(p) => {
                let job = p.instantiate_async(&mut *store).await?;
                let res = store.data_mut().table.push(term)?;
                job.call_run_step(store, res, run, step, state).await
            }
            WorldPre::V0_2(p) => {
                let job = p.instantiate_async(&mut *store).await?;
                let res = store.data_mut().table.push(term)?;
                let run = old::types::RunInfo {
                    period: run.period.clone(),
                    scheduled_at: run.scheduled_at.clone(),
                    attempt: run.attempt,
                };
                let out = job.call_run_step(store, res, &run, step, state).await?;
                Ok(match out {
                    Ok(old::types::StepOutcome::Continue(s)) => Ok(types::StepOutcome::Continue(s)),
                    Ok(old::types::StepOutcome::Done) => Ok(types::StepOutcome::Done),
                    Err(old::types::JobError::Failed(m)) => Err(types::JobError::Failed(m)),
                    Err(old::types::JobError::NotReady(m)) => Err(types::JobError::NotReady(m)),
                    Err(old::types::JobError::LostLeadership) => {
                        Err(types::JobError::LostLeadership)
                    }
                })
            }
        }
    }
}

/// A 0.2.0 spec as a current one: no quota asked for (the host's default applies).
fn spec_from_v0_2(s: old::types::JobSpec) -> types::JobSpec {
    let p = s.policies;
    types::JobSpec {
        name: s.name,
        schedule: s.schedule,
        time_zone: s.time_zone,
        limits: types::Limits {
            max_memory_bytes: s.limits.max_memory_bytes,
            max_step_millis: s.limits.max_step_millis,
            max_write_bytes: s.limits.max_write_bytes,
            max_stored_keys: 0,
            max_stored_bytes: 0,
        },
        policies: types::Policies {
            catch_up: match p.catch_up {
                old::types::CatchUp::Latest => types::CatchUp::Latest,
                old::types::CatchUp::Skip => types::CatchUp::Skip,
                old::types::CatchUp::All => types::CatchUp::All,
            },
            catch_up_window_millis: p.catch_up_window_millis,
            retry_attempts: p.retry_attempts,
            retry_backoff_millis: p.retry_backoff_millis,
            retry_max_backoff_millis: p.retry_max_backoff_millis,
            overlap: match p.overlap {
                old::types::Overlap::Queue => types::Overlap::Queue,
                old::types::Overlap::Skip => types::Overlap::Skip,
            },
            max_run_millis: p.max_run_millis,
        },
    }
}

// The 0.2.0 imports, served by the same code as the current ones.

impl old::types::Host for HostState {}

impl old::leadership::Host for HostState {}

impl old::leadership::HostTerm for HostState {
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

impl HostState {
    /// A current write error as 0.2.0 knows it; `quota-exceeded`, which 0.2.0 cannot name,
    /// stops the step (see the module doc).
    fn old_write_error(
        &mut self,
        e: bindings::leasehold::job::store::WriteError,
    ) -> wasmtime::Result<old::store::WriteError> {
        use bindings::leasehold::job::store::WriteError as New;
        Ok(match e {
            New::Fenced(m) => old::store::WriteError::Fenced(m),
            New::NotLeader => old::store::WriteError::NotLeader,
            New::InvalidKey(m) => old::store::WriteError::InvalidKey(m),
            New::TooLarge(n) => old::store::WriteError::TooLarge(n),
            New::Unavailable(m) => old::store::WriteError::Unavailable(m),
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

impl old::store::Host for HostState {
    async fn write(
        &mut self,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), old::store::WriteError>> {
        match self.store_write(key, value).await? {
            Ok(()) => Ok(Ok(())),
            Err(e) => Ok(Err(self.old_write_error(e)?)),
        }
    }

    async fn create(
        &mut self,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<bool, old::store::WriteError>> {
        match self.store_create(key, value).await? {
            Ok(created) => Ok(Ok(created)),
            Err(e) => Ok(Err(self.old_write_error(e)?)),
        }
    }

    async fn read(
        &mut self,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, old::store::ReadError>> {
        use bindings::leasehold::job::store::ReadError as New;
        Ok(self.store_read(key).await?.map_err(|e| match e {
            New::InvalidKey(m) => old::store::ReadError::InvalidKey(m),
            New::Unavailable(m) => old::store::ReadError::Unavailable(m),
        }))
    }
}

impl old::log::Host for HostState {
    async fn write(&mut self, level: old::log::Level, message: String) -> wasmtime::Result<()> {
        use bindings::leasehold::job::log::Level;
        let level = match level {
            old::log::Level::Debug => Level::Debug,
            old::log::Level::Info => Level::Info,
            old::log::Level::Warn => Level::Warn,
            old::log::Level::Error => Level::Error,
        };
        self.log_write(level, message);
        Ok(())
    }
}
