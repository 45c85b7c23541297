//! Loading a job: read the component (and its sidecar), compile it or take it from the cache,
//! type-check it against the `job` world, call `describe()` and validate the spec. Owns
//! [`LoadedJob`], [`LoadError`] and [`sidecar_of`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::bindings::leasehold::job::types;
use super::cache::Compiled;
use super::inspect::inspect;
use super::world::{Described, WorldPre};
use super::{HostState, Runtime};
use crate::exec::spec::{CatchUp, JobSpec, Limits, Overlap, RawSpec, Sidecar};

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
    pub(super) pre: WorldPre,
}

impl LoadedJob {
    /// The version of the `leasehold:job` world the component is built to (`0.4.3`, `0.4.3
    /// (fan-out-job)`, or an earlier one still loaded: `0.4.2`, `0.4.0`, `0.3.0`, `0.2.0`).
    pub fn world(&self) -> &'static str {
        self.pre.version()
    }

    /// Whether the component can run tasks (it exports `run-task`: the `fan-out-job` world).
    pub fn fans_out(&self) -> bool {
        self.pre.fans_out()
    }
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

/// The sidecar file of a component: the same path with the extension `.toml`.
pub fn sidecar_of(component: &Path) -> PathBuf {
    component.with_extension("toml")
}

impl Runtime {
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
                crate::units::show_size(max)
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
                crate::units::show_size(self.host_limits.component_bytes)
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
        // Refused before compiling when the declarations alone rule it out (milliseconds, where
        // a compile takes seconds).
        let shape = inspect(&bytes).map_err(fail)?;
        if let Some(why) = shape.refusal(self.host_limits.counts) {
            return Err(fail(why));
        }
        let content = hex::encode(Sha256::digest(&bytes));
        let hash = format!("sha256:{content}");
        let engine = self.engine.clone();
        let cache = self.cache.clone();
        // One compile per content hash in this process, even when two loads of the same bytes
        // (one file under two job names) run at once: the second waits for the first's cell.
        let cell = {
            let mut loaded = self.loaded.lock().expect("loaded components");
            if loaded.len() >= 256 && !loaded.contains_key(&hash) {
                loaded.clear();
            }
            loaded.entry(hash.clone()).or_default().clone()
        };
        let mut compiled_here = None;
        let component = cell
            .get_or_try_init(|| async {
                let key = content.clone();
                let (c, compiled) = tokio::task::spawn_blocking(move || match cache {
                    Some(cache) => cache.load_or_compile(&engine, &key, &bytes),
                    None => super::cache::compile(&engine, &bytes).map(|c| (c, Compiled::Fresh)),
                })
                .await
                .map_err(|e| fail(format!("compiler task failed: {e}")))?
                .map_err(|e| fail(format!("not a valid component: {e}")))?;
                compiled_here = Some(compiled);
                Ok::<_, LoadError>(c)
            })
            .await?
            .clone();
        let compiled = compiled_here.unwrap_or(Compiled::Shared);
        // `wasi:sockets` is linked and refuses every operation (`imports.rs`); `wasi:http` is
        // the host's sender, which sends only what the job is granted (`exec::http`).
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| fail(format!("needs an import the host does not offer: {e}")))?;
        let pre = WorldPre::new(pre, &self.engine).map_err(fail)?;
        let described = self
            .describe(&pre)
            .await
            .map_err(|e| fail(format!("describe() failed: {e}")))?;
        let mut raw = raw_spec(described).map_err(|e| fail(e.to_string()))?;
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
        let missing = self.databases.missing(&spec.sql);
        if !missing.is_empty() {
            return Err(fail(format!(
                "needs database {}, which this host is not configured with (--database NAME=URL; the job's sidecar may map a name it declares to another of the host's databases, [sql.databases])",
                missing.join(", ")
            )));
        }
        let missing = self.outbound.missing(&spec.http);
        if !missing.is_empty() {
            let names: Vec<String> = missing.iter().map(|d| d.to_string()).collect();
            return Err(fail(format!(
                "is granted HTTP destination {} (its sidecar's [http] allow), which this host does not allow (--http-allow)",
                names.join(", ")
            )));
        }
        Ok(LoadedJob {
            spec,
            hash,
            sidecar: sidecar_hash,
            path: path.to_path_buf(),
            compiled,
            pre,
        })
    }

    async fn describe(&self, pre: &WorldPre) -> anyhow::Result<Described> {
        let limits = Limits {
            // The most any job may ask for: its own limit is not known before describe().
            memory: self.host_limits.memory.1,
            step_time: Duration::from_secs(5),
            ..Limits::default()
        };
        let (state, stderr) = HostState::new(&limits, self.host_limits.counts, 0, None)?;
        let _slot = self.slot().await;
        let mut store = self.store(state);
        let call = pre.describe(&mut store);
        match tokio::time::timeout(limits.step_time, call).await {
            Ok(Ok(spec)) => Ok(spec),
            // A trap's message is a wasm backtrace; the guest's own explanation (a Python
            // exception, a Rust panic message) is on its stderr, as for a failed step.
            Ok(Err(e)) => {
                let tail = stderr.tail();
                if tail.is_empty() {
                    Err(e.into())
                } else {
                    anyhow::bail!("{e}; the job's last stderr lines:\n{tail}")
                }
            }
            Err(_) => anyhow::bail!(
                "did not return within {}",
                crate::units::show(limits.step_time)
            ),
        }
    }
}

/// The spec a component's `describe()` returned, and the databases it declares (each granted
/// under its own name), as a [`RawSpec`] for the sidecar and [`JobSpec::new`] to check.
fn raw_spec(Described { spec, databases }: Described) -> Result<RawSpec, String> {
    let mut sql = crate::exec::sql::SqlAsk::default();
    for name in databases {
        crate::exec::sql::check_name(&name)
            .map_err(|e| format!("invalid job spec: databases(): {e}"))?;
        if sql.databases.insert(name.clone(), name.clone()).is_some() {
            return Err(format!(
                "invalid job spec: databases(): database {name} is named twice"
            ));
        }
    }
    let described = spec;
    let p = &described.policies;
    Ok(RawSpec {
        name: described.name,
        schedule: described.schedule,
        time_zone: described.time_zone,
        limits: Limits {
            memory: described.limits.max_memory_bytes,
            step_time: Duration::from_millis(described.limits.max_step_millis),
            write_bytes: described.limits.max_write_bytes,
            stored_keys: described.limits.max_stored_keys,
            stored_bytes: described.limits.max_stored_bytes,
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
        sql,
        http: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(databases: &[&str]) -> Described {
        Described {
            spec: types::JobSpec {
                name: "billing".into(),
                schedule: "0 0 0 * * *".into(),
                time_zone: "UTC".into(),
                limits: types::Limits {
                    max_memory_bytes: 0,
                    max_step_millis: 0,
                    max_write_bytes: 0,
                    max_stored_keys: 0,
                    max_stored_bytes: 0,
                },
                policies: types::Policies {
                    catch_up: types::CatchUp::Latest,
                    catch_up_window_millis: 0,
                    retry_attempts: 0,
                    retry_backoff_millis: 0,
                    retry_max_backoff_millis: 0,
                    overlap: types::Overlap::Queue,
                    max_run_millis: 0,
                },
            },
            databases: databases.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn declared_databases_are_granted_under_their_names() {
        let raw = raw_spec(described(&["ledger", "accounting"])).unwrap();
        assert_eq!(
            raw.sql.databases,
            [
                ("accounting".to_string(), "accounting".to_string()),
                ("ledger".to_string(), "ledger".to_string())
            ]
            .into()
        );
    }

    #[test]
    fn a_database_declared_twice_or_misnamed_is_refused_naming_it() {
        let twice = raw_spec(described(&["ledger", "ledger"])).unwrap_err();
        assert_eq!(
            twice,
            "invalid job spec: databases(): database ledger is named twice"
        );
        let bad = raw_spec(described(&["Ledger DB"])).unwrap_err();
        assert!(
            bad.starts_with("invalid job spec: databases(): database name \"Ledger DB\""),
            "{bad}"
        );
        let empty = raw_spec(described(&[""])).unwrap_err();
        assert!(empty.contains("database name \"\""), "{empty}");
    }
}
