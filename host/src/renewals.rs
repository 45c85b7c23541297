//! One renewal round trip per heartbeat for the whole host: every term this host leads is
//! renewed in a single pipeline ([`crate::lease::renew_many`]), however many jobs it leads.
//!
//! Electors [`Renewals::add`] their term when it begins and receive one [`Renewed`] per
//! heartbeat on their own channel; dropping the [`Registration`] removes the term. Each term's
//! deadline moves to `t_sent + ttl − margin` with `t_sent` the instant the pipeline was sent
//! (I3), exactly as when each term renewed alone. Every renewal in the pipeline is its own
//! owner-checked script: one that finds the lease gone ends only its own term, and a pipeline
//! that fails or times out (bounded by the Redis timeout) is reported to every term, each of
//! which keeps its deadline and tries again at the next heartbeat.
//!
//! The batcher runs on the lease runtime with the lease connection, so renewals never wait
//! behind guest execution or step writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redis::aio::ConnectionManager;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{Timing, show};
use crate::keys::JobKeys;

/// What one heartbeat's renewal said about one term.
#[derive(Clone, Debug)]
pub enum Renewed {
    /// Renewed: the lease was still this term's when the pipeline sent at `sent` reached Redis.
    Yes {
        /// When the pipeline was sent (the new deadline counts from here).
        sent: Instant,
    },
    /// The lease is no longer this term's.
    NotOurs,
    /// No answer for this term (an error or no reply within the Redis timeout).
    Failed(String),
}

enum Msg {
    Add {
        id: u64,
        keys: JobKeys,
        owner: String,
        reply: mpsc::UnboundedSender<Renewed>,
    },
    Remove(u64),
}

/// The host's renewal batcher (cheap to clone).
#[derive(Clone)]
pub struct Renewals {
    tx: mpsc::UnboundedSender<Msg>,
    next: Arc<AtomicU64>,
}

/// A term's place in the batch; dropping it takes the term out.
pub struct Registration {
    id: u64,
    tx: mpsc::UnboundedSender<Msg>,
    /// One [`Renewed`] per heartbeat.
    pub renewed: mpsc::UnboundedReceiver<Renewed>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Remove(self.id));
    }
}

impl Renewals {
    /// Starts the batcher on `handle`, renewing over `conn` every heartbeat of `timing` until
    /// `stop` is cancelled.
    pub fn start(
        handle: &tokio::runtime::Handle,
        conn: ConnectionManager,
        timing: Timing,
        stop: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        handle.spawn(batch(conn, timing, rx, stop));
        Renewals {
            tx,
            next: Arc::default(),
        }
    }

    /// Adds the term of `owner` on `keys` to every following pipeline.
    pub fn add(&self, keys: &JobKeys, owner: &str) -> Registration {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (reply, renewed) = mpsc::unbounded_channel();
        let _ = self.tx.send(Msg::Add {
            id,
            keys: keys.clone(),
            owner: owner.to_string(),
            reply,
        });
        Registration {
            id,
            tx: self.tx.clone(),
            renewed,
        }
    }
}

struct Entry {
    keys: JobKeys,
    owner: String,
    reply: mpsc::UnboundedSender<Renewed>,
}

async fn batch(
    mut conn: ConnectionManager,
    timing: Timing,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    stop: CancellationToken,
) {
    let mut terms: BTreeMap<u64, Entry> = BTreeMap::new();
    let mut tick = tokio::time::interval(timing.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Add { id, keys, owner, reply }) => {
                    terms.insert(id, Entry { keys, owner, reply });
                }
                Some(Msg::Remove(id)) => {
                    terms.remove(&id);
                }
                None => return,
            },
            _ = tick.tick() => {
                // Terms whose elector is gone (its receiver dropped) leave the batch.
                terms.retain(|_, e| !e.reply.is_closed());
                if terms.is_empty() {
                    continue;
                }
                let batch = terms.values().map(|e| (&e.keys, e.owner.as_str()));
                let sent = Instant::now();
                crate::metrics::get().round_trip("renewals");
                let result = tokio::time::timeout(
                    timing.redis_timeout,
                    crate::lease::renew_many(&mut conn, batch, timing.lease_ttl),
                )
                .await;
                match result {
                    Ok(Ok(each)) => {
                        for (entry, r) in terms.values().zip(each) {
                            let _ = entry.reply.send(match r {
                                Ok(true) => Renewed::Yes { sent },
                                Ok(false) => Renewed::NotOurs,
                                Err(e) => Renewed::Failed(e.to_string()),
                            });
                        }
                    }
                    Ok(Err(e)) => {
                        for entry in terms.values() {
                            let _ = entry.reply.send(Renewed::Failed(e.to_string()));
                        }
                    }
                    Err(_) => {
                        let why = format!("no reply from redis within {}", show(timing.redis_timeout));
                        for entry in terms.values() {
                            let _ = entry.reply.send(Renewed::Failed(why.clone()));
                        }
                    }
                }
            }
            _ = stop.cancelled() => return,
        }
    }
}
