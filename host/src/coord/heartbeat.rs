//! The host's heartbeat: everything a host does every heartbeat goes to Redis as **one
//! round trip** (one pipeline per Redis node, see [`Batch`]), however many jobs it serves.
//!
//! Each tick sends, in one [`Conn::batch`]:
//!
//! 1. **Membership**: this host's registration ([`crate::coord::members::register`]'s script), which
//!    returns the live members; the view is published on a `watch` for preference and balance.
//! 2. **Renewals**: the owner-checked renewal of every term this host leads ([`Heartbeat::lead`]).
//!    Each term's deadline moves to `t_sent + ttl − margin` with `t_sent` the instant the
//!    batch was sent (I3), exactly as when each term renewed alone; a renewal that finds the
//!    lease gone ends only its own term; a batch that fails or times out (bounded by the Redis
//!    timeout) is reported to every term, each of which keeps its deadline and tries again at
//!    the next tick.
//! 3. **Follower looks**: for every job this host follows ([`Heartbeat::follow`]) whose lease,
//!    as last seen, would run out before the next tick (or whose ask changed), the lease's
//!    holder and time left (and this host's ask, when it is the job's preferred member). So a
//!    follower that sees the leader renewing keeps waiting without a campaign of its own, and
//!    one whose leader died still wakes at the lease's real expiry: crash failover is as fast
//!    as before, and followers cost no round trip of their own.
//! 4. **Registered reads**: every [`Read`] an upper layer asked for by now
//!    ([`Heartbeat::poll`]): commands of one job's slot and the decoder of their replies. The
//!    runner reads its job's state this way (requests, pause, cursor, open runs, a member's
//!    ask) at its safety poll, not on its own; the heartbeat knows neither the commands nor
//!    the state (so this layer does not depend on [`crate::exec`]).
//!
//! What is not periodic goes on its own: a campaign when a lease runs out or is released
//! ([`crate::coord::campaigns`] coalesces those), a runner woken by a notice, a fire time or a retry,
//! and every write of a term.
//!
//! The heartbeat runs on the lease runtime with the lease connection, so it never waits behind
//! guest execution or step writes. [`Heartbeat::kick`] runs a tick at once (a member joined).
//!
//! Length: a tick builds one batch and hands every reply back to whoever asked (registration,
//! renewals, looks, registered reads); the four share the state and the reply indices of one
//! round trip.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use redis::RedisResult;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::coord::lease::{self, Observed};
use crate::coord::members::{self, MemberInfo, View, WorkerStats};
use crate::coord::timing::Timing;
use crate::store::keys::JobKeys;
use crate::store::{Batch, Conn};
use crate::units::show;

/// What one heartbeat's renewal said about one term.
#[derive(Clone, Debug)]
pub enum Renewed {
    /// Renewed: the lease was still this term's when the batch sent at `sent` reached Redis.
    Yes {
        /// When the batch was sent (the new deadline counts from here).
        sent: Instant,
    },
    /// The lease is no longer this term's.
    NotOurs,
    /// No answer for this term (an error or no reply within the Redis timeout).
    Failed(String),
}

/// What a follower's look at the lease found.
#[derive(Clone, Debug)]
pub enum Look {
    /// The lease as Redis saw it, in the batch sent at `sent`.
    Seen {
        /// Who holds it (or [`Observed::Free`]).
        lease: Observed,
        /// When the batch was sent (a time left counts from here).
        sent: Instant,
    },
    /// No answer (the follower keeps what it saw before).
    Failed(String),
}

enum Msg {
    Lead {
        id: u64,
        keys: JobKeys,
        owner: String,
        reply: mpsc::UnboundedSender<Renewed>,
    },
    Follow {
        id: u64,
        keys: JobKeys,
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
    /// Starts the heartbeat on `handle` (the lease runtime), over `conn`, every heartbeat of
    /// `timing`, until `stop` is cancelled; then it deregisters `member`.
    pub fn start(
        handle: &tokio::runtime::Handle,
        conn: Conn,
        timing: Timing,
        member: Member,
        stop: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let kick = Arc::new(Notify::new());
        let answering = Arc::new(AtomicBool::new(true));
        let task = handle.spawn(beat(
            conn,
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

    /// Renews the term of `owner` on `keys` at every tick from now on.
    pub fn lead(&self, keys: &JobKeys, owner: &str) -> Lead {
        let id = self.id();
        let (reply, renewed) = mpsc::unbounded_channel();
        let _ = self.tx.send(Msg::Lead {
            id,
            keys: keys.clone(),
            owner: owner.to_string(),
            reply,
        });
        Lead {
            id,
            tx: self.tx.clone(),
            renewed,
        }
    }

    /// Follows the lease of `keys`: see [`Follow::expect`].
    pub fn follow(&self, keys: &JobKeys) -> Follow {
        let id = self.id();
        let (reply, looked) = mpsc::unbounded_channel();
        let _ = self.tx.send(Msg::Follow {
            id,
            keys: keys.clone(),
            reply,
        });
        Follow {
            id,
            tx: self.tx.clone(),
            looked,
        }
    }

    /// Sends `read` in the first tick at or after `due` and resolves to its decoded replies;
    /// `None` when the heartbeat stopped first. Dropping the future withdraws the read.
    pub fn poll<T: Send + 'static>(
        &self,
        read: Read<T>,
        due: Instant,
    ) -> impl Future<Output = Option<RedisResult<T>>> + Send + use<T> {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Msg::Poll(Polled {
            slot_key: read.slot_key,
            cmds: read.cmds,
            due,
            reply,
        }));
        let decode = read.decode;
        async move { Some(rx.await.ok()?.and_then(decode)) }
    }

    /// Whether the last heartbeat was answered in time. A host whose heartbeat is not answered
    /// asks for no job ([`Follow::expect`]'s ask is held back, and the elector's campaigns do
    /// not ask): its commands may still reach Redis late (a slow link applies what the host
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

struct Term {
    keys: JobKeys,
    owner: String,
    reply: mpsc::UnboundedSender<Renewed>,
}

struct Followed {
    keys: JobKeys,
    reply: mpsc::UnboundedSender<Look>,
    expiry: Option<Instant>,
    ask: Option<String>,
    /// Whether `ask` has been sent since it changed.
    asked: bool,
}

/// A read another layer rides on the heartbeat: commands that all address one slot (one job's
/// hash tag) and what makes their replies, in order, into a `T`.
pub struct Read<T> {
    /// A key of the slot the commands address (a cluster routes them by it).
    pub slot_key: String,
    /// The commands.
    pub cmds: Vec<redis::Cmd>,
    /// Their replies, in order, as a `T`.
    pub decode: fn(Vec<RedisResult<redis::Value>>) -> RedisResult<T>,
}

/// A [`Read`] waiting for its tick; the reply is the raw replies (or why there are none).
struct Polled {
    slot_key: String,
    cmds: Vec<redis::Cmd>,
    due: Instant,
    reply: oneshot::Sender<RedisResult<Vec<RedisResult<redis::Value>>>>,
}

#[derive(Default)]
struct State {
    terms: BTreeMap<u64, Term>,
    follows: BTreeMap<u64, Followed>,
    polls: Vec<Polled>,
}

impl State {
    fn apply(&mut self, msg: Msg) {
        match msg {
            Msg::Lead {
                id,
                keys,
                owner,
                reply,
            } => {
                self.terms.insert(id, Term { keys, owner, reply });
            }
            Msg::Follow { id, keys, reply } => {
                self.follows.insert(
                    id,
                    Followed {
                        keys,
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
    mut conn: Conn,
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
        let ok = once(&mut conn, &timing, &member, &mut state, !failing).await;
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
    match tokio::time::timeout(
        timing.redis_timeout,
        members::deregister(&mut conn, &member.node),
    )
    .await
    {
        Ok(Ok(())) => info!(node = %member.node, "left the membership"),
        _ => {
            warn!(node = %member.node, "could not leave the membership; it expires after {}", show(timing.lease_ttl))
        }
    }
}

/// One tick: builds the batch, sends it, hands out the answers. False when the batch got no
/// answer at all. `answering`: whether the last tick was answered; if not, no ask is sent
/// (they wait, unsent, for a tick after an answered one).
async fn once(
    conn: &mut Conn,
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

    let mut batch = Batch::new();
    let mut info = member.info.clone();
    info.seen = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    info.tasks = (member.tasks)();
    let registration = members::register_into(&mut batch, &member.node, &info, timing.lease_ttl);
    let renewals: Vec<(u64, usize)> = state
        .terms
        .iter()
        .map(|(id, t)| {
            (
                *id,
                lease::renew_into(&mut batch, &t.keys, &t.owner, timing.lease_ttl),
            )
        })
        .collect();
    let looks: Vec<(u64, usize)> = state
        .follows
        .iter_mut()
        .filter(|(_, f)| f.expiry.is_some_and(|e| e <= next_tick) || (!f.asked && answering))
        .map(|(id, f)| {
            let ask = if answering {
                f.asked = true;
                f.ask.as_deref()
            } else {
                None
            };
            (
                *id,
                lease::observe_into(&mut batch, &f.keys, ask, timing.lease_ttl),
            )
        })
        .collect();
    let (due, later): (Vec<Polled>, Vec<Polled>) = std::mem::take(&mut state.polls)
        .into_iter()
        .partition(|p| p.due <= now);
    state.polls = later;
    let reads: Vec<(Polled, (usize, usize))> = due
        .into_iter()
        .map(|mut p| {
            let first = batch.len();
            let cmds = std::mem::take(&mut p.cmds);
            let n = cmds.len();
            for c in cmds {
                batch.cmd(&p.slot_key, c);
            }
            (p, (first, n))
        })
        .collect();

    let sent = Instant::now();
    let replies =
        match tokio::time::timeout(timing.redis_timeout, conn.batch("heartbeat", &batch)).await {
            Ok(r) => r,
            Err(_) => {
                let why = format!("no reply from redis within {}", show(timing.redis_timeout));
                for (id, _) in &renewals {
                    let _ = state.terms[id].reply.send(Renewed::Failed(why.clone()));
                }
                for (id, _) in &looks {
                    let _ = state.follows[id].reply.send(Look::Failed(why.clone()));
                }
                for (p, _) in reads {
                    let _ = p.reply.send(Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "no reply from redis in time",
                    ))));
                }
                return false;
            }
        };
    let mut replies: Vec<Option<RedisResult<redis::Value>>> =
        replies.into_iter().map(Some).collect();
    let mut take = |i: usize| {
        replies
            .get_mut(i)
            .and_then(Option::take)
            .unwrap_or_else(|| {
                Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "no reply",
                )))
            })
    };
    let answered = match members::registered(take(registration)) {
        Ok(live) => {
            let next = member.view.borrow().next(live, Instant::now());
            if next.members.keys().ne(member.view.borrow().members.keys()) {
                info!(node = %member.node, members = %members::joined(next.members.keys()), "membership changed");
            }
            member.view.send_replace(next);
            true
        }
        Err(e) => {
            // Another command may still have been answered (a cluster's other primaries).
            tracing::debug!(node = %member.node, "membership registration failed: {e}");
            false
        }
    };
    for (id, i) in renewals {
        let _ = state.terms[&id].reply.send(match lease::renewed(take(i)) {
            Ok(true) => Renewed::Yes { sent },
            Ok(false) => Renewed::NotOurs,
            Err(e) => Renewed::Failed(e.to_string()),
        });
    }
    for (id, i) in looks {
        let look = match lease::observed(take(i)) {
            Ok(lease) => Look::Seen { lease, sent },
            Err(e) => Look::Failed(e.to_string()),
        };
        if let Some(f) = state.follows.get_mut(&id) {
            // Until the follower says otherwise, do not look again before the new expiry.
            if let Look::Seen {
                lease: Observed::Held { ttl: Some(ttl), .. },
                ..
            } = &look
            {
                f.expiry = Some(sent + *ttl);
            }
            let _ = f.reply.send(look);
        }
    }
    for (p, (first, n)) in reads {
        let replies = (first..first + n).map(&mut take).collect();
        let _ = p.reply.send(Ok(replies));
    }
    answered
}
