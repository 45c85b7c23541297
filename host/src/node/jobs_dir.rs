//! The jobs directory, watched while the host runs: add, replace or remove a `.wasm` file and
//! the host follows.
//!
//! A [`JobsDir::scan`] lists the directory's `*.wasm` files (hidden files are skipped, so a
//! copy tool's `.name.wasm.tmp` is never read) and decides which version of which job this host
//! should serve:
//!
//! * **Settling.** A file is read only once it has *settled*: unmodified for [`SETTLE`] by its
//!   modification time, or unchanged (size, time, inode) across scans for twice that long when
//!   its time is in the future. A job's sidecar (`name.toml` beside `name.wasm`, see
//!   [`crate::exec::spec::Sidecar`]) is part of its version: changing it reloads the job. A file still being copied is therefore not loaded half-written;
//!   a file that stalls mid-copy longer than that is loaded, refused as truncated, and loaded
//!   again when it changes. Renaming a finished file into the directory is atomic and settles
//!   at once if its time is old enough.
//! * **One outcome per file version.** A settled file is loaded (validated, compiled through
//!   the code cache, described) once per fingerprint; the result, a job or a refusal naming the
//!   file and the reason, is logged once.
//! * **Loading in the background.** A scan queues what it must load and a task loads the
//!   queue, at most [`LOADS_AT_ONCE`] at a time and smallest component first, so a scan never
//!   waits for a compile (a large component takes seconds): the node serves HTTP and runs the
//!   jobs it has meanwhile, a scan lists the files still compiling or waiting to ([`Scan::compiling`]), and
//!   a finished load wakes the node ([`JobsDir::loaded`]) to scan again and start the job. Each
//!   compile has a thread pool of its own ([`crate::exec::runtime`]), so a small component compiling
//!   beside a large one shares the cores instead of queueing behind the large one's functions.
//! * **Replacing keeps serving.** While a replacement settles, or when it is refused, the
//!   version already served from that file keeps running (the refusal says so).
//! * **One file per job name.** When two files describe the same job, the one already serving
//!   it keeps it (otherwise the first in name order); the other is refused.
//! * A file that disappears stops serving its job.
//!
//! The node ([`crate::node`]) applies a scan: starts a new job's elector and runner, hands a new
//! version to the runner (a run in progress finishes with the version it started with, see
//! [`crate::exec::runner`]), and stops and releases a removed job. Scans run when the directory
//! changes (inotify, through `notify`) and every [`RESCAN_WATCHED`] anyway (every [`RESCAN`]
//! when the directory cannot be watched), for changes the watch does not report.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::exec::runtime::{LoadError, LoadedJob, Runtime};

/// How long a file must stay unmodified before it is read.
pub(crate) const SETTLE: Duration = Duration::from_millis(500);
/// Scan interval when the directory cannot be watched.
pub(crate) const RESCAN: Duration = Duration::from_secs(2);
/// Scan interval when nothing reports a change although the directory is watched: a safety
/// net for a change the watch misses (a symlink's target replaced elsewhere). A scan costs a
/// `stat` per file, so with 10,000 jobs it is not free.
pub(crate) const RESCAN_WATCHED: Duration = Duration::from_secs(10);
/// Loads (compiles) running at once; each compile is itself parallel across functions.
pub(crate) const LOADS_AT_ONCE: usize = 2;

/// What identifies one version of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

/// One version of a job's files: the component and its sidecar, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    component: FileId,
    sidecar: Option<FileId>,
}

impl Fingerprint {
    /// The newest modification time of the files.
    fn modified(&self) -> Option<SystemTime> {
        let c = self.component.modified;
        match self.sidecar {
            Some(s) => c.max(s.modified),
            None => c,
        }
    }
}

/// What this host knows about one file.
struct FileState {
    fingerprint: Fingerprint,
    first_seen: Instant,
    outcome: Option<Outcome>,
    /// The load of this version, while it runs.
    loading: Option<Loading>,
    /// A conflict (its job name served from another file) was logged for this version.
    conflict_logged: bool,
}

#[derive(Clone)]
enum Outcome {
    Loaded(Arc<LoadedJob>),
    Refused(String),
}

/// A refused file and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The file.
    pub path: PathBuf,
    /// Why, in words.
    pub reason: String,
}

/// The result of a scan: what to serve.
#[derive(Default)]
pub(crate) struct Scan {
    /// Job name → the version this host should serve.
    pub jobs: BTreeMap<String, Arc<LoadedJob>>,
    /// Files refused in their current version.
    pub refused: Vec<Refusal>,
    /// Some file has not settled yet: scan again soon.
    pub settling: bool,
    /// Files being loaded (compiled) now or waiting to be, in name order.
    pub compiling: Vec<PathBuf>,
}

/// A load's place among the [`LOADS_AT_ONCE`]: however the load ends (done, failed, or
/// abandoned because its file changed or went away), the place is given back first and then
/// the node is woken ([`JobsDir::loaded`]) to scan and serve what was loaded.
struct LoadSlot {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    loaded: Arc<tokio::sync::Notify>,
}

impl Drop for LoadSlot {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.loaded.notify_one();
    }
}

/// A load queued or running in the background, seen from its file: the channel its result
/// comes on, sent *before* its [`LoadSlot`] wakes the node, so the scan that wake causes finds
/// the result (a scan that asked a task handle could run between the wake and the task's end,
/// see the load still running, and leave the job to the next rescan: replicas loaded a
/// renamed-in file 10 s late that way). Dropping it (its file changed or went away, the
/// directory dropped) cancels the load: one not started yet is skipped, a running one is
/// abandoned at its next await.
struct Loading {
    result: tokio::sync::oneshot::Receiver<Result<LoadedJob, LoadError>>,
}

/// A file a scan queued for loading, and where its result goes.
struct Queued {
    file: PathBuf,
    result: tokio::sync::oneshot::Sender<Result<LoadedJob, LoadError>>,
}

/// The watched jobs directory.
pub(crate) struct JobsDir {
    dir: PathBuf,
    node: String,
    files: HashMap<PathBuf, FileState>,
    /// Bounds the loads running at once.
    loads: Arc<tokio::sync::Semaphore>,
    /// Notified when a load finishes.
    loaded: Arc<tokio::sync::Notify>,
}

impl JobsDir {
    /// A jobs directory at `dir` (read at the first scan), watched by node `node` (a log field).
    pub(crate) fn new(dir: &Path, node: &str) -> Self {
        JobsDir {
            dir: dir.to_path_buf(),
            node: node.to_string(),
            files: HashMap::new(),
            loads: Arc::new(tokio::sync::Semaphore::new(LOADS_AT_ONCE)),
            loaded: Arc::default(),
        }
    }

    /// Resolves when a load started by a scan has finished: scan again to apply it.
    pub(crate) fn loaded(&self) -> impl std::future::Future<Output = ()> + use<> {
        let loaded = self.loaded.clone();
        async move { loaded.notified().await }
    }

    /// Loads `queue` in its order (smallest component first), at most [`LOADS_AT_ONCE`] at a
    /// time across every scan's queue, in one task: the scan that queued them does not wait,
    /// and loads go on while the node scans (a scan per finished load would list the directory
    /// once per job: thousands of jobs would take hours to start). Each finished load sends its
    /// result, then gives its place back and wakes the node.
    fn start_loads(&self, runtime: &Runtime, queue: Vec<Queued>) {
        let (runtime, loads, loaded) = (runtime.clone(), self.loads.clone(), self.loaded.clone());
        tokio::spawn(async move {
            for item in queue {
                if item.result.is_closed() {
                    continue;
                }
                let Ok(permit) = loads.clone().acquire_owned().await else {
                    return;
                };
                let slot = LoadSlot {
                    permit: Some(permit),
                    loaded: loaded.clone(),
                };
                let runtime = runtime.clone();
                tokio::spawn(async move {
                    // Dropped after the send: the wake comes once the result is there.
                    let _slot = slot;
                    let Queued { file, mut result } = item;
                    tokio::select! {
                        loaded = runtime.load(&file) => {
                            let _ = result.send(loaded);
                        }
                        // The file changed or went away meanwhile: its load is not wanted.
                        _ = result.closed() => {}
                    }
                });
            }
        });
    }

    /// Lists the directory, loads what settled and changed, and decides what to serve, given
    /// what is served now (`serving`).
    pub(crate) async fn scan(
        &mut self,
        runtime: &Runtime,
        serving: &BTreeMap<String, Arc<LoadedJob>>,
    ) -> anyhow::Result<Scan> {
        let listed = list(&self.dir).await?;
        let now = Instant::now();
        // A file gone takes its load with it (dropping a `Loading` cancels it).
        let present: std::collections::HashSet<&PathBuf> = listed.iter().map(|(p, _)| p).collect();
        self.files.retain(|p, _| present.contains(p));
        let mut scan = Scan::default();
        // Loads start smallest component first, so small jobs are served while a large one
        // still compiles: the queue is in that order, and its task takes the places in it.
        let mut by_size: Vec<&(PathBuf, Fingerprint)> = listed.iter().collect();
        by_size.sort_by(|(a, fa), (b, fb)| (fa.component.len, a).cmp(&(fb.component.len, b)));
        let mut queue = Vec::new();
        for (path, fp) in by_size {
            let fresh = || FileState {
                fingerprint: *fp,
                first_seen: now,
                outcome: None,
                loading: None,
                conflict_logged: false,
            };
            let state = self.files.entry(path.clone()).or_insert_with(fresh);
            if state.fingerprint != *fp {
                *state = fresh();
            }
            if state.outcome.is_some() {
                continue;
            }
            let finished = match state.loading.as_mut().map(|l| l.result.try_recv()) {
                None => None,
                Some(Err(tokio::sync::oneshot::error::TryRecvError::Empty)) => {
                    scan.compiling.push(path.clone());
                    continue;
                }
                Some(Ok(result)) => Some(result),
                Some(Err(tokio::sync::oneshot::error::TryRecvError::Closed)) => {
                    Some(Err(LoadError {
                        path: path.clone(),
                        reason: "the loading task failed (it panicked)".into(),
                    }))
                }
            };
            let Some(result) = finished else {
                let age = fp
                    .modified()
                    .and_then(|m| SystemTime::now().duration_since(m).ok());
                let settled =
                    age.is_some_and(|a| a >= SETTLE) || now - state.first_seen >= SETTLE * 2;
                if !settled {
                    scan.settling = true;
                    continue;
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                queue.push(Queued {
                    file: path.clone(),
                    result: tx,
                });
                state.loading = Some(Loading { result: rx });
                scan.compiling.push(path.clone());
                continue;
            };
            state.loading = None;
            state.outcome = Some(match result {
                Ok(job) => {
                    info!(file = %path.display(), job = %job.spec.name, node = %self.node, hash = %job.hash, compiled = job.compiled.as_str(), schedule = %job.spec.schedule.expr(), tz = %job.spec.schedule.tz(), "loaded job");
                    Outcome::Loaded(Arc::new(job))
                }
                Err(e) => {
                    let serving_from_here = serving.values().find(|j| &j.path == path);
                    match serving_from_here {
                        Some(j) => {
                            error!(file = %path.display(), job = %j.spec.name, node = %self.node, "refused: {}; version {} keeps running", e.reason, j.hash)
                        }
                        None => {
                            error!(file = %path.display(), node = %self.node, "refused: {}", e.reason)
                        }
                    }
                    Outcome::Refused(e.reason)
                }
            });
        }
        if !queue.is_empty() {
            self.start_loads(runtime, queue);
        }
        scan.compiling.sort();
        tracing::debug!(node = %self.node, files = listed.len(), settling = scan.settling, compiling = scan.compiling.len(), "jobs directory scanned");

        // Claims: job name → files offering it, in name order (`listed` is sorted).
        let mut claims: BTreeMap<String, Vec<(PathBuf, Arc<LoadedJob>)>> = BTreeMap::new();
        for (path, _) in &listed {
            let state = &self.files[path];
            let offered = match &state.outcome {
                Some(Outcome::Loaded(job)) => Some(job.clone()),
                // Settling or refused: the version this file already serves keeps running.
                _ => serving.values().find(|j| &j.path == path).cloned(),
            };
            if let Some(Outcome::Refused(reason)) = &state.outcome {
                scan.refused.push(Refusal {
                    path: path.clone(),
                    reason: reason.clone(),
                });
            }
            if let Some(job) = offered {
                claims
                    .entry(job.spec.name.clone())
                    .or_default()
                    .push((path.clone(), job));
            }
        }
        for (name, offers) in claims {
            let current = serving.get(&name).map(|j| j.path.clone());
            let winner = offers
                .iter()
                .position(|(p, _)| Some(p) == current.as_ref())
                .unwrap_or(0);
            for (i, (path, _)) in offers.iter().enumerate() {
                if i == winner {
                    continue;
                }
                let reason = format!(
                    "job name {name:?} is already served from {}",
                    offers[winner].0.display()
                );
                let state = self.files.get_mut(path).expect("listed");
                if !state.conflict_logged {
                    error!(file = %path.display(), job = %name, node = %self.node, "refused: {reason}");
                    state.conflict_logged = true;
                }
                scan.refused.push(Refusal {
                    path: path.clone(),
                    reason,
                });
            }
            scan.jobs.insert(name, offers[winner].1.clone());
        }
        Ok(scan)
    }
}

/// The directory's `*.wasm` files (not hidden, regular files or links to them) with their
/// fingerprints, sorted by path.
async fn list(dir: &Path) -> anyhow::Result<Vec<(PathBuf, Fingerprint)>> {
    // One blocking call for the whole listing: a call per file (as `tokio::fs` makes) costs
    // more than the file's `stat` itself, and a directory of thousands of jobs is listed often.
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || list_now(&dir))
        .await
        .context("listing the jobs directory")?
}

fn list_now(dir: &Path) -> anyhow::Result<Vec<(PathBuf, Fingerprint)>> {
    use std::os::unix::fs::MetadataExt as _;
    let id = |m: &std::fs::Metadata| FileId {
        len: m.len(),
        modified: m.modified().ok(),
        inode: m.ino(),
    };
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read jobs directory {}", dir.display()))?;
    for e in entries {
        let e = e.with_context(|| format!("cannot read jobs directory {}", dir.display()))?;
        let path = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !name.ends_with(".wasm") {
            continue;
        }
        // Follows links; a dangling link or a directory named *.wasm is skipped.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let sidecar = std::fs::metadata(crate::exec::runtime::sidecar_of(&path))
            .ok()
            .map(|m| id(&m));
        out.push((
            path,
            Fingerprint {
                component: id(&meta),
                sidecar,
            },
        ));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Watches `dir` for changes: a message on the returned channel means "scan again". The
/// watcher stops when the returned guard is dropped. `None` (with a warning) when the platform
/// cannot watch; periodic scans still follow the directory.
pub(crate) fn watch(dir: &Path) -> (Option<notify::RecommendedWatcher>, mpsc::Receiver<()>) {
    use notify::Watcher as _;
    let (tx, rx) = mpsc::channel(1);
    let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        // Opening and reading files are events too, and a scan opens the directory: reacting to
        // them would make every scan trigger the next one.
        if let Ok(event) = res
            && !matches!(event.kind, notify::EventKind::Access(_))
        {
            // A full channel already means "scan again".
            let _ = tx.try_send(());
        }
    })
    .and_then(|mut w| {
        w.watch(dir, notify::RecursiveMode::NonRecursive)?;
        Ok(w)
    });
    match watcher {
        Ok(w) => (Some(w), rx),
        Err(e) => {
            warn!(dir = %dir.display(), "cannot watch the jobs directory ({e}); scanning it every {}", crate::node::config::show(RESCAN));
            (None, rx)
        }
    }
}
