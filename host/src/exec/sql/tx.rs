//! A guest's transaction ([`Tx`]): begun with the fence, one statement at a time within the
//! job's limits, committed only while the term leads, cancelled and closed on any other end.

use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use tokio_postgres::Statement;

use super::pool::{Conn, Pooled};
use super::statement::run_statement;
use super::{Database, SqlError, SqlLimits, Value, fence, guard};
use crate::coord::term::Term;

/// What a statement returned: its columns, its rows, and how many rows it returned or (asked
/// for a count) changed.
pub type Ran = (Vec<String>, Vec<Vec<Value>>, u64);

/// An open, fenced transaction of one job's term on one database.
pub struct Tx {
    /// The job's name for the database.
    pub name: String,
    conn: Option<Pooled>,
    term: Term,
    limits: SqlLimits,
    /// A statement was sent and its answer not read: the connection cannot be reused.
    in_flight: bool,
    /// Why the transaction is over, once it is.
    ended: Option<String>,
}

impl Tx {
    /// Begins a transaction on `db` for `job`'s `term` and raises the database's fence to the
    /// term's token (see the module doc), all within the statement time: one round trip (two at
    /// a connection's first transaction, which prepares the fence call). The fence's answer is
    /// read before this returns.
    pub async fn begin(
        name: &str,
        db: &Arc<Database>,
        job: &str,
        term: &Term,
        limits: SqlLimits,
    ) -> Result<Tx, SqlError> {
        let (mut tx, fence_call, params) = Tx::open(name, db, job, term, limits).await?;
        let wait = limits.statement_time;
        // One round trip: the batch, then the fence call pipelined behind it (both are sent
        // before either answer is read).
        let reply = {
            let client = &tx.conn.as_mut().expect("an open transaction").conn().client;
            let (p1, p2, p3, p4, p5) = &params;
            let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [p1, p2, p3, p4, p5];
            tokio::time::timeout(wait, async {
                tokio::join!(
                    biased;
                    client.batch_execute(fence::BEGIN_BATCH),
                    client.query_one(&fence_call, &args),
                )
            })
            .await
        };
        let Ok((begun, fenced)) = reply else {
            tx.cancel();
            return Err(not_begun(db, wait));
        };
        tx.in_flight = false;
        if let Err(e) = fence::answer(db, job, term, wait, begun, fenced) {
            tx.rollback().await;
            return Err(e);
        }
        Ok(tx)
    }

    /// One statement in a transaction of its own, committed: [`Tx::begin`], [`Tx::run`] and
    /// [`Tx::commit`] in two round trips instead of three. The BEGIN batch, the fence call and
    /// the statement are sent together; the statement runs after the fence in the same
    /// transaction, and only writes when the fence was raised: a refused fence makes the
    /// transaction read-only before the statement runs ([`fence::FENCE_CALL`]), a fence that
    /// raised an error aborts it, and the connection's own default is read-only, so a statement
    /// outside the transaction (its BEGIN failed) cannot write either. The host reads the
    /// fence's answer, then the statement's, and sends COMMIT only when both succeeded and the
    /// term still leads. The host's timer gives the fence twice the statement time (its row may
    /// be held by another term's transaction), then the statement its statement time from the
    /// fence's answer; a fence that refused the term is reported as `fenced` even when the
    /// statement behind it timed out.
    #[allow(clippy::too_many_arguments)]
    pub async fn single(
        name: &str,
        db: &Arc<Database>,
        job: &str,
        term: &Term,
        limits: SqlLimits,
        statement: &str,
        params: &[Value],
        count: bool,
    ) -> Result<Ran, SqlError> {
        guard::check(statement).map_err(SqlError::Refused)?;
        let (mut tx, fence_call, fence_params) = Tx::open(name, db, job, term, limits).await?;
        let limit = limits.statement_time;
        // When the fence answered, and the row's token if it refused this term.
        let (answered, refused) = (OnceLock::new(), OnceLock::new());
        let fence_done = Notify::new();
        let reply = {
            let Conn {
                client, statements, ..
            } = tx.conn.as_mut().expect("an open transaction").conn();
            let client = &*client;
            let (p1, p2, p3, p4, p5) = &fence_params;
            let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [p1, p2, p3, p4, p5];
            let (answered, refused, fence_done) = (&answered, &refused, &fence_done);
            // Sent in this order at the first poll: BEGIN, the fence, then the statement (or
            // its PREPARE, whose EXECUTE follows the fence's answer).
            let work = async {
                tokio::join!(
                    biased;
                    client.batch_execute(fence::BEGIN_BATCH),
                    async {
                        let r = client.query_one(&fence_call, &args).await;
                        if let Ok(row) = &r
                            && let (Ok(false), Ok(stored)) =
                                (row.try_get::<_, bool>(0), row.try_get::<_, i64>(1))
                        {
                            let _ = refused.set(stored);
                        }
                        let _ = answered.set(Instant::now());
                        fence_done.notify_one();
                        r
                    },
                    run_statement(client, statements, statement, params, count, &limits),
                )
            };
            tokio::pin!(work);
            // The host's timer: twice the statement time for the fence (its row may be held by
            // another term's transaction), then the statement time from the fence's answer.
            let start = Instant::now();
            loop {
                let deadline = answered.get().map_or(start + limit * 2, |at| *at + limit);
                tokio::select! {
                    biased;
                    r = &mut work => break Some(r),
                    _ = fence_done.notified(), if answered.get().is_none() => {}
                    _ = tokio::time::sleep_until(deadline.into()) => break None,
                }
            }
        };
        let Some((begun, fenced, ran)) = reply else {
            tx.cancel();
            return Err(match (refused.get(), answered.get()) {
                (Some(stored), _) => SqlError::Fenced {
                    database: db.name().to_string(),
                    token: term.token(),
                    stored: (*stored).max(0) as u64,
                },
                (None, Some(_)) => SqlError::Timeout(limit),
                (None, None) => not_begun(db, limit * 2),
            });
        };
        tx.in_flight = false;
        // The fence first: a statement refused because the fence was (read-only, or the
        // transaction aborted) is reported as the fence's refusal.
        if let Err(e) = fence::answer(db, job, term, limit, begun, fenced) {
            tx.rollback().await;
            return Err(e);
        }
        match ran {
            Ok(out) => tx.commit().await.map(|()| out),
            Err(e) => {
                tx.end(&format!("{e}")).await;
                Err(e)
            }
        }
    }

    /// A connection taken for `job`'s `term`, with the fence call prepared on it and its
    /// parameters: a transaction not yet begun (in flight: dropped, its connection is closed).
    async fn open(
        name: &str,
        db: &Arc<Database>,
        job: &str,
        term: &Term,
        limits: SqlLimits,
    ) -> Result<(Tx, Statement, fence::FenceParams), SqlError> {
        if !term.still_leader() {
            return Err(SqlError::NotLeader);
        }
        let wait = limits.statement_time;
        let conn = db.take(wait).await?;
        let mut tx = Tx {
            name: name.to_string(),
            conn: Some(conn),
            term: term.clone(),
            limits,
            in_flight: true,
            ended: None,
        };
        let params = match fence::fence_params(job, term.token(), term.owner(), wait, limits.idle) {
            Ok(p) => p,
            Err(e) => {
                tx.cancel();
                return Err(SqlError::Unavailable(e));
            }
        };
        let conn = tx.conn.as_mut().expect("an open transaction").conn();
        // The fence call is prepared once per connection (a round trip the first time).
        let prepared = match conn.fence.clone() {
            Some(s) => Ok(s),
            None => {
                match tokio::time::timeout(wait, conn.client.prepare(fence::FENCE_CALL)).await {
                    Ok(Ok(s)) => {
                        conn.fence = Some(s.clone());
                        Ok(s)
                    }
                    Ok(Err(e)) => Err(SqlError::from_pg(e, wait)),
                    Err(_) => Err(SqlError::Timeout(wait)),
                }
            }
        };
        match prepared {
            Ok(s) => Ok((tx, s, params)),
            Err(e) => {
                // Nothing of a transaction was sent: the connection is dropped all the same
                // (a prepare cut off by the timer may still be answered).
                tx.cancel();
                Err(match e {
                    SqlError::Timeout(_) => SqlError::Unavailable(format!(
                        "database {} did not prepare the fence call within {wait:?}",
                        db.name()
                    )),
                    other => other,
                })
            }
        }
    }

    /// Runs one statement and returns its rows, or with `count`, only how many rows it changed.
    pub async fn run(
        &mut self,
        statement: &str,
        params: &[Value],
        count: bool,
    ) -> Result<Ran, SqlError> {
        if let Some(why) = &self.ended {
            return Err(SqlError::Refused(format!(
                "the transaction has ended ({why}): begin another"
            )));
        }
        guard::check(statement).map_err(SqlError::Refused)?;
        if !self.term.still_leader() {
            self.end("the term ended").await;
            return Err(SqlError::NotLeader);
        }
        let limit = self.limits.statement_time;
        self.in_flight = true;
        let res = tokio::time::timeout(limit, self.send(statement, params, count)).await;
        let res = match res {
            Err(_) => {
                self.cancel();
                self.ended = Some(format!("a statement was cancelled after {limit:?}"));
                return Err(SqlError::Timeout(limit));
            }
            Ok(r) => r,
        };
        self.in_flight = false;
        match res {
            Ok(out) => Ok(out),
            Err(e) => {
                self.end(&format!("{e}")).await;
                Err(e)
            }
        }
    }

    async fn send(
        &mut self,
        statement: &str,
        params: &[Value],
        count: bool,
    ) -> Result<Ran, SqlError> {
        let limits = self.limits;
        let Conn {
            client, statements, ..
        } = self.conn.as_mut().expect("an open transaction").conn();
        run_statement(client, statements, statement, params, count, &limits).await
    }

    /// Commits, once the term is checked to lead still (otherwise rolls back: `not-leader`).
    pub async fn commit(mut self) -> Result<(), SqlError> {
        if let Some(why) = &self.ended {
            return Err(SqlError::Refused(format!(
                "the transaction has ended ({why}): nothing to commit"
            )));
        }
        if !self.term.still_leader() {
            self.end("the term ended").await;
            return Err(SqlError::NotLeader);
        }
        let limit = self.limits.statement_time;
        self.in_flight = true;
        let client = &self
            .conn
            .as_mut()
            .expect("an open transaction")
            .conn()
            .client;
        match tokio::time::timeout(limit, client.batch_execute("COMMIT")).await {
            Err(_) => {
                self.cancel();
                Err(SqlError::Unavailable(format!(
                    "COMMIT was not answered within {limit:?}: it may or may not have been applied"
                )))
            }
            Ok(Err(e)) if e.as_db_error().is_none() => {
                self.cancel();
                let idle = if e.is_closed() {
                    format!(
                        " (the database ends a transaction idle for longer than {:?} between statements)",
                        self.limits.idle
                    )
                } else {
                    String::new()
                };
                Err(SqlError::Unavailable(format!(
                    "{e}: the COMMIT may or may not have been applied{idle}"
                )))
            }
            Ok(Err(e)) => {
                // The database refused the COMMIT (a deferred constraint, a serialization
                // failure): nothing was applied.
                self.in_flight = false;
                self.end("the COMMIT failed").await;
                Err(SqlError::from_pg(e, limit))
            }
            Ok(Ok(())) => {
                self.in_flight = false;
                self.ended = Some("committed".into());
                if let Some(c) = self.conn.take() {
                    c.give_back();
                }
                Ok(())
            }
        }
    }

    /// Ends the transaction with `why`, rolling it back.
    async fn end(&mut self, why: &str) {
        self.ended = Some(why.to_string());
        self.rollback().await;
    }

    /// Rolls back and gives the connection back (or closes it if the rollback fails).
    pub async fn rollback(&mut self) {
        if self.in_flight {
            self.cancel();
            return;
        }
        self.ended.get_or_insert_with(|| "rolled back".into());
        if let Some(mut c) = self.conn.take() {
            let wait = self.limits.statement_time;
            let ok = tokio::time::timeout(wait, c.conn().client.batch_execute("ROLLBACK"))
                .await
                .is_ok_and(|r| r.is_ok());
            if ok {
                c.give_back();
            }
        }
    }

    /// Cancels what the connection is running and closes it: the database rolls back.
    fn cancel(&mut self) {
        self.ended.get_or_insert_with(|| "cancelled".into());
        if let Some(mut c) = self.conn.take() {
            c.cancel_running();
            drop(c);
        }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        // Dropped open (a guest's drop is handled by `rollback`; this is a step stopped mid-way,
        // or the store dropped): cancel and close, and the database rolls back.
        if self.conn.is_some() {
            self.cancel();
        }
    }
}

/// The error of a BEGIN batch and fence call that were not answered within `wait`.
fn not_begun(db: &Database, wait: Duration) -> SqlError {
    SqlError::Unavailable(format!(
        "database {} did not begin the transaction within {wait:?} (the fence's row may be held by another term's transaction)",
        db.name()
    ))
}
