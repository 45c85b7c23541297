//! etcd as a store for terms: a job's lease, its token and the writes fenced by it, on etcd's own
//! primitives (issue 30, in part): campaign, renew, resign, a single fenced write (here) and a
//! term's whole write with its quota and run bookkeeping ([`fenced`]), a host's heartbeat
//! ([`beat`]), a follower's wait for a job to fall free ([`vacancy`]), one listener per host
//! for every job's notices ([`notices`]), the term history ([`history`]), operators' requests
//! and pause flag ([`operator`]) and the jobs each host serves ([`served`]); a cluster is named
//! by an `etcd://` URL ([`url`]). A host runs on it (`node/stores.rs`), but for fan-out
//! tasks (`docs/store-contract.md` lists what is left). Tested against a real 3-member cluster
//! (`tests/integration/etcd.rs`, `contract.rs` beside the Redis store, and three hosts in
//! `etcd_hosts.rs`).
//!
//! **Keys.** A job's keys are under `lh/<job>/`: its key `<rest>` (as the Redis store names it
//! without the job's prefix `lh:{<job>}:`, e.g. `cursor`, `run:<period>`, `data:<key>`) is
//! `lh/<job>/<rest>`, and each member of its sets and hashes (`open`, `runs`, `requests`) a key
//! of its own, `lh/<job>/<set>/<member>`. Its term key and its notices are apart from them,
//! under one prefix for all jobs (`lh/{jobs}/lease/<job>`, `lh/{jobs}/notify/<job>`,
//! `lh/{jobs}/work/<job>`), so one watch per host hears them all and no guest write
//! ([`notices`]); members are `lh/{members}/<node>` ([`beat`]), the jobs each serves
//! `lh/{served}/<node>` ([`served`]); the cluster's token base is
//! `lh/{tokens}/base` ([`tokens`]).
//!
//! **Guarantees.** A term is the key `lh/{jobs}/lease/<job>`, created only if absent (a transaction
//! comparing its create revision with 0) and attached to its client's etcd lease: one lease per
//! client (a host), shared by every term it wins, so one keep-alive renews them all
//! ([`EtcdTerms::renew_all`]: a keep-alive and one read a heartbeat, one more read for each
//! 128 terms beyond the first 126 at etcd's default `--max-txn-ops`). The
//! term's token is the cluster's token base plus the key's create revision ([`tokens`]): etcd's
//! revisions only grow and the base never falls, so every later term of the job has a higher
//! token, and no two terms share one. A fenced write
//! ([`EtcdTerms::write`]) is one transaction that applies only while the lease key still has
//! the term's create revision: once the term's lease lapsed (a crashed or frozen holder, one
//! cut off from the majority), was revoked or the key released, no write of that term applies,
//! whatever the holder's clock says; a refused write is answered with the key's current holder.
//! Every request needs a member with a leader (`require-leader`): on the minority side of a
//! partition a renewal is refused (no leader) instead of being answered from a stale view, so
//! the holder's term ends at its own deadline.
//!
//! **Non-guarantees.** TTLs are whole seconds (rounded up), and etcd raises one under its floor
//! (⌈1.5 × election timeout⌉) to the floor: the term's TTL is what etcd granted. Every etcd
//! leader change gives every lease a full TTL again, so a crashed holder's lease outlives its
//! TTL by as much as the cluster keeps changing leaders. Expired leases are revoked by a loop on
//! etcd's leader (about every 500 ms), and a lapse counts only once that revoke is committed; no
//! new term begins before it. Tokens continue another store's (the Redis store's are
//! microseconds since the epoch) only as far as the hosts' clocks agree, as [`tokens`] says; a
//! database's fence that holds a higher one raises the base ([`EtcdTerms::raise_tokens`]).
//! Reads are linearizable (a quorum round each). A member that is down stays in the client's
//! balancer (tonic's), which goes on sending it a share of requests; those that a term lives by
//! (`EtcdTerms::resent`: a campaign, a heartbeat, a fenced write, a release) are sent again
//! when the connection was refused, others fail and their callers try again. A member that does
//! not answer at all costs each request sent there its timeout.
//!
//! **Clock model.** etcd keeps no wall clock for leases: it counts a lease's TTL on its leader
//! from the last keep-alive it received. The holder counts its term from before it sent the
//! campaign (or renewal) and stops acting a margin before the TTL, as the Redis store's terms do.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, Txn, TxnOpResponse};

mod beat;
mod fenced;
mod history;
mod notices;
mod operator;
mod purge;
mod reads;
mod served;
mod status;
mod terms;
mod tokens;
mod url;
mod vacancy;

pub use beat::{Beaten, Registration};
pub use fenced::{EtcdWrite, WriteOutcome};
pub use history::{HISTORY_KEPT, HistoryEntry};
pub use reads::JobStateRead;
pub use status::StatusRead;
pub use url::{EtcdUrl, parse as parse_url};

/// etcd's own limit on a transaction's operations when it is not configured (`--max-txn-ops`).
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// A client for terms on an etcd cluster.
#[derive(Clone)]
pub struct EtcdTerms {
    client: Client,
    /// The most one operation may take.
    timeout: Duration,
    /// The most operations a transaction may have (the cluster's `--max-txn-ops`).
    max_txn_ops: usize,
    /// The lease writes' answers are kept under, and when it was granted ([`fenced`]).
    applied: Arc<Mutex<Option<(i64, Instant)>>>,
    /// The lease every term this client wins is attached to.
    host: Arc<Mutex<Option<terms::HostLease>>>,
    /// The cluster's token base as this client last saw it ([`tokens`]).
    base: Arc<Mutex<Option<i64>>>,
}

/// A term won by [`EtcdTerms::campaign`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTerm {
    /// The job.
    pub job: String,
    /// Who holds it.
    pub owner: String,
    /// The term's fencing token: the cluster's token base ([`tokens`]) plus `revision`.
    pub token: i64,
    /// The lease key's create revision: what the store compares to fence the term's writes.
    pub revision: i64,
    /// The etcd lease the key is attached to.
    pub lease: i64,
    /// The lease's TTL as etcd granted it.
    pub ttl: Duration,
}

/// What a campaign found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Campaign {
    /// The job was free: this term is ours.
    Won(EtcdTerm),
    /// Another term holds the job.
    Held {
        /// Its owner.
        owner: String,
        /// Its lease key's create revision.
        revision: i64,
    },
}

/// What a fenced write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fenced {
    /// Applied.
    Applied {
        /// The cluster's revision that holds the write.
        revision: i64,
    },
    /// Refused, nothing written: the term no longer holds the job.
    Refused {
        /// Who holds it now, if anyone (owner and lease key's create revision).
        holder: Option<(String, i64)>,
    },
}

/// An etcd request that failed (the cluster unreachable, no leader, a timeout).
pub type EtcdResult<T> = Result<T, etcd_client::Error>;

/// Where every job's term key and notices are: one prefix, so that one watch per host hears
/// every job's release and lapse and every notice ([`notices`]), and no guest write.
const JOBS: &str = "lh/{jobs}/";

/// The key of `job`'s term, `lh/{jobs}/lease/<job>`. A job name holds no `/`, `{` or `}` (the
/// host's job names are `a-z 0-9 - _`), so no job's keys fall under another's, nor under the
/// prefixes of the store's own (`lh/{jobs}/`, `lh/{members}/`).
fn lease_key(job: &str) -> EtcdResult<String> {
    if job.is_empty() || job.contains(['/', '{', '}']) {
        return Err(etcd_client::Error::InvalidArgs(format!(
            "job name {job:?}: empty or with a '/', '{{' or '}}'"
        )));
    }
    Ok(format!("{JOBS}lease/{job}"))
}

/// The etcd key of the job's key `rest`, as the Redis store names it without the job's prefix
/// (`lh:{job}:<rest>` there, `lh/<job>/<rest>` here).
fn job_key(job: &str, rest: &str) -> EtcdResult<String> {
    lease_key(job)?;
    Ok(format!("lh/{job}/{rest}"))
}

/// The etcd key of `member` of the job's set or hash `collection` (`open`, `runs`,
/// `requests`): one key per member, under `lh/<job>/<collection>/`. No key of the job's own
/// has a `/` right after a collection's name, so a prefix read of the collection finds only
/// its members.
fn member_key(job: &str, collection: &str, member: &str) -> EtcdResult<String> {
    lease_key(job)?;
    Ok(format!("lh/{job}/{collection}/{member}"))
}

fn data_key(job: &str, key: &str) -> EtcdResult<String> {
    job_key(job, &format!("data:{key}"))
}

/// `ttl` in whole seconds, rounded up, at least 1.
pub fn ttl_seconds(ttl: Duration) -> i64 {
    (ttl.as_millis().div_ceil(1000) as i64).max(1)
}

impl EtcdTerms {
    /// Connects to the cluster at `endpoints` (`http://host:port`); every request is answered
    /// within `timeout` or fails, and only by a member with a leader.
    pub async fn connect(endpoints: &[String], timeout: Duration) -> EtcdResult<Self> {
        Self::connect_with(endpoints, timeout, ConnectOptions::new()).await
    }

    /// [`EtcdTerms::connect`] with `options` (a user, from [`EtcdTerms::connect_url`]).
    async fn connect_with(
        endpoints: &[String],
        timeout: Duration,
        options: ConnectOptions,
    ) -> EtcdResult<Self> {
        let options = options
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_require_leader(true);
        let client = bounded(timeout, Client::connect(endpoints, Some(options))).await?;
        Ok(EtcdTerms {
            client,
            timeout,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            applied: Arc::default(),
            host: Arc::default(),
            base: Arc::default(),
        })
    }

    /// With a cluster whose `--max-txn-ops` is `ops` (writes needing more are refused before
    /// they are sent).
    pub fn with_max_txn_ops(mut self, ops: usize) -> Self {
        self.max_txn_ops = ops;
        self
    }
}

/// `op`, or a timed-out error after `limit` (a member that stopped answering mid-stream).
async fn bounded<T>(limit: Duration, op: impl Future<Output = EtcdResult<T>>) -> EtcdResult<T> {
    tokio::time::timeout(limit, op).await.unwrap_or_else(|_| {
        Err(etcd_client::Error::IoError(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("etcd did not answer within {limit:?}"),
        )))
    })
}

/// Attempts of a request that was never sent ([`never_sent`]): the client's balancer picks
/// another member for each, so with one member of three down, all three fail one time in 27
/// or less.
const UNSENT_ATTEMPTS: usize = 3;

/// Whether `e` says the request never left this host: the connection to the member the
/// client's balancer picked was refused. A member that is down stays in the balancer
/// (tonic's, under etcd-client), which goes on sending a share of requests there; such a
/// request may be sent again, whatever it does, since no member saw it. Read from the error's
/// chain of causes (an I/O error of kind `ConnectionRefused` under a gRPC `Unavailable`),
/// never from its text.
fn never_sent(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = e else {
        return false;
    };
    if status.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut cause = std::error::Error::source(status);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = c.source();
    }
    false
}

impl EtcdTerms {
    /// `op` on a clone of the client, answered within the client's timeout, and made again (up
    /// to [`UNSENT_ATTEMPTS`] in all, within the same timeout) while it was [`never_sent`]: for
    /// the requests a term lives by (a campaign and its lease, a heartbeat, a fenced write, a
    /// release, a term's end), so that a member whose port refuses connections costs them no
    /// failure. A member that does not answer at all (its machine gone, no refusal) still
    /// costs a request sent there its timeout.
    async fn resent<T, F, Fut>(&self, mut op: F) -> EtcdResult<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = EtcdResult<T>>,
    {
        let attempts = async {
            let mut tried = 0;
            loop {
                tried += 1;
                match op(self.client.clone()).await {
                    Err(e) if tried < UNSENT_ATTEMPTS && never_sent(&e) => continue,
                    answer => return answer,
                }
            }
        };
        bounded(self.timeout, attempts).await
    }

    /// `txn`, [`EtcdTerms::resent`] while it was never sent.
    async fn txn(&self, txn: Txn) -> EtcdResult<etcd_client::TxnResponse> {
        self.resent(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// A keep-alive of `lease` (the stream opened, one keep-alive sent and its answer read),
    /// [`EtcdTerms::resent`] while it was never sent.
    async fn keep_alive_once(&self, lease: i64) -> EtcdResult<()> {
        self.resent(|mut c| async move { c.lease_keep_alive(lease).await.map(|_| ()) })
            .await
    }
}

/// The owner and create revision of the lease key a transaction's `get` returned.
fn holder_of(replies: &[TxnOpResponse]) -> Option<(String, i64)> {
    replies.iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .filter(|kv| kv.key() != tokens::BASE.as_bytes())
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.create_revision(),
                )
            }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_to_a_member_that_refuses_the_connection_was_never_sent() {
        // A port nobody listens on: the connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let client = Client::connect([endpoint], None).await.unwrap();
        let refused = client.kv_client().get("k", None).await.unwrap_err();
        assert!(never_sent(&refused), "{refused:?}");
        let timed_out = etcd_client::Error::IoError(std::io::ErrorKind::TimedOut.into());
        assert!(!never_sent(&timed_out));
        let no_leader = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("no leader"));
        assert!(!never_sent(&no_leader));
    }

    #[test]
    fn ttls_are_whole_seconds_rounded_up_and_at_least_one() {
        assert_eq!(ttl_seconds(Duration::from_millis(100)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(10)), 10);
    }
}
