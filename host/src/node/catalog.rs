//! What a node serves, as the HTTP API reads it: the jobs with their current version and this
//! node's role for each, and the files refused. [`crate::node`] publishes a new [`Catalog`] on
//! a `watch` channel after every scan of the jobs directory; [`crate::node::http`] only reads it,
//! and [`publish`] writes the served names to Redis for `leasehold trigger`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::coord::elector::Role;
use crate::coord::term_store::{Store, TermStore};
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

/// How often the served names are written again even if unchanged: a member whose registration
/// lapsed (its entry dropped with it) publishes them again within this time.
const REPUBLISH: Duration = Duration::from_secs(60);

/// Writes the names of the served jobs to the store ([`TermStore::publish_jobs`])
/// whenever they change, once the files present at start have loaded, until `stop`. A failed
/// write is tried again a second later; it never holds up the node.
pub(crate) async fn publish(
    mut catalog: watch::Receiver<Catalog>,
    store: Store,
    node: String,
    stop: CancellationToken,
) {
    let mut published: Option<Vec<String>> = None;
    let mut again = tokio::time::interval(REPUBLISH);
    again.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let names = {
            let c = catalog.borrow_and_update();
            c.started
                .then(|| c.jobs.keys().cloned().collect::<Vec<_>>())
        };
        let mut wait = None;
        if let Some(names) = names
            && published.as_ref() != Some(&names)
        {
            let write = store.publish_jobs(&node, &names);
            match tokio::time::timeout(Duration::from_secs(5), write).await {
                Ok(Ok(())) => published = Some(names),
                Ok(Err(e)) => {
                    debug!(node = %node, "publishing the served jobs failed: {e}");
                    wait = Some(Duration::from_secs(1));
                }
                Err(_) => wait = Some(Duration::from_secs(1)),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait.unwrap_or(REPUBLISH)), if wait.is_some() => {}
            changed = catalog.changed() => if changed.is_err() { return },
            _ = again.tick() => published = None,
        }
    }
}
