//! The host side of the `job` world's imports: [`HostState`] (the data of every store),
//! [`StepContext`], WASI, key checks, and the `types`, `leadership`, `store` and `log`
//! interfaces a guest calls.

use std::path::PathBuf;
use std::time::Instant;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use super::bindings::leasehold::job::{leadership, log as guest_log, store, types};
use super::error::StepError;
use super::sandbox::{GuestOutput, JobLimiter};
use crate::fence::{self, Refusal, TermWriteError};
use crate::keys::JobKeys;
use crate::quota::{Quota, QuotaUsage};
use crate::spec::{Counts, Limits};
use crate::term::Term;

/// Most bytes of a guest's stderr kept per step.
pub(super) const STDERR_CAPACITY: usize = 64 * 1024;
/// Longest log line kept, in bytes.
const LOG_LINE_MAX: usize = 4096;
/// Longest key a guest may use, in bytes.
pub const KEY_MAX: usize = 256;

/// Everything a step's host imports need. Absent while `describe()` runs.
pub struct StepContext {
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
            Err(e @ (TermWriteError::Redis(_) | TermWriteError::NotReplicated { .. })) => {
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
        let quota = self.quota;
        let ctx = self.step()?;
        let writes = [(ctx.keys.data(&key), value.as_slice())];
        let write = fence::TermWrite {
            create,
            quota: Some(quota),
            ..fence::TermWrite::new(&writes, &[])
        };
        let res = fence::term_write(&mut ctx.conn, &ctx.keys, &ctx.term, write).await;
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

    /// `store.read`, for every world version.
    pub(super) async fn store_read(
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
