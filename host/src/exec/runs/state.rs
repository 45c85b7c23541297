//! What a leader reads every round ([`JobState`], one round trip), and the pause flag
//! operators set.

use std::collections::BTreeMap;

use super::requests::Request;
use crate::coord::term_store::{JobReads, Store, TermStore as _};
use crate::store::keys::JobKeys;

/// What a leader reads every round, in one round trip.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobState {
    /// Operator requests not yet cleared, by period.
    pub requested: BTreeMap<String, Request>,
    /// Periods whose run is open (`pending`, `running` or `waiting`).
    pub open: Vec<String>,
    /// Why the job is paused (who and when), if it is.
    pub paused: Option<String>,
    /// The start instant of the newest period accounted for (RFC 3339; older versions wrote a
    /// wall-clock time).
    pub cursor: Option<String>,
    /// The member that asks for the job (its preferred member, following it), if one does:
    /// its node id and the version it serves (see [`crate::coord::balance`]).
    pub wanted: Option<String>,
    /// Whether the job's run index is built (its marker is in it: records written before the
    /// index existed were indexed by a leader).
    pub indexed: bool,
}

impl From<JobReads> for JobState {
    fn from(r: JobReads) -> Self {
        JobState {
            requested: r
                .requests
                .into_iter()
                .map(|(period, v)| (period, Request::decode(&String::from_utf8_lossy(&v))))
                .collect(),
            open: r.open,
            paused: r.paused,
            cursor: r.cursor,
            wanted: r.wanted,
            indexed: r.indexed,
        }
    }
}

/// Reads the job's [`JobState`] through the seam in one request
/// ([`crate::coord::term_store::TermStore::job_state`]).
pub async fn state_of(store: &Store, keys: &JobKeys) -> anyhow::Result<JobState> {
    Ok(store.job_state(keys.job()).await?.into())
}

/// Pauses the job (`reason` says who and when) or resumes it (`None`), waking the leader's
/// runner. Operator actions, like requests, are not fenced: they are inputs to the leader, not
/// results, and no leader writes the flag.
pub async fn set_paused(store: &Store, keys: &JobKeys, reason: Option<&str>) -> anyhow::Result<()> {
    store.set_paused(keys.job(), reason).await
}
