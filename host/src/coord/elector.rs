//! Leader election for one job: `run = campaign → lead (renew) → step down`, forever.
//!
//! **States**: CANDIDATE → LEADER when the acquire script grants the lease;
//! CANDIDATE → FOLLOWER when another owner holds it; FOLLOWER → CANDIDATE when the observed
//! lease time runs out; LEADER → LEADER on every successful renewal; LEADER → CANDIDATE when a
//! renewal says the lease is gone, when the local deadline passes without a successful renewal,
//! or when a fenced write was refused; LEADER → released on resignation (shutdown).
//! The current [`Role`] is published on a `watch` channel for the runner and for status.
//!
//! **Guarantees.** While [`Role::Leader`] is published, its [`Term`] is valid only inside
//! `[t_sent, t_sent + ttl − margin)` of the last acquire/renew that succeeded (I3); the term's
//! deadline ends it even if this task is late. Every lease call is bounded by `redis_timeout`,
//! which the config rules keep below the renewal deadline (I4). (A term's writes are bounded
//! by the term itself instead: see [`crate::exec::runner`] and [`crate::exec::runtime`].) A term that ends is ended for
//! every clone of it, so the runner's guest sees `still-leader() == false` at once.
//!
//! **Non-guarantees.** Election does not stop a paused process from *believing* it leads after
//! it wakes; the fence does (see [`crate::coord::fence`]).
//!
//! **Failover speed.** Followers wake at the lease expiry they observed (crash failover ≈ one
//! TTL) and at once when the lease is released: the release script publishes on the job's
//! channel, and [`crate::coord::notices::listen_for_releases`] wakes the job's elector (graceful handover ≈ one round
//! trip). If the notice is lost (the pub/sub connection dropped), the follower still wakes at
//! the observed expiry.
//!
//! Electors run on their own single-threaded runtime with their own connection to the store
//! ([`crate::coord::lease_thread::LeaseRuntime`]), so renewals never wait behind guest
//! execution or step writes; they campaign and release through the seam
//! ([`crate::coord::term_store::Store`]: on Redis the acquire and release scripts).
//!
//! Length: one state machine (campaign, follow, lead, step down) whose states share the locals
//! of `Elector::run`; the lease runtime and the notices are in files of their own.

use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::coord::heartbeat::{Look, Renewed};
use crate::coord::notices::Notice;
use crate::coord::term::{Replicas, Term, mono_ms};
use crate::coord::term_store::{Campaign, Candidacy, Lease, Store, StoreTerm, TermStore as _};
use crate::coord::terms::TermEnd;
use crate::coord::timing::Timing;
use crate::store::keys::JobKeys;
use crate::units::show;

/// This node's role for one job.
#[derive(Clone, Debug)]
pub enum Role {
    /// Campaigning, or unable to reach Redis: not acting.
    Candidate,
    /// Another owner holds the lease.
    Follower {
        /// The owner (`node-id:uuid`) holding the lease when last observed.
        leader: String,
    },
    /// This node leads the job in this term.
    Leader(Term),
    /// The elector has stopped (shutdown) and released its lease.
    Stopped,
}

impl Role {
    /// The term, if this node leads and the term is still valid.
    pub fn term(&self) -> Option<&Term> {
        match self {
            Role::Leader(t) if t.still_leader() => Some(t),
            _ => None,
        }
    }

    /// A short name for logs and status.
    pub fn name(&self) -> &'static str {
        match self {
            Role::Candidate => "candidate",
            Role::Follower { .. } => "follower",
            Role::Leader(t) if t.still_leader() => "leader",
            Role::Leader(_) => "candidate",
            Role::Stopped => "stopped",
        }
    }
}

/// The node part of an owner value `node-id:uuid`.
pub fn owner_node(owner: &str) -> &str {
    owner.rsplit_once(':').map(|(n, _)| n).unwrap_or(owner)
}

/// What one job's elector needs.
#[derive(Clone)]
pub struct Elector {
    /// Job name.
    pub job: String,
    /// This node's id.
    pub node: String,
    /// Lease timings.
    pub timing: Timing,
    /// The job's keys.
    pub keys: JobKeys,
    /// Signalled when the job's lease is released (see [`crate::coord::notices::listen_for_releases`]), with the
    /// releasing owner (`node:uuid`) as payload.
    pub released: Notice,
    /// Replicas every write of this node's terms waits for (`--min-replicas`).
    pub replicas: Option<Replicas>,
    /// The membership as this host sees it: a host not preferred for the job campaigns a
    /// heartbeat late (see [`crate::coord::members`]).
    pub members: watch::Receiver<crate::coord::members::View>,
    /// The token of a term the runner asks to hand over (between runs or steps): the elector
    /// releases that term's lease and campaigns again as a non-preferred host.
    pub hand_over: watch::Receiver<u64>,
    /// The hash of the component version this host serves the job with: its ask for the job
    /// names it, so a leader hands a run in progress only to a member with the same version.
    pub version: watch::Receiver<String>,
    /// The host's heartbeat: renews every term it leads and looks at every lease it follows,
    /// in one round trip per heartbeat.
    pub heartbeat: crate::coord::heartbeat::Heartbeat,
    /// The host's campaign coalescer: campaigns sent at the same moment share a pipeline.
    pub campaigns: crate::coord::campaigns::Campaigns,
}

/// Why a follower stopped following.
enum Woke {
    /// The lease ran out (as seen) or is gone: campaign at once.
    Expired,
    /// A release notice: campaign (after a heartbeat when not preferred).
    Released,
    /// The node resigns.
    Resigned,
}

/// Why a term ended.
enum Ended {
    Resigned,
    HandedOver,
    Lost(String, TermEnd),
}

impl Elector {
    /// Campaigns until `resign` is cancelled; then releases the lease if held and publishes
    /// [`Role::Stopped`].
    pub async fn run(self, store: Store, role: watch::Sender<Role>, resign: CancellationToken) {
        let Timing {
            lease_ttl,
            heartbeat,
            redis_timeout,
            ..
        } = self.timing;
        let (job, node) = (self.job.as_str(), self.node.as_str());
        let metrics = crate::metrics::get();
        // Since when this node has known no leader for the job (for the metric).
        let mut leaderless_since = Some(Instant::now());
        let leader_known = |known: bool, since: &mut Option<Instant>| {
            if known {
                if let Some(t) = since.take() {
                    metrics.without_leader(job, t.elapsed());
                }
            } else if since.is_none() {
                *since = Some(Instant::now());
            }
        };
        // The node whose lease this host last saw (and then saw expire or be released): it is
        // left out of the preference, since it is gone or has just given the job away.
        let mut last_holder: Option<String> = None;
        // Whether this campaign follows a lease this host saw run out (a crash, most likely):
        // then failover speed comes first and nobody defers; balance follows by hand-over.
        let mut after_expiry = false;
        // A term that ended while the store did not answer, and how it ended, for its history
        // entry (reported before the next campaign).
        let mut unreported: Option<(StoreTerm, TermEnd)> = None;
        while !resign.is_cancelled() {
            if let Some((held, how)) = unreported.take()
                && !self.release_quietly(&store, &held, how).await
            {
                unreported = Some((held, how));
            }
            if !after_expiry && let Some(preferred) = self.defer_to(last_holder.as_deref()) {
                debug!(preferred = %preferred, "not the preferred member: campaigning a heartbeat late");
                let until = tokio::time::Instant::now() + heartbeat;
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => break,
                        // A release meanwhile (the member deferred to leaving, or handing the
                        // job on before this host ever saw it lead): left out of the
                        // preference, it may make this host the one to campaign now.
                        _ = self.released.wake.notified() => {
                            if let Some(by) = self.released_node() {
                                last_holder = Some(by);
                            }
                            if self.defer_to(last_holder.as_deref()).is_none() {
                                break;
                            }
                        }
                        _ = resign.cancelled() => break,
                    }
                }
                if resign.is_cancelled() {
                    break;
                }
            }
            let owner = format!("{node}:{}", uuid::Uuid::new_v4());
            // The preferred member asks for the job while another holds it.
            let ask = self.ask();
            let sent = Instant::now();
            let acquired = tokio::time::timeout(
                redis_timeout,
                self.campaigns.acquire(Candidacy {
                    job: self.job.clone(),
                    owner: owner.clone(),
                    ttl: lease_ttl,
                    ask,
                }),
            )
            .await;
            let wait = match acquired {
                Ok(Ok(Campaign::Won(held))) => {
                    let token = held.token;
                    let term =
                        Term::granted(&held, sent + self.timing.leader_window(), self.replicas);
                    info!(token, owner = %owner, ttl = %show(lease_ttl), sent_ms = mono_ms(sent), deadline_ms = term.deadline_ms(), "became leader");
                    role.send_replace(Role::Leader(term.clone()));
                    leader_known(true, &mut leaderless_since);
                    metrics.became_leader(job, token);
                    last_holder = None;
                    // Whatever ends this term, the next campaign defers if not preferred (after
                    // a hand-over, so that the preferred member acquires first).
                    after_expiry = false;
                    let mut hand_over = self.hand_over.clone();
                    // Only a request made during this term counts.
                    hand_over.borrow_and_update();
                    let ended = self.lead(&term, &resign, &mut hand_over).await;
                    term.end();
                    metrics.stopped_leading(job);
                    leader_known(false, &mut leaderless_since);
                    match ended {
                        Ended::Resigned => {
                            let released = tokio::time::timeout(
                                redis_timeout,
                                store.end(&held, TermEnd::Released),
                            )
                            .await;
                            match released {
                                Ok(Ok(true)) => info!(token, "released lease"),
                                Ok(Ok(false)) => {
                                    info!(token, "lease was no longer ours at release")
                                }
                                Ok(Err(e)) => {
                                    warn!(token, "releasing lease failed: {e}")
                                }
                                Err(_) => warn!(
                                    token,
                                    "releasing lease timed out after {}",
                                    show(redis_timeout)
                                ),
                            }
                            break;
                        }
                        Ended::HandedOver => {
                            let released = tokio::time::timeout(
                                redis_timeout,
                                store.end(&held, TermEnd::Released),
                            )
                            .await;
                            info!(
                                token,
                                released = matches!(released, Ok(Ok(true))),
                                "handed over: lease released for the preferred member"
                            );
                            role.send_replace(Role::Candidate);
                            continue;
                        }
                        Ended::Lost(why, how) => {
                            warn!(
                                token,
                                at_ms = mono_ms(Instant::now()),
                                "stopped leading: {why}"
                            );
                            role.send_replace(Role::Candidate);
                            // If Redis still holds our lease (a renewal that arrived late),
                            // give it back so that nobody waits out its TTL; the term's history
                            // entry says how it ended (asked again until Redis answers).
                            if !self.release_quietly(&store, &held, how).await {
                                unreported = Some((held, how));
                            }
                            continue;
                        }
                    }
                }
                // This very candidacy holds the lease: the acquire was applied more than once
                // (a batch resent after a redirect), and its token is unknown here. Give the
                // lease back and campaign again.
                Ok(Ok(Campaign::Held { owner: holder, .. })) if holder == owner => {
                    warn!(
                        "the campaign found the lease held by this candidacy (an acquire applied twice); giving it back and campaigning again"
                    );
                    self.give_back(&store, &owner).await;
                    heartbeat
                }
                Ok(Ok(Campaign::Held {
                    owner: holder,
                    left: ttl,
                })) => {
                    leader_known(true, &mut leaderless_since);
                    let changed =
                        !matches!(&*role.borrow(), Role::Follower { leader } if *leader == holder);
                    if changed {
                        info!(leader = %holder, "following");
                        role.send_replace(Role::Follower {
                            leader: holder.clone(),
                        });
                    }
                    if ttl.is_none() && matches!(store, Store::Redis(_)) {
                        warn!(key = %self.keys.lease(), "the lease key has no expiry (set by hand?); looking at it every heartbeat until it is gone");
                    }
                    let (woke, holder) = self
                        .follow(holder, ttl.map(|t| sent + t), &role, &resign)
                        .await;
                    last_holder = Some(owner_node(&holder).to_string());
                    match woke {
                        Woke::Expired => after_expiry = true,
                        Woke::Released => {
                            // The notice names who released: the holder this host last saw
                            // may have handed the job on since.
                            if let Some(by) = self.released_node() {
                                last_holder = Some(by);
                            }
                            after_expiry = false;
                        }
                        Woke::Resigned => break,
                    }
                    continue;
                }
                Ok(Err(e)) => {
                    warn!("campaign failed: {e}");
                    leader_known(false, &mut leaderless_since);
                    role.send_replace(Role::Candidate);
                    // A dropped connection may have carried the campaign to the store before
                    // it failed: give back whatever it may have taken (owner-checked).
                    self.give_back(&store, &owner).await;
                    heartbeat
                }
                Err(_) => {
                    warn!(
                        "campaign failed: no reply from redis within {}",
                        show(redis_timeout)
                    );
                    leader_known(false, &mut leaderless_since);
                    role.send_replace(Role::Candidate);
                    // The campaign may still be applied after we gave up on it.
                    self.give_back(&store, &owner).await;
                    heartbeat
                }
            };
            after_expiry = false;
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.released.wake.notified() => {}
                _ = resign.cancelled() => {}
            }
        }
        role.send_replace(Role::Stopped);
    }

    /// Releases `held`'s lease if the store still holds it and writes `how` the term ended
    /// into the term history, without waiting longer than the Redis timeout or complaining:
    /// used after a term ended uncleanly. False when the store did not answer.
    async fn release_quietly(&self, store: &Store, held: &StoreTerm, how: TermEnd) -> bool {
        let released = tokio::time::timeout(self.timing.redis_timeout, store.end(held, how)).await;
        if let Ok(Ok(true)) = released {
            info!("gave back a lease the store still held for a term that had ended");
        }
        matches!(released, Ok(Ok(_)))
    }

    /// Gives back what the campaign as `owner` may have taken, its answer unheard
    /// ([`crate::coord::term_store::TermStore::give_back`]), bounded by the Redis timeout,
    /// without complaining.
    async fn give_back(&self, store: &Store, owner: &str) {
        let given =
            tokio::time::timeout(self.timing.redis_timeout, store.give_back(&self.job, owner))
                .await;
        if let Ok(Ok(true)) = given {
            info!("gave back a lease a campaign took without hearing its answer");
        }
    }

    /// The node of the owner the last release notice named, if it named one.
    fn released_node(&self) -> Option<String> {
        let by = self
            .released
            .payload
            .as_ref()?
            .lock()
            .expect("notice payload");
        (!by.is_empty()).then(|| owner_node(&by).to_string())
    }

    /// The member to let campaign first, when this host is not the job's preferred member
    /// among the live ones (`gone`, the last holder seen, left out); `None` to campaign now.
    fn defer_to(&self, gone: Option<&str>) -> Option<String> {
        let view = self.members.borrow();
        let gone = gone.filter(|g| *g != self.node);
        match view.preferred(&self.job, gone) {
            Some(p) if p != self.node => Some(p.to_string()),
            _ => None,
        }
    }

    /// This host's ask for the job (its node id and the version it serves), when it is the
    /// job's preferred member among the live ones and its heartbeat is answered in time (see
    /// [`crate::coord::heartbeat::Heartbeat::answering`]).
    fn ask(&self) -> Option<String> {
        let preferred = self.heartbeat.answering()
            && self.members.borrow().preferred(&self.job, None) == Some(self.node.as_str());
        preferred.then(|| crate::coord::balance::Ask::encode(&self.node, &self.version.borrow()))
    }

    /// Follows the lease `holder` holds until it runs out at `expiry` (as seen), is released,
    /// or the node resigns. The heartbeat looks at the lease in its last tick before `expiry`:
    /// a leader that renews moves the expiry on, so the follower campaigns only when the
    /// lease really ran out (or is gone), or at once on a release notice. Returns why it woke
    /// and the holder last seen.
    async fn follow(
        &self,
        mut holder: String,
        mut expiry: Option<Instant>,
        role: &watch::Sender<Role>,
        resign: &CancellationToken,
    ) -> (Woke, String) {
        let mut follow = self.heartbeat.follow(&self.job);
        let mut members = self.members.clone();
        members.borrow_and_update();
        follow.expect(expiry.unwrap_or_else(Instant::now), self.ask());
        loop {
            let runs_out = async {
                match expiry {
                    // One millisecond late: the lease is gone in Redis by then.
                    Some(e) => {
                        tokio::time::sleep_until((e + Duration::from_millis(1)).into()).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = runs_out => return (Woke::Expired, holder),
                look = follow.looked.recv() => match look {
                    Some(Look::Seen { lease: Lease::Held { holder: h, ttl }, sent }) => {
                        if h != holder {
                            info!(leader = %h, "following");
                            role.send_replace(Role::Follower { leader: h.clone() });
                            holder = h;
                        }
                        expiry = ttl.map(|t| sent + t);
                        follow.expect(expiry.unwrap_or_else(Instant::now), self.ask());
                    }
                    Some(Look::Seen { lease: Lease::Free, .. }) => return (Woke::Expired, holder),
                    Some(Look::Failed(why)) => debug!("looking at the lease failed: {why}"),
                    // The heartbeat stopped (shutdown): the observed expiry still wakes us.
                    None => expiry = expiry.or_else(|| Some(Instant::now() + self.timing.heartbeat)),
                },
                _ = self.released.wake.notified() => return (Woke::Released, holder),
                Ok(()) = members.changed() => {
                    follow.expect(expiry.unwrap_or_else(Instant::now), self.ask());
                }
                _ = resign.cancelled() => return (Woke::Resigned, holder),
            }
        }
    }

    /// Renews with the host's batch every heartbeat until the term ends, the node resigns, or
    /// the runner asks to hand the term over.
    async fn lead(
        &self,
        term: &Term,
        resign: &CancellationToken,
        hand_over: &mut watch::Receiver<u64>,
    ) -> Ended {
        let (job, token) = (self.job.as_str(), term.token());
        let mut batch = self.heartbeat.lead(term.in_store(&self.job));
        loop {
            tokio::select! {
                renewed = batch.renewed.recv() => match renewed {
                    Some(Renewed::Yes { sent }) => {
                        term.extend(sent + self.timing.leader_window());
                        crate::metrics::get().renewed(job, sent.elapsed());
                        debug!(token, sent_ms = mono_ms(sent), deadline_ms = term.deadline_ms(), "renewed");
                    }
                    Some(Renewed::NotOurs) => return Ended::Lost("the lease is no longer ours".into(), TermEnd::Expired),
                    Some(Renewed::Failed(e)) => warn!(token, deadline_ms = term.deadline_ms(), "renewal failed: {e}"),
                    // The batcher stopped (shutdown): the deadline ends the term.
                    None => {
                        tokio::select! {
                            _ = resign.cancelled() => return Ended::Resigned,
                            _ = term.ended() => return ended_lost(term),
                        }
                    }
                },
                _ = resign.cancelled() => return Ended::Resigned,
                _ = term.ended() => return ended_lost(term),
                Ok(()) = hand_over.changed() => {
                    // Another term's request (an older one) is ignored.
                    if *hand_over.borrow_and_update() == token {
                        term.end();
                        return Ended::HandedOver;
                    }
                }
            }
        }
    }
}

fn ended_lost(term: &Term) -> Ended {
    // `Term::end` is called by the store when the fence refused a write; otherwise the local
    // deadline passed without a successful renewal.
    if term.deadline().is_none() {
        Ended::Lost(
            "the term was ended (a fenced write was refused)".into(),
            TermEnd::Fenced,
        )
    } else {
        Ended::Lost(
            "local lease deadline passed without a successful renewal".into(),
            TermEnd::Expired,
        )
    }
}
