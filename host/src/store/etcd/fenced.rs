//! A term's whole write on etcd: keys set and deleted, counted against the job's storage
//! quota, with the run bookkeeping that goes with them, all or nothing, and only while the
//! term holds the job — what the Redis store's fenced-write script does, on etcd's
//! transactions (`docs/store-contract.md`, section 2).
//!
//! **How.** A Redis script reads and writes in one step; etcd has no scripts, so a write is
//! *read, then compare and write*. One read-only transaction reads what the write depends on
//! (the term's key, the write's earlier answer when it has an id, the job's usage, the keys it
//! sets or deletes when their sizes or existence matter, the requests it may clear); then one
//! transaction compares the term's key's create revision with the term's token and every key
//! read with the revision it was read at, and applies the write only if none changed. When only
//! a key read changed (another writer of the same job, such as a task's worker), the write is
//! worked out again from a new read, at most [`ATTEMPTS`] times; when the term's key changed,
//! the write is refused.
//!
//! **Guarantees.** As the Redis script's, for a step's write: refused (nothing written) unless
//! the term still holds the job when etcd applies it (C1: on etcd the term's key is the fence,
//! so there is no separate fence to raise); `create` writes nothing if a key to set exists;
//! the quota counts keys and bytes (the full key, spelled as the Redis store spells it so that
//! both stores count the same, plus the value) and refuses a write only in a dimension it grows;
//! a deleted key comes off the count; a request is cleared only while it still carries the id
//! that was served; a write with an id answers a resend of itself as it answered first (its
//! answer kept for 60–90 s under a lease the client shares between writes).
//!
//! **Not here** (tasks are not on etcd yet): a task's write (a worker's claim) is refused with
//! an error, and a run's end has no queued tasks to end.
//!
//! **Costs.** Two round trips (three or more under contention); every key whose size counts is
//! read whole (etcd has no size-only read), so rewriting a large value reads it first. A write
//! is limited by etcd's own limits (`--max-txn-ops`, 128 by default, and `--max-request-bytes`,
//! 1.5 MiB): a write that needs more operations than [`EtcdTerms::max_txn_ops`] allows is refused
//! before it is sent, naming the flag.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::{EtcdResult, EtcdTerm, EtcdTerms, bounded, job_key, lease_key, member_key};

/// Reads and compares tried before a contended write gives up.
pub(super) const ATTEMPTS: usize = 16;

/// How long a write's answer is kept for a resend (at least; the shared lease lives up to half
/// as long again).
const APPLIED_TTL: Duration = Duration::from_secs(60);

/// What one write does. Keys are the job's keys as the Redis store names them without the
/// job's prefix (`data:<key>`, `run:<period>`, `cursor`, …: [`crate::store::keys::JobKeys::rest`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct EtcdWrite<'a> {
    /// `(key, value)` pairs to set.
    pub sets: &'a [(&'a str, &'a [u8])],
    /// Keys to delete.
    pub deletes: &'a [&'a str],
    /// Set nothing if a key to set exists.
    pub create: bool,
    /// Count the keys against `(keys, bytes)` (a guest's write).
    pub quota: Option<(u64, u64)>,
    /// The write's id, for an answer that depends on what it finds (`create`, `delete`).
    pub id: Option<&'a str>,
    /// Periods added to the open-runs index.
    pub open_add: &'a [String],
    /// Periods removed from it.
    pub open_remove: &'a [String],
    /// `(period, request id)`: each request cleared only while it still has that id.
    pub clear_requests: &'a [(String, String)],
    /// Periods added to the run index.
    pub runs_add: &'a [String],
}

/// What a write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Applied (or, for `create` that found a key, answered with nothing written).
    Applied {
        /// False when `create` found a key to set already there.
        created: bool,
        /// How many of the keys to delete existed.
        deleted: u32,
        /// `(keys, bytes)` the job keeps, for a write counted against its quota.
        usage: Option<(u64, u64)>,
    },
    /// Refused, nothing written: the term no longer holds the job.
    Refused {
        /// Who holds it now (owner and token), if anyone.
        holder: Option<(String, i64)>,
    },
    /// Refused, nothing written: past the quota; what the job would keep.
    Quota {
        /// Keys it would keep.
        keys: u64,
        /// Bytes it would keep.
        bytes: u64,
    },
}

/// A key as read: its revision (0 when absent) and its value.
#[derive(Clone, Debug, Default)]
struct Seen {
    revision: i64,
    value: Option<Vec<u8>>,
}

impl EtcdTerms {
    /// Applies `write` as `term` (the module doc says how, and what it guarantees).
    pub async fn write_all(
        &self,
        term: &EtcdTerm,
        write: &EtcdWrite<'_>,
    ) -> EtcdResult<WriteOutcome> {
        if term.revision <= 0 {
            return Ok(WriteOutcome::Refused { holder: None });
        }
        let job = term.job.as_str();
        let lease = lease_key(job)?;
        let applied = match write.id {
            Some(id) => Some(job_key(job, &format!("applied:{id}"))?),
            None => None,
        };
        let usage_key = job_key(job, "usage")?;
        // The keys whose revisions the write depends on: those it sets or deletes when their
        // sizes (quota), existence (`create`, the count of deletes) matter; and the requests it
        // may clear.
        let mut watched: Vec<String> = Vec::new();
        if write.quota.is_some() || write.create {
            for (k, _) in write.sets {
                watched.push(job_key(job, k)?);
            }
        }
        for k in write.deletes {
            watched.push(job_key(job, k)?);
        }
        let requests: Vec<String> = write
            .clear_requests
            .iter()
            .map(|(period, _)| member_key(job, "requests", period))
            .collect::<EtcdResult<_>>()?;
        let ops = 3
            + watched.len() * 2
            + requests.len() * 2
            + write.sets.len()
            + write.open_add.len()
            + write.open_remove.len()
            + write.runs_add.len();
        if ops > self.max_txn_ops {
            return Err(etcd_client::Error::InvalidArgs(format!(
                "a write of {ops} operations is over the {} etcd allows in one transaction (raise etcd's --max-txn-ops and the host's setting with it)",
                self.max_txn_ops
            )));
        }
        for _ in 0..ATTEMPTS {
            // Read what the write depends on.
            let mut reads = vec![TxnOp::get(lease.clone(), None)];
            reads.push(TxnOp::get(usage_key.clone(), None));
            if let Some(a) = &applied {
                reads.push(TxnOp::get(a.clone(), None));
            }
            for k in watched.iter().chain(&requests) {
                reads.push(TxnOp::get(k.clone(), None));
            }
            let got = self.txn(Txn::new().and_then(reads)).await?;
            let mut seen = got.op_responses().into_iter().map(seen_of);
            let mut next = || seen.next().unwrap_or_default();
            let (_lease, usage_seen) = (next(), next());
            let holder_rev = got
                .op_responses()
                .first()
                .and_then(|r| match r {
                    TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.create_revision()),
                    _ => None,
                })
                .unwrap_or(0);
            if holder_rev != term.revision {
                return Ok(WriteOutcome::Refused {
                    holder: holder_of_get(got.op_responses().first()),
                });
            }
            if applied.is_some() {
                let prior = next();
                if let Some(answer) = prior.value.as_deref().and_then(parse_answer) {
                    return Ok(answer);
                }
            }
            let watched_seen: Vec<Seen> = watched.iter().map(|_| next()).collect();
            let requests_seen: Vec<Seen> = requests.iter().map(|_| next()).collect();

            let mut compares = vec![Compare::create_revision(
                lease.clone(),
                CompareOp::Equal,
                term.revision,
            )];
            for (k, s) in watched
                .iter()
                .zip(&watched_seen)
                .chain(requests.iter().zip(&requests_seen))
            {
                compares.push(Compare::mod_revision(
                    k.clone(),
                    CompareOp::Equal,
                    s.revision,
                ));
            }
            let set_seen = |i: usize| -> Option<&Seen> {
                (write.quota.is_some() || write.create).then(|| &watched_seen[i])
            };
            let delete_seen = |i: usize| -> &Seen {
                let offset = if write.quota.is_some() || write.create {
                    write.sets.len()
                } else {
                    0
                };
                &watched_seen[offset + i]
            };
            let deleted = (0..write.deletes.len())
                .filter(|&i| delete_seen(i).value.is_some())
                .count() as u32;
            let mut then: Vec<TxnOp> = Vec::new();
            let answer = if write.create
                && (0..write.sets.len()).any(|i| set_seen(i).is_some_and(|s| s.value.is_some()))
            {
                WriteOutcome::Applied {
                    created: false,
                    deleted: 0,
                    usage: None,
                }
            } else {
                let mut usage = None;
                if let Some((max_keys, max_bytes)) = write.quota {
                    compares.push(Compare::mod_revision(
                        usage_key.clone(),
                        CompareOp::Equal,
                        usage_seen.revision,
                    ));
                    let full = |k: &str| (6 + job.len() + k.len()) as i64;
                    let (mut dkeys, mut dbytes) = (0i64, 0i64);
                    for (i, (k, v)) in write.sets.iter().enumerate() {
                        let old = set_seen(i).and_then(|s| s.value.as_ref());
                        match old {
                            None => {
                                dkeys += 1;
                                dbytes += full(k) + v.len() as i64;
                            }
                            Some(old) => dbytes += v.len() as i64 - old.len() as i64,
                        }
                    }
                    for (i, k) in write.deletes.iter().enumerate() {
                        if let Some(old) = &delete_seen(i).value {
                            dkeys -= 1;
                            dbytes -= full(k) + old.len() as i64;
                        }
                    }
                    let (keys0, bytes0) = usage_seen
                        .value
                        .as_deref()
                        .and_then(parse_usage)
                        .unwrap_or((0, 0));
                    let keys = (keys0 as i64 + dkeys).max(0) as u64;
                    let bytes = (bytes0 as i64 + dbytes).max(0) as u64;
                    if (dkeys > 0 && keys > max_keys) || (dbytes > 0 && bytes > max_bytes) {
                        return Ok(WriteOutcome::Quota { keys, bytes });
                    }
                    then.push(TxnOp::put(
                        usage_key.clone(),
                        format!("{keys} {bytes}"),
                        None,
                    ));
                    usage = Some((keys, bytes));
                }
                for (k, v) in write.sets {
                    then.push(TxnOp::put(job_key(job, k)?, *v, None));
                }
                for k in write.deletes {
                    then.push(TxnOp::delete(job_key(job, k)?, None));
                }
                for p in write.open_add {
                    then.push(TxnOp::put(member_key(job, "open", p)?, "", None));
                }
                for p in write.open_remove {
                    then.push(TxnOp::delete(member_key(job, "open", p)?, None));
                }
                for p in write.runs_add {
                    then.push(TxnOp::put(member_key(job, "runs", p)?, "", None));
                }
                for (((_, id), k), s) in write
                    .clear_requests
                    .iter()
                    .zip(&requests)
                    .zip(&requests_seen)
                {
                    let served = s.value.as_deref().is_some_and(|v| {
                        v == id.as_bytes()
                            || (v.len() > id.len()
                                && v.starts_with(id.as_bytes())
                                && v[id.len()] == b' ')
                    });
                    if served {
                        then.push(TxnOp::delete(k.clone(), None));
                    }
                }
                WriteOutcome::Applied {
                    created: true,
                    deleted,
                    usage,
                }
            };
            if let Some(a) = &applied {
                let lease = self.applied_lease().await?;
                then.push(TxnOp::put(
                    a.clone(),
                    encode_answer(&answer),
                    Some(PutOptions::new().with_lease(lease)),
                ));
            }
            let txn = Txn::new()
                .when(compares)
                .and_then(then)
                .or_else([TxnOp::get(lease.clone(), None)]);
            let reply = self.txn(txn).await?;
            if reply.succeeded() {
                return Ok(answer);
            }
            let responses = reply.op_responses();
            let now_rev = match responses.first() {
                Some(TxnOpResponse::Get(g)) => g.kvs().first().map_or(0, |kv| kv.create_revision()),
                _ => 0,
            };
            if now_rev != term.revision {
                return Ok(WriteOutcome::Refused {
                    holder: holder_of_get(responses.first()),
                });
            }
            // Only a key read changed: work the write out again.
        }
        Err(etcd_client::Error::InvalidArgs(format!(
            "a write of job {job} was contended by other writes {ATTEMPTS} times; nothing was written"
        )))
    }

    /// The lease a write's answer is kept under: one shared by every write, granted for one and
    /// a half times [`APPLIED_TTL`] and replaced once half of that has passed, so an answer lives
    /// at least [`APPLIED_TTL`].
    pub(super) async fn applied_lease(&self) -> EtcdResult<i64> {
        let renew_after = APPLIED_TTL / 2;
        if let Some((id, at)) = *self.applied.lock().expect("applied lease")
            && at.elapsed() < renew_after
        {
            return Ok(id);
        }
        let mut c = self.client.clone();
        let granted = bounded(
            self.timeout,
            c.lease_grant((APPLIED_TTL.as_secs() * 3 / 2) as i64, None),
        )
        .await?;
        *self.applied.lock().expect("applied lease") = Some((granted.id(), Instant::now()));
        Ok(granted.id())
    }
}

fn seen_of(r: TxnOpResponse) -> Seen {
    match r {
        TxnOpResponse::Get(g) => g.kvs().first().map_or_else(Seen::default, |kv| Seen {
            revision: kv.mod_revision(),
            value: Some(kv.value().to_vec()),
        }),
        _ => Seen::default(),
    }
}

fn holder_of_get(r: Option<&TxnOpResponse>) -> Option<(String, i64)> {
    match r {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
            )
        }),
        _ => None,
    }
}

/// `keys bytes`.
pub(super) fn parse_usage(v: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(v).ok()?;
    let (k, b) = text.split_once(' ')?;
    Some((k.parse().ok()?, b.parse().ok()?))
}

/// An applied write's answer, kept for a resend: `created deleted [keys bytes]`.
fn encode_answer(a: &WriteOutcome) -> String {
    match a {
        WriteOutcome::Applied {
            created,
            deleted,
            usage,
        } => match usage {
            Some((k, b)) => format!("{} {deleted} {k} {b}", u8::from(*created)),
            None => format!("{} {deleted}", u8::from(*created)),
        },
        // Only applied answers are kept.
        _ => String::new(),
    }
}

fn parse_answer(v: &[u8]) -> Option<WriteOutcome> {
    let text = std::str::from_utf8(v).ok()?;
    let mut words = text.split(' ');
    let created = words.next()? == "1";
    let deleted = words.next()?.parse().ok()?;
    let usage = match (words.next(), words.next()) {
        (Some(k), Some(b)) => Some((k.parse().ok()?, b.parse().ok()?)),
        _ => None,
    };
    Some(WriteOutcome::Applied {
        created,
        deleted,
        usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_kept_for_a_resend_read_back() {
        for a in [
            WriteOutcome::Applied {
                created: true,
                deleted: 0,
                usage: None,
            },
            WriteOutcome::Applied {
                created: false,
                deleted: 3,
                usage: Some((12, 3400)),
            },
        ] {
            assert_eq!(parse_answer(encode_answer(&a).as_bytes()), Some(a));
        }
        assert_eq!(parse_answer(b""), None);
        assert_eq!(parse_usage(b"3 40"), Some((3, 40)));
        assert_eq!(parse_usage(b"3"), None);
    }
}
