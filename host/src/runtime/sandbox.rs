//! The walls around a guest that are not wasmtime's defaults: one memory budget for the whole
//! instance, bounded tables and instance counts, and a stderr that never fails the guest.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime::ResourceLimiter;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

/// Most elements any one table may grow to.
pub(crate) const TABLE_ELEMENTS: usize = 1 << 20;
/// Most instances, tables and memories one step may create.
const COUNT: usize = 16;

/// Limits one store: the *sum* of all linear memories stays within the job's memory limit (a
/// per-memory limit would let a component with many memories multiply it), tables stay below
/// [`TABLE_ELEMENTS`], and a refused grow traps with a message naming the limit.
pub(crate) struct JobLimiter {
    max_memory: usize,
    memory: usize,
    /// A memory grow was refused: the trap that follows is the memory limit's.
    pub memory_exceeded: bool,
}

impl JobLimiter {
    /// A limiter for `max_memory` bytes of linear memory in total.
    pub(crate) fn new(max_memory: u64) -> Self {
        JobLimiter {
            max_memory: usize::try_from(max_memory).unwrap_or(usize::MAX),
            memory: 0,
            memory_exceeded: false,
        }
    }
}

impl ResourceLimiter for JobLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.memory - current.min(self.memory) + desired;
        if total > self.max_memory {
            self.memory_exceeded = true;
            wasmtime::bail!(
                "forcing trap when growing memory to {desired} bytes: the job's memory limit is {} bytes in total",
                self.max_memory
            );
        }
        self.memory = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > TABLE_ELEMENTS {
            wasmtime::bail!(
                "forcing trap when growing a table to {desired} elements: the limit is {TABLE_ELEMENTS}"
            );
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        COUNT
    }

    fn tables(&self) -> usize {
        COUNT
    }

    fn memories(&self) -> usize {
        COUNT
    }
}

/// A guest's stderr: keeps the first `capacity` bytes and counts the rest, and never refuses a
/// write (a refused write would make Rust's `eprintln!` panic and fail the step).
#[derive(Clone)]
pub(crate) struct GuestOutput {
    inner: Arc<Mutex<(Vec<u8>, usize)>>,
    capacity: usize,
}

impl GuestOutput {
    /// An empty output keeping at most `capacity` bytes.
    pub(crate) fn new(capacity: usize) -> Self {
        GuestOutput {
            inner: Arc::default(),
            capacity,
        }
    }

    /// What was kept, and how many bytes were dropped.
    pub(crate) fn take(&self) -> (Vec<u8>, usize) {
        std::mem::take(&mut *self.inner.lock().unwrap())
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl tokio::io::AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut inner = self.inner.lock().unwrap();
        let room = self.capacity.saturating_sub(inner.0.len());
        let kept = buf.len().min(room);
        inner.0.extend_from_slice(&buf[..kept]);
        inner.1 += buf.len() - kept;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_limited_in_total_across_memories() {
        let mut l = JobLimiter::new(100);
        assert!(l.memory_growing(0, 60, None).unwrap());
        // A second memory may not take the total past the limit.
        assert!(l.memory_growing(0, 50, None).is_err());
        assert!(l.memory_growing(0, 40, None).unwrap());
        // Growing the first memory counts only the difference.
        assert!(l.memory_growing(40, 40, None).unwrap());
        assert!(l.table_growing(0, TABLE_ELEMENTS + 1, None).is_err());
    }

    #[tokio::test]
    async fn output_past_capacity_is_counted_not_refused() {
        use tokio::io::AsyncWriteExt;
        let out = GuestOutput::new(4);
        let mut w = Box::into_pin(out.async_stream());
        w.write_all(b"abcdef").await.unwrap();
        assert_eq!(out.take(), (b"abcd".to_vec(), 2));
    }
}
