//! The host's heartbeat: everything a host does every heartbeat goes to its store as **one
//! call**, [`TermStore::beat`](crate::coord::term_store::TermStore::beat) — on Redis one round
//! trip (one pipeline per Redis node, see [`crate::store::Batch`]), on etcd one keep-alive and
//! the transactions sent with it — however many jobs it serves.
//!
//! Each tick asks, in one [`Beat`]:
//!
//! 1. **Membership**: this host's registration, which returns the live members; the view is
//!    published on a `watch` for preference and balance.
//! 2. **Renewals**: the owner-checked renewal of every term this host leads ([`Heartbeat::lead`]).
//!    Each term's deadline moves to `t_sent + ttl − margin` with `t_sent` the instant the
//!    beat was sent (I3), exactly as when each term renewed alone; a renewal that finds the
//!    lease gone ends only its own term; a beat that fails or times out (bounded by the store
//!    timeout, `--redis-timeout`) is reported to every term, each of which keeps its deadline
//!    and tries again at the next tick.
//! 3. **Follower looks**: for every job this host follows ([`Heartbeat::follow`]) whose lease,
//!    as last seen, would run out before the next tick (or whose ask changed), the lease's
//!    holder and, where the store says (Redis), its time left (and this host's ask, when it is
//!    the job's preferred member). So a follower that sees the leader renewing keeps waiting
//!    without a campaign of its own, and one whose leader died still wakes at the lease's real
//!    expiry: crash failover is as fast as before, and followers cost no round trip of their
//!    own. (On etcd a look finds no time left: a follower is looked for at every tick, and the
//!    host's listener wakes it when the lease lapses.)
//! 4. **Registered reads**: the state ([`JobReads`]) of every job a runner asked for by now
//!    ([`Heartbeat::poll`]). The runner reads its job's state this way (requests, pause,
//!    cursor, open runs, a member's ask) at its safety poll, not on its own; the heartbeat
//!    carries the seam's reads and knows nothing of what the runner makes of them (so this
//!    layer does not depend on [`crate::exec`]).
//!
//! What is not periodic goes on its own: a campaign when a lease runs out or is released
//! ([`crate::coord::campaigns`] coalesces those), a runner woken by a notice, a fire time or a retry,
//! and every write of a term.
//!
//! The heartbeat runs on the lease runtime with the lease connection's store, so it never waits
//! behind guest execution or step writes. [`Heartbeat::kick`] runs a tick at once (a member
//! joined).
//!
//! Length: a tick builds one beat and hands every answer back to whoever asked (registration,
//! renewals, looks, registered reads); the four share the state of one call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::coord::members::{self, MemberInfo, View, WorkerStats};
use crate::coord::term_store::{
    Beat, Beaten, JobReads, Lease, LookAt, Store, StoreTerm, TermStore as _,
};
use crate::coord::timing::Timing;
use crate::units::show;

/// What one heartbeat's renewal said about one term.
#[derive(Clone, Debug)]
pub enum Renewed {
    /// Renewed: the lease was still this term's when the beat sent at `sent` reached the store.
    Yes {
        /// When the batch was sent (the new deadline counts from here).
        sent: Instant,
    },
    /// The lease is no longer this term's.
    NotOurs,
    /// No answer for this term (an error or no reply within the store timeout).
    Failed(String),
}

/// What a follower's look at the lease found.
#[derive(Clone, Debug)]
pub enum Look {
    /// The lease as the store saw it, in the beat sent at `sent`.
    Seen {
        /// Who holds it (or [`Lease::Free`]).
        lease: Lease,
        /// When the beat was sent (a time left counts from here).
        sent: Instant,
    },
    /// No answer (the follower keeps what it saw before).
    Failed(String),
}

enum Msg {
    Lead {
        id: u64,
        term: StoreTerm,
        reply: mpsc::UnboundedSender<Renewed>,
    },
    Follow {
        id: u64,
        job: String,
        reply: mpsc::UnboundedSender<Look>,
    },
    Expect {
        id: u64,
        expiry: Instant,
        ask: Option<String>,
    },
    Poll(Polled),
    Remove(u64),
}

/// The host's heartbeat (cheap to clone).
#[derive(Clone)]
pub struct Heartbeat {
    tx: mpsc::UnboundedSender<Msg>,
    next: Arc<AtomicU64>,
    kick: Arc<Notify>,
    answering: Arc<AtomicBool>,
}

/// A term's place in the heartbeat; dropping it takes the term out.
pub struct Lead {
    id: u64,
    tx: mpsc::UnboundedSender<Msg>,
    /// One [`Renewed`] per heartbeat.
    pub renewed: mpsc::UnboundedReceiver<Renewed>,
}

/// A followed job's place in the heartbeat; dropping it takes the job out.
pub struct Follow {
    id: u64,
    tx: mpsc::UnboundedSender<Msg>,
    /// A [`Look`] each time the heartbeat looked at the lease.
    pub looked: mpsc::UnboundedReceiver<Look>,
}

impl Drop for Lead {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Remove(self.id));
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Remove(self.id));
    }
}

impl Follow {
    /// The lease as last seen runs out at `expiry`: the heartbeat looks again in its last tick
    /// before then. `ask`: this node's ask for the job (when it is its preferred member); a
    /// changed ask is sent at the next tick.
    pub fn expect(&self, expiry: Instant, ask: Option<String>) {
        let _ = self.tx.send(Msg::Expect {
            id: self.id,
            expiry,
            ask,
        });
    }
}

/// Who this host is in the membership, for the heartbeat's registration.
pub struct Member {
    /// This host's node id.
    pub node: String,
    /// What it registers (its last heartbeat and its workers' figures are filled in at each
    /// tick).
    pub info: MemberInfo,
    /// Where the live membership is published.
    pub view: watch::Sender<View>,
    /// Its task workers' figures now, registered by whoever runs them (the node, from its
    /// workers' counters), read at each tick.
    pub tasks: Box<dyn Fn() -> WorkerStats + Send + Sync>,
}

impl Heartbeat {
    /// Starts the heartbeat on `handle` (the lease runtime), on `store`, every heartbeat of
    /// `timing`, until `stop` is cancelled; then it deregisters `member`.
    pub fn start(
        handle: &tokio::runtime::Handle,
        store: Store,
        timing: Timing,
        member: Member,
        stop: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let kick = Arc::new(Notify::new());
        let answering = Arc::new(AtomicBool::new(true));
        let task = handle.spawn(beat(
            store,
            timing,
            member,
            rx,
            kick.clone(),
            answering.clone(),
            stop,
        ));
        (
            Heartbeat {
                tx,
                next: Arc::default(),
                kick,
                answering,
            },
            task,
        )
    }

    fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Renews `term` at every tick from now on.
    pub fn lead(&self, term: StoreTerm) -> Lead {
        let id = self.id();
        let (reply, renewed) = mpsc::unbounded_channel();
        let _ = self.tx.send(Msg::Lead { id, term, reply });
        Lead {
            id,
            tx: self.tx.clone(),
            renewed,
        }
    }

    /// Follows the lease of `job`: see [`Follow::expect`].
    pub fn follow(&self, job: &str) -> Follow {
        let id = self.id();
        let (reply, looked) = mpsc::unbounded_channel();
        let _ = self.tx.send(Msg::Follow {
            id,
            job: job.to_string(),
            reply,
        });
        Follow {
            id,
            tx: self.tx.clone(),
            looked,
        }
    }

    /// Reads `job`'s state in the first tick at or after `due`; `None` when the heartbeat
    /// stopped first. Dropping the future withdraws the read.
    pub fn poll(
        &self,
        job: &str,
        due: Instant,
    ) -> impl Future<Output = Option<anyhow::Result<JobReads>>> + Send + use<> {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Msg::Poll(Polled {
            job: job.to_string(),
            due,
            reply,
        }));
        async move { rx.await.ok() }
    }

    /// Whether the last heartbeat was answered in time. A host whose heartbeat is not answered
    /// asks for no job ([`Follow::expect`]'s ask is held back, and the elector's campaigns do
    /// not ask): its commands may still reach the store late (a slow link applies what the host
    /// gave up on), and a leader that handed it a job would hand it to a host that cannot
    /// hold a lease.
    pub fn answering(&self) -> bool {
        self.answering.load(Ordering::Relaxed)
    }

    /// Runs a tick now (a member joined: the membership view should know it at once).
    pub fn kick(&self) {
        self.kick.notify_one();
    }

    /// What [`Heartbeat::kick`] notifies, for the notice listener to wake directly.
    pub fn kicker(&self) -> Arc<Notify> {
        self.kick.clone()
    }
}

struct Led {
    term: StoreTerm,
    reply: mpsc::UnboundedSender<Renewed>,
}

struct Followed {
    job: String,
    reply: mpsc::UnboundedSender<Look>,
    expiry: Option<Instant>,
    ask: Option<String>,
    /// Whether `ask` has been sent since it changed.
    asked: bool,
}

/// A job's state read waiting for its tick.
struct Polled {
    job: String,
    due: Instant,
    reply: oneshot::Sender<anyhow::Result<JobReads>>,
}

#[derive(Default)]
struct State {
    terms: BTreeMap<u64, Led>,
    follows: BTreeMap<u64, Followed>,
    polls: Vec<Polled>,
}

impl State {
    fn apply(&mut self, msg: Msg) {
        match msg {
            Msg::Lead { id, term, reply } => {
                self.terms.insert(id, Led { term, reply });
            }
            Msg::Follow { id, job, reply } => {
                self.follows.insert(
                    id,
                    Followed {
                        job,
                        reply,
                        expiry: None,
                        ask: None,
                        asked: true,
                    },
                );
            }
            Msg::Expect { id, expiry, ask } => {
                if let Some(f) = self.follows.get_mut(&id) {
                    f.expiry = Some(expiry);
                    if f.ask != ask {
                        f.asked = ask.is_none();
                        f.ask = ask;
                    }
                }
            }
            Msg::Poll(p) => self.polls.push(p),
            Msg::Remove(id) => {
                self.terms.remove(&id);
                self.follows.remove(&id);
            }
        }
    }
}

async fn beat(
    store: Store,
    timing: Timing,
    member: Member,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    kick: Arc<Notify>,
    answering: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let mut state = State::default();
    let mut tick = tokio::time::interval(timing.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut failing = false;
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(m) => {
                    state.apply(m);
                    continue;
                }
                None => break,
            },
            _ = tick.tick() => {}
            _ = kick.notified() => {}
            _ = stop.cancelled() => break,
        }
        // Everything asked for so far goes into this tick.
        while let Ok(m) = rx.try_recv() {
            state.apply(m);
        }
        let ok = once(&store, &timing, &member, &mut state, !failing).await;
        answering.store(ok, Ordering::Relaxed);
        if ok == failing {
            if ok {
                info!(node = %member.node, "heartbeat answered again");
            } else {
                warn!(node = %member.node, "heartbeat got no answer; leaders keep their deadlines, balancing uses the last membership view");
            }
            failing = !ok;
        }
    }
    match tokio::time::timeout(timing.redis_timeout, store.deregister(&member.node)).await {
        Ok(Ok(())) => info!(node = %member.node, "left the membership"),
        _ => {
            warn!(node = %member.node, "could not leave the membership; it expires after {}", show(timing.lease_ttl))
        }
    }
}

/// One tick: builds the beat, sends it, hands out the answers. False when the beat got no
/// answer at all. `answering`: whether the last tick was answered; if not, no ask is sent
/// (they wait, unsent, for a tick after an answered one).
async fn once(
    store: &Store,
    timing: &Timing,
    member: &Member,
    state: &mut State,
    answering: bool,
) -> bool {
    let now = Instant::now();
    let next_tick = now + timing.heartbeat + timing.redis_timeout;
    state.terms.retain(|_, t| !t.reply.is_closed());
    state.follows.retain(|_, f| !f.reply.is_closed());
    state.polls.retain(|p| !p.reply.is_closed());

    let mut info = member.info.clone();
    info.seen = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    info.tasks = (member.tasks)();
    let renewals: Vec<u64> = state.terms.keys().copied().collect();
    // Each look, and whether it carries the follower's ask.
    let looks: Vec<(u64, bool)> = state
        .follows
        .iter_mut()
        .filter(|(_, f)| f.expiry.is_some_and(|e| e <= next_tick) || (!f.asked && answering))
        .map(|(id, f)| {
            if answering {
                f.asked = true;
            }
            (*id, answering)
        })
        .collect();
    let (due, later): (Vec<Polled>, Vec<Polled>) = std::mem::take(&mut state.polls)
        .into_iter()
        .partition(|p| p.due <= now);
    state.polls = later;

    let sent = Instant::now();
    let beaten = {
        let beat = Beat {
            node: &member.node,
            info: &info,
            ttl: timing.lease_ttl,
            renew: renewals.iter().map(|id| &state.terms[id].term).collect(),
            look: looks
                .iter()
                .map(|(id, ask)| {
                    let f = &state.follows[id];
                    LookAt {
                        job: &f.job,
                        ask: if *ask { f.ask.as_deref() } else { None },
                    }
                })
                .collect(),
            read: due.iter().map(|p| p.job.as_str()).collect(),
        };
        match tokio::time::timeout(timing.redis_timeout, store.beat(&beat)).await {
            Ok(beaten) => beaten,
            Err(_) => Beaten::failed(
                &beat,
                &format!(
                    "no reply from the store within {}",
                    show(timing.redis_timeout)
                ),
            ),
        }
    };
    let answered = match beaten.members {
        Ok(live) => {
            let next = member.view.borrow().next(live, Instant::now());
            if next.members.keys().ne(member.view.borrow().members.keys()) {
                info!(node = %member.node, members = %members::joined(next.members.keys()), "membership changed");
            }
            member.view.send_replace(next);
            true
        }
        Err(e) => {
            // Another part may still have been answered (a cluster's other primaries).
            tracing::debug!(node = %member.node, "membership registration failed: {e:#}");
            false
        }
    };
    for (id, renewed) in renewals.iter().zip(beaten.renewed) {
        let _ = state.terms[id].reply.send(match renewed {
            Ok(true) => Renewed::Yes { sent },
            Ok(false) => Renewed::NotOurs,
            Err(e) => Renewed::Failed(format!("{e:#}")),
        });
    }
    for ((id, _), looked) in looks.iter().zip(beaten.looked) {
        let look = match looked {
            Ok(lease) => Look::Seen { lease, sent },
            Err(e) => Look::Failed(format!("{e:#}")),
        };
        if let Some(f) = state.follows.get_mut(id) {
            // Until the follower says otherwise, do not look again before the new expiry.
            if let Look::Seen {
                lease: Lease::Held { ttl: Some(ttl), .. },
                ..
            } = &look
            {
                f.expiry = Some(sent + *ttl);
            }
            let _ = f.reply.send(look);
        }
    }
    for (p, read) in due.into_iter().zip(beaten.read) {
        let _ = p.reply.send(read);
    }
    answered
}
