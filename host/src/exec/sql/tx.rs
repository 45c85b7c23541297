//! A guest's transaction ([`Tx`]): begun with the fence, one statement at a time within the
//! job's limits, committed only while the term leads, cancelled and closed on any other end.

use std::sync::Arc;

use super::pool::{Pooled, STATEMENTS_KEPT};
use super::{Database, SqlError, SqlLimits, Value, fence, guard, value};
use crate::coord::term::Term;

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
    /// term's token (see the module doc), all within the statement time.
    pub async fn begin(
        name: &str,
        db: &Arc<Database>,
        job: &str,
        term: &Term,
        limits: SqlLimits,
    ) -> Result<Tx, SqlError> {
        if !term.still_leader() {
            return Err(SqlError::NotLeader);
        }
        let wait = limits.statement_time;
        let mut conn = db.take(wait).await?;
        let mut tx = Tx {
            name: name.to_string(),
            conn: None,
            term: term.clone(),
            limits,
            in_flight: true,
            ended: None,
        };
        let params = fence::fence_params(job, term.token(), term.owner(), wait, limits.idle)
            .map_err(SqlError::Unavailable)?;
        // The fence call is prepared once per connection (a round trip the first time).
        let prepared = match conn.conn().fence.clone() {
            Some(s) => Ok(s),
            None => match tokio::time::timeout(wait, conn.conn().client.prepare(fence::FENCE_CALL))
                .await
            {
                Ok(Ok(s)) => {
                    conn.conn().fence = Some(s.clone());
                    Ok(s)
                }
                Ok(Err(e)) => Err(SqlError::from_pg(e, wait)),
                Err(_) => Err(SqlError::Timeout(wait)),
            },
        };
        let stmt = match prepared {
            Ok(s) => s,
            Err(e) => {
                // Nothing of a transaction was sent: the connection is dropped all the same
                // (a prepare cut off by the timer may still be answered).
                tx.conn = Some(conn);
                tx.cancel();
                return Err(match e {
                    SqlError::Timeout(_) => SqlError::Unavailable(format!(
                        "database {} did not prepare the fence call within {wait:?}",
                        db.name()
                    )),
                    other => other,
                });
            }
        };
        // One round trip: the batch, then the fence call pipelined behind it (both are sent
        // before either answer is read).
        let reply = {
            let client = &conn.conn().client;
            let (p1, p2, p3, p4, p5) = &params;
            let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [p1, p2, p3, p4, p5];
            tokio::time::timeout(wait, async {
                tokio::join!(
                    client.batch_execute(fence::BEGIN_BATCH),
                    client.query_one(&stmt, &args),
                )
            })
            .await
        };
        tx.conn = Some(conn);
        let row = match reply {
            Err(_) => {
                tx.cancel();
                return Err(SqlError::Unavailable(format!(
                    "database {} did not begin the transaction within {wait:?} (the fence's row may be held by another term's transaction)",
                    db.name()
                )));
            }
            Ok((begun, fenced)) => {
                tx.in_flight = false;
                match begun.and(fenced) {
                    Ok(row) => row,
                    Err(e) => {
                        let not_registered = e
                            .as_db_error()
                            .is_some_and(|d| d.code().code() == fence::NOT_REGISTERED);
                        tx.rollback().await;
                        if not_registered {
                            return Err(SqlError::NotGranted(format!(
                                "database {} has no fence row for job {job} and the host's role: run `leasehold db init URL --role ROLE --job {job}`",
                                db.name()
                            )));
                        }
                        return Err(match SqlError::from_pg(e, wait) {
                            SqlError::Timeout(_) => SqlError::Unavailable(format!(
                                "database {} did not lock the fence's row within {wait:?}",
                                db.name()
                            )),
                            other => other,
                        });
                    }
                }
            }
        };
        let raised: Option<bool> = row.try_get(0).ok();
        let stored: Option<i64> = row.try_get(1).ok();
        match (raised, stored) {
            (Some(true), Some(_)) => Ok(tx),
            (Some(false), Some(stored)) => {
                tx.rollback().await;
                Err(SqlError::Fenced {
                    database: db.name().to_string(),
                    token: term.token(),
                    stored: stored.max(0) as u64,
                })
            }
            _ => {
                tx.rollback().await;
                Err(SqlError::Unavailable(format!(
                    "database {}: the fence function gave no answer",
                    db.name()
                )))
            }
        }
    }

    /// Runs one statement and returns its rows, or with `count`, only how many rows it changed.
    pub async fn run(
        &mut self,
        statement: &str,
        params: &[Value],
        count: bool,
    ) -> Result<(Vec<String>, Vec<Vec<Value>>, u64), SqlError> {
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
    ) -> Result<(Vec<String>, Vec<Vec<Value>>, u64), SqlError> {
        let limit = self.limits.statement_time;
        let (rows_cap, bytes_cap) = (self.limits.rows, self.limits.result_bytes);
        let conn = self.conn.as_mut().expect("an open transaction").conn();
        let stmt = match conn.statements.get(statement) {
            Some(s) => s.clone(),
            None => {
                let s = conn
                    .client
                    .prepare(statement)
                    .await
                    .map_err(|e| SqlError::from_pg(e, limit))?;
                if conn.statements.len() >= STATEMENTS_KEPT {
                    conn.statements.clear();
                }
                conn.statements.insert(statement.to_string(), s.clone());
                s
            }
        };
        if stmt.params().len() != params.len() {
            return Err(SqlError::Refused(format!(
                "the statement takes {} parameters and {} were given",
                stmt.params().len(),
                params.len()
            )));
        }
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            params.iter().map(|p| p as _).collect();
        if count {
            let n = conn
                .client
                .execute(&stmt, &refs)
                .await
                .map_err(|e| SqlError::from_pg(e, limit))?;
            return Ok((Vec::new(), Vec::new(), n));
        }
        let columns: Vec<String> = stmt
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        let stream = conn
            .client
            .query_raw(&stmt, refs)
            .await
            .map_err(|e| SqlError::from_pg(e, limit))?;
        use futures_util::TryStreamExt as _;
        let mut stream = std::pin::pin!(stream);
        let mut rows = Vec::new();
        let mut bytes = 0u64;
        while let Some(row) = stream
            .try_next()
            .await
            .map_err(|e| SqlError::from_pg(e, limit))?
        {
            if rows.len() as u64 >= rows_cap {
                return Err(SqlError::TooLarge(format!(
                    "more than the job's {rows_cap} rows per statement"
                )));
            }
            let mut values = Vec::with_capacity(columns.len());
            for i in 0..columns.len() {
                let v = value::column(&row, i).map_err(SqlError::Unsupported)?;
                bytes += v.size() as u64;
                values.push(v);
            }
            if bytes > bytes_cap {
                return Err(SqlError::TooLarge(format!(
                    "more than the job's {} per statement",
                    crate::units::show_size(bytes_cap)
                )));
            }
            rows.push(values);
        }
        let n = rows.len() as u64;
        Ok((columns, rows, n))
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
