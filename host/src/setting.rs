//! A setting of `leasehold run` and the violations of its rules: what validation reports in
//! every layer (the lease timings in [`crate::coord::timing`], everything else in
//! [`crate::node::config`]), all violations at once, each naming the setting and its values.
//! A leaf: it uses nothing of the crate.

use std::fmt;

/// A setting of `leasehold run` that a rule is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// `--lease-ttl`.
    LeaseTtl,
    /// `--heartbeat`.
    Heartbeat,
    /// `--lease-margin`.
    LeaseMargin,
    /// `--redis-timeout`.
    RedisTimeout,
    /// `--node-id`.
    NodeId,
    /// `--max-memory`.
    MaxMemory,
    /// `--max-step-time`.
    MaxStepTime,
    /// `--max-write-size`.
    MaxWriteSize,
    /// `--max-component-size`.
    MaxComponentSize,
    /// `--max-stored-keys`.
    MaxStoredKeys,
    /// `--max-stored-bytes`.
    MaxStoredBytes,
    /// `--max-instances`.
    MaxInstances,
    /// `--max-tables`.
    MaxTables,
    /// `--max-memories`.
    MaxMemories,
    /// `--instance-pool`.
    InstancePool,
    /// `--cache-dir`.
    CacheDir,
    /// `--http-token`.
    HttpToken,
    /// `--replica-timeout`.
    ReplicaTimeout,
    /// `--min-replicas`.
    MinReplicas,
    /// `--capacity`.
    Capacity,
    /// `--redis-url`.
    RedisUrl,
    /// `--task-slots`.
    TaskSlots,
    /// `--database`.
    Database,
    /// `--max-statement-time`.
    MaxStatementTime,
    /// `--http-allow`.
    HttpAllow,
    /// `--max-http-timeout`.
    MaxHttpTimeout,
}

impl Setting {
    /// The flag's name without `--` (also the start of its environment variable's meaning).
    pub fn flag(self) -> &'static str {
        match self {
            Setting::LeaseTtl => "lease-ttl",
            Setting::Heartbeat => "heartbeat",
            Setting::LeaseMargin => "lease-margin",
            Setting::RedisTimeout => "redis-timeout",
            Setting::NodeId => "node-id",
            Setting::MaxMemory => "max-memory",
            Setting::MaxStepTime => "max-step-time",
            Setting::MaxWriteSize => "max-write-size",
            Setting::MaxComponentSize => "max-component-size",
            Setting::MaxStoredKeys => "max-stored-keys",
            Setting::MaxStoredBytes => "max-stored-bytes",
            Setting::MaxInstances => "max-instances",
            Setting::MaxTables => "max-tables",
            Setting::MaxMemories => "max-memories",
            Setting::InstancePool => "instance-pool",
            Setting::CacheDir => "cache-dir",
            Setting::HttpToken => "http-token",
            Setting::ReplicaTimeout => "replica-timeout",
            Setting::MinReplicas => "min-replicas",
            Setting::Capacity => "capacity",
            Setting::RedisUrl => "redis-url",
            Setting::TaskSlots => "task-slots",
            Setting::Database => "database",
            Setting::MaxStatementTime => "max-statement-time",
            Setting::HttpAllow => "http-allow",
            Setting::MaxHttpTimeout => "max-http-timeout",
        }
    }
}

/// One violated rule: the setting it is about and a message naming the values that break it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The setting.
    pub setting: Setting,
    /// The rule and the values that break it.
    pub message: String,
}

impl Violation {
    /// A violation of `setting`'s rule.
    pub fn new(setting: Setting, message: String) -> Self {
        Violation { setting, message }
    }
}

/// One or more violated configuration rules. `Display` lists every violation on its own line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Each violated rule, with the values that violate it.
    pub violations: Vec<Violation>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration:")?;
        for v in &self.violations {
            write!(f, "\n  - {}", v.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}
