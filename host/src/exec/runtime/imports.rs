//! The host side of the `job` world's imports: [`HostState`] (the data of every store),
//! [`StepContext`], WASI, key checks, and the `types`, `leadership`, `store` and `log`
//! interfaces a guest calls.
//!
//! Length: every host import of the `job` world (store, tasks, leadership, log) on the one
//! `HostState`, so each import's checks sit beside the fenced write they guard.

use std::path::PathBuf;
use std::time::Instant;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use super::bindings::leasehold::job::{leadership, log as guest_log, store, tasks, types};
use super::error::StepError;
use super::sandbox::{GuestOutput, JobLimiter};
use crate::coord::fence::{self, Refusal, TermWriteError};
use crate::coord::quota::{Quota, QuotaUsage};
use crate::coord::term::Term;
use crate::coord::term_store::TermStore as _;
use crate::exec::spec::{Counts, Limits};
use crate::store::keys::JobKeys;

/// Most bytes of a guest's stderr kept per step.
pub(super) const STDERR_CAPACITY: usize = 64 * 1024;
/// Longest log line kept, in bytes.
const LOG_LINE_MAX: usize = 4096;
/// Longest key a guest may use, in bytes.
pub const KEY_MAX: usize = 256;
/// Most entries one `store.write-many` may carry.
pub const BATCH_ENTRIES: usize = 65_536;
/// Most bytes (keys and values) one `store.write-many` may carry.
pub const BATCH_BYTES: u64 = 64 << 20;

/// Everything a step's (or a task's) host imports need. Absent while `describe()` runs.
pub struct StepContext {
    /// The job's keys.
    pub keys: JobKeys,
    /// The term the step runs in (for a task: the term that submitted it, valid while the
    /// worker's claim holds).
    pub term: Term,
    /// The store, for guest reads and fenced writes. Calls are bounded by the term: a call
    /// still pending when the term ends is abandoned.
    pub store: crate::coord::term_store::Store,
    /// `<data-dir>/<job>/`, preopened read-only at `/data` when it exists.
    pub data_dir: Option<PathBuf>,
    /// A step of a run, or a task.
    pub work: Work,
    /// Where the call leaves the guest's last stderr lines when it ends (empty when it wrote
    /// none): the runner keeps them in the run record of a step that failed or waits.
    pub stderr: StderrTail,
}

/// The Redis connection a step's or task's fan-out calls take (tasks are not on the seam yet):
/// on etcd, unavailable.
fn tasks_conn(ctx: &StepContext) -> Result<crate::store::Conn, tasks::TasksError> {
    ctx.store
        .redis_conn()
        .map_err(|e| tasks::TasksError::Unavailable(format!("{e:#}")))
}

/// The last lines a guest wrote to stderr in one call, handed back to whoever made the call.
#[derive(Clone, Debug, Default)]
pub struct StderrTail(std::sync::Arc<std::sync::Mutex<String>>);

impl StderrTail {
    /// Replaces what is kept with `tail`.
    pub(super) fn set(&self, tail: String) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = tail;
    }

    /// What the call left, `None` when the guest wrote nothing to stderr.
    pub fn take(&self) -> Option<String> {
        let tail = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        (!tail.is_empty()).then_some(tail)
    }
}

impl StepContext {
    /// The context of a step of `period`'s run outside a runner (tests, benchmarks): tasks it
    /// submits name no component version.
    pub fn for_step(
        keys: JobKeys,
        term: Term,
        store: crate::coord::term_store::Store,
        data_dir: Option<PathBuf>,
        period: &str,
    ) -> Self {
        StepContext {
            keys,
            term,
            store,
            data_dir,
            work: Work::Step(crate::exec::tasks::RunOf {
                period: period.to_string(),
                attempt: 0,
                scheduled_at: String::new(),
                component: String::new(),
            }),
            stderr: StderrTail::default(),
        }
    }
}

/// What a call into a job is part of.
#[derive(Clone, Debug)]
pub enum Work {
    /// A step of this run: it may submit tasks and read their outputs.
    Step(crate::exec::tasks::RunOf),
    /// A task, run under this worker's claim: its writes need the claim too.
    Task(crate::exec::tasks::Claim),
}

/// The data of every store: WASI state, resources, limits and the step's context.
pub struct HostState {
    wasi: WasiCtx,
    pub(super) table: ResourceTable,
    pub(super) limits: JobLimiter,
    pub(super) step: Option<StepContext>,
    max_write: u64,
    quota: Quota,
    pub(super) deadline: Instant,
    pub(super) interrupt: Option<StepError>,
    pub(super) refusal: Option<Refusal>,
    /// The quota's refusal of this step's last write, if it was refused: a step that then
    /// fails (or traps) is recorded as `quota-exceeded`.
    pub(super) quota_refused: Option<QuotaUsage>,
    log_lines: u32,
    max_log_lines: u32,
    pub(super) log_dropped: u32,
    /// The step's databases and open transactions (`sql`); none in `describe()`.
    pub(super) sql: Option<super::sql_import::StepSql>,
    http_ctx: wasmtime_wasi_http::WasiHttpCtx,
    /// What the step's requests are sent for (`wasi:http`); refusing all in `describe()`.
    pub(super) http: crate::exec::http::HttpHooks,
}

impl wasmtime_wasi_http::WasiHttpView for HostState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        wasmtime_wasi_http::WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.http,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
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
    pub(super) fn new(
        limits: &Limits,
        counts: Counts,
        max_log_lines: u32,
        step: Option<StepContext>,
    ) -> anyhow::Result<(Self, GuestOutput)> {
        let stderr = GuestOutput::new(STDERR_CAPACITY);
        let mut wasi = WasiCtx::builder();
        wasi.stderr(stderr.clone());
        // No network: `wasi:sockets` is linked so that components importing it load, and
        // every use is refused before any socket is made (these are WASI's defaults, stated
        // so that a change of defaults cannot open the network).
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }));
        if let Some(dir) = step.as_ref().and_then(|s| s.data_dir.as_ref()) {
            wasi.preopened_dir(dir, "/data", FsPerms::ReadOnly)
                .map_err(|e| {
                    anyhow::anyhow!("cannot open data directory {}: {e}", dir.display())
                })?;
        }
        let state = HostState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits: JobLimiter::new(limits.memory, counts),
            step,
            max_write: limits.write_bytes,
            quota: Quota {
                keys: limits.stored_keys,
                bytes: limits.stored_bytes,
            },
            deadline: Instant::now() + limits.step_time,
            interrupt: None,
            refusal: None,
            quota_refused: None,
            log_lines: 0,
            max_log_lines,
            log_dropped: 0,
            sql: None,
            http_ctx: wasmtime_wasi_http::WasiHttpCtx::new(),
            http: crate::exec::http::HttpHooks::refuse_all(),
        };
        Ok((state, stderr))
    }

    pub(super) fn step(&mut self) -> wasmtime::Result<&mut StepContext> {
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
            Err(e @ (TermWriteError::Store(_) | TermWriteError::NotReplicated { .. })) => {
                Err(store::WriteError::Unavailable(e.to_string()))
            }
            Err(TermWriteError::Ended) => Err(store::WriteError::NotLeader),
            Err(TermWriteError::QuotaExceeded(usage)) => {
                self.quota_refused = Some(usage);
                Err(store::WriteError::QuotaExceeded(store::QuotaUsage {
                    keys: usage.keys,
                    bytes: usage.bytes,
                    max_keys: usage.max_keys,
                    max_bytes: usage.max_bytes,
                }))
            }
        }
    }

    /// `store.write`, for every world version.
    pub(super) async fn store_write(
        &mut self,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), store::WriteError>> {
        Ok(self.counted_write(key, value, false).await?.map(drop))
    }

    /// `store.create`, for every world version.
    pub(super) async fn store_create(
        &mut self,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<bool, store::WriteError>> {
        Ok(self
            .counted_write(key, value, true)
            .await?
            .map(|w| w.created))
    }

    /// A guest's write: checked, fenced and counted against the job's quota.
    async fn counted_write(
        &mut self,
        key: String,
        value: Vec<u8>,
        create: bool,
    ) -> wasmtime::Result<Result<fence::Written, store::WriteError>> {
        if let Err(e) = self.check_write(&key, &value) {
            return Ok(Err(e));
        }
        let ctx = self.step()?;
        let writes = [(ctx.keys.data(&key), value.as_slice())];
        self.fenced_guest_write(&writes, create).await
    }

    /// `store.delete` (0.4.1): the key checked, then deleted in a fenced write that takes it off
    /// the job's storage count; true when it existed.
    pub(super) async fn store_delete(
        &mut self,
        key: String,
    ) -> wasmtime::Result<Result<bool, store::WriteError>> {
        if let Err(why) = validate_key(&key) {
            return Ok(Err(store::WriteError::InvalidKey(why)));
        }
        let ctx = self.step()?;
        let deletes = [ctx.keys.data(&key)];
        Ok(self
            .fenced_guest_write_with(&[], &deletes, false)
            .await?
            .map(|w| w.deleted > 0))
    }

    /// `writes` (full keys of the job's data) as one fenced write of the step's term (and, for a
    /// task, its claim), counted against the job's quota; the outcome as the guest sees it.
    async fn fenced_guest_write(
        &mut self,
        writes: &[(String, &[u8])],
        create: bool,
    ) -> wasmtime::Result<Result<fence::Written, store::WriteError>> {
        self.fenced_guest_write_with(writes, &[], create).await
    }

    /// [`HostState::fenced_guest_write`], deleting `deletes` (full keys of the job's data) in
    /// the same write.
    async fn fenced_guest_write_with(
        &mut self,
        writes: &[(String, &[u8])],
        deletes: &[String],
        create: bool,
    ) -> wasmtime::Result<Result<fence::Written, store::WriteError>> {
        let quota = self.quota;
        let ctx = self.step()?;
        let claim = match &ctx.work {
            Work::Task(c) => Some(c.clone()),
            Work::Step(_) => None,
        };
        // A create's or a delete's answer depends on what it finds: an id lets a resent call
        // answer as the first one did.
        let id = (create || !deletes.is_empty()).then(|| uuid::Uuid::new_v4().simple().to_string());
        let write = fence::TermWrite {
            create,
            quota: Some(quota),
            claim: claim.as_ref(),
            id: id.as_deref(),
            ..fence::TermWrite::new(writes, deletes)
        };
        let res = fence::term_write(&ctx.store, &ctx.keys, &ctx.term, write).await;
        if res.is_ok() {
            // The guest got past the refusal (it wrote less, or elsewhere): a later failure
            // is not the quota's.
            self.quota_refused = None;
        }
        let ctx = self.step()?;
        let metrics = crate::metrics::get();
        match &res {
            Ok(fence::Written {
                usage: Some((keys, bytes)),
                ..
            }) => metrics.stored(ctx.keys.job(), *keys, *bytes),
            Err(TermWriteError::QuotaExceeded(_)) => metrics.quota_refused(ctx.keys.job()),
            _ => {}
        }
        Ok(self.write_result(res))
    }

    /// `store.write-many`: every entry checked, then one fenced write of all of them, counted
    /// against the quota together.
    pub(super) async fn store_write_many(
        &mut self,
        entries: Vec<store::Entry>,
    ) -> wasmtime::Result<Result<(), store::BatchError>> {
        let whole = |error| store::BatchError { index: None, error };
        if entries.len() > BATCH_ENTRIES {
            return Ok(Err(whole(store::WriteError::TooLarge(BATCH_BYTES))));
        }
        let mut total = 0u64;
        for (i, e) in entries.iter().enumerate() {
            if let Err(error) = self.check_write(&e.key, &e.value) {
                return Ok(Err(store::BatchError {
                    index: Some(i as u32),
                    error,
                }));
            }
            total += (e.key.len() + e.value.len()) as u64;
        }
        if total > BATCH_BYTES {
            return Ok(Err(whole(store::WriteError::TooLarge(BATCH_BYTES))));
        }
        let ctx = self.step()?;
        // Later entries win over earlier ones with the same key (as one write after another).
        let mut last = std::collections::HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            last.insert(e.key.as_str(), i);
        }
        let writes: Vec<(String, &[u8])> = entries
            .iter()
            .enumerate()
            .filter(|(i, e)| last.get(e.key.as_str()) == Some(i))
            .map(|(_, e)| (ctx.keys.data(&e.key), e.value.as_slice()))
            .collect();
        Ok(self
            .fenced_guest_write(&writes, false)
            .await?
            .map(drop)
            .map_err(whole))
    }

    /// The run a step belongs to (`tasks` calls are a step's only).
    fn run_of(&mut self) -> wasmtime::Result<Result<crate::exec::tasks::RunOf, tasks::TasksError>> {
        Ok(match &self.step()?.work {
            Work::Step(run) => Ok(run.clone()),
            Work::Task(_) => Err(tasks::TasksError::NotInAStep),
        })
    }

    /// `tasks.submit`.
    async fn tasks_submit(
        &mut self,
        list: Vec<tasks::Task>,
    ) -> wasmtime::Result<Result<(), tasks::TasksError>> {
        let run = match self.run_of()? {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        if list.len() > crate::exec::tasks::MOST_PER_SUBMIT {
            return Ok(Err(tasks::TasksError::Invalid(format!(
                "{} tasks in one submit, more than {}",
                list.len(),
                crate::exec::tasks::MOST_PER_SUBMIT
            ))));
        }
        let mut bytes = 0u64;
        for t in &list {
            if let Err(why) = crate::exec::tasks::validate_id(&t.id) {
                return Ok(Err(tasks::TasksError::Invalid(why)));
            }
            if t.payload.len() as u64 > self.max_write {
                return Ok(Err(tasks::TasksError::TooLarge(self.max_write)));
            }
            bytes += t.payload.len() as u64;
        }
        if bytes > crate::exec::tasks::MOST_BYTES_PER_SUBMIT {
            return Ok(Err(tasks::TasksError::TooLarge(
                crate::exec::tasks::MOST_BYTES_PER_SUBMIT,
            )));
        }
        let quota = self.quota;
        let ctx = self.step()?;
        // An id given twice in one call is the first one (as if submitted again).
        let mut seen = std::collections::HashSet::new();
        let list: Vec<(String, Vec<u8>)> = list
            .into_iter()
            .filter(|t| seen.insert(t.id.clone()))
            .map(|t| (t.id, t.payload))
            .collect();
        let term = ctx.term.clone();
        if !term.still_leader() {
            return Ok(Err(tasks::TasksError::NotLeader));
        }
        let mut conn = match tasks_conn(ctx) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let call = crate::exec::tasks::submit(
            &mut conn,
            &ctx.keys,
            (term.owner(), term.token()),
            &run,
            &list,
            quota.bytes,
        );
        Ok(match term.bound(call).await {
            Some(Ok(crate::exec::tasks::Submitted::Added(added))) => {
                tracing::info!(period = %run.period, tasks = list.len(), added, "tasks submitted");
                Ok(())
            }
            Some(Ok(crate::exec::tasks::Submitted::TooMany(has))) => {
                Err(tasks::TasksError::Invalid(format!(
                    "the run has {has} tasks: {} more would take it past {} tasks per run; nothing was submitted",
                    list.len(),
                    crate::exec::tasks::MOST_PER_RUN
                )))
            }
            Some(Ok(crate::exec::tasks::Submitted::Quota(keys, bytes))) => {
                let usage = crate::coord::quota::QuotaUsage {
                    keys,
                    bytes,
                    max_keys: quota.keys,
                    max_bytes: quota.bytes,
                };
                // The step fails as quota-exceeded if the guest gives up (as after a write).
                self.quota_refused = Some(usage);
                Err(tasks::TasksError::Invalid(format!(
                    "{usage}: task payloads count against the storage quota while their run keeps them; nothing was submitted"
                )))
            }
            Some(Err(fence::FenceError::Refused(r))) => {
                tracing::warn!(token = term.token(), "tasks refused: {r}; stepping down");
                term.end();
                crate::metrics::get().fence_refused(ctx.keys.job());
                let text = r.to_string();
                self.refusal = Some(r);
                Err(tasks::TasksError::Fenced(text))
            }
            Some(Err(e)) => Err(tasks::TasksError::Unavailable(e.to_string())),
            None => Err(tasks::TasksError::NotLeader),
        })
    }

    /// `tasks.output`.
    async fn tasks_output(
        &mut self,
        id: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, tasks::TasksError>> {
        let period = match self.run_of()? {
            Ok(r) => r.period,
            Err(e) => return Ok(Err(e)),
        };
        if let Err(why) = crate::exec::tasks::validate_id(&id) {
            return Ok(Err(tasks::TasksError::Invalid(why)));
        }
        let ctx = self.step()?;
        let mut conn = match tasks_conn(ctx) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let call = crate::exec::tasks::output(&mut conn, &ctx.keys, &period, &id);
        Ok(match ctx.term.bound(call).await {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(tasks::TasksError::Unavailable(e.to_string())),
            None => Err(tasks::TasksError::NotLeader),
        })
    }

    /// `tasks.progress`.
    async fn tasks_progress(
        &mut self,
    ) -> wasmtime::Result<Result<tasks::TaskProgress, tasks::TasksError>> {
        let period = match self.run_of()? {
            Ok(r) => r.period,
            Err(e) => return Ok(Err(e)),
        };
        let ctx = self.step()?;
        let mut conn = match tasks_conn(ctx) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let call = crate::exec::tasks::progress(&mut conn, &ctx.keys, &period);
        Ok(match ctx.term.bound(call).await {
            Some(Ok(p)) => Ok(tasks::TaskProgress {
                submitted: p.submitted,
                finished: p.finished,
                failed: p.failed,
            }),
            Some(Err(e)) => Err(tasks::TasksError::Unavailable(e.to_string())),
            None => Err(tasks::TasksError::NotLeader),
        })
    }

    /// `store.read`, for every world version.
    pub(super) async fn store_read(
        &mut self,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, store::ReadError>> {
        let ctx = self.step()?;
        if let Err(reason) = validate_key(&key) {
            return Ok(Err(store::ReadError::InvalidKey(reason)));
        }
        let res = ctx.term.bound(ctx.store.read(ctx.keys.job(), &key)).await;
        Ok(match res {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(store::ReadError::Unavailable(e.to_string())),
            None => Err(store::ReadError::Unavailable("the term ended".into())),
        })
    }

    /// `log.write`, for every world version.
    pub(super) fn log_write(&mut self, level: guest_log::Level, message: String) {
        if self.log_lines >= self.max_log_lines {
            self.log_dropped += 1;
            return;
        }
        self.log_lines += 1;
        let message = crate::logging::clip(message, LOG_LINE_MAX);
        // The job, node and term come from the runner's spans (see crate::logging).
        match level {
            guest_log::Level::Debug => tracing::debug!(guest = true, "{message}"),
            guest_log::Level::Info => tracing::info!(guest = true, "{message}"),
            guest_log::Level::Warn => tracing::warn!(guest = true, "{message}"),
            guest_log::Level::Error => tracing::error!(guest = true, "{message}"),
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
        self.store_write(key, value).await
    }

    async fn create(
        &mut self,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<bool, store::WriteError>> {
        self.store_create(key, value).await
    }

    async fn read(
        &mut self,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, store::ReadError>> {
        self.store_read(key).await
    }

    async fn delete(&mut self, key: String) -> wasmtime::Result<Result<bool, store::WriteError>> {
        self.store_delete(key).await
    }

    async fn write_many(
        &mut self,
        entries: Vec<store::Entry>,
    ) -> wasmtime::Result<Result<(), store::BatchError>> {
        self.store_write_many(entries).await
    }
}

impl tasks::Host for HostState {
    async fn submit(
        &mut self,
        list: Vec<tasks::Task>,
    ) -> wasmtime::Result<Result<(), tasks::TasksError>> {
        self.tasks_submit(list).await
    }

    async fn output(
        &mut self,
        id: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, tasks::TasksError>> {
        self.tasks_output(id).await
    }

    async fn progress(
        &mut self,
    ) -> wasmtime::Result<Result<tasks::TaskProgress, tasks::TasksError>> {
        self.tasks_progress().await
    }
}

impl guest_log::Host for HostState {
    async fn write(&mut self, level: guest_log::Level, message: String) -> wasmtime::Result<()> {
        self.log_write(level, message);
        Ok(())
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
