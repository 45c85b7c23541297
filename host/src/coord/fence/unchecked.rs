//! Writes as a given term `(owner, token)` with none of [`super::term_write`]'s local checks
//! (no deadline, no ending of a refused term): what a zombie leader's write looks like to Redis.
//! [`super::term_write`] sends its script through [`invoke`]; tests, benchmarks and the demo use
//! these to act as a stale term. No host code writes with them directly, which is why the
//! module is hidden from the documentation.

use redis::aio::ConnectionLike;

use super::{FenceError, TermWrite, Written, script_call};
use crate::store::keys::JobKeys;

/// Sets every `(key, value)` pair (full Redis keys of this job), fenced by the term
/// `(owner, token)`.
pub async fn write<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    owner: &str,
    token: u64,
    writes: &[(String, &[u8])],
) -> Result<(), FenceError> {
    let write = TermWrite::new(writes, &[]);
    invoke(conn, keys, (owner, token), &write).await.map(drop)
}

/// Runs the script as the term `(owner, token)`, with none of [`super::term_write`]'s local checks:
/// the primitive under every term write (tests and the demo send writes as a given term with
/// it).
pub async fn invoke<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    (owner, token): (&str, u64),
    write: &TermWrite<'_>,
) -> Result<Written, FenceError> {
    let (script_keys, args) = script_call(keys, (owner, token), write);
    let mut inv = super::script::FENCED_WRITE.prepare_invoke();
    for k in &script_keys {
        inv.key(k);
    }
    for a in &args {
        inv.arg(a.as_slice());
    }
    let reply: (i64, String, String, String) = inv.invoke_async(conn).await?;
    super::answer(reply, token, write)
}
