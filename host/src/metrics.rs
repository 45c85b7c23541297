//! Prometheus metrics (`GET /metrics`, OpenMetrics text), one registry per process.
//!
//! The metrics, their types, labels and meaning are listed in one place: README.md, "Metrics".
//! Adding one: register it here, add its row there, and assert it from a live node (most are in
//! `tests/integration/operate.rs`).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `job` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct JobLabel {
    /// The job's name.
    pub job: String,
}

/// `kind` label: what a Redis round trip was for.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabel {
    /// `heartbeat`, `campaigns`, `job-state`.
    pub kind: String,
}

/// `job` and another label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TransitionLabel {
    /// The job's name.
    pub job: String,
    /// `leader` or `follower`.
    pub to: String,
}

/// `job` and `outcome`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StepLabel {
    /// The job's name.
    pub job: String,
    /// `continue`, `done`, `failed`, `not-ready`, `trap`, `memory-limit`, `timeout`,
    /// `lost-leadership`, `host`.
    pub outcome: String,
}

/// `job` and `status`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RunLabel {
    /// The job's name.
    pub job: String,
    /// The final status.
    pub status: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric of the process.
pub(crate) struct Metrics {
    registry: Registry,
    /// See the module table.
    pub leader: Family<JobLabel, Gauge>,
    /// See the module table.
    pub token: Family<JobLabel, Gauge>,
    /// See the module table.
    pub transitions: Family<TransitionLabel, Counter>,
    /// See the module table.
    pub renew_latency: Histograms<JobLabel>,
    /// See the module table.
    pub without_leader: Family<JobLabel, Counter<f64>>,
    /// See the module table.
    pub fence_refusals: Family<JobLabel, Counter>,
    /// See the module table.
    pub step_duration: Histograms<StepLabel>,
    /// See the module table.
    pub guest_traps: Family<JobLabel, Counter>,
    /// See the module table.
    pub guest_timeouts: Family<JobLabel, Counter>,
    /// See the module table.
    pub runs: Family<RunLabel, Counter>,
    /// See the module table.
    pub stored_keys: Family<JobLabel, Gauge>,
    /// See the module table.
    pub stored_bytes: Family<JobLabel, Gauge>,
    /// See the module table.
    pub quota_refusals: Family<JobLabel, Counter>,
    /// Redis round trips of the recurring kinds (each pipeline counts once).
    pub round_trips: Family<KindLabel, Counter>,
    /// See the module table.
    pub tasks: Family<StepLabel, Counter>,
    /// See the module table.
    pub task_duration: Histograms<StepLabel>,
    /// See the module table.
    pub guest_memory_peak: Family<JobLabel, Gauge>,
    /// See the module table.
    pub jobs: Gauge,
    /// See the module table.
    pub refused_files: Gauge,
}

fn latency_buckets() -> Histogram {
    // 100 µs to about 6.5 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

fn step_buckets() -> Histogram {
    // 1 ms to about 9 minutes.
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut registry = Registry::with_prefix("leasehold");
    let m = Metrics {
        leader: Family::default(),
        token: Family::default(),
        transitions: Family::default(),
        renew_latency: Family::new_with_constructor(latency_buckets),
        without_leader: Family::default(),
        fence_refusals: Family::default(),
        step_duration: Family::new_with_constructor(step_buckets),
        guest_traps: Family::default(),
        guest_timeouts: Family::default(),
        round_trips: Family::default(),
        tasks: Family::default(),
        task_duration: Family::new_with_constructor(step_buckets),
        runs: Family::default(),
        stored_keys: Family::default(),
        stored_bytes: Family::default(),
        quota_refusals: Family::default(),
        guest_memory_peak: Family::default(),
        jobs: Gauge::default(),
        refused_files: Gauge::default(),
        registry: Registry::default(),
    };
    registry.register(
        "leader",
        "1 while this node leads the job",
        m.leader.clone(),
    );
    registry.register(
        "token",
        "Token of this node's current or last term of the job",
        m.token.clone(),
    );
    registry.register(
        "leadership_transitions",
        "Times this node became leader or stopped leading",
        m.transitions.clone(),
    );
    registry.register(
        "renew_latency_seconds",
        "Lease renewal round trips that got an answer",
        m.renew_latency.clone(),
    );
    registry.register(
        "without_leader_seconds",
        "Time this node saw the job without a leader",
        m.without_leader.clone(),
    );
    registry.register(
        "fence_refusals",
        "Fenced writes of this node refused by the fence",
        m.fence_refusals.clone(),
    );
    registry.register(
        "step_duration_seconds",
        "Job steps by outcome",
        m.step_duration.clone(),
    );
    registry.register(
        "guest_traps",
        "Steps ended by a trap or the memory limit",
        m.guest_traps.clone(),
    );
    registry.register(
        "guest_timeouts",
        "Steps stopped at their time limit",
        m.guest_timeouts.clone(),
    );
    registry.register(
        "runs",
        "Runs that reached a final state on this node",
        m.runs.clone(),
    );
    registry.register(
        "job_stored_keys",
        "Keys the job keeps in its store, as of this node's last write for it",
        m.stored_keys.clone(),
    );
    registry.register(
        "job_stored_bytes",
        "Bytes (keys and values) the job keeps in its store, as of this node's last write for it",
        m.stored_bytes.clone(),
    );
    registry.register(
        "quota_refusals",
        "Guest writes refused by the job's storage quota on this node",
        m.quota_refusals.clone(),
    );
    registry.register(
        "guest_memory_peak_bytes",
        "Largest linear memory a step or task of the job reached on this node",
        m.guest_memory_peak.clone(),
    );
    registry.register("jobs", "Jobs this node serves", m.jobs.clone());
    registry.register(
        "redis_round_trips",
        "Redis round trips this node made, by kind (heartbeat: one batch per Redis node carrying membership, every renewal, follower looks and idle runners' reads; campaigns: one per coalesced pipeline; job-state: a runner's own read of its job's state)",
        m.round_trips.clone(),
    );
    registry.register(
        "tasks",
        "Task attempts this node ran as a worker, by how they ended: done, retried (failed, queued again), failed (on its last attempt), refused (the claim or the term had moved on), reclaimed (taken over from a worker that stopped answering), dropped (its claim lapsed here)",
        m.tasks.clone(),
    );
    registry.register(
        "task_duration_seconds",
        "Task attempts this node ran as a worker, by outcome",
        m.task_duration.clone(),
    );
    registry.register(
        "refused_files",
        "Files in the jobs directory refused in their current version",
        m.refused_files.clone(),
    );
    Metrics { registry, ..m }
});

/// The process's metrics.
pub(crate) fn get() -> &'static Metrics {
    &METRICS
}

/// The metrics in OpenMetrics text format, as `GET /metrics` serves them (the benchmarks read
/// them in process too).
pub fn encode() -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &METRICS.registry)
        .expect("writing to a String cannot fail");
    out
}

fn job(job: &str) -> JobLabel {
    JobLabel {
        job: job.to_string(),
    }
}

impl Metrics {
    /// This node became the job's leader with `token`.
    pub(crate) fn became_leader(&self, name: &str, token: u64) {
        self.leader.get_or_create(&job(name)).set(1);
        self.token
            .get_or_create(&job(name))
            .set(i64::try_from(token).unwrap_or(i64::MAX));
        self.transitions
            .get_or_create(&TransitionLabel {
                job: name.to_string(),
                to: "leader".into(),
            })
            .inc();
    }

    /// This node stopped leading the job.
    pub(crate) fn stopped_leading(&self, name: &str) {
        self.leader.get_or_create(&job(name)).set(0);
        self.transitions
            .get_or_create(&TransitionLabel {
                job: name.to_string(),
                to: "follower".into(),
            })
            .inc();
    }

    /// One Redis round trip of `kind` (see [`KindLabel`]).
    pub(crate) fn round_trip(&self, kind: &str) {
        self.round_trips
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// A renewal of the job's lease got an answer after `d`.
    pub(crate) fn renewed(&self, name: &str, d: Duration) {
        self.renew_latency
            .get_or_create(&job(name))
            .observe(d.as_secs_f64());
    }

    /// The job had no known leader for `d`.
    pub(crate) fn without_leader(&self, name: &str, d: Duration) {
        self.without_leader
            .get_or_create(&job(name))
            .inc_by(d.as_secs_f64());
    }

    /// The fence refused one of the job's writes from this node.
    pub(crate) fn fence_refused(&self, name: &str) {
        self.fence_refusals.get_or_create(&job(name)).inc();
    }

    /// A step of the job ended with `outcome` after `d`.
    pub(crate) fn step(&self, name: &str, outcome: &str, d: Duration) {
        self.step_duration
            .get_or_create(&StepLabel {
                job: name.to_string(),
                outcome: outcome.to_string(),
            })
            .observe(d.as_secs_f64());
        match outcome {
            "trap" | "memory-limit" => {
                self.guest_traps.get_or_create(&job(name)).inc();
            }
            "timeout" => {
                self.guest_timeouts.get_or_create(&job(name)).inc();
            }
            _ => {}
        }
    }

    /// A write of the job left it keeping `keys` keys and `bytes` bytes.
    pub(crate) fn stored(&self, name: &str, keys: u64, bytes: u64) {
        let g = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.stored_keys.get_or_create(&job(name)).set(g(keys));
        self.stored_bytes.get_or_create(&job(name)).set(g(bytes));
    }

    /// A step or task of `name` ended with `bytes` of linear memory (memories never shrink, so
    /// that is its peak): the gauge keeps the largest.
    pub(crate) fn guest_memory(&self, name: &str, bytes: usize) {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        self.guest_memory_peak
            .get_or_create(&job(name))
            .inner()
            .fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// The job's storage quota refused one of its writes.
    pub(crate) fn quota_refused(&self, name: &str) {
        self.quota_refusals.get_or_create(&job(name)).inc();
    }

    /// A task attempt of the job ended with `outcome` on this node (after `d`, when it ran).
    pub(crate) fn task(&self, name: &str, outcome: &str, d: Option<Duration>) {
        let label = StepLabel {
            job: name.to_string(),
            outcome: outcome.to_string(),
        };
        self.tasks.get_or_create(&label).inc();
        if let Some(d) = d {
            self.task_duration
                .get_or_create(&label)
                .observe(d.as_secs_f64());
        }
    }

    /// A run of the job reached the final `status` on this node.
    pub(crate) fn run_final(&self, name: &str, status: &str) {
        self.runs
            .get_or_create(&RunLabel {
                job: name.to_string(),
                status: status.to_string(),
            })
            .inc();
    }
}
