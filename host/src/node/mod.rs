//! One replica: follows the jobs directory ([`crate::node::jobs_dir`]), and for every job it serves
//! runs an elector (on the lease runtime) and a runner (on the main runtime), until shutdown.
//!
//! Stop order (I7), for a removed job and for all jobs at shutdown: stop the runners (which
//! drops the running step and so stops the guest), *then* resign the electors (which releases
//! the leases and tells followers at once).
//!
//! **Shutdown** is a tree of [`CancellationToken`]s with two roots, one for runners and one
//! for electors, so that cancelling can never release a lease before the step is stopped:
//! each job's runner and elector get a child token of their own (a removed job stops alone),
//! and at shutdown every runner is cancelled and awaited before any elector is. The HTTP server
//! and the release listener have a token of their own. Every task is spawned on a
//! [`TaskTracker`], and every wait for a task to end is bounded: a runner that does not stop
//! within [`STOP_GRACE`] is aborted (with a warning) before its lease is released, an elector
//! gets two Redis timeouts to release, and the whole node waits at most [`STOP_GRACE`] for
//! the rest.
//!
//! **The store's settings** are read at start-up and again every
//! [`stores::DEPLOYMENT_RECHECK_HEARTBEATS`] heartbeats ([`crate::store::deployment`]): a Redis that may now
//! evict keys (a `CONFIG SET maxmemory-policy` after start-up) shuts the host down the clean way
//! (steps stopped, leases released), logs why as an error and exits non-zero, as the start-up
//! refusal does, unless `--allow-evicting-redis`.
//!
//! Each job's runner and elector run inside a `job` span (`job`, `node`), so their log lines
//! carry both without naming them (see [`crate::logging`]).
//!
//! Length: start-up and the stop order (I7) in one file, so that the order in which runners,
//! electors, the heartbeat and the listener start and stop is read in one place.

mod catalog;
pub mod config;
mod http;
mod jobs_dir;
mod stores;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument as _, info, warn};

use crate::coord::elector::{Elector, Role};
use crate::coord::lease_thread::LeaseRuntime;
use crate::coord::notices::{Notice, ReleaseNotices};
use crate::coord::term_store::{Store, TermStore as _};
use crate::exec::runner::{Runner, RunnerHost};
use crate::exec::runtime::{LoadedJob, Runtime};
use crate::store::keys::JobKeys;
use catalog::{Catalog, JobView};
use config::NodeConfig;
use jobs_dir::{JobsDir, RESCAN, RESCAN_WATCHED, SETTLE, Scan};

/// Longest a stopping runner (or, at shutdown, any other task of the node) is waited for.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(5);

/// The span a job's runner and elector run in: every line they log names the job and node.
/// At ERROR level so that it is enabled whenever any of their lines is.
fn job_span(job: &str, node: &str) -> tracing::Span {
    tracing::error_span!("job", job = %job, node = %node)
}

/// What a replica shares between its jobs.
struct Host {
    cfg: NodeConfig,
    runtime: Runtime,
    /// The store behind the seam (see [`crate::coord::term_store`]).
    seam: Store,
    /// The same store over the lease connection: what the electors campaign and release with.
    lease_seam: Store,
    leases: LeaseRuntime,
    notices: ReleaseNotices,
    jobs: BTreeMap<String, JobHandle>,
    /// The served jobs, for the HTTP API.
    catalog: watch::Sender<Catalog>,
    /// The parent of every job's runner token.
    runners: CancellationToken,
    /// The parent of every job's elector token (cancelled only after every runner stopped).
    electors: CancellationToken,
    /// Every task the node spawns.
    tasks: TaskTracker,
    /// The membership, as this node's registrations see it.
    members: watch::Receiver<crate::coord::members::View>,
    /// This node's rate of hand-overs to preferred members.
    handoffs: Arc<crate::coord::balance::Limiter>,
    /// The heartbeat every elector's term renews through, every follower looks through, and
    /// every idle runner reads its state through.
    heartbeat: crate::coord::heartbeat::Heartbeat,
    /// The campaign coalescer every elector campaigns through.
    campaigns: crate::coord::campaigns::Campaigns,
    /// What every job's task worker shares (fan-out); none on etcd (tasks are on Redis only).
    workers: Option<Arc<crate::exec::workers::Workers>>,
}

/// One served job: its elector (lease runtime) and its runner (main runtime).
struct JobHandle {
    job: Arc<LoadedJob>,
    role: watch::Receiver<Role>,
    version: watch::Sender<Arc<LoadedJob>>,
    /// The served version's hash, for the elector's ask.
    hash: watch::Sender<String>,
    stop_runner: CancellationToken,
    runner: JoinHandle<()>,
    /// The job's task worker (it works only while the job's version fans out).
    worker: JoinHandle<()>,
    resign: CancellationToken,
    elector: JoinHandle<()>,
    channel: String,
}

impl Host {
    /// What is served now: job name → version.
    fn serving(&self) -> BTreeMap<String, Arc<LoadedJob>> {
        self.jobs
            .iter()
            .map(|(n, h)| (n.clone(), h.job.clone()))
            .collect()
    }

    /// Makes the served jobs match a scan of the jobs directory.
    async fn apply(&mut self, scan: Scan) {
        let Scan {
            jobs,
            refused,
            settling,
            compiling,
        } = scan;
        let node = self.cfg.node_id.clone();
        let removed: Vec<String> = self
            .jobs
            .keys()
            .filter(|n| !jobs.contains_key(*n))
            .cloned()
            .collect();
        for name in removed {
            let handle = self.jobs.remove(&name).expect("listed");
            info!(job = %name, node = %node, file = %handle.job.path.display(), "job removed from the jobs directory: stopping it and releasing its lease");
            self.stop(vec![handle]).await;
            info!(job = %name, node = %node, "job stopped");
        }
        for (name, job) in jobs {
            match self.jobs.get_mut(&name) {
                Some(h) if h.job.hash == job.hash && h.job.sidecar == job.sidecar => {}
                Some(h) if h.job.hash == job.hash => {
                    info!(job = %name, node = %node, file = %job.path.display(), sidecar = ?job.sidecar, "job spec changed by its sidecar: new runs use the new schedule and policies");
                    h.job = job.clone();
                    h.version.send_replace(job);
                }
                Some(h) => {
                    info!(job = %name, node = %node, file = %job.path.display(), from = %h.job.hash, to = %job.hash, "job replaced: new runs use the new version; a run in progress finishes with the version it started with");
                    h.job = job.clone();
                    h.hash.send_replace(job.hash.clone());
                    h.version.send_replace(job);
                }
                None => self.start(job),
            }
        }
        let metrics = crate::metrics::get();
        metrics.jobs.set(self.jobs.len() as i64);
        metrics.refused_files.set(refused.len() as i64);
        self.catalog.send_replace(Catalog {
            jobs: self
                .jobs
                .iter()
                .map(|(n, h)| {
                    (
                        n.clone(),
                        JobView {
                            job: h.job.clone(),
                            role: h.role.clone(),
                        },
                    )
                })
                .collect(),
            refused,
            // Ready once the files present at start have settled and loaded (or been refused).
            started: self.catalog.borrow().started || (!settling && compiling.is_empty()),
            compiling,
        });
    }

    /// Starts campaigning for `job` and running it when leading.
    fn start(&mut self, job: Arc<LoadedJob>) {
        let (cfg, node) = (&self.cfg, &self.cfg.node_id);
        let name = job.spec.name.clone();
        let data_dir = match cfg.data_dir.as_ref().map(|d| d.join(&name)) {
            Some(d) if d.is_dir() => Some(d),
            Some(d) => {
                warn!(job = %name, node = %node, "data directory {} does not exist; the job runs without /data", d.display());
                None
            }
            None => None,
        };
        let (role_tx, role_rx) = watch::channel(Role::Candidate);
        let role = role_rx.clone();
        let keys = JobKeys::new(&name);
        let released = Notice::with_payload();
        let channel = keys.released_channel();
        let notice = Arc::new(tokio::sync::Notify::new());
        let work = Arc::new(tokio::sync::Notify::new());
        {
            let mut notices = self.notices.lock().expect("release notices");
            notices.insert(channel.clone(), released.clone());
            notices.insert(keys.notice_channel(), Notice::wake(notice.clone()));
            notices.insert(keys.work_channel(), Notice::wake(work.clone()));
        }
        let (hand_over_tx, hand_over) = watch::channel(0u64);
        let (hash, hash_rx) = watch::channel(job.hash.clone());
        let elector = Elector {
            job: name.clone(),
            node: node.clone(),
            timing: cfg.timing,
            keys: keys.clone(),
            released,
            replicas: cfg.replicas,
            members: self.members.clone(),
            hand_over,
            version: hash_rx,
            heartbeat: self.heartbeat.clone(),
            campaigns: self.campaigns.clone(),
        };
        let span = job_span(&name, node);
        let resign = self.electors.child_token();
        let elector = self.tasks.spawn_on(
            elector
                .run(self.lease_seam.clone(), role_tx, resign.clone())
                .instrument(span.clone()),
            self.leases.handle(),
        );
        let (version, versions) = watch::channel(job.clone());
        let (versions_for_worker, data_dir_for_worker) = (versions.clone(), data_dir.clone());
        let runner = Runner::new(
            versions,
            RunnerHost {
                runtime: self.runtime.clone(),
                store: self.seam.clone(),
                node: node.clone(),
                timing: cfg.timing,
                heartbeat: self.heartbeat.clone(),
            },
            data_dir,
            crate::coord::balance::Balance::new(
                node.clone(),
                self.members.clone(),
                hand_over_tx,
                self.handoffs.clone(),
                cfg.timing.heartbeat,
            ),
            notice,
        );
        let stop_runner = self.runners.child_token();
        let worker = match self.workers.clone() {
            Some(workers) => self.tasks.spawn(
                workers
                    .work(
                        versions_for_worker,
                        data_dir_for_worker,
                        work,
                        stop_runner.clone(),
                    )
                    .instrument(span.clone()),
            ),
            None => self.tasks.spawn(stop_runner.clone().cancelled_owned()),
        };
        let runner = self
            .tasks
            .spawn(runner.run(role_rx, stop_runner.clone()).instrument(span));
        self.jobs.insert(
            name,
            JobHandle {
                job,
                role,
                version,
                hash,
                stop_runner,
                runner,
                worker,
                resign,
                elector,
                channel,
            },
        );
    }

    /// Stops jobs in the order of I7: every running step first, then every lease.
    async fn stop(&mut self, handles: Vec<JobHandle>) {
        for h in &handles {
            h.stop_runner.cancel();
        }
        let mut electors = Vec::new();
        for mut h in handles {
            if tokio::time::timeout(STOP_GRACE, &mut h.runner)
                .await
                .is_err()
            {
                warn!(job = %h.job.spec.name, node = %self.cfg.node_id, "the runner did not stop within {}; aborting it before the lease is released", crate::node::config::show(STOP_GRACE));
                h.runner.abort();
                if tokio::time::timeout(STOP_GRACE, &mut h.runner)
                    .await
                    .is_err()
                {
                    // Still running: releasing the lease now could let a successor start while
                    // a step of this term goes on. Leave the lease to expire instead (I7).
                    warn!(job = %h.job.spec.name, node = %self.cfg.node_id, "the runner did not stop after being aborted; its lease is left to expire");
                    h.resign = CancellationToken::new();
                    h.elector.abort();
                }
            }
            // The task worker stopped with the runner (same token); its running tasks were
            // dropped, and their claims lapse to other workers.
            if tokio::time::timeout(STOP_GRACE, &mut h.worker)
                .await
                .is_err()
            {
                h.worker.abort();
            }
            electors.push((h.resign, h.elector, h.job.spec.name.clone(), h.channel));
        }
        for (resign, _, _, _) in &electors {
            resign.cancel();
        }
        let limit = self.cfg.timing.redis_timeout * 2 + Duration::from_millis(100);
        for (_, elector, name, channel) in electors {
            if tokio::time::timeout(limit, elector).await.is_err() {
                warn!(job = %name, node = %self.cfg.node_id, "the elector did not stop in time");
            }
            let mut notices = self.notices.lock().expect("release notices");
            notices.remove(&channel);
            notices.remove(&JobKeys::new(&name).notice_channel());
            notices.remove(&JobKeys::new(&name).work_channel());
        }
    }
}

/// Runs the replica until `shutdown` resolves.
pub async fn run(
    cfg: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let node = cfg.node_id.clone();
    let runtime = Runtime::new(cfg.limits)?;
    let runtime = match &cfg.cache_dir {
        Some(dir) => runtime.with_cache(dir)?,
        None => runtime,
    };
    // The databases jobs may be granted: each one's fence is checked before any job uses it, as
    // Redis's eviction policy is; one that answers and cannot be trusted stops the start.
    let databases =
        crate::exec::sql::Databases::new(&cfg.databases, cfg.sql_caps, cfg.timing.lease_ttl);
    for db in databases.iter() {
        match db.verify(Duration::from_secs(10)).await {
            Ok(v) => {
                info!(node = %node, database = db.name(), role = %v.role, jobs = %v.jobs.join(","), tls = db.tls_roots().unwrap_or("off"), "database checked: the fence is in place")
            }
            Err(crate::exec::sql::VerifyError::Unreachable(why)) => {
                warn!(node = %node, database = db.name(), "cannot check database {} now ({why}); it is checked again at its first use", db.name())
            }
            Err(crate::exec::sql::VerifyError::Unsafe(why)) => {
                anyhow::bail!("database {} ({}): {why}", db.name(), db.shown())
            }
        }
    }
    let runtime = runtime
        .with_databases(databases)
        .with_outbound(crate::exec::http::Outbound::new(cfg.http_caps.clone()));
    let leases = LeaseRuntime::start().context("starting the lease runtime")?;
    // The store behind the seam (issue 30), Redis or etcd, as the URL names it.
    let stores::Stores {
        seam,
        lease_seam,
        unsafe_: store_unsafe,
        refusal: store_refusal,
    } = stores::open(&cfg, &node, &leases).await?;
    // Bound before anything else starts, so a taken address is a start-up error.
    let http = match cfg.http {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on http address {addr}"))?,
        ),
        None => None,
    };
    let mut dir = JobsDir::new(&cfg.jobs_dir, &cfg.node_id);
    // An unreadable jobs directory at start-up is a configuration error; later, the host keeps
    // serving what it has.
    let first = dir.scan(&runtime, &BTreeMap::new()).await?;

    let notices = ReleaseNotices::default();
    let tasks = TaskTracker::new();
    let stop_listener = CancellationToken::new();
    {
        let (seam, notices, stop) = (seam.clone(), notices.clone(), stop_listener.clone());
        tasks.spawn_on(
            async move { seam.listen(notices, stop).await },
            leases.handle(),
        );
    }
    // Membership: registered once before any job campaigns (so that preference is known from
    // the first campaign), then every heartbeat on the lease runtime.
    let member = crate::coord::members::MemberInfo {
        capacity: cfg.capacity,
        version: env!("CARGO_PKG_VERSION").to_string(),
        http: http
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map(|a| a.to_string()),
        since: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        seen: String::new(),
        tasks: crate::coord::members::WorkerStats {
            slots: cfg.task_slots,
            ..Default::default()
        },
    };
    let counters = Arc::new(crate::exec::workers::Counters::new(cfg.task_slots));
    let first_view = match tokio::time::timeout(
        cfg.timing.redis_timeout,
        lease_seam.register(&node, &member, cfg.timing.lease_ttl),
    )
    .await
    {
        Ok(Ok(m)) => crate::coord::members::View::default().next(m, std::time::Instant::now()),
        _ => {
            warn!(node = %node, "could not register in the membership at start-up; every job campaigns at once until it can");
            crate::coord::members::View::default()
        }
    };
    info!(node = %node, members = %crate::coord::members::joined(first_view.members.keys()), capacity = cfg.capacity, "registered in the membership");
    let (members_tx, members) = watch::channel(first_view);
    // The heartbeat: membership, renewals, follower looks and idle runners' reads in one call
    // to the store (one round trip per Redis node) every heartbeat, on the lease runtime.
    let stop_heartbeat = CancellationToken::new();
    let (heartbeat, heartbeat_task) = crate::coord::heartbeat::Heartbeat::start(
        leases.handle(),
        lease_seam.clone(),
        cfg.timing,
        crate::coord::heartbeat::Member {
            node: node.clone(),
            info: member,
            view: members_tx,
            tasks: {
                let counters = counters.clone();
                Box::new(move || counters.snapshot())
            },
        },
        stop_heartbeat.clone(),
    );
    // A member joining is announced on the membership's notice channel: read the membership
    // at once.
    notices.lock().expect("release notices").insert(
        crate::coord::members::JOINED_CHANNEL.to_string(),
        Notice::wake(heartbeat.kicker()),
    );
    let (_watcher, mut changes) = jobs_dir::watch(&cfg.jobs_dir);
    let watching = _watcher.is_some();
    let (catalog, catalog_rx) = watch::channel(Catalog::default());
    tasks.spawn(catalog::publish(
        catalog_rx.clone(),
        seam.clone(),
        node.clone(),
        stop_heartbeat.clone(),
    ));
    let stop_http = CancellationToken::new();
    if let Some(listener) = http {
        let addr = listener.local_addr().ok();
        // Tests and supervisors bind port 0 and read the bound address from this line.
        if let Some(a) = addr {
            info!(node = %node, addr = %a, "HTTP API listening");
        }
        if cfg.http_token.is_none() && addr.is_some_and(|a| !a.ip().is_loopback()) {
            warn!(node = %node, addr = ?addr, "the HTTP API listens beyond this machine without a token: anyone who reaches it can trigger, pause and resume jobs; set LEASEHOLD_HTTP_TOKEN");
        }
        let api = crate::node::http::Api {
            node: node.clone(),
            store: seam.clone(),
            jobs: catalog_rx,
            token: cfg.http_token.clone(),
            timing: cfg.timing,
            members: members.clone(),
            counters: counters.clone(),
            sessions: Default::default(),
        };
        let stop = stop_http.clone().cancelled_owned();
        tasks.spawn(async move {
            if let Err(e) = crate::node::http::serve(listener, api, stop).await {
                warn!("HTTP API stopped: {e}");
            }
        });
    }
    let handoffs = Arc::new(crate::coord::balance::Limiter::new(cfg.timing.heartbeat));
    // Fan-out tasks are on Redis only yet (issue 30): on etcd no job's task worker runs.
    let workers = match &seam {
        Store::Redis(r) => Some(Arc::new(crate::exec::workers::Workers {
            runtime: runtime.clone(),
            conn: r.conn().clone(),
            store: seam.clone(),
            consumer: format!("{node}:{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            slots: Arc::new(tokio::sync::Semaphore::new(cfg.task_slots as usize)),
            counters: counters.clone(),
            timing: cfg.timing,
        })),
        Store::Etcd(_) => None,
    };
    let campaigns = crate::coord::campaigns::Campaigns::start(
        leases.handle(),
        lease_seam.clone(),
        stop_heartbeat.clone(),
    );
    let mut host = Host {
        cfg,
        runtime,
        seam,
        lease_seam,
        leases,
        notices,
        jobs: BTreeMap::new(),
        catalog,
        runners: CancellationToken::new(),
        electors: CancellationToken::new(),
        tasks: tasks.clone(),
        handoffs,
        members,
        heartbeat,
        campaigns,
        workers,
    };
    let mut settling = first.settling;
    let nothing_yet = first.jobs.is_empty() && first.compiling.is_empty() && !first.settling;
    host.apply(first).await;
    if nothing_yet {
        warn!(node = %node, dir = %host.cfg.jobs_dir.display(), "no job loaded yet; drop .wasm components into the jobs directory");
    }
    info!(node = %node, jobs = host.jobs.len(), ttl = %crate::node::config::show(host.cfg.timing.lease_ttl), heartbeat = %crate::node::config::show(host.cfg.timing.heartbeat), "node started");

    tokio::pin!(shutdown);
    let mut dir_error = false;
    loop {
        let wait = match (settling, watching) {
            (true, _) => SETTLE / 2,
            (false, true) => RESCAN_WATCHED,
            (false, false) => RESCAN,
        };
        tokio::select! {
            _ = &mut shutdown => break,
            _ = store_unsafe.cancelled() => break,
            Some(()) = changes.recv(), if watching => {}
            _ = dir.loaded() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        let serving = host.serving();
        let scan = tokio::select! {
            _ = &mut shutdown => break,
            _ = store_unsafe.cancelled() => break,
            scan = dir.scan(&host.runtime, &serving) => scan,
        };
        match scan {
            Ok(scan) => {
                if dir_error {
                    info!(node = %node, "jobs directory readable again");
                    dir_error = false;
                }
                settling = scan.settling;
                host.apply(scan).await;
            }
            Err(e) if !dir_error => {
                warn!(node = %node, "{e:#}; serving the jobs already loaded");
                dir_error = true;
            }
            Err(_) => {}
        }
    }

    info!(node = %node, "shutting down: stopping running steps");
    stop_http.cancel();
    let handles: Vec<JobHandle> = std::mem::take(&mut host.jobs).into_values().collect();
    host.stop(handles).await;
    // Every job's tokens are cancelled by now; the roots make sure nothing was missed.
    host.runners.cancel();
    host.electors.cancel();
    info!(node = %node, "steps stopped and leases released");
    // Out of the membership last: until its leases are released it is still a member.
    stop_heartbeat.cancel();
    let _ = tokio::time::timeout(host.cfg.timing.redis_timeout * 2, heartbeat_task).await;
    stop_listener.cancel();
    tasks.close();
    if tokio::time::timeout(STOP_GRACE, tasks.wait())
        .await
        .is_err()
    {
        warn!(node = %node, tasks = tasks.len(), "some tasks did not stop within {}", crate::node::config::show(STOP_GRACE));
    }
    drop(host);
    info!(node = %node, "stopped");
    store_unsafe.cancel();
    match store_refusal.lock().expect("store refusal").take() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
