//! The seam between a term and its store (issue 30, its first cut): what a term asks of the
//! store — campaign, renew, a fenced write, a whole term write (a guest's keys against its
//! quota, `create`, deletes, a resend's answer, the run bookkeeping: [`TermStore::write_all`]),
//! reads, resign, a follower's wait for the job to fall free
//! ([`TermStore::await_vacancy`]), a host's one listener for every job's releases and
//! notices ([`TermStore::listen`], [`TermStore::notify`]), and the term history
//! ([`TermStore::end`], [`TermStore::history`]) — as one trait, [`TermStore`], with
//! the Redis store (the scripts the host runs today: [`crate::coord::lease`] and the fenced
//! write) and the etcd store ([`crate::store::etcd`]) behind it. The contract both must keep is
//! tested against both by the same tests (`tests/integration/contract.rs`).
//!
//! **The contract** (`docs/store-contract.md`, C1 and C4). At most one term holds a job; a
//! campaign on a held job names the holder. Every new term of a job has a higher token than every
//! earlier one. A fenced write applies only while its term holds the job: once the term was
//! resigned, or its lease lapsed and a later term began, the store itself refuses the write and
//! writes nothing, whatever the writer's clock says. A term renewed before its TTL goes on; one
//! not renewed lapses after it (on etcd: the TTL etcd granted, in whole seconds, and longer while
//! etcd changes leaders). Resigning and renewing are only the term's own: a later term's hold is
//! never released or extended by an earlier one — on Redis given that every campaign has an
//! owner of its own (the scripts compare the owner; the host makes one `node:uuid` per
//! candidacy), on etcd by the term's lease and token.
//!
//! Tokens grow within one store, and continue across a move from one store to the other as far
//! as the hosts' clocks agree: Redis's are microseconds since the epoch (Redis's clock), etcd's
//! a base set once from a host's clock in microseconds plus a revision
//! ([`crate::store::etcd`]'s `tokens`). Where a database's fence shows a higher token than the
//! store's, [`TermStore::raise_tokens`] puts every later term above it.
//!
//! **What the host takes from the seam.** A host holds one [`Store`] (the store its URL names,
//! either store behind one type; the contract suite opens both through it). Through it go every
//! write a term makes ([`crate::coord::fence::term_write`]: the runner's records and the
//! guests' writes; on Redis the same script, `WAIT` and connection as before), the guests'
//! reads, the SQL fence's token raise ([`TermStore::raise_tokens`]), the electors' campaigns
//! ([`TermStore::campaign_many`], coalesced by [`crate::coord::campaigns`]) and releases
//! ([`TermStore::end`], [`TermStore::give_back`]), the runner's reads (its job's state,
//! [`TermStore::job_state`]; its records and checkpoints, [`TermStore::read_key`] and
//! [`TermStore::read_keys`]), the host's one listener, and its heartbeat, one call
//! ([`TermStore::beat`]: its registration, the renewal of every term it leads, its followers'
//! looks at their leases and the job states its runners asked for; on Redis the one pipeline
//! per node the heartbeat has always sent). The Redis store is the host's own connection
//! ([`crate::store::Conn`]: a node, Sentinel, Cluster; the contract is also tested on a
//! 3-primary Cluster).
//!
//! **Operators' writes** go through the seam too: a request for a run and the pause flag, each
//! with the notice that wakes the runner ([`TermStore::request`], [`TermStore::set_paused`]),
//! and the lists of the jobs each host serves ([`TermStore::publish_jobs`],
//! [`TermStore::served_jobs`]) — what the CLI's `trigger`, `cancel`, `pause` and `resume`, the
//! HTTP API's and the console's actions and the catalog use, on either store — and the run
//! history operators read ([`TermStore::newest_runs`], then [`TermStore::read_keys`]).
//!
//! **Not yet.** The rest of the host still calls the Redis functions directly: tasks, the HTTP
//! API's and the console's status and term-history reads, the CLI's `purge`, the start-up
//! checks ([`Store::redis_conn`] hands the Redis connection to what is not moved yet, and on
//! etcd says so). Moving them is the rest of issue 30, and until then a host runs only on
//! Redis. A task's write (a worker's claim) is not part of the contract yet: the etcd store
//! refuses one.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use crate::coord::fence::{TermWrite, Written as TermWritten};
use crate::coord::members::{MemberInfo, Members};
use crate::coord::notices::{NoticeFor, ReleaseNotices};
use crate::coord::terms::TermEnd;
use tokio_util::sync::CancellationToken;

mod any;
mod beat;
mod etcd;
mod reads;
mod redis;
mod redis_beat;

pub use any::{Store, names_etcd};
pub use beat::{Beat, Beaten, Lease, LookAt};
pub use reads::{JobStatus, TermHistory};
pub use redis::RedisTerms;

/// A term a store granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreTerm {
    /// The job.
    pub job: String,
    /// Who holds it.
    pub owner: String,
    /// Its fencing token.
    pub token: u64,
    /// Its lease's length.
    pub ttl: Duration,
    /// The etcd lease the term's key is attached to, and the key's create revision (etcd
    /// only).
    pub(crate) lease: Option<(i64, i64)>,
}

/// What a campaign found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Campaign {
    /// The job was free: this term is ours.
    Won(StoreTerm),
    /// Another term holds the job.
    Held {
        /// Its owner.
        owner: String,
        /// Its lease's time left, where the store says: on Redis (`None` for a key without
        /// expiry, never set so by Leasehold); on etcd never (the host's watch wakes a follower
        /// when the lease lapses, as on a release).
        left: Option<Duration>,
    },
}

/// One campaign of [`TermStore::campaign_many`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidacy {
    /// The job.
    pub job: String,
    /// The owner it would hold the job as (one of its own per campaign).
    pub owner: String,
    /// The lease's length.
    pub ttl: Duration,
    /// This host's ask for the job ([`crate::coord::balance::Ask`]) when it is the job's
    /// preferred member: stored with the campaign when the job is held (Redis only: the etcd
    /// store does not keep asks yet).
    pub ask: Option<String>,
}

/// What a fenced write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Applied.
    Applied,
    /// Refused by the store, nothing written: the term no longer holds the job.
    Refused,
}

/// What a whole term write did ([`TermStore::write_all`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wrote {
    /// Applied (for `create` that found a key: answered, nothing written).
    Applied(TermWritten),
    /// Refused by the store, nothing written: the term no longer holds the job (why, and who
    /// holds it where the store says).
    Refused(crate::coord::checks::Refusal),
    /// Refused, nothing written: the write would take the job past its quota; what it would
    /// keep `(keys, bytes)`.
    Quota(u64, u64),
}

/// What a term asks of its store (the module doc states the contract).
pub trait TermStore {
    /// Campaigns for `job` as `owner` (one of its own per campaign) with a lease of `ttl`.
    fn campaign(
        &self,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = anyhow::Result<Campaign>> + Send;

    /// Every campaign of `candidacies` (one host's, sent in the same moment) at once, each
    /// answering for itself, in order: on Redis one round trip per node (each its own acquire
    /// script), on etcd one transaction each, sent together.
    fn campaign_many(
        &self,
        candidacies: &[Candidacy],
    ) -> impl Future<Output = Vec<anyhow::Result<Campaign>>> + Send;

    /// Gives back what a campaign as `owner` may have taken without its answer being heard (a
    /// lost reply, a timeout): the job's lease if `owner` holds it. True when it did. On Redis
    /// the term's history entry reads `released`; on etcd it is left open (read as `crashed`
    /// once a later term begins).
    fn give_back(
        &self,
        job: &str,
        owner: &str,
    ) -> impl Future<Output = anyhow::Result<bool>> + Send;

    /// Raises the tokens of `job`'s later terms above `token` (never lowers them): every term
    /// won after this returns has a higher token (a database's fence holds one the store has not
    /// reached). True when anything was raised. On Redis the job's counter, on etcd the
    /// cluster's base (every job's later tokens; tokens only need to grow).
    fn raise_tokens(
        &self,
        job: &str,
        token: u64,
    ) -> impl Future<Output = anyhow::Result<bool>> + Send;

    /// Renews `term`'s lease for its TTL: false when the term no longer holds the job.
    fn renew(&self, term: &StoreTerm) -> impl Future<Output = anyhow::Result<bool>> + Send;

    /// Renews every term of `terms` (one host's) at once, in few requests (on Redis one
    /// pipeline; on etcd one keep-alive, and one read for every 128 terms at etcd's default
    /// `--max-txn-ops`): for each, whether it still holds its job (false ends it).
    fn renew_all(
        &self,
        terms: &[StoreTerm],
    ) -> impl Future<Output = anyhow::Result<Vec<bool>>> + Send;

    /// Registers `node` with `info` in the membership for `ttl` (renewed by registering again,
    /// gone once not renewed for `ttl`): the live members, this one included.
    fn register(
        &self,
        node: &str,
        info: &MemberInfo,
        ttl: Duration,
    ) -> impl Future<Output = anyhow::Result<Members>> + Send;

    /// One heartbeat ([`Beat`]): registers the host, renews its terms, looks at the leases it
    /// follows and reads the states its runners asked for, in as few requests as the store
    /// allows — on Redis one pipeline per node (the registration script, a renewal script per
    /// term, a look per followed job, the job-state commands per read); on etcd one keep-alive
    /// of the host's lease and one transaction per `--max-txn-ops` operations for the
    /// registration, the members, the renewals' and the looks' keys, sent at once, and one
    /// read-only transaction per job state, sent with them.
    fn beat(&self, beat: &Beat<'_>) -> impl Future<Output = Beaten> + Send;

    /// Takes `node` out of the membership, and the jobs it published with it.
    fn deregister(&self, node: &str) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Publishes the names of the jobs `node` serves (after a scan of its jobs directory). Not
    /// a term's write: it describes the host, like its registration, and counts only while
    /// `node` is a live member.
    fn publish_jobs(
        &self,
        node: &str,
        jobs: &[String],
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The jobs the live members serve, by node: only members that have published theirs.
    fn served_jobs(
        &self,
    ) -> impl Future<Output = anyhow::Result<BTreeMap<String, Vec<String>>>> + Send;

    /// Writes `value` under the job's `key`, fenced by `term`.
    fn write(
        &self,
        term: &StoreTerm,
        key: &str,
        value: &[u8],
    ) -> impl Future<Output = anyhow::Result<Written>> + Send;

    /// Applies `write` as `term`, all or nothing ([`crate::coord::fence`]'s module doc lists
    /// what a write does; a task's write, with a claim, is not part of this contract yet).
    /// Its keys are the job's keys as [`crate::store::keys::JobKeys`] names them.
    fn write_all(
        &self,
        term: &StoreTerm,
        write: &TermWrite<'_>,
    ) -> impl Future<Output = anyhow::Result<Wrote>> + Send;

    /// The job's key `rest` ([`crate::store::keys::JobKeys::rest`] of it: `cursor`, `run:<period>`, …).
    fn read_key(
        &self,
        job: &str,
        rest: &str,
    ) -> impl Future<Output = anyhow::Result<Option<Vec<u8>>>> + Send;

    /// The job's keys `rests` (as [`TermStore::read_key`] names them), in order: on Redis one
    /// `MGET`, on etcd one read-only transaction per `--max-txn-ops` keys.
    fn read_keys(
        &self,
        job: &str,
        rests: &[String],
    ) -> impl Future<Output = anyhow::Result<Vec<Option<Vec<u8>>>>> + Send;

    /// The members of the job's open-runs index (`open`) or run index (`runs`), or the
    /// periods and values of its operators' requests (`requests`), ordered by member.
    fn members(
        &self,
        job: &str,
        collection: Collection,
    ) -> impl Future<Output = anyhow::Result<Vec<(String, Vec<u8>)>>> + Send;

    /// The newest `limit` periods of the job's run index, newest first (periods sort as text in
    /// time order; the index's marker, [`crate::store::keys::INDEXED`], is not one): on Redis one
    /// `ZREVRANGEBYLEX`, on etcd one sorted range read.
    fn newest_runs(
        &self,
        job: &str,
        limit: usize,
    ) -> impl Future<Output = anyhow::Result<Vec<String>>> + Send;

    /// What a leader reads of `job` every round, in one request (on Redis one pipeline of the
    /// job's slot; on etcd one read-only transaction): every field read at one moment.
    fn job_state(&self, job: &str) -> impl Future<Output = anyhow::Result<JobReads>> + Send;

    /// What operators read of `job`'s status ([`JobStatus`]): on Redis one pipeline of the
    /// job's slot; on etcd one read-only transaction, and the lease's time left while held.
    fn job_status(&self, job: &str) -> impl Future<Output = anyhow::Result<JobStatus>> + Send;

    /// Deletes every data key of `job` whose key (as the guest names it) starts with `prefix`,
    /// lowering the job's storage count by each: what was deleted, `(keys, bytes)`. An
    /// operator's write, unfenced (a run writing meanwhile may write some again). Redis: short
    /// atomic scripts over a scan of the job's slot; etcd: a transaction a page.
    fn purge(
        &self,
        job: &str,
        prefix: &str,
    ) -> impl Future<Output = anyhow::Result<(u64, u64)>> + Send;

    /// Counts every data key of `job` and sets its storage count to that, `(keys, bytes)`.
    fn recount(&self, job: &str) -> impl Future<Output = anyhow::Result<(u64, u64)>> + Send;

    /// Writes an operator's request for a run of `period` (`value`, as `exec::runs::Request`
    /// encodes it) and wakes the job's runner (the notice `request`): replacing any request
    /// there (`replace`), or only where there is none. True when written. Unfenced: an input to
    /// the leader, not a term's result. On Redis one pipeline (`HSET` or `HSETNX`, `PUBLISH`),
    /// on etcd one transaction (comparing the request key's create revision with 0 unless
    /// replacing). A request not written may still send the notice (Redis publishes it
    /// anyway; etcd does not): a notice only wakes the runner, which reads what is there.
    fn request(
        &self,
        job: &str,
        period: &str,
        value: &str,
        replace: bool,
    ) -> impl Future<Output = anyhow::Result<bool>> + Send;

    /// Pauses `job` with `reason` (who paused it and when) or resumes it (`None`), and wakes
    /// its runner (the notice `paused`). Unfenced, as [`TermStore::request`]; the runner reads
    /// the flag in [`TermStore::job_state`].
    fn set_paused(
        &self,
        job: &str,
        reason: Option<&str>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The job's key.
    fn read(
        &self,
        job: &str,
        key: &str,
    ) -> impl Future<Output = anyhow::Result<Option<Vec<u8>>>> + Send;

    /// Who holds `job` now, if anyone.
    fn holder(&self, job: &str) -> impl Future<Output = anyhow::Result<Option<String>>> + Send;

    /// Ends `term`: false when it no longer held the job. Its history entry reads `released`.
    fn resign(&self, term: &StoreTerm) -> impl Future<Output = anyhow::Result<bool>> + Send;

    /// Ends `term` saying `how` ([`TermEnd::Released`], `Expired`, `Fenced`): as
    /// [`TermStore::resign`] while it holds the job, its history entry closed with `how`; once
    /// it does not, only an entry still open or read as `crashed` is closed, as `expired` or
    /// `fenced` (a holder back from a pause says why it went quiet; a release that found its
    /// term gone reads `expired`). False when it no longer held the job.
    fn end(
        &self,
        term: &StoreTerm,
        how: TermEnd,
    ) -> impl Future<Output = anyhow::Result<bool>> + Send;

    /// The job's terms, newest first, at most `limit` (and [`crate::coord::terms::KEPT`]): each
    /// term a campaign won has one, added by that campaign alone; one a later term followed
    /// without its end said reads [`TermEnd::Crashed`]. Times are the store's clock on Redis,
    /// the campaigning host's on etcd. An entry that does not parse is counted, not returned.
    fn history(
        &self,
        job: &str,
        limit: usize,
    ) -> impl Future<Output = anyhow::Result<TermHistory>> + Send;

    /// Waits until `job` is free or `limit` has passed: true when no term held it at some
    /// moment since the call (it may be held again by the time this returns: a campaign
    /// decides), false when it was held throughout `limit`. A release or a lapse wakes it at
    /// once, not at a poll: on Redis the release channel and the lease's own expiry, on etcd a
    /// watch on the lease key ([`crate::store::etcd`]'s `vacancy`). A follower's wait.
    fn await_vacancy(
        &self,
        job: &str,
        limit: Duration,
    ) -> impl Future<Output = anyhow::Result<bool>> + Send;

    /// A host's one listener: wakes what `notices` registers under a job's release channel when
    /// the job's term is released (its payload: the owner that released), and under its notice
    /// or work channel on a [`TermStore::notify`] for it (its payload: the notice's), for every
    /// job, those registered later too, until `stop` is cancelled. A broken listener is opened
    /// again; meanwhile nothing is woken (followers, runners and workers fall back to their
    /// polls). On etcd a lapse wakes the release channel too ([`crate::store::etcd`]'s
    /// `notices`); on Redis only a release does.
    fn listen(
        &self,
        notices: ReleaseNotices,
        stop: CancellationToken,
    ) -> impl Future<Output = ()> + Send;

    /// Sends a notice about `job` to its runner or its task workers, with `payload`, to every
    /// host's [`TermStore::listen`] (an operator's request or pause, a member's ask, tasks
    /// queued). Unfenced, as on Redis: a notice only wakes, and what it wakes reads the store.
    fn notify(
        &self,
        job: &str,
        to: NoticeFor,
        payload: &str,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// What a leader reads of its job every round, as stored ([`TermStore::job_state`]; the runner
/// decodes it: `exec::runs::JobState`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobReads {
    /// Operators' requests not yet cleared: period → request as stored.
    pub requests: Vec<(String, Vec<u8>)>,
    /// Periods whose run is open.
    pub open: Vec<String>,
    /// The pause flag (who paused and when), if set.
    pub paused: Option<String>,
    /// The newest period's start accounted for, if any.
    pub cursor: Option<String>,
    /// The ask of the member that asks for the job, if one does.
    pub wanted: Option<String>,
    /// Whether the run index holds its marker ([`crate::store::keys::INDEXED`]).
    pub indexed: bool,
}

/// A job's set or hash that a term write's bookkeeping changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collection {
    /// The open-runs index.
    Open,
    /// The run index.
    Runs,
    /// Operators' requests, period → request.
    Requests,
}

impl Collection {
    pub(super) fn name(self) -> &'static str {
        match self {
            Collection::Open => "open",
            Collection::Runs => "runs",
            Collection::Requests => "requests",
        }
    }
}

/// `periods` without the run index's marker, at most `limit`.
fn without_marker(periods: Vec<String>, limit: usize) -> Vec<String> {
    periods
        .into_iter()
        .filter(|p| p != crate::store::keys::INDEXED)
        .take(limit)
        .collect()
}
