//! The lease of one job in Redis: acquire, renew, release, each one atomic script.
//!
//! * **Acquire** = `SET lease owner NX PX ttl` and, in the same script, the term's token: one
//!   more than the larger of the counter and the fence, and never less than Redis's clock in
//!   microseconds (`TIME`). The script reads and checks everything before it writes anything,
//!   so an error (a counter that is not a number, a fence of the wrong type) leaves no lease
//!   behind; the elector releases (owner-checked) after any acquire whose outcome it did not
//!   learn. The script also raises the fence to the new token with the new
//!   owner as holder, so the term is fenced *when it starts*, before any step runs (I2).
//! * **Renew** extends the TTL only if the lease still holds this owner.
//! * **Release** deletes the lease only if it still holds this owner, and publishes the old
//!   owner on `lh:{job}:released` so that followers campaign at once.
//!
//! **Why tokens never go backwards (I8).** While the counter or the fence survives, the new
//! token is above both. When Redis loses both (a restart without persistence), the clock floor
//! takes over: every token ever issued was at most `TIME_µs` at its issue plus the number of
//! terms started within the same microsecond, which is zero or one (each term costs a Redis
//! round trip). A later `TIME_µs` is therefore above all of them. The floor fails only if Redis's
//! wall clock steps back by more than the outage lasted *and* the counter and fence were both
//! lost; both must happen together. Tokens stay below 2^53 (until the year 2255) so Lua compares
//! them exactly; the script refuses to issue one beyond that.
//!
//! Owners are `node-id:uuid`, fresh for every candidacy, so a node that restarts quickly can
//! never renew or release a lease taken by its previous incarnation.
//!
//! The acquire and release scripts also write the job's term history ([`crate::coord::terms`]):
//! a term's entry is pushed by the script that raises the fence to its token, and closed by
//! its release.
//!
//! Length: the lease scripts side by side (acquire, renew, observe, release, the counter's
//! raise), so that the checks each one makes, and the history they write, read together.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::coord::term_store::Lease;
use crate::coord::terms::{KEPT, TermEnd};
use crate::store::keys::JobKeys;
use crate::store::{Batch, Conn};

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: lease, token counter, fence, wanted, term history.  ARGV: owner, ttl in ms, asking
-- node id (or empty), the job's notice channel, how many terms the history keeps.
-- Everything is read and checked before anything is written: a script error (a key of the
-- wrong type, a counter that is not a number) leaves Redis as it was, with no lease held.
local holder = redis.call('GET', KEYS[1])
if holder then
  -- A follower that is the job's preferred member asks for it (KEYS[4], ARGV[3]: its node id),
  -- for twice the TTL: the leader hands the job over only to a member that asked.
  if ARGV[3] and ARGV[3] ~= '' then
    local asked = redis.call('GET', KEYS[4])
    redis.call('SET', KEYS[4], ARGV[3], 'PX', tonumber(ARGV[2]) * 2)
    -- A new ask wakes the leader's runner (ARGV[4]: the job's notice channel).
    if asked ~= ARGV[3] then
      redis.call('PUBLISH', ARGV[4], 'wanted')
    end
  end
  return {0, holder, redis.call('PTTL', KEYS[1])}
end
local counter_raw = redis.call('GET', KEYS[2])
local counter = tonumber(counter_raw or '0')
if counter == nil then
  return redis.error_reply('BADTOKEN token counter ' .. KEYS[2] .. ' is not a number')
end
local fence_raw = redis.call('HGET', KEYS[3], 'token')
local fence = tonumber(fence_raw or '0')
if fence == nil then
  return redis.error_reply('BADFENCE fence ' .. KEYS[3] .. ' has a token that is not a number')
end
local now = redis.call('TIME')
local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
local token = math.max(counter + 1, fence + 1, floor)
if token >= 9007199254740992 then
  return redis.error_reply('TOKENRANGE next token ' .. string.format('%.0f', token) .. ' is not below 2^53')
end
local t = string.format('%.0f', token)
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], t)
redis.call('HSET', KEYS[3], 'token', t, 'holder', ARGV[1])
-- The job's term history (KEYS[5], newest first, ARGV[5] entries at most; see coord/terms.rs).
-- Informational: a key of another type is left alone rather than keep the job leaderless.
if redis.call('TYPE', KEYS[5]).ok ~= 'none' and redis.call('TYPE', KEYS[5]).ok ~= 'list' then
  return {1, t, tonumber(ARGV[2])}
end
local ms = string.format('%.0f', math.floor(floor / 1000))
-- A term still open at the head never said how it ended, and its lease ran out unreleased:
-- its holder has not been heard from since ('crashed', until it reports back how it ended).
local head = redis.call('LINDEX', KEYS[5], 0)
if head then
  local ok, h = pcall(cjson.decode, head)
  if ok and type(h) == 'table' and h['end'] == nil then
    h['end'] = 'crashed'
    h['ended_ms'] = ms
    redis.call('LSET', KEYS[5], 0, cjson.encode(h))
  end
end
redis.call('LPUSH', KEYS[5], cjson.encode({token = t, owner = ARGV[1], started_ms = ms}))
redis.call('LTRIM', KEYS[5], 0, tonumber(ARGV[5]) - 1)
return {1, t, tonumber(ARGV[2])}
"#,
    )
});

static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: lease.  ARGV: owner, ttl in ms.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, holder}
end
return {0, holder or ''}
"#,
    )
});

static OBSERVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: lease, wanted.  ARGV: asking node value (or empty), ttl in ms, the job's notice channel.
-- A follower's look at the lease (sent in the host's heartbeat): who holds it and for how long;
-- the job's preferred member also asks for it, exactly as the acquire script does.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return {0, '', -2}
end
if ARGV[1] ~= '' then
  local asked = redis.call('GET', KEYS[2])
  redis.call('SET', KEYS[2], ARGV[1], 'PX', tonumber(ARGV[2]) * 2)
  if asked ~= ARGV[1] then
    redis.call('PUBLISH', ARGV[3], 'wanted')
  end
end
return {1, holder, redis.call('PTTL', KEYS[1])}
"#,
    )
});

static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: lease, fence, term history.  ARGV: owner, release channel, how the term ended
-- (released, expired, fenced).
local released = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[1])
  released = 1
end
-- The term's own entry in the history says how it ended (coord/terms.rs): while the fence is
-- still the term's (no later term began), an open entry is closed; once a later term began
-- (and marked this one 'crashed'), the holder, back, may only say why it went quiet (expired,
-- fenced). A term can neither add an entry nor touch another owner's.
if redis.call('TYPE', KEYS[3]).ok ~= 'list' then
  return released
end
local how = ARGV[3]
if released == 0 and how == 'released' then
  how = 'expired'
end
local ours = redis.call('HGET', KEYS[2], 'holder') == ARGV[1]
local now = redis.call('TIME')
local ms = string.format('%.0f', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
for i, raw in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local ok, e = pcall(cjson.decode, raw)
  if ok and type(e) == 'table' and e['owner'] == ARGV[1] then
    if (e['end'] == nil and ours) or (e['end'] == 'crashed' and not ours and how ~= 'released') then
      e['end'] = how
      if e['ended_ms'] == nil then
        e['ended_ms'] = ms
      end
      redis.call('LSET', KEYS[3], i - 1, cjson.encode(e))
    end
    break
  end
end
return released
"#,
    )
});

/// Result of an acquire attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is ours: a new term with this token has begun (and the fence is raised to it).
    Granted {
        /// The new term's fencing token.
        token: u64,
    },
    /// Someone else holds the lease.
    Held {
        /// The current owner (`node-id:uuid`), empty if the key vanished meanwhile.
        holder: String,
        /// Time left on their lease as Redis sees it; `None` when the key has no expiry
        /// (never set so by Leasehold).
        ttl: Option<Duration>,
    },
}

/// Lease operations failed (Redis unreachable, script error, or an unexpected reply).
pub type LeaseResult<T> = Result<T, redis::RedisError>;

fn bad_reply(what: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected script reply",
        what.to_string(),
    ))
}

/// Tries to take the lease of `keys` for `owner` for `ttl`.
pub async fn acquire<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    owner: &str,
    ttl: Duration,
) -> LeaseResult<Acquired> {
    acquire_or_ask(conn, keys, owner, ttl, None).await
}

/// [`acquire`]; when the lease is held by another owner and `ask` names this node, it also
/// records in the same script that this node asks for the job (`lh:{job}:wanted`, for twice
/// the TTL): the leader hands a job over only to a member that asked (see
/// [`crate::coord::balance`]).
pub async fn acquire_or_ask<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    owner: &str,
    ttl: Duration,
    ask: Option<&str>,
) -> LeaseResult<Acquired> {
    let reply: (i64, String, i64) = acquire_invocation(keys, owner, ttl, ask)
        .invoke_async(conn)
        .await?;
    acquired(reply)
}

/// One campaign for [`acquire_many`]: the job's keys, the candidate owner, the TTL, and the
/// node id to ask with (see [`acquire_or_ask`]).
pub struct Campaign {
    /// The job's keys.
    pub keys: JobKeys,
    /// The owner (`node-id:uuid`) this candidacy would hold the lease as.
    pub owner: String,
    /// The lease TTL.
    pub ttl: Duration,
    /// This node's id when it is the job's preferred member.
    pub ask: Option<String>,
}

/// [`acquire_or_ask`] for every campaign in one round trip per Redis node
/// ([`Conn::batch`]): each acquire is its own script and answers for itself.
pub async fn acquire_many(conn: &mut Conn, campaigns: &[Campaign]) -> Vec<LeaseResult<Acquired>> {
    let mut batch = Batch::new();
    for c in campaigns {
        let keys = &c.keys;
        batch.script(
            &ACQUIRE,
            &[
                keys.lease(),
                keys.token(),
                keys.fence(),
                keys.wanted(),
                keys.terms(),
            ],
            (
                &c.owner,
                c.ttl.as_millis() as u64,
                c.ask.as_deref().unwrap_or(""),
                keys.notice_channel(),
                KEPT,
            ),
        );
    }
    conn.batch("campaigns", &batch)
        .await
        .into_iter()
        .map(|r| {
            r.and_then(|v| redis::from_redis_value::<(i64, String, i64)>(v).map_err(Into::into))
                .and_then(acquired)
        })
        .collect()
}

fn acquire_invocation<'a>(
    keys: &JobKeys,
    owner: &str,
    ttl: Duration,
    ask: Option<&str>,
) -> redis::ScriptInvocation<'a> {
    let mut i = ACQUIRE.key(keys.lease());
    i.key(keys.token())
        .key(keys.fence())
        .key(keys.wanted())
        .key(keys.terms())
        .arg(owner)
        .arg(ttl.as_millis() as u64)
        .arg(ask.unwrap_or(""))
        .arg(keys.notice_channel())
        .arg(KEPT);
    i
}

/// The acquire script's reply as an [`Acquired`].
fn acquired((won, value, ttl_ms): (i64, String, i64)) -> LeaseResult<Acquired> {
    if won == 1 {
        let token = value
            .parse()
            .map_err(|_| bad_reply(&format!("token {value:?}")))?;
        Ok(Acquired::Granted { token })
    } else {
        Ok(Acquired::Held {
            holder: value,
            ttl: (ttl_ms >= 0).then(|| Duration::from_millis(ttl_ms as u64)),
        })
    }
}

/// Extends the lease by `ttl` if `owner` still holds it. `Ok(false)`: the lease is gone or
/// someone else's; the caller must stop leading at once.
pub async fn renew<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    owner: &str,
    ttl: Duration,
) -> LeaseResult<bool> {
    let (ok, _holder): (i64, String) = RENEW
        .key(keys.lease())
        .arg(owner)
        .arg(ttl.as_millis() as u64)
        .invoke_async(conn)
        .await?;
    Ok(ok == 1)
}

/// Adds the owner-checked renewal of `owner`'s lease on `keys` (to `ttl`) to `batch`; its
/// reply reads with [`renewed`].
pub fn renew_into(batch: &mut Batch, keys: &JobKeys, owner: &str, ttl: Duration) -> usize {
    batch.script(&RENEW, &[keys.lease()], (owner, ttl.as_millis() as u64))
}

/// A renewal's reply: `Ok(true)` renewed, `Ok(false)` the lease is not that owner's any more.
pub fn renewed(reply: redis::RedisResult<redis::Value>) -> LeaseResult<bool> {
    let (ok, _holder): (i64, String) = redis::from_redis_value(reply?)?;
    Ok(ok == 1)
}

/// Renews every `(keys, owner)` lease of `terms` to `ttl` in one round trip per Redis node:
/// each is the owner-checked renew script on its own, so each answers for itself (see
/// [`renewed`]). What the host's heartbeat does every heartbeat ([`crate::coord::heartbeat`]).
pub async fn renew_many<'a>(
    conn: &mut Conn,
    terms: impl IntoIterator<Item = (&'a JobKeys, &'a str)>,
    ttl: Duration,
) -> Vec<LeaseResult<bool>> {
    let mut batch = Batch::new();
    for (keys, owner) in terms {
        renew_into(&mut batch, keys, owner, ttl);
    }
    conn.batch("renewals", &batch)
        .await
        .into_iter()
        .map(renewed)
        .collect()
}

/// Adds a follower's look at the lease of `keys` to `batch`: who holds it and for how long,
/// and, with `ask` (this node, when it is the job's preferred member), the same ask for the job
/// the acquire script makes ([`acquire_or_ask`]). Its reply reads with [`observed`].
pub fn observe_into(batch: &mut Batch, keys: &JobKeys, ask: Option<&str>, ttl: Duration) -> usize {
    batch.script(
        &OBSERVE,
        &[keys.lease(), keys.wanted()],
        (
            ask.unwrap_or(""),
            ttl.as_millis() as u64,
            keys.notice_channel(),
        ),
    )
}

/// A follower's look's reply (`ttl`: the time left as Redis saw it; `None` for a lease without
/// expiry, set by hand).
pub fn observed(reply: redis::RedisResult<redis::Value>) -> LeaseResult<Lease> {
    let (held, holder, ttl_ms): (i64, String, i64) = redis::from_redis_value(reply?)?;
    Ok(if held == 1 {
        Lease::Held {
            holder,
            ttl: (ttl_ms >= 0).then(|| Duration::from_millis(ttl_ms as u64)),
        }
    } else {
        Lease::Free
    })
}

/// Deletes the lease if `owner` still holds it and announces it on the job's release channel
/// (followers campaign at once); `Ok(false)` if it was not ours any more.
///
/// The same script writes how the term ended into its entry of the job's term history
/// ([`crate::coord::terms`]): `how` as given while the lease was still ours (`Expired` when it
/// was gone already), or, once a later term has begun, only `Expired` or `Fenced` in place of
/// the `crashed` that term assumed.
pub async fn release<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    owner: &str,
    how: TermEnd,
) -> LeaseResult<bool> {
    let released: i64 = RELEASE
        .key(keys.lease())
        .key(keys.fence())
        .key(keys.terms())
        .arg(owner)
        .arg(keys.released_channel())
        .arg(how.as_str())
        .invoke_async(conn)
        .await?;
    Ok(released == 1)
}

static RAISE_COUNTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: token counter.  ARGV: the token the counter must reach.
local counter = tonumber(redis.call('GET', KEYS[1]) or '0')
if counter == nil then
  return redis.error_reply('BADTOKEN token counter ' .. KEYS[1] .. ' is not a number')
end
if counter < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0
"#,
    )
});

/// Raises the job's token counter to at least `token` (never lowers it): the next term's token
/// is then above `token`. Used when a store outside Redis (a database's fence) holds a token
/// Redis no longer knows of; raising a counter is always safe, since tokens only need to grow.
/// True when the counter was below `token`.
pub async fn raise_counter<C: ConnectionLike>(
    conn: &mut C,
    keys: &JobKeys,
    token: u64,
) -> LeaseResult<bool> {
    let raised: i64 = RAISE_COUNTER
        .key(keys.token())
        .arg(token)
        .invoke_async(conn)
        .await?;
    Ok(raised == 1)
}
