//! The term history: who led a job when, with which token, and how each term ended.
//!
//! A capped list per job (`lh:{job}:terms`, newest first, [`KEPT`] entries), written only by
//! the lease scripts ([`crate::coord::lease`]):
//!
//! * **A term begins** in the acquire script, in the same script that raises the fence to its
//!   token: the entry is pushed there and nowhere else, so only a term that the fence accepted
//!   has an entry, and a stale leader cannot add one. If the head entry is still open then, its
//!   term never said how it ended and nobody released its lease: it is closed as `crashed`.
//! * **A term ends** in the release script, which writes how (`released` for a resignation or
//!   a hand-over; `expired` when the local deadline passed without a renewal; `fenced` when a
//!   write was refused for a later token). It closes its own entry only while the fence still
//!   names its owner; once a later term has begun, it may only replace the `crashed` that term
//!   assumed by `expired` or `fenced` (a holder that paused or was cut off, back, says why it
//!   went quiet). The elector keeps asking, a heartbeat apart, until Redis answers.
//!
//! **Guarantees.** Entries are in token order (each is pushed by the term that raised the fence
//! above every earlier one). `started_ms` and `ended_ms` are Redis's clock. **Non-guarantees.**
//! `crashed` means "not heard from": a holder that is cut off for good stays `crashed`; a
//! host of an earlier version neither adds entries nor closes them (its terms are missing, and
//! the term before it reads `crashed`). The list is informational: nothing decides a write by
//! it.

use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use crate::store::keys::JobKeys;

/// How many terms a job's history keeps (each about 150 bytes).
pub const KEPT: usize = 32;

/// How a term ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TermEnd {
    /// The leader gave the lease back (shutdown, resignation, hand-over to the preferred member).
    Released,
    /// The leader's lease ran out while it lived (a pause, a cut from Redis).
    Expired,
    /// A write of the term was refused: a later term had begun.
    Fenced,
    /// A later term began and the holder never said how its term ended.
    Crashed,
}

impl TermEnd {
    /// The word stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            TermEnd::Released => "released",
            TermEnd::Expired => "expired",
            TermEnd::Fenced => "fenced",
            TermEnd::Crashed => "crashed",
        }
    }
}

/// One term, as the history shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TermRecord {
    /// The term's fencing token.
    pub token: u64,
    /// The lease owner (`node-id:uuid`).
    pub owner: String,
    /// The node that led.
    pub node: String,
    /// When the term began (ms since the epoch, Redis's clock).
    pub started_ms: u64,
    /// When it ended, once it has.
    pub ended_ms: Option<u64>,
    /// How it ended; `None` while it lasts.
    pub end: Option<TermEnd>,
}

/// An entry as the scripts store it (numbers as strings: Lua's JSON would round them).
#[derive(Deserialize)]
struct Stored {
    token: String,
    owner: String,
    started_ms: String,
    ended_ms: Option<String>,
    #[serde(rename = "end")]
    how: Option<TermEnd>,
}

/// Parses one stored entry; `None` for one that is not an entry.
pub fn parse(raw: &str) -> Option<TermRecord> {
    let s: Stored = serde_json::from_str(raw).ok()?;
    let node = crate::coord::elector::owner_node(&s.owner).to_string();
    Some(TermRecord {
        token: s.token.parse().ok()?,
        started_ms: s.started_ms.parse().ok()?,
        ended_ms: match s.ended_ms {
            Some(e) => Some(e.parse().ok()?),
            None => None,
        },
        end: s.how,
        owner: s.owner,
        node,
    })
}

/// A job's terms, newest first (at most `limit`), and how many stored entries did not parse.
pub async fn history<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    limit: usize,
) -> redis::RedisResult<(Vec<TermRecord>, usize)> {
    let raw: Vec<String> = redis::cmd("LRANGE")
        .arg(keys.terms())
        .arg(0)
        .arg(limit.clamp(1, KEPT) as i64 - 1)
        .query_async(conn)
        .await?;
    let parsed: Vec<_> = raw.iter().filter_map(|r| parse(r)).collect();
    let bad = raw.len() - parsed.len();
    Ok((parsed, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_with_their_numbers_exact() {
        let open = r#"{"token":"1733390000123457","owner":"n1:abc","started_ms":"1733390000123"}"#;
        let r = parse(open).unwrap();
        assert_eq!(r.token, 1_733_390_000_123_457);
        assert_eq!(r.node, "n1");
        assert_eq!((r.ended_ms, r.end), (None, None));
        let ended =
            r#"{"token":"7","owner":"n2:x","started_ms":"1","ended_ms":"2","end":"fenced"}"#;
        assert_eq!(parse(ended).unwrap().end, Some(TermEnd::Fenced));
        assert_eq!(parse(r#"{"token":"x","owner":"n","started_ms":"1"}"#), None);
        assert_eq!(parse("not json"), None);
        assert_eq!(
            parse(r#"{"token":"7","owner":"n","started_ms":"1","end":"vanished"}"#),
            None
        );
    }
}
