//! Campaigns coalesced into pipelines: the acquire scripts that a host's electors send at the
//! same moment go to Redis as one pipeline ([`crate::coord::lease::acquire_many`]; one per primary on
//! a Redis Cluster).
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

use crate::coord::lease::{Acquired, Campaign, LeaseResult};
use crate::store::Conn;

/// Most campaigns in one pipeline.
const MOST_PER_PIPELINE: usize = 1000;

type Reply = oneshot::Sender<LeaseResult<Acquired>>;

/// The host's campaign coalescer (cheap to clone).
#[derive(Clone)]
pub struct Campaigns {
    tx: mpsc::UnboundedSender<(Campaign, Reply)>,
}

impl Campaigns {
    /// Starts the coalescer on `handle` (the lease runtime), sending over `conn`, until `stop`
    /// is cancelled.
    pub fn start(handle: &tokio::runtime::Handle, conn: Conn, stop: CancellationToken) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        handle.spawn(coalesce(conn, rx, stop));
        Campaigns { tx }
    }

    /// Sends `campaign` with whatever other campaigns this host sends at the same moment, and
    /// returns its answer. The caller bounds the wait (the Redis timeout).
    pub async fn acquire(&self, campaign: Campaign) -> LeaseResult<Acquired> {
        let (reply, answer) = oneshot::channel();
        let gone = || {
            redis::RedisError::from((redis::ErrorKind::Io, "the campaign coalescer has stopped"))
        };
        self.tx.send((campaign, reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn coalesce(
    mut conn: Conn,
    mut rx: mpsc::UnboundedReceiver<(Campaign, Reply)>,
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
        let (campaigns, replies): (Vec<Campaign>, Vec<Reply>) = batch.into_iter().unzip();
        // One round trip per Redis node; each acquire answers for itself.
        let answers = crate::coord::lease::acquire_many(&mut conn, &campaigns).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            let _ = reply.send(answer);
        }
    }
}
