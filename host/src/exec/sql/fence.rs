//! The fence inside the database: the `leasehold` schema that `leasehold db init` creates
//! ([`init`]), the check a host runs on every configured database before a job uses it
//! ([`verify`]), and the host's first statements of every transaction ([`BEGIN_BATCH`] and
//! [`FENCE_CALL`]).
//!
//! `leasehold.fence` holds one row per job: the highest token that has written, its holder,
//! and the role that may raise it. `leasehold.raise_fence(job, token, holder)` is the only way
//! to change a row: a `SECURITY DEFINER` function owned by the schema's owner, with
//! `search_path` pinned to `leasehold, pg_temp` (so no temporary table can shadow the fence),
//! which a job's role may only EXECUTE and only for the jobs registered for that role, only as
//! a transaction's first act (a later call, which can only be a guest's, finds the transaction
//! holding an id and is refused: `LH002`), with a token below 2^53. It locks
//! the job's row (`FOR UPDATE`, in READ COMMITTED: a second term waits for the first to end and
//! then reads what it committed), raises it when the token is higher (or the same token of the
//! same holder), and reports whether it did and what the row holds.

use std::time::Duration;

use tokio_postgres::Row;

use super::{Database, SqlError};
use crate::coord::term::Term;

/// SQLSTATE the fence function raises when the job is not registered for the calling role.
pub const NOT_REGISTERED: &str = "LH001";
/// The function's mark of the current version: a database whose function lacks it was set up
/// by an earlier `leasehold db init`, whose function a guest could call to raise any job's
/// fence of its role.
const FUNCTION_MARK: &str = "txid_current_if_assigned()";

/// The schema, table and function, idempotently (`CREATE … IF NOT EXISTS`, `CREATE OR
/// REPLACE`); run by the schema's owner.
const SCHEMA: &str = r#"
CREATE SCHEMA IF NOT EXISTS leasehold;
REVOKE ALL ON SCHEMA leasehold FROM PUBLIC;
CREATE TABLE IF NOT EXISTS leasehold.fence (
    job text PRIMARY KEY,
    role name NOT NULL,
    token bigint NOT NULL DEFAULT 0,
    holder text NOT NULL DEFAULT '',
    raised_at timestamptz
);
REVOKE ALL ON leasehold.fence FROM PUBLIC;
CREATE OR REPLACE FUNCTION leasehold.raise_fence(p_job text, p_token bigint, p_holder text,
        OUT raised boolean, OUT stored bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = leasehold, pg_temp AS $fn$
DECLARE
    r leasehold.fence%ROWTYPE;
BEGIN
    -- Only as a transaction's first act, which is the host's call: the row lock below gives
    -- the transaction its id, which nothing can take back, so any later call (a guest's, however
    -- it is made: a function, a query run from a string) finds one and is refused.
    IF txid_current_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'the fence is raised only as a transaction''s first act, by the host'
            USING ERRCODE = 'LH002';
    END IF;
    IF p_token < 0 OR p_token >= 9007199254740992 THEN
        RAISE EXCEPTION 'token % is out of range (tokens stay below 2^53)', p_token
            USING ERRCODE = 'LH003';
    END IF;
    SELECT * INTO r FROM leasehold.fence WHERE job = p_job AND role = session_user FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % is not registered in leasehold.fence for role %', p_job, session_user
            USING ERRCODE = 'LH001';
    END IF;
    IF r.token = p_token AND r.holder = p_holder THEN
        -- This term's next transaction: the row is locked (FOR UPDATE) and needs no write.
        raised := true;
        stored := p_token;
    ELSIF r.token < p_token THEN
        UPDATE leasehold.fence SET token = p_token, holder = p_holder, raised_at = now()
            WHERE job = p_job;
        raised := true;
        stored := p_token;
    ELSE
        raised := false;
        stored := r.token;
    END IF;
END
$fn$;
REVOKE ALL ON FUNCTION leasehold.raise_fence(text, bigint, text) FROM PUBLIC;
DO $do$ BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
END $do$;
"#;

/// Quotes `s` as an SQL string literal.
pub fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Quotes `s` as an SQL identifier.
pub fn ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// What `leasehold db init` did, line by line.
pub async fn init(
    client: &tokio_postgres::Client,
    role: &str,
    jobs: &[String],
) -> Result<Vec<String>, tokio_postgres::Error> {
    let mut done = Vec::new();
    client.batch_execute(SCHEMA).await?;
    done.push(
        "schema leasehold, table leasehold.fence and function leasehold.raise_fence are in place"
            .to_string(),
    );
    done.push("TEMP on this database revoked from PUBLIC".into());
    let exists = client
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
        .await?
        .is_some();
    if !exists {
        client
            .batch_execute(&format!("CREATE ROLE {} LOGIN", ident(role)))
            .await?;
        done.push(format!(
            "role {role} created (LOGIN, no password: set one with ALTER ROLE, or use your pg_hba rules)"
        ));
    }
    let r = ident(role);
    client
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA leasehold TO {r};
             GRANT SELECT ON leasehold.fence TO {r};
             GRANT EXECUTE ON FUNCTION leasehold.raise_fence(text, bigint, text) TO {r};
             DO $do$ BEGIN
                 EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM %I', current_database(), {role_lit});
             END $do$;",
            role_lit = literal(role)
        ))
        .await?;
    done.push(format!(
        "role {role} may EXECUTE leasehold.raise_fence and read leasehold.fence, nothing else in schema leasehold; no TEMP"
    ));
    for job in jobs {
        let n = client
            .execute(
                "INSERT INTO leasehold.fence (job, role) VALUES ($1, $2)
                 ON CONFLICT (job) DO UPDATE SET role = EXCLUDED.role
                 WHERE leasehold.fence.role IS DISTINCT FROM EXCLUDED.role",
                &[job, &role],
            )
            .await?;
        done.push(if n == 0 {
            format!("job {job}: already registered for role {role}")
        } else {
            format!("job {job}: registered for role {role} (its fence row; the token is kept)")
        });
    }
    Ok(done)
}

/// What a host found when it checked a database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The role the host logs in as.
    pub role: String,
    /// The jobs registered for that role.
    pub jobs: Vec<String>,
}

/// Checks what the fence depends on, as the job's role: the role is not a superuser and cannot
/// bypass row security, cannot change `leasehold.fence` nor create temporary tables, and the
/// fence function is a `SECURITY DEFINER` with its `search_path` pinned, owned by a role this one
/// is not a member of; and the connection starts read-only (`default_transaction_read_only`,
/// which the host asks for in the options of a job connection). The error says what is wrong
/// and what to run.
pub async fn verify(client: &tokio_postgres::Client) -> Result<Verified, String> {
    let q = |e: tokio_postgres::Error| format!("checking the database: {e}");
    let schema = client
        .query_one(
            "SELECT to_regclass('leasehold.fence') IS NOT NULL,
                    to_regprocedure('leasehold.raise_fence(text,bigint,text)') IS NOT NULL",
            &[],
        )
        .await
        .map_err(q)?;
    if !schema.get::<_, bool>(0) || !schema.get::<_, bool>(1) {
        return Err(
            "the leasehold schema is missing (no leasehold.fence or leasehold.raise_fence): run `leasehold db init URL --role ROLE --job JOB` as the database's owner"
                .into(),
        );
    }
    let row = client
        .query_one(
            "SELECT session_user::text, r.rolsuper, r.rolbypassrls,
                    has_database_privilege(current_database(), 'TEMP'),
                    has_table_privilege('leasehold.fence', 'INSERT')
                        OR has_table_privilege('leasehold.fence', 'UPDATE')
                        OR has_table_privilege('leasehold.fence', 'DELETE')
                        OR has_table_privilege('leasehold.fence', 'TRUNCATE'),
                    p.prosecdef,
                    coalesce(array_to_string(p.proconfig, E'\n'), ''),
                    pg_has_role(session_user, p.proowner, 'USAGE'),
                    has_function_privilege('leasehold.raise_fence(text,bigint,text)', 'EXECUTE'),
                    strpos(p.prosrc, $1) > 0,
                    current_setting('default_transaction_read_only') = 'on'
               FROM pg_roles r, pg_proc p
              WHERE r.rolname = session_user
                AND p.oid = 'leasehold.raise_fence(text,bigint,text)'::regprocedure",
            &[&FUNCTION_MARK],
        )
        .await
        .map_err(q)?;
    let role: String = row.get(0);
    let mut wrong = Vec::new();
    if row.get::<_, bool>(1) {
        wrong.push(format!("role {role} is a superuser"));
    }
    if row.get::<_, bool>(2) {
        wrong.push(format!("role {role} bypasses row-level security"));
    }
    if row.get::<_, bool>(3) {
        wrong.push(format!(
            "role {role} may create temporary tables (REVOKE TEMPORARY ON DATABASE … FROM PUBLIC, {role})"
        ));
    }
    if row.get::<_, bool>(4) {
        wrong.push(format!(
            "role {role} may change leasehold.fence directly (it must only EXECUTE leasehold.raise_fence)"
        ));
    }
    if !row.get::<_, bool>(5) {
        wrong.push("leasehold.raise_fence is not SECURITY DEFINER".into());
    }
    let config: String = row.get(6);
    if !config
        .lines()
        .any(|c| c == "search_path=leasehold, pg_temp")
    {
        wrong.push(format!(
            "leasehold.raise_fence does not pin search_path to leasehold, pg_temp (its settings: {config:?})"
        ));
    }
    if row.get::<_, bool>(7) {
        wrong.push(format!(
            "role {role} is (or is a member of) the fence function's owner, and could replace it"
        ));
    }
    if !row.get::<_, bool>(8) {
        wrong.push(format!("role {role} may not EXECUTE leasehold.raise_fence"));
    }
    if !row.get::<_, bool>(9) {
        wrong.push(
            "leasehold.raise_fence is an earlier version's (it lets a later call in a transaction raise a fence)"
                .into(),
        );
    }
    if !row.get::<_, bool>(10) {
        wrong.push(
            "connections do not start read-only (the host asks for default_transaction_read_only=on in the connection's options: a connection pooler in between may drop them; connect to PostgreSQL directly, or let the pooler pass options)"
                .into(),
        );
    }
    if !wrong.is_empty() {
        return Err(format!(
            "the fence cannot be trusted: {}; run `leasehold db init URL --role {role}` as the database's owner, and log the host in as {role}",
            wrong.join("; ")
        ));
    }
    let jobs = client
        .query(
            "SELECT job FROM leasehold.fence WHERE role = session_user ORDER BY job",
            &[],
        )
        .await
        .map_err(q)?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    Ok(Verified { role, jobs })
}

/// The host's first statements of every transaction, sent as one simple query: session
/// settings back to their defaults (a guest's `set_config(…, false)` does not outlive its
/// transaction on the connection, tested), string literals read as the guard reads them
/// (`standard_conforming_strings` on, whatever default the role was given), then `BEGIN` in
/// READ COMMITTED (a newer term waiting
/// on the fence row reads the committed row; REPEATABLE READ would fail it with `40001`).
/// [`FENCE_CALL`] follows it in the same round trip (pipelined), so the fence costs no round
/// trip of its own.
pub const BEGIN_BATCH: &str = "RESET ALL; SET standard_conforming_strings = on; BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE";

/// The fence raised to the term's token, and the transaction's timeouts, as one prepared
/// statement (parsed and planned once per connection; its function and `set_config` resolved
/// when prepared, so no later `search_path` changes them). Parameters: job, token, holder, the
/// statement and lock timeout, the idle timeout (ms, as text). Its row: `(raised, stored, …)`.
///
/// A refused fence also makes the transaction read-only (`transaction_read_only`) and its
/// statement and lock timeouts 1 ms, so a statement sent behind the call before its answer is
/// read (the single-statement path, `Tx::single`) can neither write nor hold the fence's row
/// from the leading term for longer than that; the host rolls the transaction back either way.
///
/// The timeouts are set as the statement's row is formed, after the fence's row lock is taken:
/// the wait for that lock is bounded by the host's own timer (which cancels), and every guest
/// statement after it by the server's too. Sent behind [`BEGIN_BATCH`]: if the batch failed
/// before its `BEGIN`, this call would run on its own, outside a transaction, where the job
/// connections' default (`default_transaction_read_only`, checked by [`verify`]) refuses the
/// function's row lock; the host then rolls back and reports the failure. Only a single
/// statement is sent before both answers are read (see `Tx::single`).
pub const FENCE_CALL: &str = "SELECT f.raised, f.stored, \
    pg_catalog.set_config('statement_timeout', CASE WHEN f.raised THEN $4 ELSE '1' END, true), \
    pg_catalog.set_config('lock_timeout', CASE WHEN f.raised THEN $4 ELSE '1' END, true), \
    pg_catalog.set_config('idle_in_transaction_session_timeout', $5, true), \
    CASE WHEN f.raised THEN NULL \
        ELSE pg_catalog.set_config('transaction_read_only', 'on', true) END \
    FROM leasehold.raise_fence($1, $2, $3) f";

/// [`FENCE_CALL`]'s parameters: job, token, holder, statement time and idle time (ms, as text).
pub type FenceParams = (String, i64, String, String, String);

/// [`FENCE_CALL`]'s parameters for `job`'s term of `token` held by `holder`, with the job's
/// statement and idle times.
pub fn fence_params(
    job: &str,
    token: u64,
    holder: &str,
    statement: Duration,
    idle: Duration,
) -> Result<FenceParams, String> {
    let token = i64::try_from(token)
        .map_err(|_| format!("the token {token} does not fit PostgreSQL's bigint"))?;
    Ok((
        job.to_string(),
        token,
        holder.to_string(),
        statement.as_millis().max(1).to_string(),
        idle.as_millis().max(1).to_string(),
    ))
}

/// What the BEGIN batch and the fence call answered: `Ok` when the fence was raised to the
/// term's token (the transaction goes on), else why not (the caller rolls back).
pub(super) fn answer(
    db: &Database,
    job: &str,
    term: &Term,
    wait: Duration,
    begun: Result<(), tokio_postgres::Error>,
    fenced: Result<Row, tokio_postgres::Error>,
) -> Result<(), SqlError> {
    let row = begun.and(fenced).map_err(|e| {
        if e
            .as_db_error()
            .is_some_and(|d| d.code().code() == NOT_REGISTERED)
        {
            return SqlError::NotGranted(format!(
                "database {} has no fence row for job {job} and the host's role: run `leasehold db init URL --role ROLE --job {job}`",
                db.name()
            ));
        }
        match SqlError::from_pg(e, wait) {
            SqlError::Timeout(_) => SqlError::Unavailable(format!(
                "database {} did not lock the fence's row within {wait:?}",
                db.name()
            )),
            other => other,
        }
    })?;
    let raised: Option<bool> = row.try_get(0).ok();
    let stored: Option<i64> = row.try_get(1).ok();
    match (raised, stored) {
        (Some(true), Some(_)) => Ok(()),
        (Some(false), Some(stored)) => Err(SqlError::Fenced {
            database: db.name().to_string(),
            token: term.token(),
            stored: stored.max(0) as u64,
        }),
        _ => Err(SqlError::Unavailable(format!(
            "database {}: the fence function gave no answer",
            db.name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_identifiers_are_quoted() {
        assert_eq!(literal("a'b"), "'a''b'");
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn the_fence_call_takes_the_terms_token_and_the_jobs_times() {
        let p = fence_params(
            "billing",
            7,
            "node-a:x'y",
            Duration::from_secs(5),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(
            p,
            (
                "billing".into(),
                7,
                "node-a:x'y".into(),
                "5000".into(),
                "10000".into()
            )
        );
        assert!(fence_params("b", u64::MAX, "h", Duration::ZERO, Duration::ZERO).is_err());
        assert!(FENCE_CALL.contains("FROM leasehold.raise_fence($1, $2, $3) f"));
        assert!(!FENCE_CALL.contains("  "), "{FENCE_CALL}");
    }
}
