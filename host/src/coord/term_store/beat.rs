//! What a host's heartbeat asks of its store, and what the store answers
//! ([`super::TermStore::beat`]): each part for itself.

use std::time::Duration;

use super::{JobReads, StoreTerm};
use crate::coord::members::{MemberInfo, Members};

/// One heartbeat's asks of the store ([`super::TermStore::beat`]): everything a host does every
/// heartbeat, in one call.
#[derive(Clone, Debug)]
pub struct Beat<'a> {
    /// This host's node id, registered in the membership.
    pub node: &'a str,
    /// What it registers.
    pub info: &'a MemberInfo,
    /// The membership's and the renewals' TTL (a follower's ask lives as long).
    pub ttl: Duration,
    /// Every term this host leads, renewed for `ttl`.
    pub renew: Vec<&'a StoreTerm>,
    /// Every job whose lease this host looks at (it follows them), each with this host's ask
    /// when it is the job's preferred member.
    pub look: Vec<LookAt<'a>>,
    /// Every job whose state ([`super::TermStore::job_state`]) a runner asked to be read.
    pub read: Vec<&'a str>,
}

/// A follower's look at a job's lease, in a [`Beat`].
#[derive(Clone, Copy, Debug)]
pub struct LookAt<'a> {
    /// The job.
    pub job: &'a str,
    /// This host's ask for it ([`crate::coord::balance::Ask`]), stored beside the lease while
    /// it is held (Redis only, as a campaign's).
    pub ask: Option<&'a str>,
}

/// What a [`Beat`] found, each part answering for itself and in the beat's order (on a Redis
/// Cluster a node that did not answer fails only what it holds).
#[derive(Debug)]
pub struct Beaten {
    /// The live members, this one included.
    pub members: anyhow::Result<Members>,
    /// For each term renewed, whether it still holds its job (false ends it).
    pub renewed: Vec<anyhow::Result<bool>>,
    /// For each look, the lease as the store saw it.
    pub looked: Vec<anyhow::Result<Lease>>,
    /// For each job read, its state.
    pub read: Vec<anyhow::Result<JobReads>>,
}

impl Beaten {
    /// A beat that got no answer at all: `why`, for every part of `beat`.
    pub fn failed(beat: &Beat<'_>, why: &str) -> Beaten {
        fn e<T>(why: &str) -> anyhow::Result<T> {
            Err(anyhow::anyhow!("{why}"))
        }
        Beaten {
            members: e(why),
            renewed: beat.renew.iter().map(|_| e(why)).collect(),
            looked: beat.look.iter().map(|_| e(why)).collect(),
            read: beat.read.iter().map(|_| e(why)).collect(),
        }
    }
}

/// A job's lease as a look found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lease {
    /// Held by `holder`.
    Held {
        /// The owner.
        holder: String,
        /// Its time left where the store says (Redis); `None` on etcd, where the host's
        /// listener wakes a follower when the lease lapses.
        ttl: Option<Duration>,
    },
    /// Nobody holds it.
    Free,
}
