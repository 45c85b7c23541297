//! Leadership balancing, the leader's half: a leader that is not its job's preferred member
//! ([`crate::members`]) hands the job over *between runs*, so no step is interrupted.
//!
//! A hand-over is graceful: the runner, idle, asks the elector to end the term (a `watch` with
//! the term's token); the elector ends it, releases the lease with the owner-checked script
//! (which publishes the release notice) and campaigns again a heartbeat late, as every
//! non-preferred host does, so the preferred member, woken by the notice, acquires first. No
//! TTL is waited out.
//!
//! Hand-overs are held back three ways, so that balancing never churns:
//!
//! * **Settled members only.** The preferred member must have been live in this host's view for
//!   [`SETTLE_HEARTBEATS`] heartbeats: a member that flaps never receives a job.
//! * **A bounded rate.** At most [`PER_HEARTBEAT`] hand-overs per heartbeat per host.
//! * **Backoff per job.** After handing a job over, this host does not hand the same job over
//!   again for [`BACKOFF_START`], doubling up to [`BACKOFF_MAX`]: if the preferred member does
//!   not take it (it lacks the job's file, say), the job comes back and stays.
//!
//! Balance never decides safety (I10): a hand-over only ends a term early; who may write is
//! still decided by the lease and the fence.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::members::View;

/// Heartbeats a member must have been live before jobs are handed to it.
pub(crate) const SETTLE_HEARTBEATS: u32 = 2;
/// Hand-overs per heartbeat per host, at most.
pub(crate) const PER_HEARTBEAT: u32 = 100;
/// A job handed over is not handed over again by this host for this long at first.
pub(crate) const BACKOFF_START: Duration = Duration::from_secs(30);
/// The longest back-off between two hand-overs of one job by one host.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(600);

/// Counts hand-overs per heartbeat window, for one host.
pub(crate) struct Limiter {
    window: Duration,
    state: Mutex<(Instant, u32)>,
}

impl Limiter {
    /// At most [`PER_HEARTBEAT`] per `heartbeat`.
    pub(crate) fn new(heartbeat: Duration) -> Self {
        Limiter {
            window: heartbeat,
            state: Mutex::new((Instant::now(), 0)),
        }
    }

    /// Takes one hand-over from the current window; false when it is used up.
    fn take(&self, now: Instant) -> bool {
        let mut s = self.state.lock().expect("hand-over limiter");
        if now.saturating_duration_since(s.0) >= self.window {
            *s = (now, 0);
        }
        if s.1 >= PER_HEARTBEAT {
            return false;
        }
        s.1 += 1;
        true
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
    /// No hand-over of this job before this instant.
    not_before: Option<Instant>,
    /// The next back-off.
    backoff: Duration,
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
            not_before: None,
            backoff: BACKOFF_START,
        }
    }

    /// The member to hand `job` over to now, if it should be: this host leads it, is idle
    /// between runs, the preferred member asks for it (`wanted`, see
    /// [`crate::lease::acquire_or_ask`]: a member that does not serve the job never asks), and
    /// the rules of the module doc allow it. Taking the answer counts it against the rate and
    /// starts the job's back-off.
    pub(crate) fn hand_over_to(
        &mut self,
        job: &str,
        wanted: Option<&str>,
        now: Instant,
    ) -> Option<String> {
        let to = {
            let view = self.view.borrow();
            should_hand_over(&view, job, &self.node, self.heartbeat, now)?.to_string()
        };
        if wanted != Some(to.as_str()) {
            return None;
        }
        if self.not_before.is_some_and(|t| now < t) || !self.limiter.take(now) {
            return None;
        }
        self.not_before = Some(now + self.backoff);
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        Some(to)
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
    use crate::members::{MemberInfo, Members};

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
        let fresh = view(&["a", "b", "c"], hb, now);
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
        let mut b = Balance::new("a".into(), rx, hand_over, limiter.clone(), hb);
        let to = v.preferred(&job, None).unwrap().to_string();
        // Nobody asks for it (the preferred member does not serve the job): it stays.
        assert!(b.hand_over_to(&job, None, now).is_none());
        assert!(b.hand_over_to(&job, Some("someone-else"), now).is_none());
        let want = Some(to.as_str());
        assert!(b.hand_over_to(&job, want, now).is_some());
        // Backed off: the same job is not handed over again at once, nor after 29 s.
        assert!(b.hand_over_to(&job, want, now).is_none());
        assert!(
            b.hand_over_to(&job, want, now + Duration::from_secs(29))
                .is_none()
        );
        assert!(
            b.hand_over_to(&job, want, now + Duration::from_secs(31))
                .is_some()
        );
        // Then 60 s.
        assert!(
            b.hand_over_to(&job, want, now + Duration::from_secs(31 + 59))
                .is_none()
        );
        // The host's rate: PER_HEARTBEAT per window.
        let l = Limiter::new(hb);
        let t = Instant::now();
        assert_eq!(
            (0..PER_HEARTBEAT + 5).filter(|_| l.take(t)).count() as u32,
            PER_HEARTBEAT
        );
        assert!(l.take(t + hb));
    }
}
