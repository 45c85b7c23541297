//! The compiled-code cache: each component is compiled once and kept, in a directory the host
//! owns, so a restart loads every job without recompiling.
//!
//! An entry is named by the component's content hash *and* a hash of the engine's settings
//! (`Engine::precompile_compatibility_hash`: wasmtime version, target, features), so code
//! compiled by another engine configuration is never even looked at. Entries are written to a
//! temporary file and renamed, so a crash never leaves half an entry under its final name. An
//! entry that does not load (corrupt, truncated, from another wasmtime) is logged, removed and
//! rebuilt. Precompiled code is never read from anywhere else (in particular not from the jobs
//! directory, which untrusted users may write to).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use tracing::warn;
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where a loaded component's machine code came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compiled {
    /// Compiled now (and stored, when there is a cache).
    Fresh,
    /// Loaded from the cache.
    Cached,
    /// Already loaded in this process (another job or an earlier load of the same bytes).
    Shared,
}

impl Compiled {
    /// `fresh` or `cached`, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Compiled::Fresh => "fresh",
            Compiled::Cached => "cached",
            Compiled::Shared => "shared",
        }
    }
}

/// A cache directory for one engine configuration.
#[derive(Clone, Debug)]
pub(crate) struct CodeCache {
    dir: PathBuf,
    engine_key: String,
}

impl CodeCache {
    /// Opens (creating it if needed) the cache in `dir` for `engine`'s configuration.
    pub(crate) fn open(dir: &Path, engine: &Engine) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        Ok(CodeCache {
            dir: dir.to_path_buf(),
            engine_key: format!("{:016x}", h.finish()),
        })
    }

    /// The entry for the component whose sha256 is `content` (hex).
    pub(crate) fn entry(&self, content: &str) -> PathBuf {
        self.dir
            .join(format!("{content}-{}.cwasm", self.engine_key))
    }

    /// The compiled component for `bytes` (whose sha256 is `content`): from the cache when a
    /// usable entry exists, otherwise compiled and stored. Blocking: call it off the runtime.
    pub(crate) fn load_or_compile(
        &self,
        engine: &Engine,
        content: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, Compiled)> {
        let entry = self.entry(content);
        if entry.exists() {
            // SAFETY: the entry was written by `store` below, from a component this engine
            // configuration compiled, into a directory only the host writes; wasmtime still
            // checks its header and version.
            #[allow(unsafe_code)]
            match unsafe { Component::deserialize_file(engine, &entry) } {
                Ok(c) => return Ok((c, Compiled::Cached)),
                Err(e) => {
                    warn!(entry = %entry.display(), "compiled-code cache entry unusable, recompiling: {e}");
                    let _ = std::fs::remove_file(&entry);
                }
            }
        }
        let component = compile(engine, bytes)?;
        if let Err(e) = self.store(&entry, &component) {
            warn!(entry = %entry.display(), "cannot write the compiled-code cache: {e}");
        }
        Ok((component, Compiled::Fresh))
    }

    fn store(&self, entry: &Path, component: &Component) -> anyhow::Result<()> {
        let code = component.serialize()?;
        let tmp = entry.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, code)?;
        std::fs::rename(&tmp, entry)?;
        Ok(())
    }
}

/// Compiles `bytes` on a thread pool of its own, as wide as the machine. Wasmtime compiles a
/// component's functions in parallel on the current rayon pool; on the one global pool a small
/// component's functions would wait until every function of a large one compiling beside it
/// has been taken, so a ticker would load only after a Python job. With a pool per compile the
/// operating system shares the cores between them. Blocking: call it off the runtime.
pub(crate) fn compile(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("compile-{i}"))
        .build()
    {
        Ok(pool) => pool.install(|| Component::new(engine, bytes)),
        // No threads to be had: compile on the global pool rather than not at all.
        Err(_) => Component::new(engine, bytes),
    }
}
