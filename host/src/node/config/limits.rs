//! Host limits (`--max-*` flags): as given ([`RawLimits`]) and validated into
//! [`HostLimits`], every violation reported at once, naming the flag.

use std::time::Duration;

use super::{ConfigError, Setting, Violation, show, show_size};
use crate::exec::spec::HostLimits;

/// The largest `--max-instances`, `--max-tables` and `--max-memories` (wasmtime's own default
/// limit of each per store).
const MAX_COUNT: u32 = 10_000;

/// Host limits as given (`--max-*` flags), before validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawLimits {
    /// Most linear memory a job may use, in bytes.
    pub max_memory: u64,
    /// Longest a step may run.
    pub max_step_time: Duration,
    /// Largest value one write (or checkpoint) may carry, in bytes.
    pub max_write_size: u64,
    /// Largest component file the host reads, in bytes.
    pub max_component_size: u64,
    /// Guest log lines kept per step.
    pub guest_log_lines: u32,
    /// The largest storage quota a job may have, in keys.
    pub max_stored_keys: u64,
    /// The largest storage quota a job may have, in bytes.
    pub max_stored_bytes: u64,
    /// Most core instances one instantiation of a job may create.
    pub max_instances: u32,
    /// Most tables one instantiation of a job may create.
    pub max_tables: u32,
    /// Most linear memories one instantiation of a job may create.
    pub max_memories: u32,
    /// Guest instances live at once in the pooling allocator; 0 allocates on demand.
    pub instance_pool: u32,
}

impl RawLimits {
    /// Validates the limits; every violation is reported at once, naming the flag.
    pub fn validate(&self) -> Result<HostLimits, ConfigError> {
        let mut bad = Vec::new();
        self.check(&mut bad);
        if !bad.is_empty() {
            return Err(ConfigError { violations: bad });
        }
        Ok(HostLimits::with_maxima(
            self.max_memory,
            self.max_step_time,
            self.max_write_size,
            self.max_component_size,
            self.guest_log_lines,
        )
        .with_quota(self.max_stored_keys, self.max_stored_bytes)
        .with_counts(self.max_instances, self.max_tables, self.max_memories)
        .with_instance_pool(self.instance_pool))
    }

    pub(super) fn check(&self, bad: &mut Vec<Violation>) {
        if self.max_memory < 1 << 20 {
            bad.push(Violation::new(
                Setting::MaxMemory,
                format!(
                    "max-memory ({}) must be at least 1 MiB: no component starts in less",
                    show_size(self.max_memory)
                ),
            ));
        }
        if self.max_step_time < Duration::from_millis(100) {
            bad.push(Violation::new(
                Setting::MaxStepTime,
                format!(
                    "max-step-time ({}) must be at least 100ms",
                    show(self.max_step_time)
                ),
            ));
        }
        if self.max_step_time > Duration::from_secs(86_400) {
            bad.push(Violation::new(
                Setting::MaxStepTime,
                format!(
                    "max-step-time ({}) must be at most 1 day",
                    show(self.max_step_time)
                ),
            ));
        }
        if self.max_write_size < 1 << 10 {
            bad.push(Violation::new(
                Setting::MaxWriteSize,
                format!(
                    "max-write-size ({}) must be at least 1 KiB",
                    show_size(self.max_write_size)
                ),
            ));
        }
        if self.max_stored_keys == 0 {
            bad.push(Violation::new(
                Setting::MaxStoredKeys,
                "max-stored-keys (0) must be at least 1".into(),
            ));
        }
        if self.max_stored_bytes < 1 << 10 {
            bad.push(Violation::new(
                Setting::MaxStoredBytes,
                format!(
                    "max-stored-bytes ({}) must be at least 1 KiB",
                    show_size(self.max_stored_bytes)
                ),
            ));
        }
        if self.instance_pool > MAX_INSTANCE_POOL {
            bad.push(Violation::new(
                Setting::InstancePool,
                format!(
                    "instance-pool ({}) must be at most {MAX_INSTANCE_POOL} (0 allocates every instance on demand)",
                    self.instance_pool
                ),
            ));
        }
        for (setting, value) in [
            (Setting::MaxInstances, self.max_instances),
            (Setting::MaxTables, self.max_tables),
            (Setting::MaxMemories, self.max_memories),
        ] {
            if !(1..=MAX_COUNT).contains(&value) {
                bad.push(Violation::new(
                    setting,
                    format!(
                        "{} ({value}) must be between 1 and {MAX_COUNT}",
                        setting.flag()
                    ),
                ));
            }
        }
        if self.max_component_size < 64 << 10 {
            bad.push(Violation::new(
                Setting::MaxComponentSize,
                format!(
                    "max-component-size ({}) must be at least 64 KiB",
                    show_size(self.max_component_size)
                ),
            ));
        }
    }
}

/// Largest `--instance-pool`: each slot reserves address space for its memories.
const MAX_INSTANCE_POOL: u32 = 1000;
