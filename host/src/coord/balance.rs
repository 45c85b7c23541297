//! Leadership balancing, the leader's half: a leader that is not its job's preferred member
//! ([`crate::coord::members`]) hands the job over *between runs* or *between steps* of a run (after a
//! step's checkpoint is saved, before the next step starts), so no step is interrupted.
//!
//! A hand-over is graceful: the runner, idle, asks the elector to end the term (a `watch` with
//! the term's token); the elector ends it, releases the lease with the owner-checked script
//! (which publishes the release notice) and campaigns again a heartbeat late, as every
//! non-preferred host does, so the preferred member, woken by the notice, acquires first. No
//! TTL is waited out. Between steps, the run stays open with its checkpoint, and the new leader
//! resumes it from there, exactly as after a failover; this is done only when the member that
//! asks has the component version the run started with (its ask names it), since a run never
//! mixes versions.
//!
//! Hand-overs are held back three ways, so that balancing never churns:
//!
//! * **Settled members only.** The preferred member must have been live in this host's view for
//!   [`SETTLE_HEARTBEATS`] heartbeat — a member that left the view in the last ten minutes and
//!   came back, ten times as long, doubling each further time
//!   ([`crate::coord::members::View::settled`]): a member that flaps, or wakes from a long pause,
//!   receives nothing while it flaps.
//! * **A bounded rate.** At most a third of the jobs this host leads (and at least
//!   [`PER_HEARTBEAT`]) are handed over per heartbeat.
//! * **Backoff per job.** After handing a job over, this host does not hand the same job over
//!   again for [`BACKOFF_START`], doubling up to [`BACKOFF_MAX`]: if the preferred member does
//!   not take it (it lacks the job's file, say), the job comes back and stays.
//!
//! Balance never decides safety (I10): a hand-over only ends a term early; who may write is
//! still decided by the lease and the fence.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::coord::members::View;

/// Heartbeats a member must have been live before jobs are handed to it.
pub(crate) const SETTLE_HEARTBEATS: u32 = 1;
/// Hand-overs per heartbeat per host allowed whatever the number of jobs it leads (the limit is
/// a third of those it leads when that is more).
pub(crate) const PER_HEARTBEAT: u32 = 100;
/// A job handed over is not handed over again by this host for this long at first.
pub(crate) const BACKOFF_START: Duration = Duration::from_secs(30);
/// The longest back-off between two hand-overs of one job by one host.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(600);

/// Counts hand-overs per heartbeat window, for one host, and the terms it leads.
pub(crate) struct Limiter {
    window: Duration,
    state: Mutex<(Instant, u32)>,
    leading: AtomicUsize,
}

impl Limiter {
    /// At most a third of the terms led (at least [`PER_HEARTBEAT`]) per `heartbeat`.
    pub(crate) fn new(heartbeat: Duration) -> Self {
        Limiter {
            window: heartbeat,
            state: Mutex::new((Instant::now(), 0)),
            leading: AtomicUsize::new(0),
        }
    }

    /// The most hand-overs allowed in one window now.
    fn cap(&self) -> u32 {
        let third = (self.leading.load(Ordering::Relaxed) / 3) as u32;
        third.max(PER_HEARTBEAT)
    }

    /// Takes one hand-over from the current window; false when it is used up.
    fn take(&self, now: Instant) -> bool {
        let cap = self.cap();
        let mut s = self.state.lock().expect("hand-over limiter");
        if now.saturating_duration_since(s.0) >= self.window {
            *s = (now, 0);
        }
        if s.1 >= cap {
            return false;
        }
        s.1 += 1;
        true
    }

    /// Counts a term this host leads until the guard is dropped.
    pub(crate) fn leading(self: &Arc<Self>) -> Leading {
        self.leading.fetch_add(1, Ordering::Relaxed);
        Leading(self.clone())
    }
}

/// A term counted by [`Limiter::leading`].
pub(crate) struct Leading(Arc<Limiter>);

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.leading.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A member's ask for a job (`lh:{job}:wanted`): its node id, and the component version it
/// serves the job with (absent in asks of hosts before this version).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    /// The asking member.
    pub node: String,
    /// The hash of its version of the job's component.
    pub version: Option<String>,
}

impl Ask {
    /// The value an ask is stored as: `node` or `node version`.
    pub(crate) fn encode(node: &str, version: &str) -> String {
        format!("{node} {version}")
    }

    /// Reads a stored ask.
    pub(crate) fn decode(v: &str) -> Ask {
        match v.split_once(' ') {
            Some((node, version)) => Ask {
                node: node.to_string(),
                version: Some(version.to_string()),
            },
            None => Ask {
                node: v.to_string(),
                version: None,
            },
        }
    }
}

/// What a job's runner needs to hand its job over.
pub(crate) struct Balance {
    /// This host.
    pub node: String,
    /// The membership as this host sees it.
    pub view: watch::Receiver<View>,
    /// Where the runner asks the elector to hand a term over (its token).
    pub hand_over: watch::Sender<u64>,
    /// The host's hand-over rate.
    pub limiter: std::sync::Arc<Limiter>,
    /// The heartbeat (for settling).
    pub heartbeat: Duration,
    /// No hand-over of this job before this instant, and the next back-off.
    backoff: Mutex<(Option<Instant>, Duration)>,
}

impl Balance {
    /// A balance for one job's runner.
    pub(crate) fn new(
        node: String,
        view: watch::Receiver<View>,
        hand_over: watch::Sender<u64>,
        limiter: std::sync::Arc<Limiter>,
        heartbeat: Duration,
    ) -> Self {
        Balance {
            node,
            view,
            hand_over,
            limiter,
            heartbeat,
            backoff: Mutex::new((None, BACKOFF_START)),
        }
    }

    /// The member to hand `job` over to now, if it should be: this host leads it, is between
    /// runs or steps, the preferred member asks for it (`wanted`, see
    /// [`crate::coord::lease::acquire_or_ask`]: a member that does not serve the job never asks) —
    /// with the component version `version` when one is given (a run in progress) — and the
    /// rules of the module doc allow it. Taking the answer counts it against the rate and
    /// starts the job's back-off.
    pub(crate) fn hand_over_to(
        &self,
        job: &str,
        wanted: Option<&Ask>,
        version: Option<&str>,
        now: Instant,
    ) -> Option<String> {
        let to = {
            let view = self.view.borrow();
            should_hand_over(&view, job, &self.node, self.heartbeat, now)?.to_string()
        };
        let ask = wanted.filter(|a| a.node == to)?;
        if version.is_some() && ask.version.as_deref() != version {
            return None;
        }
        let mut backoff = self.backoff.lock().expect("hand-over back-off");
        if backoff.0.is_some_and(|t| now < t) || !self.limiter.take(now) {
            return None;
        }
        *backoff = (Some(now + backoff.1), (backoff.1 * 2).min(BACKOFF_MAX));
        Some(to)
    }

    /// Whether the preferred member asks for `job` now and the membership rules (settled) would
    /// let it have the job: a look with no side effect, to decide whether the open runs'
    /// records are worth reading before [`Balance::hand_over_to`].
    pub(crate) fn asked_by_preferred(&self, job: &str, wanted: Option<&Ask>, now: Instant) -> bool {
        let view = self.view.borrow();
        let to = should_hand_over(&view, job, &self.node, self.heartbeat, now);
        to.is_some() && wanted.is_some_and(|a| Some(a.node.as_str()) == to)
    }

    /// Asks the elector to hand the term with `token` over.
    pub(crate) fn ask(&self, token: u64) {
        self.hand_over.send_replace(token);
    }
}

/// The member `job` should go to, if `node` leads it and is not the preferred member, and the
/// preferred member has been live for [`SETTLE_HEARTBEATS`] heartbeats.
pub(crate) fn should_hand_over<'a>(
    view: &'a View,
    job: &str,
    node: &str,
    heartbeat: Duration,
    now: Instant,
) -> Option<&'a str> {
    let preferred = view.preferred(job, None)?;
    (preferred != node && view.settled(preferred, heartbeat * SETTLE_HEARTBEATS, now))
        .then_some(preferred)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::members::{MemberInfo, Members};

    fn view(nodes: &[&str], age: Duration, now: Instant) -> View {
        let members: Members = nodes
            .iter()
            .map(|n| (n.to_string(), MemberInfo::with_capacity(1)))
            .collect();
        View::default().next(members, now - age)
    }

    /// A job that `a` does not prefer among a, b, c.
    fn job_not_for(v: &View, node: &str) -> String {
        (0..)
            .map(|i| format!("job-{i}"))
            .find(|j| v.preferred(j, None) != Some(node))
            .unwrap()
    }

    #[test]
    fn only_a_settled_preferred_member_receives_a_job() {
        let now = Instant::now() + Duration::from_secs(100);
        let hb = Duration::from_millis(500);
        let settled = view(&["a", "b", "c"], hb * 3, now);
        let job = job_not_for(&settled, "a");
        let to = should_hand_over(&settled, &job, "a", hb, now);
        assert_eq!(to, settled.preferred(&job, None));
        // Just joined: not yet.
        let fresh = view(&["a", "b", "c"], hb / 2, now);
        assert_eq!(should_hand_over(&fresh, &job, "a", hb, now), None);
        // The preferred member keeps its job.
        let p = settled.preferred(&job, None).unwrap().to_string();
        assert_eq!(should_hand_over(&settled, &job, &p, hb, now), None);
    }

    #[test]
    fn hand_overs_are_rate_limited_and_backed_off_per_job() {
        let now = Instant::now() + Duration::from_secs(100);
        let hb = Duration::from_millis(500);
        let v = view(&["a", "b", "c"], hb * 3, now);
        let (_tx, rx) = watch::channel(v.clone());
        let (hand_over, _) = watch::channel(0);
        let limiter = std::sync::Arc::new(Limiter::new(hb));
        let job = job_not_for(&v, "a");
        let b = Balance::new("a".into(), rx, hand_over, limiter.clone(), hb);
        let to = v.preferred(&job, None).unwrap().to_string();
        let ask = |node: &str, version: &str| Ask::decode(&Ask::encode(node, version));
        // Nobody asks for it (the preferred member does not serve the job): it stays.
        assert!(b.hand_over_to(&job, None, None, now).is_none());
        let other = ask("someone-else", "v1");
        assert!(b.hand_over_to(&job, Some(&other), None, now).is_none());
        // Between steps, only to a member with the run's version.
        let want = ask(&to, "v1");
        assert!(b.hand_over_to(&job, Some(&want), Some("v2"), now).is_none());
        assert!(b.hand_over_to(&job, Some(&want), Some("v1"), now).is_some());
        // Backed off: the same job is not handed over again at once, nor after 29 s.
        let want = Some(&want);
        assert!(b.hand_over_to(&job, want, None, now).is_none());
        assert!(
            b.hand_over_to(&job, want, None, now + Duration::from_secs(29))
                .is_none()
        );
        assert!(
            b.hand_over_to(&job, want, None, now + Duration::from_secs(31))
                .is_some()
        );
        // Then 60 s.
        assert!(
            b.hand_over_to(&job, want, None, now + Duration::from_secs(31 + 59))
                .is_none()
        );
        // An ask of an older host names no version: between runs it counts.
        assert_eq!(Ask::decode(&to).version, None);
        // The host's rate: PER_HEARTBEAT per window, or a third of the terms it leads.
        let l = std::sync::Arc::new(Limiter::new(hb));
        let t = Instant::now();
        assert_eq!(
            (0..PER_HEARTBEAT + 5).filter(|_| l.take(t)).count() as u32,
            PER_HEARTBEAT
        );
        assert!(l.take(t + hb));
        let terms: Vec<_> = (0..900).map(|_| l.leading()).collect();
        let t = t + hb * 2;
        assert_eq!((0..400).filter(|_| l.take(t)).count(), 300);
        drop(terms);
        assert_eq!(l.cap(), PER_HEARTBEAT);
    }
}
