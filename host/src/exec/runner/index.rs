//! The leader's bookkeeping of which periods exist: the schedule it publishes for `trigger`,
//! the run index it keeps, and the period a run id names (in the schedule, or in the record of
//! a run of an earlier schedule), refusing a request that names none.

use super::*;
use crate::coord::term_store::Store;

impl Runner {
    /// Publishes the schedule this term runs (`lh:{job}:schedule`, a fenced write) unless
    /// `published` says it already has: `leasehold trigger` checks periods against it.
    pub(super) async fn publish_schedule(
        &self,
        term: &Term,
        published: &mut Option<String>,
    ) -> Result<(), RunEnd> {
        let schedule = &self.job.spec.schedule;
        let value = serde_json::json!({
            "schedule": schedule.expr(),
            "time_zone": schedule.tz().name(),
        })
        .to_string();
        if published.as_ref() == Some(&value) {
            return Ok(());
        }
        let sets = [(self.keys.schedule(), value.as_bytes())];
        match self.fenced(term, TermWrite::new(&sets, &[])).await {
            Ok(()) => {
                *published = Some(value);
                Ok(())
            }
            Err(RunEnd::Lost) => Err(RunEnd::Lost),
            Err(e) => {
                warn!("cannot publish the job's schedule: {}", e.why());
                Ok(())
            }
        }
    }

    /// Adds every run record of the job to its run index (`lh:{job}:runs`), with the marker that
    /// says it is built, in fenced writes of `term`: once per job, for records written before
    /// the index existed (every record written since is indexed with its write). A `fresh` job
    /// (no cursor, no open run: never accounted for) has none, and only gets the marker; for
    /// the others the records are found with a `SCAN` of the job's node (on one Redis node, the
    /// whole keyspace: once per job, after an upgrade).
    pub(super) async fn index_runs(&self, term: &Term, fresh: bool) -> Result<(), RunEnd> {
        let mut periods = match &self.store {
            Store::Redis(_) if !fresh => {
                let mut conn = self
                    .store
                    .redis_conn()
                    .map_err(|e| RunEnd::Interrupted(format!("{e:#}")))?;
                self.in_term(term, runs::unindexed(&mut conn, &self.keys))
                    .await?
            }
            // An etcd store has no record from before the index: its every record was indexed
            // with its write.
            _ => Vec::new(),
        };
        if !periods.is_empty() {
            info!(
                records = periods.len(),
                "indexing the job's run records written before the run index"
            );
        }
        // The marker goes with the last chunk: a crash before it means indexing again.
        periods.push(runs::INDEXED.to_string());
        for chunk in periods.chunks(1000) {
            let book = Bookkeeping {
                runs_add: chunk,
                ..Bookkeeping::default()
            };
            self.fenced(term, TermWrite::new(&[], &[]).with(book))
                .await?;
        }
        Ok(())
    }

    /// The period `id` names in the job's schedule, or, for a period of an earlier schedule
    /// that has a run record (open when the schedule changed, or final and asked for again),
    /// the period its record names: the run goes on under the period it fired for. A period
    /// that is neither (a bad request) is dropped from the open index and its request cleared
    /// (fenced), with a warning.
    pub(super) async fn period_of(
        &self,
        term: &Term,
        id: &str,
        request: Option<&Request>,
    ) -> Option<Period> {
        let schedule = &self.job.spec.schedule;
        if let Some(p) = schedule.period_by_id(id) {
            // A period is run at or after its fire time: a request for one still to come
            // (written before any leader published the schedule) is refused, not run early.
            if request.is_some() && p.fire.with_timezone(&chrono::Utc) > chrono::Utc::now() {
                let why = format!(
                    "{id} fires at {}, in the future: a period runs at or after its fire time; the request was refused",
                    p.fire.to_rfc3339()
                );
                warn!(period = %id, "{why}");
                if let Err(e) = self.refuse(term, id, request, why).await {
                    warn!(period = %id, "cannot record the refusal: {}", e.why());
                }
                return None;
            }
            return Some(p);
        }
        match term
            .bound(runs::read_from(&self.store, &self.keys, id))
            .await
        {
            None => return None,
            Some(Ok(Some(record))) => {
                if let Some(p) = schedule.period_of_record(id, &record.scheduled_at) {
                    if !record.status.is_final() || request.is_some() {
                        info!(period = %id, status = record.status.as_str(), "period of an earlier schedule: its run goes on under the period it fired for (the schedule is now {:?}, {})", schedule.expr(), schedule.tz());
                    }
                    return Some(p);
                }
            }
            Some(Ok(None)) => {}
            // A corrupt record is moved aside by the run (which reads only the period's id).
            Some(Err(runs::RecordError::Corrupt { .. })) => {
                return Some(crate::exec::spec::Period {
                    id: id.to_string(),
                    fire: chrono::Utc::now().with_timezone(&schedule.tz()),
                    local: chrono::Utc::now().naive_utc(),
                });
            }
            Some(Err(e)) => {
                warn!(period = %id, "cannot read the period's record: {e}");
                return None;
            }
        }
        let why = format!(
            "{id} is not a period of schedule {:?} ({}) and has no run record: the request was refused",
            schedule.expr(),
            schedule.tz()
        );
        warn!(period = %id, "{why}");
        if let Err(e) = self.refuse(term, id, request, why).await {
            warn!(period = %id, "cannot record the refusal: {}", e.why());
        }
        None
    }

    /// Records the refusal of `request` for `id` where the operator looks (the run history,
    /// `lh:{job}:refused:<id>`), takes `id` out of the open index and clears the request, in
    /// one fenced write of `term`.
    pub(super) async fn refuse(
        &self,
        term: &Term,
        id: &str,
        request: Option<&Request>,
        why: String,
    ) -> Result<(), RunEnd> {
        let now = now_rfc3339();
        let record = runs::RunRecord {
            token: term.token(),
            node: self.node.clone(),
            component: self.job.hash.clone(),
            error: Some(why),
            ..runs::RunRecord::refused(id, &now)
        };
        let json = serde_json::to_vec(&record).expect("run records serialize");
        let sets = [(self.keys.refused(id), json.as_slice())];
        let ids = [id.to_string()];
        let clear: Vec<(String, String)> = request
            .map(|r| (id.to_string(), r.id.clone()))
            .into_iter()
            .collect();
        let book = Bookkeeping {
            open_remove: &ids,
            runs_add: &ids,
            clear_requests: &clear,
            ..Bookkeeping::default()
        };
        self.fenced(term, TermWrite::new(&sets, &[]).with(book))
            .await
    }
}
