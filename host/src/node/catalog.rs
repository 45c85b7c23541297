//! What a node serves, as the HTTP API reads it: the jobs with their current version and this
//! node's role for each, and the files refused. [`crate::node`] publishes a new [`Catalog`] on
//! a `watch` channel after every scan of the jobs directory; [`crate::node::http`] only reads it.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::coord::elector::Role;
use crate::exec::runtime::LoadedJob;
use crate::node::jobs_dir::Refusal;

/// The served jobs with their roles, and the refusals.
#[derive(Clone, Default)]
pub(crate) struct Catalog {
    /// Served jobs by name.
    pub jobs: BTreeMap<String, JobView>,
    /// Files refused in their current version.
    pub refused: Vec<Refusal>,
    /// The files present at start have all been loaded or refused.
    pub started: bool,
    /// Files being compiled now (they are served once loaded).
    pub compiling: Vec<std::path::PathBuf>,
}

/// One served job as the HTTP API sees it.
#[derive(Clone)]
pub(crate) struct JobView {
    /// The version new runs use.
    pub job: Arc<LoadedJob>,
    /// This node's role for the job.
    pub role: watch::Receiver<Role>,
}
