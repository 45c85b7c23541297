//! The walls around a guest that are not wasmtime's defaults: one memory budget for the whole
//! instance, bounded tables and instance counts, and a stderr that never fails the guest.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime::ResourceLimiter;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use crate::exec::spec::Counts;

/// Most elements any one table may grow to.
pub(crate) const TABLE_ELEMENTS: usize = 1 << 20;

/// Limits one store: the *sum* of all linear memories stays within the job's memory limit (a
/// per-memory limit would let a component with many memories multiply it), tables stay below
/// [`TABLE_ELEMENTS`], and a refused grow traps with a message naming the limit.
pub(crate) struct JobLimiter {
    max_memory: usize,
    memory: usize,
    counts: Counts,
    /// A memory grow was refused: the trap that follows is the memory limit's.
    pub memory_exceeded: bool,
}

impl JobLimiter {
    /// A limiter for `max_memory` bytes of linear memory in total, and at most `counts`
    /// instances, tables and memories.
    pub(crate) fn new(max_memory: u64, counts: Counts) -> Self {
        JobLimiter {
            max_memory: usize::try_from(max_memory).unwrap_or(usize::MAX),
            memory: 0,
            counts,
            memory_exceeded: false,
        }
    }

    /// The linear memory of the store so far, every memory together: its peak, since a
    /// memory never shrinks.
    pub(crate) fn memory(&self) -> usize {
        self.memory
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
        self.counts.instances as usize
    }

    fn tables(&self) -> usize {
        self.counts.tables as usize
    }

    fn memories(&self) -> usize {
        self.counts.memories as usize
    }
}

/// The last bytes of a guest's stderr kept whatever came before: where a trap's explanation
/// is (a Python traceback, a Rust panic message).
pub(crate) const STDERR_TAIL: usize = 2048;

/// A guest's stderr: keeps the first `capacity` bytes (for the log) and counts the rest, keeps
/// the last [`STDERR_TAIL`] bytes (for a failure's record), and never refuses a write (a
/// refused write would make Rust's `eprintln!` panic and fail the step).
#[derive(Clone)]
pub(crate) struct GuestOutput {
    inner: Arc<Mutex<Kept>>,
    capacity: usize,
}

#[derive(Default)]
struct Kept {
    head: Vec<u8>,
    dropped: usize,
    tail: std::collections::VecDeque<u8>,
}

impl GuestOutput {
    /// An empty output keeping at most `capacity` bytes.
    pub(crate) fn new(capacity: usize) -> Self {
        GuestOutput {
            inner: Arc::default(),
            capacity,
        }
    }

    /// What was kept from the start, and how many bytes were dropped after it.
    pub(crate) fn take(&self) -> (Vec<u8>, usize) {
        let mut inner = self.inner.lock().unwrap();
        (
            std::mem::take(&mut inner.head),
            std::mem::take(&mut inner.dropped),
        )
    }

    /// The last lines written (at most [`STDERR_TAIL`] bytes, whole lines where the cut
    /// allows: a line longer than the tail keeps its end, after `…`), without blank lines;
    /// empty when nothing was written.
    pub(crate) fn tail(&self) -> String {
        let inner = self.inner.lock().unwrap();
        let bytes: Vec<u8> = inner.tail.iter().copied().collect();
        let text = String::from_utf8_lossy(&bytes);
        let lines = |t: &str| {
            t.lines()
                .filter(|l| !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join("\n")
        };
        if bytes.len() < STDERR_TAIL {
            return lines(&text);
        }
        // A cut through the first line drops that line, unless it is all there is.
        match text.find('\n').map(|at| lines(&text[at + 1..])) {
            Some(rest) if !rest.is_empty() => rest,
            _ => format!("…{}", lines(&text)),
        }
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
        let room = self.capacity.saturating_sub(inner.head.len());
        let kept = buf.len().min(room);
        inner.head.extend_from_slice(&buf[..kept]);
        inner.dropped += buf.len() - kept;
        let last = &buf[buf.len().saturating_sub(STDERR_TAIL)..];
        inner.tail.extend(last);
        let over = inner.tail.len().saturating_sub(STDERR_TAIL);
        inner.tail.drain(..over);
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
        let mut l = JobLimiter::new(100, crate::exec::spec::HostLimits::default().counts);
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

    #[tokio::test]
    async fn the_tail_keeps_the_last_whole_lines() {
        use tokio::io::AsyncWriteExt;
        let out = GuestOutput::new(16);
        let mut w = Box::into_pin(out.async_stream());
        assert_eq!(out.tail(), "");
        w.write_all(b"first\n\nsecond\n").await.unwrap();
        assert_eq!(out.tail(), "first\nsecond");
        // Past the tail's size: the line cut at the front is dropped.
        let long = format!("{}\n", "x".repeat(STDERR_TAIL));
        w.write_all(long.as_bytes()).await.unwrap();
        w.write_all(b"Traceback (most recent call last):\nValueError: bad row\n")
            .await
            .unwrap();
        assert_eq!(
            out.tail(),
            "Traceback (most recent call last):\nValueError: bad row"
        );
        // One line longer than the tail: its end, marked as cut.
        w.write_all(format!("{}end\n", "y".repeat(STDERR_TAIL)).as_bytes())
            .await
            .unwrap();
        let tail = out.tail();
        assert!(tail.starts_with("…y") && tail.ends_with("yend"), "{tail}");
    }
}
