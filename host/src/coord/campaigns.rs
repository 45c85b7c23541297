//! Campaigns coalesced into pipelines: the campaigns that a host's electors send at the same
//! moment go to the store together
//! ([`crate::coord::term_store::TermStore::campaign_many`]: on Redis one pipeline of acquire
//! scripts, one per primary on a Redis Cluster; on etcd a transaction each, sent at once).
//!
//! Followers wake when the lease they saw runs out, and the leases one host holds are renewed
//! together (in the host's heartbeat, see [`crate::coord::heartbeat`]), so they expire together: the followers of
//! every job that host leads wake in the same timer tick. Each elector hands its campaign to
//! the coalescer and waits for the answer; the coalescer takes the first campaign, lets every
//! other elector woken in the same tick run (`yield_now` on the lease runtime), drains what
//! they sent, and sends it all as one pipeline. Nothing waits for a tick: a lone campaign is
//! sent at once, so failover is as fast as with one script per campaign.
//!
//! Every acquire is its own script and answers for itself; a pipeline that fails is reported
//! to each campaign in it, which the elector treats as the failed campaign it is (it releases,
//! owner-checked, whatever the acquire may have taken).

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::coord::term_store::{Campaign, Candidacy, Store, TermStore as _};

/// Most campaigns in one pipeline.
const MOST_PER_PIPELINE: usize = 1000;

type Reply = oneshot::Sender<anyhow::Result<Campaign>>;

/// The host's campaign coalescer (cheap to clone).
#[derive(Clone)]
pub struct Campaigns {
    tx: mpsc::UnboundedSender<(Candidacy, Reply)>,
}

impl Campaigns {
    /// Starts the coalescer on `handle` (the lease runtime), sending to `store`, until `stop`
    /// is cancelled.
    pub fn start(handle: &tokio::runtime::Handle, store: Store, stop: CancellationToken) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        handle.spawn(coalesce(store, rx, stop));
        Campaigns { tx }
    }

    /// Sends `campaign` with whatever other campaigns this host sends at the same moment, and
    /// returns its answer. The caller bounds the wait (the Redis timeout).
    pub async fn acquire(&self, campaign: Candidacy) -> anyhow::Result<Campaign> {
        let (reply, answer) = oneshot::channel();
        let gone = || anyhow::anyhow!("the campaign coalescer has stopped");
        self.tx.send((campaign, reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn coalesce(
    store: Store,
    mut rx: mpsc::UnboundedReceiver<(Candidacy, Reply)>,
    stop: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            m = rx.recv() => match m {
                Some(m) => m,
                None => return,
            },
            _ = stop.cancelled() => return,
        };
        // Let every elector woken in the same tick send its campaign first.
        tokio::task::yield_now().await;
        let mut batch = vec![first];
        while batch.len() < MOST_PER_PIPELINE {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        // An elector that stopped waiting (its Redis timeout) has given the campaign up: it
        // is not sent late, to take a lease nobody would hold.
        batch.retain(|(_, reply)| !reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let (campaigns, replies): (Vec<Candidacy>, Vec<Reply>) = batch.into_iter().unzip();
        // One round trip per Redis node; each campaign answers for itself.
        let answers = store.campaign_many(&campaigns).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            let _ = reply.send(answer);
        }
    }
}
