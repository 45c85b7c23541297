//! The history etcd applied, read back from its own revisions, and the fencing checker on it:
//! what [`crate::history`] is for Redis (where the history is recorded with `MONITOR`), for the
//! etcd store.
//!
//! **Reading.** etcd keeps every revision until it is compacted, and the harness's clusters
//! never compact: a watch of `lh/` from revision 1 replays every put and delete the hosts and
//! the CLI made, in the order etcd applied them ([`read`]). Events of one transaction share a
//! revision.
//!
//! **Checking** ([`check`], for one job and period), by replaying the events in order:
//! - the job's term key (`lh/{jobs}/lease/<job>`) created is a term whose token is the
//!   cluster's token base (`lh/{tokens}/base`, as last put) plus the key's create revision;
//!   deleted, no term holds the job. Each term's token is above every earlier one's.
//! - every put or delete of the job's data (`lh/<job>/data:…`) and run records
//!   (`lh/<job>/run:…`) is applied while a term holds the job, and is counted to that term
//!   (what the write's transaction compares); a data value that names its token (the billing
//!   guest's charges, [`check_with`]) must name that term's;
//! - every put of the period's run record carries the token of the term holding the job at
//!   its revision (the writer's own term: a record written under another term's fence is a
//!   violation), never below an earlier put's;
//! - exactly one put turns the record `done`, and none follows it.
//!
//! Deletes of data while no term holds the job pass (an operator's purge makes them). A
//! guest's data value carries no token unless the job writes one, so a data write is counted to
//! the term that held the job at its revision: what etcd's compare in the write checked, not
//! which host sent it.
//!
//! The checker's own tests feed it histories with each violation ([`tests`] below).

use etcd_client::{EventType, GetOptions, WatchOptions};
use serde_json::Value;

/// One put or delete etcd applied.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    /// The revision that applied it.
    pub(crate) revision: i64,
    pub(crate) key: String,
    /// The value put (empty for a delete).
    pub(crate) value: Vec<u8>,
    /// The key's create revision after a put (0 for a delete).
    pub(crate) create_revision: i64,
    pub(crate) deleted: bool,
}

/// A term as the history shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Term {
    pub(crate) token: i64,
    pub(crate) owner: String,
    /// The revision that created its key.
    pub(crate) from: i64,
}

/// What a history that passed [`check`] holds.
#[derive(Debug, Default)]
pub(crate) struct Checked {
    /// Every term of the job, oldest first.
    pub(crate) terms: Vec<Term>,
    /// For each term's token, how many of the job's data and run writes it made.
    pub(crate) writes: std::collections::BTreeMap<i64, usize>,
    /// The tokens of the period's run record puts, in order.
    pub(crate) run_tokens: Vec<i64>,
}

/// Every put and delete under `lh/` that the cluster at `endpoints` applied, in order, up to
/// its revision when asked. Every key the hosts write is under `lh/`, so the events reach that
/// revision. A read that fails (a request sent to a member that was killed) is made again from
/// the start, for up to 30 s.
pub(crate) async fn read(endpoints: &[String]) -> Vec<Event> {
    crate::harness::answered("etcd's history", || async {
        // An attempt on a member that stopped answering gives up, so that another is made.
        tokio::time::timeout(std::time::Duration::from_secs(10), read_once(endpoints))
            .await
            .unwrap_or_else(|_| Err(etcd_client::Error::WatchError("no answer in 10 s".into())))
    })
    .await
}

async fn read_once(endpoints: &[String]) -> Result<Vec<Event>, etcd_client::Error> {
    let mut c = etcd_client::Client::connect(endpoints, None).await?;
    let now = c
        .get("lh/", Some(GetOptions::new().with_count_only()))
        .await?
        .header()
        .expect("a response header")
        .revision();
    let options = WatchOptions::new().with_prefix().with_start_revision(1);
    let mut stream = c.watch("lh/", Some(options)).await?;
    let mut events = Vec::new();
    let mut seen = 0;
    while seen < now {
        let Some(answer) = stream.message().await? else {
            return Err(etcd_client::Error::WatchError("the watch ended".into()));
        };
        assert_eq!(answer.compact_revision(), 0, "the history was compacted");
        for e in answer.events() {
            let kv = e.kv().expect("an event's key");
            seen = seen.max(kv.mod_revision());
            events.push(Event {
                revision: kv.mod_revision(),
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                value: kv.value().to_vec(),
                create_revision: kv.create_revision(),
                deleted: e.event_type() == EventType::Delete,
            });
        }
    }
    events.retain(|e| e.revision <= now);
    Ok(events)
}

/// Checks `events` for `job`'s fencing and `period`'s one `done` (the module doc's rules); the
/// first violation found, with its revision, as the error.
pub(crate) fn check(events: &[Event], job: &str, period: &str) -> Result<Checked, String> {
    check_with(events, job, period, |_| None)
}

/// [`check`], where `data_token` reads the token a data value was written under, when the job
/// writes one (the billing guest's charges: [`leasehold_harness::fixtures::billing_charge_token`]):
/// such a write must be the holding term's, as a run record must.
pub(crate) fn check_with(
    events: &[Event],
    job: &str,
    period: &str,
    data_token: impl Fn(&[u8]) -> Option<i64>,
) -> Result<Checked, String> {
    let lease = format!("lh/{{jobs}}/lease/{job}");
    let fenced = [format!("lh/{job}/data:"), format!("lh/{job}/run:")];
    let record = format!("lh/{job}/run:{period}");
    let mut base: Option<i64> = None;
    let mut holder: Option<Term> = None;
    let mut checked = Checked::default();
    let mut done_puts = 0;
    let mut last_status = String::new();
    for e in events {
        let at = e.revision;
        if e.key == "lh/{tokens}/base" && !e.deleted {
            let v = String::from_utf8_lossy(&e.value);
            base = Some(v.parse().map_err(|_| format!("@{at}: token base {v:?}"))?);
        } else if e.key == lease {
            if e.deleted {
                holder = None;
            } else if holder.as_ref().is_none_or(|t| t.from != e.create_revision) {
                let base = base.ok_or(format!("@{at}: a term before any token base"))?;
                let term = Term {
                    token: base + e.create_revision,
                    owner: String::from_utf8_lossy(&e.value).into_owned(),
                    from: e.create_revision,
                };
                if let Some(last) = checked.terms.last()
                    && last.token >= term.token
                {
                    return Err(format!("@{at}: term {term:?} not above {last:?}"));
                }
                checked.terms.push(term.clone());
                holder = Some(term);
            }
        } else if fenced.iter().any(|p| e.key.starts_with(p.as_str())) {
            let Some(term) = &holder else {
                if e.deleted && e.key != record {
                    // An operator's purge deletes data without a term, by design.
                    continue;
                }
                return Err(format!("@{at}: {} written while no term held {job}", e.key));
            };
            *checked.writes.entry(term.token).or_default() += 1;
            if e.key != record {
                match data_token(&e.value) {
                    Some(token) if !e.deleted && token != term.token => {
                        return Err(format!(
                            "@{at}: {} written under term {token} while term {} held {job}",
                            e.key, term.token
                        ));
                    }
                    _ => continue,
                }
            }
            if e.deleted {
                return Err(format!("@{at}: the run record {record} deleted"));
            }
            let v: Value = serde_json::from_slice(&e.value)
                .map_err(|err| format!("@{at}: the run record does not parse: {err}"))?;
            let token = v["token"]
                .as_i64()
                .ok_or(format!("@{at}: no token in {v}"))?;
            if token != term.token {
                return Err(format!(
                    "@{at}: a run record of term {token} written while term {} held {job}: {v}",
                    term.token
                ));
            }
            if checked.run_tokens.last().is_some_and(|last| *last > token) {
                return Err(format!(
                    "@{at}: a run record of term {token} after a newer's"
                ));
            }
            checked.run_tokens.push(token);
            if last_status == "done" {
                return Err(format!("@{at}: a done run record rewritten as {v}"));
            }
            let status = v["status"].as_str().unwrap_or_default().to_string();
            if status == "done" {
                done_puts += 1;
            }
            last_status = status;
        }
    }
    if done_puts != 1 {
        return Err(format!("{done_puts} puts turned {record} done, not one"));
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A history builder: events at growing revisions.
    #[derive(Default)]
    struct H(Vec<Event>);

    impl H {
        fn put(mut self, key: &str, value: &str, create: Option<i64>) -> Self {
            let revision = self.0.len() as i64 + 1;
            self.0.push(Event {
                revision,
                key: key.into(),
                value: value.as_bytes().to_vec(),
                create_revision: create.unwrap_or(revision),
                deleted: false,
            });
            self
        }
        fn delete(mut self, key: &str) -> Self {
            let revision = self.0.len() as i64 + 1;
            self.0.push(Event {
                revision,
                key: key.into(),
                value: Vec::new(),
                create_revision: 0,
                deleted: true,
            });
            self
        }
        fn run(self, token: i64, status: &str) -> Self {
            let v = format!(r#"{{"token":{token},"status":"{status}"}}"#);
            self.put("lh/j/run:p", &v, None)
        }
    }

    const LEASE: &str = "lh/{jobs}/lease/j";

    /// A term at revision 2 (token 1002) crashes after its first step; its lease lapses and a
    /// term at revision 6 (token 1006) finishes the run.
    fn good() -> H {
        H::default()
            .put("lh/{tokens}/base", "0000000000001000", None)
            .put(LEASE, "a:1", None)
            .run(1002, "running")
            .put("lh/j/data:x", "1", None)
            .delete(LEASE)
            .put(LEASE, "b:1", None)
            .run(1006, "running")
            .run(1006, "done")
    }

    #[test]
    fn a_clean_failover_passes_with_each_terms_writes() {
        let c = check(&good().0, "j", "p").unwrap();
        let tokens: Vec<i64> = c.terms.iter().map(|t| t.token).collect();
        assert_eq!(tokens, [1002, 1006]);
        assert_eq!(c.writes[&1002], 2);
        assert_eq!(c.writes[&1006], 2);
        assert_eq!(c.run_tokens, [1002, 1006, 1006]);
    }

    #[test]
    fn an_old_terms_record_under_a_new_term_is_a_violation() {
        let h = good().run(1002, "running");
        let err = check(&h.0, "j", "p").unwrap_err();
        assert!(
            err.contains("of term 1002 written while term 1006"),
            "{err}"
        );
    }

    #[test]
    fn a_data_value_naming_another_terms_token_is_a_violation() {
        let token = |v: &[u8]| {
            let v = std::str::from_utf8(v).ok()?;
            leasehold_harness::fixtures::billing_charge_token(v).map(|t| t as i64)
        };
        let fine = good().put("lh/j/data:charge/p/c1", "100 token=1006 attempt=1", None);
        check_with(&fine.0, "j", "p", token).unwrap();
        let late = good().put("lh/j/data:charge/p/c1", "100 token=1002 attempt=1", None);
        let err = check_with(&late.0, "j", "p", token).unwrap_err();
        assert!(err.contains("under term 1002 while term 1006"), "{err}");
    }

    #[test]
    fn a_write_while_no_term_holds_the_job_is_a_violation() {
        let h = H::default()
            .put("lh/{tokens}/base", "0000000000001000", None)
            .put(LEASE, "a:1", None)
            .delete(LEASE)
            .put("lh/j/data:x", "late", None);
        let err = check(&h.0, "j", "p").unwrap_err();
        assert!(err.contains("while no term held"), "{err}");
    }

    #[test]
    fn a_second_done_or_none_is_a_violation() {
        let again = good().run(1006, "done");
        assert!(check(&again.0, "j", "p").unwrap_err().contains("rewritten"));
        let twice = good().run(1006, "running").run(1006, "done");
        assert!(check(&twice.0, "j", "p").unwrap_err().contains("rewritten"));
        let none = H::default()
            .put("lh/{tokens}/base", "0000000000001000", None)
            .put(LEASE, "a:1", None)
            .run(1002, "running");
        assert!(check(&none.0, "j", "p").unwrap_err().contains("0 puts"));
    }

    #[test]
    fn a_term_key_put_again_is_the_same_term_and_other_records_are_data() {
        // The term key put again with its create revision (2): still term 1002. Another
        // period's record is one of the term's writes, not checked as this period's.
        let h = H::default()
            .put("lh/{tokens}/base", "0000000000001000", None)
            .put(LEASE, "a:1", None)
            .put(LEASE, "a:1", Some(2))
            .put("lh/j/run:q", r#"{"token":1,"status":"done"}"#, None)
            .run(1002, "done");
        let c = check(&h.0, "j", "p").unwrap();
        assert_eq!(c.terms.len(), 1, "{:?}", c.terms);
        assert_eq!(c.writes[&1002], 2);
    }

    #[test]
    fn a_purge_deletes_data_without_a_term() {
        let h = good().delete(LEASE).delete("lh/j/data:x");
        check(&h.0, "j", "p").unwrap();
    }

    #[test]
    fn a_term_not_above_the_last_is_a_violation() {
        // The base lowered under a new term: its token falls below the old one's.
        let h = good()
            .delete(LEASE)
            .put("lh/{tokens}/base", "0000000000000001", None)
            .put(LEASE, "c:1", None);
        let err = check(&h.0, "j", "p").unwrap_err();
        assert!(err.contains("not above"), "{err}");
    }
}
