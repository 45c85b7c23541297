//! Temporary directories, removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A fresh temporary directory, removed (with everything in it) on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `<tmp>/leasehold-test-<name>-<unique>`; panics if it cannot.
    pub fn new(name: &str) -> Self {
        Self::create(&format!("leasehold-test-{name}"))
            .unwrap_or_else(|e| panic!("creating a temporary directory for {name}: {e}"))
    }

    /// Creates `<tmp>/<prefix>-<unique>` (the demo uses `leasehold-demo`).
    pub fn create(prefix: &str) -> std::io::Result<Self> {
        let p = std::env::temp_dir().join(format!("{prefix}-{}", unique()));
        std::fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside the directory.
    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Unique across processes (the pid) and within one (a counter), and unlikely to meet a
/// leftover of an earlier process with the same pid (the time).
fn unique() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
