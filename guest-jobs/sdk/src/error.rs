//! How the store's errors end a step: `From` for [`JobError`], and [`WriteResultExt`].

use crate::JobError;
use crate::sql::SqlError;
use crate::store::{ReadError, WriteError};
use crate::tasks::TasksError;

/// How a refused `tasks` call ends a step, as for the store: `fenced`, `not-leader` →
/// [`JobError::LostLeadership`]; `unavailable` → [`JobError::NotReady`]; `invalid`,
/// `too-large`, `not-in-a-step` → [`JobError::Failed`] naming the case.
impl From<TasksError> for JobError {
    fn from(e: TasksError) -> Self {
        match e {
            TasksError::Fenced(_) | TasksError::NotLeader => JobError::LostLeadership,
            TasksError::Unavailable(why) => JobError::NotReady(format!("tasks unavailable: {why}")),
            TasksError::Invalid(why) => JobError::Failed(format!("tasks refused: invalid: {why}")),
            TasksError::TooLarge(max) => JobError::Failed(format!(
                "tasks refused: too large: a payload is larger than the job's write limit of {max} bytes"
            )),
            TasksError::NotInAStep => JobError::Failed(
                "tasks refused: only a run's steps submit tasks and read their outputs".into(),
            ),
        }
    }
}

/// What the WIT asks a job to do after each refused write:
///
/// - `fenced`, `not-leader` → [`JobError::LostLeadership`]: another replica leads (or this
///   term is over); the next leader resumes from the last checkpoint.
/// - `invalid-key`, `too-large`, `quota-exceeded` → [`JobError::Failed`], with a message that
///   names the case and its payload: the same write fails the same way again.
/// - `unavailable` → [`JobError::NotReady`] (`store unavailable: <why>`): the host keeps the
///   run pending and calls the same step again later. Writes set whole values (and `create`
///   writes once), so running the step again is safe. A job that would rather have such a step
///   count as a failed attempt (under its retry policy) maps the error itself, e.g. with
///   [`WriteResultExt::lost_leadership_or_else`].
impl From<WriteError> for JobError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Fenced(_) | WriteError::NotLeader => JobError::LostLeadership,
            WriteError::InvalidKey(why) => {
                JobError::Failed(format!("store write refused: invalid key: {why}"))
            }
            WriteError::TooLarge(max) => JobError::Failed(format!(
                "store write refused: too large: the value is larger than the job's write limit of {max} bytes"
            )),
            WriteError::QuotaExceeded(u) => JobError::Failed(format!(
                "store write refused: quota exceeded: the job would keep {} keys and {} bytes, past its quota of {} keys and {} bytes",
                u.keys, u.bytes, u.max_keys, u.max_bytes
            )),
            WriteError::Unavailable(why) => JobError::NotReady(format!("store unavailable: {why}")),
        }
    }
}

/// How a failed `sql` call ends a step, as for the store: `fenced`, `not-leader` →
/// [`JobError::LostLeadership`]; `unavailable` and `timeout` → [`JobError::NotReady`] (the step
/// runs again later; its statements must be idempotent); every other case →
/// [`JobError::Failed`] naming it. A job that treats a unique violation as "already done"
/// matches [`SqlError::Constraint`] before `?`.
impl From<SqlError> for JobError {
    fn from(e: SqlError) -> Self {
        let db = |d: crate::sql::DatabaseError| {
            let mut m = format!("{} (SQLSTATE {})", d.message, d.code);
            if let Some(c) = d.constraint {
                m.push_str(&format!(", constraint {c}"));
            }
            if let Some(x) = d.detail {
                m.push_str(&format!(": {x}"));
            }
            m
        };
        match e {
            SqlError::Fenced(_) | SqlError::NotLeader => JobError::LostLeadership,
            SqlError::Unavailable(why) => {
                JobError::NotReady(format!("database unavailable: {why}"))
            }
            SqlError::Timeout(ms) => {
                JobError::NotReady(format!("statement cancelled after {ms} ms"))
            }
            SqlError::NotGranted(why) => JobError::Failed(format!("sql: not granted: {why}")),
            SqlError::Refused(why) => JobError::Failed(format!("sql: refused: {why}")),
            SqlError::Constraint(d) => JobError::Failed(format!("sql: constraint: {}", db(d))),
            SqlError::Database(d) => JobError::Failed(format!("sql: {}", db(d))),
            SqlError::TooLarge(why) => JobError::Failed(format!("sql: too large: {why}")),
            SqlError::Unsupported(why) => JobError::Failed(format!("sql: unsupported: {why}")),
        }
    }
}

/// A failed read: `invalid-key` → [`JobError::Failed`] naming the case; `unavailable` →
/// [`JobError::NotReady`] (`store unavailable: <why>`), as for writes.
impl From<ReadError> for JobError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::InvalidKey(why) => {
                JobError::Failed(format!("store read refused: invalid key: {why}"))
            }
            ReadError::Unavailable(why) => JobError::NotReady(format!("store unavailable: {why}")),
        }
    }
}

impl WriteError {
    /// True for the refusals that mean this replica no longer leads the job (`fenced`,
    /// `not-leader`): the step should return [`JobError::LostLeadership`] at once.
    pub fn is_lost_leadership(&self) -> bool {
        matches!(self, WriteError::Fenced(_) | WriteError::NotLeader)
    }
}

/// For the result of `store.write` or `store.create`: a lost leadership becomes
/// [`JobError::LostLeadership`], and every other refusal the job's own error.
///
/// ```
/// use leasehold_guest::prelude::*;
/// use leasehold_guest::store::WriteError;
///
/// let refused: Result<(), WriteError> = Err(WriteError::TooLarge(1024));
/// let e = refused.lost_leadership_or_else(|e| JobError::Failed(format!("writing the report: {e:?}")));
/// assert_eq!(e, Err(JobError::Failed("writing the report: WriteError::TooLarge(1024)".into())));
/// ```
pub trait WriteResultExt<T> {
    /// `Ok` as it is; `fenced` and `not-leader` as [`JobError::LostLeadership`]; any other
    /// error as `other(error)`.
    fn lost_leadership_or_else(
        self,
        other: impl FnOnce(WriteError) -> JobError,
    ) -> Result<T, JobError>;
}

impl<T> WriteResultExt<T> for Result<T, WriteError> {
    fn lost_leadership_or_else(
        self,
        other: impl FnOnce(WriteError) -> JobError,
    ) -> Result<T, JobError> {
        self.map_err(|e| {
            if e.is_lost_leadership() {
                JobError::LostLeadership
            } else {
                other(e)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::QuotaUsage;

    fn failed(e: JobError) -> String {
        match e {
            JobError::Failed(m) => m,
            other => panic!("expected failed, got {other:?}"),
        }
    }

    #[test]
    fn a_lost_term_is_lost_leadership() {
        assert_eq!(
            JobError::from(WriteError::Fenced("token 3 < 4".into())),
            JobError::LostLeadership
        );
        assert_eq!(
            JobError::from(WriteError::NotLeader),
            JobError::LostLeadership
        );
        assert!(WriteError::NotLeader.is_lost_leadership());
        assert!(!WriteError::TooLarge(1).is_lost_leadership());
    }

    #[test]
    fn a_refused_write_fails_naming_the_case() {
        let m = failed(WriteError::InvalidKey("key starts with '/'".into()).into());
        assert_eq!(m, "store write refused: invalid key: key starts with '/'");
        let m = failed(WriteError::TooLarge(1024).into());
        assert!(m.starts_with("store write refused: too large: "), "{m}");
        assert!(m.contains("1024 bytes"), "{m}");
        let m = failed(
            WriteError::QuotaExceeded(QuotaUsage {
                keys: 51,
                bytes: 6000,
                max_keys: 50,
                max_bytes: 1 << 20,
            })
            .into(),
        );
        assert_eq!(
            m,
            "store write refused: quota exceeded: the job would keep 51 keys and 6000 bytes, past its quota of 50 keys and 1048576 bytes"
        );
    }

    #[test]
    fn an_unavailable_store_is_not_ready() {
        assert_eq!(
            JobError::from(WriteError::Unavailable("timed out".into())),
            JobError::NotReady("store unavailable: timed out".into())
        );
        assert_eq!(
            JobError::from(ReadError::Unavailable("timed out".into())),
            JobError::NotReady("store unavailable: timed out".into())
        );
        assert_eq!(
            JobError::from(ReadError::InvalidKey("key is empty".into())),
            JobError::Failed("store read refused: invalid key: key is empty".into())
        );
    }

    #[test]
    fn lost_leadership_or_else_keeps_ok_and_maps_the_rest() {
        assert_eq!(
            Ok::<_, WriteError>(true).lost_leadership_or_else(|_| unreachable!()),
            Ok(true)
        );
        assert_eq!(
            Err::<(), _>(WriteError::Fenced("newer term".into()))
                .lost_leadership_or_else(|_| unreachable!()),
            Err(JobError::LostLeadership)
        );
        assert_eq!(
            Err::<(), _>(WriteError::Unavailable("down".into()))
                .lost_leadership_or_else(|e| JobError::Failed(format!("charging c1: {e:?}"))),
            Err(JobError::Failed(
                "charging c1: WriteError::Unavailable(\"down\")".into()
            ))
        );
    }
}
