//! A term: one stretch of leadership of one job, with its fencing token and its local deadline.
//!
//! **Clock model.** All deadlines are on this process's monotonic clock ([`Instant`]). A term's
//! deadline is `t_sent + lease_ttl − margin`, where `t_sent` is when the acquire or renew that
//! succeeded was *sent* (I3). Redis expires the lease on its own clock no earlier than
//! `t_received + lease_ttl ≥ t_sent + lease_ttl`; as long as the two clocks' rates differ by less
//! than `margin / lease_ttl`, this node stops acting before Redis could grant the lease to anyone
//! else. Wall-clock jumps on either side are not covered by this argument; the fence is the
//! backstop for them (a write of an older term is refused in Redis whatever the clocks say).
//!
//! [`Term::still_leader`] reads an atomic and the monotonic clock: no lock, no round trip.
//! Once a term has ended it never becomes valid again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// Nanoseconds since the process's clock base; never 0 for a real instant after the base.
fn nanos(at: Instant) -> u64 {
    at.saturating_duration_since(base()).as_nanos() as u64 + 1
}

/// Milliseconds on this process's monotonic clock (for events: comparable within one process).
pub fn mono_ms(at: Instant) -> u64 {
    nanos(at) / 1_000_000
}

fn instant(nanos: u64) -> Instant {
    base() + Duration::from_nanos(nanos.saturating_sub(1))
}

/// One term of leadership. Cloning shares the term: ending one clone ends them all.
#[derive(Clone, Debug)]
pub struct Term {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    token: u64,
    owner: String,
    /// Local deadline in [`nanos`]; 0 once the term has ended.
    deadline: AtomicU64,
    ended: watch::Sender<bool>,
    /// Replicas every write of the term waits for (see [`Replicas`]).
    replicas: Option<Replicas>,
    /// On etcd, the term's lease and its key's create revision (what its writes compare).
    lease: Option<(i64, i64)>,
}

/// How many Redis replicas must acknowledge each write of a term, and how long a write waits
/// for them (`WAIT`). A write that is not acknowledged in time fails as unavailable (it is
/// applied on the primary, and may be lost if the primary fails over).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replicas {
    /// Replicas that must acknowledge.
    pub count: u32,
    /// Longest a write waits for them.
    pub timeout: Duration,
}

impl Term {
    /// A term with `token`, held by lease owner `owner`, valid until `deadline`.
    pub fn new(token: u64, owner: String, deadline: Instant) -> Self {
        Term::with_replicas(token, owner, deadline, None)
    }

    /// [`Term::new`] for a term whose every write waits for `replicas` (none: no waiting).
    pub fn with_replicas(
        token: u64,
        owner: String,
        deadline: Instant,
        replicas: Option<Replicas>,
    ) -> Self {
        Term::made(token, owner, deadline, replicas, None)
    }

    /// The term a store granted ([`crate::coord::term_store::TermStore::campaign`]), valid until
    /// `deadline`, its every write waiting for `replicas` (none: no waiting).
    pub fn granted(
        term: &crate::coord::term_store::StoreTerm,
        deadline: Instant,
        replicas: Option<Replicas>,
    ) -> Self {
        Term::made(
            term.token,
            term.owner.clone(),
            deadline,
            replicas,
            term.lease,
        )
    }

    fn made(
        token: u64,
        owner: String,
        deadline: Instant,
        replicas: Option<Replicas>,
        lease: Option<(i64, i64)>,
    ) -> Self {
        base();
        Term {
            inner: Arc::new(Inner {
                token,
                owner,
                deadline: AtomicU64::new(nanos(deadline)),
                ended: watch::Sender::new(false),
                replicas,
                lease,
            }),
        }
    }

    /// The term as its store knows it, for a write to `job` (its TTL is not the term's to say:
    /// zero).
    pub fn in_store(&self, job: &str) -> crate::coord::term_store::StoreTerm {
        crate::coord::term_store::StoreTerm {
            job: job.to_string(),
            owner: self.inner.owner.clone(),
            token: self.inner.token,
            ttl: Duration::ZERO,
            lease: self.inner.lease,
        }
    }

    /// The replicas every write of the term waits for, if any.
    pub fn replicas(&self) -> Option<Replicas> {
        self.inner.replicas
    }

    /// The term's fencing token.
    pub fn token(&self) -> u64 {
        self.inner.token
    }

    /// The lease owner value of this term (`node-id:uuid`).
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// True while the local deadline has not passed and the term has not been ended.
    pub fn still_leader(&self) -> bool {
        let d = self.inner.deadline.load(Ordering::Acquire);
        d != 0 && nanos(Instant::now()) < d
    }

    /// The local deadline, or `None` once the term has ended.
    pub fn deadline(&self) -> Option<Instant> {
        match self.inner.deadline.load(Ordering::Acquire) {
            0 => None,
            d => Some(instant(d)),
        }
    }

    /// The local deadline in [`mono_ms`], 0 once ended.
    pub fn deadline_ms(&self) -> u64 {
        self.deadline().map(mono_ms).unwrap_or(0)
    }

    /// Time left before the local deadline (zero once ended or expired).
    pub fn time_left(&self) -> Duration {
        self.deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or_default()
    }

    /// Moves the deadline later after a successful renewal. Never moves it earlier, and never
    /// revives a term that has ended or whose deadline has passed.
    pub fn extend(&self, deadline: Instant) {
        let new = nanos(deadline);
        let now = nanos(Instant::now());
        let _ = self
            .inner
            .deadline
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur != 0 && cur > now && new > cur).then_some(new)
            });
    }

    /// Ends the term now. Idempotent.
    pub fn end(&self) {
        self.inner.deadline.store(0, Ordering::Release);
        self.inner.ended.send_replace(true);
    }

    /// Runs `work` for this term: its output, or `None` if the term ended first (the work is
    /// then dropped, i.e. cancelled).
    pub async fn bound<F: std::future::Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            r = work => Some(r),
            _ = self.ended() => None,
        }
    }

    /// Resolves once the term has ended, by [`Term::end`] or by its deadline passing.
    pub async fn ended(&self) {
        let mut rx = self.inner.ended.subscribe();
        loop {
            let Some(deadline) = self.deadline() else {
                return;
            };
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_term_is_valid_until_its_deadline() {
        let t = Term::new(7, "n:1".into(), Instant::now() + Duration::from_secs(5));
        assert!(t.still_leader());
        assert_eq!(t.token(), 7);
        let expired = Term::new(8, "n:2".into(), Instant::now() - Duration::from_millis(1));
        assert!(!expired.still_leader());
    }

    #[test]
    fn extend_moves_forward_only_and_never_revives() {
        let now = Instant::now();
        let t = Term::new(1, "n:1".into(), now + Duration::from_secs(5));
        t.extend(now + Duration::from_secs(2));
        assert!(t.deadline().unwrap() >= now + Duration::from_secs(5) - Duration::from_micros(1));
        t.extend(now + Duration::from_secs(9));
        assert!(t.deadline().unwrap() >= now + Duration::from_secs(9) - Duration::from_micros(1));
        t.end();
        t.extend(now + Duration::from_secs(20));
        assert!(!t.still_leader());
        assert_eq!(t.deadline(), None);
    }

    #[tokio::test]
    async fn ended_resolves_at_the_deadline() {
        let t = Term::new(1, "n:1".into(), Instant::now() + Duration::from_millis(300));
        let waiter = tokio::spawn({
            let t = t.clone();
            async move { t.ended().await }
        });
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("term did not end")
            .unwrap();
    }

    #[tokio::test]
    async fn ended_resolves_when_ended_explicitly() {
        let t = Term::new(1, "n:1".into(), Instant::now() + Duration::from_secs(60));
        let waiter = tokio::spawn({
            let t = t.clone();
            async move { t.ended().await }
        });
        t.end();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("term did not end")
            .unwrap();
        assert!(!t.still_leader());
    }
}
