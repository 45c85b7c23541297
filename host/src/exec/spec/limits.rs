//! Resource limits: the host-wide defaults and caps ([`HostLimits`], with the `DEFAULT_*`
//! values a job gets when it asks for nothing) and the limits one job runs with ([`Limits`]).

use std::time::Duration;

/// Host-wide limits: what a job gets when it asks for nothing (zero), the most it may ask, and
/// the limits that apply to every job alike. Set with `leasehold run`'s `--max-*` flags (see
/// README, "Limits"); [`HostLimits::default`] is what the flags default to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostLimits {
    /// Default and maximum linear memory per job (all memories of an instance together), in
    /// bytes.
    pub memory: (u64, u64),
    /// Default and maximum duration of one step.
    pub step_time: (Duration, Duration),
    /// Default and maximum size of one written value (and of a step's checkpoint), in bytes.
    pub write_bytes: (u64, u64),
    /// Default and maximum storage quota of a job, in keys.
    pub stored_keys: (u64, u64),
    /// Default and maximum storage quota of a job, in bytes (keys and values).
    pub stored_bytes: (u64, u64),
    /// Largest component file the host reads, in bytes.
    pub component_bytes: u64,
    /// Guest log lines kept per step; later lines are counted and dropped.
    pub log_lines: u32,
    /// Most core instances, tables and linear memories one instantiation of a job may create
    /// (a componentize-py component has about 14 instances; each one needs its memory).
    pub counts: Counts,
    /// Guest instances that may be live at once in the pooling allocator (`--instance-pool`);
    /// 0 allocates each instance on demand.
    pub instance_pool: u32,
}

/// Most core instances, tables and memories one store may hold (`--max-instances`,
/// `--max-tables`, `--max-memories`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Core module instances.
    pub instances: u32,
    /// Tables.
    pub tables: u32,
    /// Linear memories.
    pub memories: u32,
}

/// The default of each count: room for a componentize-py component (14 core instances with
/// default options, 17 with `--stub-wasi`) and native extensions. The memory limit applies to
/// all memories together, whatever their number.
pub const DEFAULT_COUNT: u32 = 64;

/// The default of `--instance-pool`: guest instances live at once (a step, a `describe()`
/// call) before a further one waits for a slot.
pub(crate) const DEFAULT_INSTANCE_POOL: u32 = 64;

/// What a job gets when it asks for nothing, if the host's maximum allows it.
const DEFAULT_MEMORY: u64 = 64 << 20;
const DEFAULT_STEP_TIME: Duration = Duration::from_secs(30);
const DEFAULT_WRITE_BYTES: u64 = 1 << 20;
const DEFAULT_STORED_KEYS: u64 = 100_000;
const DEFAULT_STORED_BYTES: u64 = 256 << 20;
/// The maxima of the storage quota when no flag says otherwise.
const MAX_STORED_KEYS: u64 = 1_000_000;
/// See [`MAX_STORED_KEYS`].
const MAX_STORED_BYTES: u64 = 1 << 30;

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits::with_maxima(512 << 20, Duration::from_secs(600), 16 << 20, 64 << 20, 200)
            .with_quota(MAX_STORED_KEYS, MAX_STORED_BYTES)
    }
}

impl HostLimits {
    /// Limits with the given maxima; a job that asks for nothing gets the usual default, or the
    /// maximum when that is lower.
    pub fn with_maxima(
        memory: u64,
        step_time: Duration,
        write_bytes: u64,
        component_bytes: u64,
        log_lines: u32,
    ) -> Self {
        HostLimits {
            memory: (DEFAULT_MEMORY.min(memory), memory),
            step_time: (DEFAULT_STEP_TIME.min(step_time), step_time),
            write_bytes: (DEFAULT_WRITE_BYTES.min(write_bytes), write_bytes),
            stored_keys: (DEFAULT_STORED_KEYS, MAX_STORED_KEYS),
            stored_bytes: (DEFAULT_STORED_BYTES, MAX_STORED_BYTES),
            component_bytes,
            log_lines,
            counts: Counts {
                instances: DEFAULT_COUNT,
                tables: DEFAULT_COUNT,
                memories: DEFAULT_COUNT,
            },
            instance_pool: DEFAULT_INSTANCE_POOL,
        }
    }

    /// The same, with these most core instances, tables and memories per instantiation.
    pub fn with_counts(mut self, instances: u32, tables: u32, memories: u32) -> Self {
        self.counts = Counts {
            instances,
            tables,
            memories,
        };
        self
    }

    /// The same, with room for `n` live guest instances in the pooling allocator (0: allocate
    /// on demand).
    pub fn with_instance_pool(mut self, n: u32) -> Self {
        self.instance_pool = n;
        self
    }

    /// The same, with these maxima of the storage quota (keys, bytes); the defaults are
    /// 100,000 keys and 256 MiB, or the maximum when that is lower.
    pub fn with_quota(mut self, keys: u64, bytes: u64) -> Self {
        self.stored_keys = (DEFAULT_STORED_KEYS.min(keys), keys);
        self.stored_bytes = (DEFAULT_STORED_BYTES.min(bytes), bytes);
        self
    }
}

/// The limits a job runs with after applying the host's defaults and caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Limits {
    /// Largest linear memory, in bytes.
    pub memory: u64,
    /// Longest one step may run.
    pub step_time: Duration,
    /// Largest value one write may carry, in bytes.
    pub write_bytes: u64,
    /// Most keys the job may keep in its store.
    pub stored_keys: u64,
    /// Most bytes (keys and values) the job may keep in its store.
    pub stored_bytes: u64,
}
