//! The `sql` import (world 0.4.2 and later): a guest's transactions on the databases its job is granted,
//! served by [`crate::exec::sql`], and what a fenced transaction does to the term.
//!
//! A refused fence ends the term as a refused Redis write does (the step ends as
//! `lost-leadership` with the refusal as its reason) and, first, raises the job's token counter
//! in Redis to the database's token, so the next term is granted a token the database accepts
//! (module doc of [`crate::exec::sql`], "Tokens ahead of Redis").

use std::collections::BTreeSet;
use std::sync::Arc;

use tracing::warn;
use wasmtime::component::Resource;

use super::HostState;
use super::bindings::leasehold::job::sql;
use crate::coord::checks::Refusal;
use crate::coord::term::Term;
use crate::coord::term_store::TermStore as _;
use crate::exec::sql::{Database, JobDatabases, Ran, SqlError, SqlLimits, Tx, Value};

/// A step's databases and its open transactions (one per database at a time).
#[derive(Clone)]
pub(crate) struct StepSql {
    pub(crate) dbs: JobDatabases,
    open: BTreeSet<String>,
}

impl StepSql {
    pub(crate) fn new(dbs: JobDatabases) -> Self {
        StepSql {
            dbs,
            open: BTreeSet::new(),
        }
    }
}

/// What a transaction of a step needs: the database, the job's limits, the term, the job.
struct Grant {
    db: Arc<Database>,
    limits: SqlLimits,
    term: Term,
    job: String,
}

fn param(v: sql::Value) -> Value {
    match v {
        sql::Value::Null => Value::Null,
        sql::Value::Boolean(b) => Value::Bool(b),
        sql::Value::Int(i) => Value::Int(i),
        sql::Value::Float(f) => Value::Float(f),
        sql::Value::Text(s) => Value::Text(s),
        sql::Value::Bytes(b) => Value::Bytes(b),
    }
}

fn value(c: Value) -> sql::Value {
    match c {
        Value::Null => sql::Value::Null,
        Value::Bool(b) => sql::Value::Boolean(b),
        Value::Int(i) => sql::Value::Int(i),
        Value::Float(f) => sql::Value::Float(f),
        Value::Text(s) => sql::Value::Text(s),
        Value::Bytes(b) => sql::Value::Bytes(b),
    }
}

fn guest_error(e: SqlError) -> sql::SqlError {
    let db = |d: crate::exec::sql::DbError| sql::DatabaseError {
        code: d.code,
        message: d.message,
        constraint: d.constraint,
        detail: d.detail,
    };
    match e {
        SqlError::NotGranted(m) => sql::SqlError::NotGranted(m),
        SqlError::Refused(m) => sql::SqlError::Refused(m),
        SqlError::Constraint(d) => sql::SqlError::Constraint(db(d)),
        SqlError::Database(d) => sql::SqlError::Database(db(d)),
        SqlError::Timeout(t) => sql::SqlError::Timeout(t.as_millis() as u64),
        SqlError::TooLarge(m) => sql::SqlError::TooLarge(m),
        SqlError::Unsupported(m) => sql::SqlError::Unsupported(m),
        e @ SqlError::Fenced { .. } => sql::SqlError::Fenced(e.to_string()),
        SqlError::NotLeader => sql::SqlError::NotLeader,
        SqlError::Unavailable(m) => sql::SqlError::Unavailable(m),
    }
}

fn rows(columns: Vec<String>, rows: Vec<Vec<Value>>) -> sql::Rows {
    sql::Rows {
        columns,
        rows: rows
            .into_iter()
            .map(|r| r.into_iter().map(value).collect())
            .collect(),
    }
}

impl HostState {
    /// What a transaction on the job's database `name` needs: the database, the job's limits,
    /// the term and the job's name; or why the job may not open one now.
    fn sql_grant(&mut self, name: &str) -> wasmtime::Result<Result<Grant, SqlError>> {
        let ctx = self.step()?;
        let (term, job) = (ctx.term.clone(), ctx.keys.job().to_string());
        let Some(step_sql) = self.sql.as_mut() else {
            return Ok(Err(SqlError::NotGranted(format!(
                "database {name}: this host has no databases (--database)"
            ))));
        };
        let Some(db) = step_sql.dbs.granted.get(name).cloned() else {
            return Ok(Err(SqlError::NotGranted(format!(
                "database {name} is not granted to job {job} (its databases: {}; a job declares its databases in its `databases` export, or its sidecar grants them, [sql.databases])",
                step_sql.dbs.names()
            ))));
        };
        if step_sql.open.contains(name) {
            return Ok(Err(SqlError::Refused(format!(
                "a transaction on database {name} is already open in this step: commit or drop it first"
            ))));
        }
        Ok(Ok(Grant {
            db,
            limits: step_sql.dbs.limits,
            term,
            job,
        }))
    }

    /// A transaction on the job's database `name`.
    async fn sql_begin(&mut self, name: &str) -> wasmtime::Result<Result<Tx, SqlError>> {
        let Grant {
            db,
            limits,
            term,
            job,
        } = match self.sql_grant(name)? {
            Ok(g) => g,
            Err(e) => return Ok(Err(e)),
        };
        let res = Tx::begin(name, &db, &job, &term, limits).await;
        if let Err(e) = &res {
            self.sql_fenced(e).await?;
        } else if let Some(s) = self.sql.as_mut() {
            s.open.insert(name.to_string());
        }
        Ok(res)
    }

    /// After a refused fence: the token counter raised above the database's, and the term ended.
    async fn sql_fenced(&mut self, e: &SqlError) -> wasmtime::Result<()> {
        let SqlError::Fenced {
            database,
            token,
            stored,
        } = e
        else {
            return Ok(());
        };
        let ctx = self.step()?;
        let holder = format!("database {database}");
        let refusal = if stored > token {
            Refusal::Stale {
                token: *token,
                fence_token: *stored,
                fence_holder: holder,
            }
        } else {
            Refusal::OtherHolder {
                token: *token,
                fence_holder: holder,
            }
        };
        // Raised before the term ends: the step stops at its next await once it has.
        let raise = ctx
            .term
            .bound(async { ctx.store.raise_tokens(ctx.keys.job(), *stored).await });
        match tokio::time::timeout(std::time::Duration::from_secs(5), raise).await {
            Ok(Some(Ok(true))) => warn!(
                token,
                database_token = stored,
                "database {database} holds a higher token than this term's (Redis lost its token counter, or another Redis is in use): raised the token counter to {stored} so that the next term writes"
            ),
            Ok(Some(Ok(false))) => {}
            Ok(Some(Err(err))) => {
                warn!(
                    token,
                    "cannot raise the token counter above database {database}'s token {stored}: {err}"
                )
            }
            Ok(None) | Err(_) => warn!(
                token,
                "raising the token counter above database {database}'s token {stored} did not finish"
            ),
        }
        ctx.term.end();
        self.refusal = Some(refusal);
        Ok(())
    }

    /// One statement in a transaction of its own, committed ([`Tx::single`]: two round trips).
    async fn sql_single(
        &mut self,
        database: String,
        statement: String,
        params: Vec<sql::Value>,
        count: bool,
    ) -> wasmtime::Result<Result<Ran, SqlError>> {
        // Refused statements are refused before a connection is taken or the fence raised.
        if let Err(why) = crate::exec::sql::guard::check(&statement) {
            return Ok(Err(SqlError::Refused(why)));
        }
        let Grant {
            db,
            limits,
            term,
            job,
        } = match self.sql_grant(&database)? {
            Ok(g) => g,
            Err(e) => return Ok(Err(e)),
        };
        let params: Vec<Value> = params.into_iter().map(param).collect();
        let res = Tx::single(
            &database, &db, &job, &term, limits, &statement, &params, count,
        )
        .await;
        if let Err(e) = &res {
            self.sql_fenced(e).await?;
        }
        Ok(res)
    }

    fn sql_closed(&mut self, name: &str) {
        if let Some(s) = self.sql.as_mut() {
            s.open.remove(name);
        }
    }
}

impl sql::Host for HostState {
    async fn begin(
        &mut self,
        database: String,
    ) -> wasmtime::Result<Result<Resource<Tx>, sql::SqlError>> {
        match self.sql_begin(&database).await? {
            Ok(tx) => Ok(Ok(self.table.push(tx)?)),
            Err(e) => Ok(Err(guest_error(e))),
        }
    }

    async fn execute(
        &mut self,
        database: String,
        statement: String,
        params: Vec<sql::Value>,
    ) -> wasmtime::Result<Result<u64, sql::SqlError>> {
        Ok(self
            .sql_single(database, statement, params, true)
            .await?
            .map(|(_, _, n)| n)
            .map_err(guest_error))
    }

    async fn query(
        &mut self,
        database: String,
        statement: String,
        params: Vec<sql::Value>,
    ) -> wasmtime::Result<Result<sql::Rows, sql::SqlError>> {
        Ok(self
            .sql_single(database, statement, params, false)
            .await?
            .map(|(c, r, _)| rows(c, r))
            .map_err(guest_error))
    }
}

impl sql::HostTransaction for HostState {
    async fn query(
        &mut self,
        tx: Resource<Tx>,
        statement: String,
        params: Vec<sql::Value>,
    ) -> wasmtime::Result<Result<sql::Rows, sql::SqlError>> {
        let params: Vec<Value> = params.into_iter().map(param).collect();
        let res = self
            .table
            .get_mut(&tx)?
            .run(&statement, &params, false)
            .await;
        Ok(res.map(|(c, r, _)| rows(c, r)).map_err(guest_error))
    }

    async fn execute(
        &mut self,
        tx: Resource<Tx>,
        statement: String,
        params: Vec<sql::Value>,
    ) -> wasmtime::Result<Result<u64, sql::SqlError>> {
        let params: Vec<Value> = params.into_iter().map(param).collect();
        let res = self
            .table
            .get_mut(&tx)?
            .run(&statement, &params, true)
            .await;
        Ok(res.map(|(_, _, n)| n).map_err(guest_error))
    }

    async fn commit(&mut self, this: Resource<Tx>) -> wasmtime::Result<Result<(), sql::SqlError>> {
        let tx = self.table.delete(this)?;
        self.sql_closed(&tx.name.clone());
        Ok(tx.commit().await.map_err(guest_error))
    }

    async fn drop(&mut self, rep: Resource<Tx>) -> wasmtime::Result<()> {
        let mut tx = self.table.delete(rep)?;
        self.sql_closed(&tx.name.clone());
        tx.rollback().await;
        Ok(())
    }
}
