//! Database configuration: `--database NAME=URL` ([`parse_database`]), the host's caps, what a
//! job's sidecar asks for and the limits it gets.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::config::SslMode;

use super::DEFAULT_POOL;
use super::tls::Tls;

/// The setting every connection of a job's pool starts with.
const READ_ONLY_BY_DEFAULT: &str = "-c default_transaction_read_only=on";

/// One configured database, as `--database NAME=URL` gives it.
#[derive(Clone)]
pub struct DatabaseConfig {
    /// The name jobs use.
    pub name: String,
    /// The URL with its password hidden, for messages.
    pub shown: String,
    /// The connection settings.
    pub pg: tokio_postgres::Config,
    /// Most connections open at once.
    pub pool: usize,
    /// Plain text, or TLS and what it trusts (the URL's `sslmode` and `sslrootcert`).
    pub(super) tls: Tls,
}

impl DatabaseConfig {
    /// Opens a connection within `wait` (TLS as the URL asks), its I/O driven by a task of its
    /// own; the error names the database's URL (password hidden) and, for TLS, what it trusts.
    pub async fn connect(&self, wait: Duration) -> Result<tokio_postgres::Client, String> {
        self.tls.connect(&self.pg, wait, &self.shown).await
    }

    /// Opens a connection for jobs' transactions, like [`DatabaseConfig::connect`] with
    /// `default_transaction_read_only` on (added to the URL's `options`): nothing sent outside a
    /// transaction the host began `READ WRITE` (after a failed `BEGIN`, say) can write, and
    /// `RESET ALL` keeps it (a connection's options are its settings' defaults).
    pub(super) async fn connect_for_jobs(
        &self,
        wait: Duration,
    ) -> Result<tokio_postgres::Client, String> {
        let mut pg = self.pg.clone();
        let options = match pg.get_options() {
            Some(o) if !o.trim().is_empty() => format!("{o} {READ_ONLY_BY_DEFAULT}"),
            _ => READ_ONLY_BY_DEFAULT.to_string(),
        };
        pg.options(&options);
        self.tls.connect(&pg, wait, &self.shown).await
    }

    /// Whether connections use TLS, and trusting what (`None`: plain text).
    pub fn tls_roots(&self) -> Option<&str> {
        self.tls.roots()
    }

    /// Asks the server, in the background, to cancel what `token`'s connection runs.
    pub(super) fn cancel(&self, token: tokio_postgres::CancelToken) {
        self.tls.cancel(token);
    }
}

impl std::fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={} (pool {})", self.name, self.shown, self.pool)
    }
}

impl PartialEq for DatabaseConfig {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.shown == other.shown && self.pool == other.pool
    }
}

impl Eq for DatabaseConfig {}

/// Whether `name` may name a database: 1 to 64 of `a-z 0-9 _ -` (the host's names, and the
/// names a job declares or its sidecar maps); the error says so, naming it.
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "database name {name:?} must be 1 to 64 of a-z, 0-9, - and _"
        ))
    }
}

/// Reads `NAME=URL`: a name of `a-z 0-9 _ -` and a `postgres://` or `postgresql://` URL, whose
/// `pool=N` parameter (taken out before the URL is read) sets the connections kept, and whose
/// `sslmode` and `sslrootcert` choose TLS as the [`tls`](super::tls) module explains.
pub fn parse_database(arg: &str) -> Result<DatabaseConfig, String> {
    let Some((name, url)) = arg.split_once('=') else {
        return Err(format!(
            "{:?} is not NAME=URL (e.g. ledger=postgres://billing@db:5432/accounts)",
            crate::store::redact(arg)
        ));
    };
    check_name(name)?;
    let shown = crate::store::redact(url);
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(format!(
            "database {name}: {shown} is not a PostgreSQL URL (postgres://user@host:port/db)"
        ));
    }
    let mut pool = DEFAULT_POOL;
    let mut ssl = SslMode::Disable;
    let mut root_cert = None;
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        match kv.split_once('=') {
            Some(("pool", n)) => {
                pool = n
                    .parse()
                    .ok()
                    .filter(|n| (1..=256).contains(n))
                    .ok_or_else(|| format!("database {name}: pool={n} must be 1 to 256"))?;
            }
            Some(("sslmode", m)) => {
                ssl = match m {
                    "disable" => SslMode::Disable,
                    "prefer" => SslMode::Prefer,
                    "require" | "verify-ca" | "verify-full" => SslMode::Require,
                    other => {
                        return Err(format!(
                            "database {name}: sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
                        ));
                    }
                };
            }
            Some(("sslrootcert", path)) => root_cert = Some(path.to_string()),
            _ => kept.push(kv),
        }
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let mut pg: tokio_postgres::Config = url
        .parse()
        .map_err(|e| format!("database {name}: {shown}: {e}"))?;
    // Plain text unless the URL asks for TLS (libpq would prefer it): see the `tls` module.
    pg.ssl_mode(ssl);
    if root_cert.is_some() && ssl == SslMode::Disable {
        return Err(format!(
            "database {name}: sslrootcert is set but sslmode is disable (add sslmode=verify-full)"
        ));
    }
    let tls =
        Tls::for_mode(ssl, root_cert.as_deref()).map_err(|e| format!("database {name}: {e}"))?;
    if pg.get_application_name().is_none() {
        pg.application_name("leasehold");
    }
    Ok(DatabaseConfig {
        name: name.to_string(),
        shown,
        pg,
        pool,
        tls,
    })
}

/// The host's statement limits: the most a job may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqlCaps {
    /// Longest statement.
    pub statement_time: Duration,
    /// Most rows one statement returns.
    pub rows: u64,
    /// Most bytes one statement's rows carry.
    pub result_bytes: u64,
}

impl Default for SqlCaps {
    fn default() -> Self {
        SqlCaps {
            statement_time: Duration::from_secs(60),
            rows: 1_000_000,
            result_bytes: 256 << 20,
        }
    }
}

/// What a job asks for: the databases it declares (its `databases` export, each granted as the
/// host's database of the same name) and its sidecar's `[sql]` (zero: the default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SqlAsk {
    /// Job's name for a database → the host's name for it.
    pub databases: BTreeMap<String, String>,
    /// Longest statement.
    pub statement_time: Duration,
    /// Most rows one statement returns.
    pub rows: u64,
    /// Most bytes one statement's rows carry.
    pub result_bytes: u64,
}

/// A job's effective statement limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqlLimits {
    /// Longest statement (and longest wait for a connection, and for the fence's lock).
    pub statement_time: Duration,
    /// Most rows one statement returns.
    pub rows: u64,
    /// Most bytes one statement's rows carry.
    pub result_bytes: u64,
    /// Longest a transaction may sit idle between statements before the database ends it.
    pub idle: Duration,
}
