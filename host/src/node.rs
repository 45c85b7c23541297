//! One replica: loads the jobs directory, and for every job runs an elector (on the lease
//! runtime) and a runner (on the main runtime), until shutdown.
//!
//! Shutdown order (I7): stop every runner (which drops the running step and so stops the
//! guest), *then* resign every elector (which releases the lease), then return.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::config::Timing;
use crate::elector::{Elector, LeaseRuntime, Role};
use crate::keys::JobKeys;
use crate::redis_conn;
use crate::runner::Runner;
use crate::runtime::{LoadedJob, Runtime};
use crate::spec::HostLimits;

/// Everything `leasehold run` is configured with, already validated.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Redis URL (`redis://`, `rediss://`, with optional user and password).
    pub redis_url: String,
    /// Directory of `.wasm` job components.
    pub jobs_dir: PathBuf,
    /// Directory of read-only job inputs, one subfolder per job.
    pub data_dir: Option<PathBuf>,
    /// Directory for compiled job code (see [`crate::cache`]); none: compile at every start.
    pub cache_dir: Option<PathBuf>,
    /// This node's id.
    pub node_id: String,
    /// Lease timings.
    pub timing: Timing,
}

/// Loads every `*.wasm` in `dir`, in name order. Files that fail are logged with the file and
/// the reason and skipped; a second file describing an already loaded job name is refused.
pub async fn load_jobs(runtime: &Runtime, dir: &Path) -> anyhow::Result<Vec<Arc<LoadedJob>>> {
    let mut paths = Vec::new();
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .with_context(|| format!("cannot read jobs directory {}", dir.display()))?;
    while let Some(e) = entries.next_entry().await? {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "wasm") {
            paths.push(p);
        }
    }
    paths.sort();
    let mut jobs: Vec<Arc<LoadedJob>> = Vec::new();
    for p in paths {
        match runtime.load(&p).await {
            Ok(job) => {
                if let Some(other) = jobs.iter().find(|j| j.spec.name == job.spec.name) {
                    error!(file = %p.display(), job = %job.spec.name, "refused: job name {:?} is already used by {}", job.spec.name, other.path.display());
                    continue;
                }
                info!(file = %p.display(), job = %job.spec.name, hash = %job.hash, compiled = job.compiled.as_str(), schedule = %job.spec.schedule.expr(), tz = %job.spec.schedule.tz(), "loaded job");
                jobs.push(Arc::new(job));
            }
            Err(e) => error!(file = %p.display(), "refused: {}", e.reason),
        }
    }
    Ok(jobs)
}

/// Runs the replica until `shutdown` resolves.
pub async fn run(
    cfg: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let node = cfg.node_id.clone();
    let runtime = Runtime::new(HostLimits::default())?;
    let runtime = match &cfg.cache_dir {
        Some(dir) => runtime.with_cache(dir)?,
        None => runtime,
    };
    // Run records, checkpoints and guest writes: bounded by the term they belong to (and by one
    // lease TTL per command), not by the Redis timeout: a large write over a slow link may take
    // longer than a renewal may.
    let conn = redis_conn::connect(
        &cfg.redis_url,
        cfg.timing.redis_timeout,
        Some(cfg.timing.lease_ttl),
    )
    .await?;
    let jobs = load_jobs(&runtime, &cfg.jobs_dir).await?;
    if jobs.is_empty() {
        warn!(node = %node, dir = %cfg.jobs_dir.display(), "no job loaded; add .wasm components to the jobs directory and restart");
    }

    let leases = LeaseRuntime::start().context("starting the lease runtime")?;
    let lease_conn = {
        let url = cfg.redis_url.clone();
        let timeout = cfg.timing.redis_timeout;
        leases
            .handle()
            .spawn(async move { redis_conn::connect(&url, timeout, Some(timeout)).await })
            .await??
    };

    let (stop_runners, runners_stop) = watch::channel(false);
    let mut release_notices = HashMap::new();
    let (resign, resigned) = watch::channel(false);
    let mut electors = Vec::new();
    let mut runners = Vec::new();
    for job in jobs {
        let name = job.spec.name.clone();
        let data_dir = cfg.data_dir.as_ref().map(|d| d.join(&name));
        let data_dir = match data_dir {
            Some(d) if d.is_dir() => Some(d),
            Some(d) => {
                warn!(job = %name, node = %node, "data directory {} does not exist; the job runs without /data", d.display());
                None
            }
            None => None,
        };
        let (role_tx, role_rx) = watch::channel(Role::Candidate);
        let keys = JobKeys::new(&name);
        let released = Arc::new(tokio::sync::Notify::new());
        release_notices.insert(keys.released_channel(), released.clone());
        let elector = Elector {
            job: name.clone(),
            node: node.clone(),
            timing: cfg.timing,
            keys: keys.clone(),
            released,
        };
        electors.push(leases.handle().spawn(elector.run(
            lease_conn.clone(),
            role_tx,
            resigned.clone(),
        )));
        let runner = Runner {
            job,
            runtime: runtime.clone(),
            conn: conn.clone(),
            node: node.clone(),
            timing: cfg.timing,
            data_dir,
            keys,
        };
        runners.push(tokio::spawn(runner.run(role_rx, runners_stop.clone())));
    }
    let client = redis::Client::open(cfg.redis_url.as_str())?;
    let listener = leases.handle().spawn(crate::elector::listen_for_releases(
        client,
        release_notices,
        resigned.clone(),
    ));
    info!(node = %node, jobs = runners.len(), ttl = %crate::config::show(cfg.timing.lease_ttl), heartbeat = %crate::config::show(cfg.timing.heartbeat), "node started");

    shutdown.await;
    info!(node = %node, "shutting down: stopping running steps");
    stop_runners.send_replace(true);
    for r in runners {
        let _ = r.await;
    }
    info!(node = %node, "steps stopped; releasing leases");
    resign.send_replace(true);
    for e in electors {
        if tokio::time::timeout(cfg.timing.redis_timeout * 2 + Duration::from_millis(100), e)
            .await
            .is_err()
        {
            warn!(node = %node, "an elector did not stop in time");
        }
    }
    let _ = listener.await;
    drop(leases);
    info!(node = %node, "stopped");
    Ok(())
}
