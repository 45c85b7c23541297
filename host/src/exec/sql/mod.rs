//! PostgreSQL for jobs: the databases a host is configured with ([`Databases`], from
//! `--database NAME=URL`), the transactions a guest opens on them ([`Tx`]), each fenced by the
//! term's token inside the database ([`fence`]), and the statements refused before they are
//! sent ([`guard`]).
//!
//! **Guarantees.** Every transaction a guest runs begins, in one round trip and before any
//! statement of the guest, with the fence: the job's row in `leasehold.fence` is locked and raised
//! to the term's token, or the transaction is rolled back (`fenced`) when the row holds a higher
//! token (or the same token of another holder). An interactive transaction ([`Tx::begin`]) reads
//! the fence's answer before the guest's first statement is sent; a single statement
//! ([`Tx::single`]) is sent in the same round trip, behind the fence, and a refused fence makes the
//! transaction read-only before it runs (an error from the fence aborts the transaction; the pool's
//! connections start read-only outside the host's `BEGIN … READ WRITE`, which [`fence::verify`] checks), so it writes
//! nothing, tested with a sequence a rollback would not undo. The row stays locked until the
//! transaction ends, so the transactions of two terms never interleave: every write of an older
//! term commits before any write of a newer one, or never. COMMIT is sent only while the term still
//! leads locally. The host logs in as the job's role, which may only EXECUTE the fence function
//! ([`fence::verify`] checks it before the database is used); what the database's privileges do not
//! stop (a plain `COMMIT`, `SET`, several statements) is refused before it is sent ([`guard`],
//! which also refuses `set_config`, `pg_settings` and the fence function by name). Statement time
//! is enforced twice: `statement_timeout` in the database and the host's own timer, which cancels
//! the statement (a function the role may call could lift the former, not the latter). The fence
//! function refuses a second call in a transaction (the guest's).
//!
//! **Non-guarantees.** A COMMIT whose reply is lost may or may not have been applied
//! (`unavailable`): a job makes its writes idempotent with unique keys. A database the job's
//! role can reach some other way (an extension such as `dblink` or `postgres_fdw` granted to it)
//! is outside the fence: grant the role nothing but its own tables. Tokens stay in order only
//! if the database's fence row is never lowered by hand.
//!
//! **Tokens ahead of Redis.** A term whose token is below the row's (Redis lost its counter and
//! its clock stepped back, or another Redis is pointed at) is refused; the host then raises the
//! job's token counter in Redis above the database's token and ends the term, so the next term
//! is granted a higher token and writes (see the runtime's `sql` imports).
//!
//! Files: `config` (`--database`, caps, a job's ask and limits), `tls` (TLS to the database: always
//! verified), `pool` ([`Database`], its connections and its check), `tx` ([`Tx`]), `statement` (one
//! statement on a connection), [`fence`] (also the fence call's answer), [`guard`], [`value`]; this
//! file the registry ([`Databases`]) and the errors.

mod config;
pub mod fence;
pub mod guard;
mod pool;
mod statement;
mod tls;
mod tx;
pub mod value;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;

pub use config::{DatabaseConfig, SqlAsk, SqlCaps, SqlLimits, check_name, parse_database};
pub use pool::{Database, VerifyError};
pub(crate) use tls::system_roots;
pub use tx::{Ran, Tx};
pub use value::Value;

/// Default statement time of a job that asks for none.
pub const DEFAULT_STATEMENT_TIME: Duration = Duration::from_secs(5);
/// Default most rows one statement may return.
pub const DEFAULT_ROWS: u64 = 10_000;
/// Default most bytes one statement's rows may carry.
pub const DEFAULT_RESULT_BYTES: u64 = 16 << 20;
/// Connections per database when the URL gives no `pool`.
pub const DEFAULT_POOL: usize = 4;

/// The databases a host is configured with, and its caps.
#[derive(Clone, Default)]
pub struct Databases {
    dbs: BTreeMap<String, Arc<Database>>,
    caps: SqlCaps,
    idle: Duration,
    /// A host's (not `leasehold check`'s): a job needing a database it lacks is refused.
    enforced: bool,
}

impl Databases {
    /// The databases of `configs`, with `caps`; a transaction idle longer than `idle` (the lease
    /// TTL: a frozen leader's transaction then releases the fence row for its successor) is
    /// ended by the database.
    pub fn new(configs: &[DatabaseConfig], caps: SqlCaps, idle: Duration) -> Self {
        Databases {
            dbs: configs
                .iter()
                .map(|c| (c.name.clone(), Arc::new(Database::new(c.clone()))))
                .collect(),
            caps,
            idle,
            enforced: true,
        }
    }

    /// The configured databases.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Database>> {
        self.dbs.values()
    }

    /// The host's name of every database `ask` needs that this host lacks.
    pub fn missing(&self, ask: &SqlAsk) -> Vec<String> {
        if !self.enforced {
            return Vec::new();
        }
        ask.databases
            .values()
            .filter(|n| !self.dbs.contains_key(*n))
            .cloned()
            .collect()
    }

    /// A job's databases (by the job's names) and limits, as its sidecar asks, capped.
    pub fn for_job(&self, ask: &SqlAsk) -> JobDatabases {
        let pick = |asked: u64, default: u64, cap: u64| {
            if asked == 0 {
                default.min(cap)
            } else {
                asked.min(cap)
            }
        };
        let statement_time = if ask.statement_time.is_zero() {
            DEFAULT_STATEMENT_TIME.min(self.caps.statement_time)
        } else {
            ask.statement_time.min(self.caps.statement_time)
        };
        JobDatabases {
            granted: ask
                .databases
                .iter()
                .filter_map(|(job_name, host_name)| {
                    self.dbs
                        .get(host_name)
                        .map(|d| (job_name.clone(), d.clone()))
                })
                .collect(),
            limits: SqlLimits {
                statement_time,
                rows: pick(ask.rows, DEFAULT_ROWS, self.caps.rows),
                result_bytes: pick(
                    ask.result_bytes,
                    DEFAULT_RESULT_BYTES,
                    self.caps.result_bytes,
                ),
                idle: self.idle.max(Duration::from_secs(1)),
            },
        }
    }
}

/// The databases one job may use in a step, by the job's names, and its limits.
#[derive(Clone)]
pub struct JobDatabases {
    /// Job's name → database.
    pub granted: BTreeMap<String, Arc<Database>>,
    /// The job's limits.
    pub limits: SqlLimits,
}

impl JobDatabases {
    /// The names the job may use, for messages.
    pub fn names(&self) -> String {
        if self.granted.is_empty() {
            "none".into()
        } else {
            self.granted.keys().cloned().collect::<Vec<_>>().join(", ")
        }
    }
}

/// A database error as the guest sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbError {
    /// SQLSTATE.
    pub code: String,
    /// The message.
    pub message: String,
    /// The constraint named, if any.
    pub constraint: Option<String>,
    /// The detail line, if any.
    pub detail: Option<String>,
}

/// Why a statement or transaction did not succeed (the `sql-error` of `wit/job.wit`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SqlError {
    /// Not a database the job may use.
    #[error("not granted: {0}")]
    NotGranted(String),
    /// Refused before sending.
    #[error("refused: {0}")]
    Refused(String),
    /// A constraint violation.
    #[error("constraint violated ({}): {}", .0.code, .0.message)]
    Constraint(DbError),
    /// Another database error.
    #[error("database error ({}): {}", .0.code, .0.message)]
    Database(DbError),
    /// The statement took longer than the job's statement time.
    #[error("statement cancelled after {0:?}")]
    Timeout(Duration),
    /// The result is larger than the job's limits.
    #[error("result too large: {0}")]
    TooLarge(String),
    /// A column of a type a value cannot carry.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The database's fence holds a higher token (or this token of another holder).
    #[error(
        "fenced: token {token} is refused by database {database}, whose fence holds token {stored}"
    )]
    Fenced {
        /// The host's name of the database.
        database: String,
        /// This term's token.
        token: u64,
        /// The fence's token.
        stored: u64,
    },
    /// The term has ended locally.
    #[error("the term has ended")]
    NotLeader,
    /// The database could not be reached, or the connection failed.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl SqlError {
    /// A driver error as the guest sees it: by SQLSTATE, never by message text.
    pub(super) fn from_pg(e: tokio_postgres::Error, limit: Duration) -> Self {
        let Some(db) = e.as_db_error() else {
            return SqlError::Unavailable(e.to_string());
        };
        let err = DbError {
            code: db.code().code().to_string(),
            message: db.message().to_string(),
            constraint: db.constraint().map(str::to_string),
            detail: db.detail().map(str::to_string),
        };
        if *db.code() == SqlState::QUERY_CANCELED {
            SqlError::Timeout(limit)
        } else if err.code.starts_with("23") {
            SqlError::Constraint(err)
        } else if err.code.starts_with("08") || err.code.starts_with("57P") {
            // Connection exceptions, and the server shutting the session down (admin shutdown,
            // crash, idle-in-transaction timeout).
            SqlError::Unavailable(format!("{} ({})", err.message, err.code))
        } else {
            SqlError::Database(err)
        }
    }
}
