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
    /// Largest component file the host reads, in bytes.
    pub component_bytes: u64,
    /// Guest log lines kept per step; later lines are counted and dropped.
    pub log_lines: u32,
}

/// What a job gets when it asks for nothing, if the host's maximum allows it.
const DEFAULT_MEMORY: u64 = 64 << 20;
const DEFAULT_STEP_TIME: Duration = Duration::from_secs(30);
const DEFAULT_WRITE_BYTES: u64 = 1 << 20;

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits::with_maxima(512 << 20, Duration::from_secs(600), 16 << 20, 64 << 20, 200)
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
            component_bytes,
            log_lines,
        }
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
}
