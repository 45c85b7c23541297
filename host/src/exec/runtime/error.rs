//! [`StepError`]: every way a step can end other than by returning normally.

/// What ended a step that did not return normally.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The guest returned `job-error.failed`.
    #[error("job failed: {0}")]
    Failed(String),
    /// The guest returned `job-error.not-ready`.
    #[error("inputs not ready: {0}")]
    NotReady(String),
    /// The term ended (deadline, lost lease, or a refused write) before or during the step.
    #[error("leadership lost{}", .0.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    LostLeadership(Option<String>),
    /// The step ran longer than the job's step time limit.
    #[error("step exceeded its time limit of {0}")]
    Timeout(String),
    /// The guest trapped (panic, unreachable, stack overflow, table limit, ...).
    #[error("guest trapped: {0}")]
    Trap(String),
    /// The guest tried to grow its memory past the job's memory limit.
    #[error("memory limit exceeded: {0}")]
    MemoryLimit(String),
    /// A write would have taken the job past its storage quota, and the step then failed (or,
    /// for a 0.2.0 component, which cannot be told, was stopped).
    #[error("{0}")]
    QuotaExceeded(String),
    /// The host could not run the step (e.g. the data directory could not be opened). Not the
    /// job's fault: the run is retried, not failed.
    #[error("host could not run the step: {0}")]
    Host(String),
}
