//! One database ([`Database`]): a pool of connections logged in as the jobs' role, and the
//! check of its fence that comes before any use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_postgres::{Client, Statement};

use super::{DatabaseConfig, SqlError, fence};

/// Prepared statements a connection keeps (then it forgets them all and starts again).
pub(super) const STATEMENTS_KEPT: usize = 64;

/// One database: its settings and a pool of connections logged in as the job's role.
pub struct Database {
    config: DatabaseConfig,
    idle: Mutex<Vec<Conn>>,
    permits: Arc<tokio::sync::Semaphore>,
    verified: tokio::sync::OnceCell<fence::Verified>,
}

/// A pooled connection and the statements prepared on it.
pub(super) struct Conn {
    pub(super) client: Client,
    pub(super) statements: HashMap<String, Statement>,
    /// The fence call ([`fence::FENCE_CALL`]), prepared at the connection's first transaction.
    pub(super) fence: Option<Statement>,
}

impl Database {
    pub(super) fn new(config: DatabaseConfig) -> Self {
        Database {
            permits: Arc::new(tokio::sync::Semaphore::new(config.pool)),
            config,
            idle: Mutex::default(),
            verified: tokio::sync::OnceCell::new(),
        }
    }

    /// The host's name for the database.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The URL, password hidden.
    pub fn shown(&self) -> &str {
        &self.config.shown
    }

    /// What TLS connections trust (`None`: plain text).
    pub fn tls_roots(&self) -> Option<&str> {
        self.config.tls_roots()
    }

    /// Opens a connection for jobs within `wait` (read-only unless the host begins a
    /// transaction `READ WRITE`).
    async fn connect(&self, wait: Duration) -> Result<Client, String> {
        self.config.connect_for_jobs(wait).await
    }

    /// Asks the server, in the background, to cancel what `token`'s connection runs.
    pub(super) fn cancel(&self, token: tokio_postgres::CancelToken) {
        self.config.cancel(token);
    }

    /// Checks the database's fence (once per process, when it passes; see [`fence::verify`]).
    pub async fn verify(&self, wait: Duration) -> Result<&fence::Verified, VerifyError> {
        self.verified
            .get_or_try_init(|| async {
                let client = self.connect(wait).await.map_err(VerifyError::Unreachable)?;
                tokio::time::timeout(wait, fence::verify(&client))
                    .await
                    .map_err(|_| {
                        VerifyError::Unreachable(format!(
                            "checking {} took longer than {wait:?}",
                            self.shown()
                        ))
                    })?
                    .map_err(VerifyError::Unsafe)
            })
            .await
    }

    /// A connection within `wait`: an idle one, or a new one while the pool has room.
    pub(super) async fn take(self: &Arc<Self>, wait: Duration) -> Result<Pooled, SqlError> {
        let permit = tokio::time::timeout(wait, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| {
                SqlError::Unavailable(format!(
                    "all {} connections to database {} stayed busy for {wait:?}",
                    self.config.pool,
                    self.name()
                ))
            })?
            .expect("the pool's semaphore is never closed");
        self.verify(wait)
            .await
            .map_err(|e| SqlError::Unavailable(e.to_string()))?;
        let idle = self.idle.lock().unwrap().pop();
        let conn = match idle {
            Some(c) if !c.client.is_closed() => c,
            _ => Conn {
                client: self.connect(wait).await.map_err(SqlError::Unavailable)?,
                statements: HashMap::new(),
                fence: None,
            },
        };
        Ok(Pooled {
            conn: Some(conn),
            db: self.clone(),
            _permit: permit,
        })
    }
}

/// Why a database's fence could not be checked, or failed the check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The database could not be reached (it is checked again at its first use).
    #[error("{0}")]
    Unreachable(String),
    /// The database answered, and its fence cannot be trusted (what is wrong, what to run).
    #[error("{0}")]
    Unsafe(String),
}

/// A connection taken from a pool: given back by [`Pooled::give_back`], closed when dropped
/// otherwise (the database then rolls back whatever it had open).
pub(super) struct Pooled {
    conn: Option<Conn>,
    db: Arc<Database>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Pooled {
    pub(super) fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a pooled connection until given back")
    }

    /// Asks the server to cancel what this connection runs, in the background.
    pub(super) fn cancel_running(&mut self) {
        let token = self.conn().client.cancel_token();
        self.db.cancel(token);
    }

    pub(super) fn give_back(mut self) {
        if let Some(c) = self.conn.take()
            && !c.client.is_closed()
        {
            self.db.idle.lock().unwrap().push(c);
        }
    }
}
