//! The fenced-write script: the checks and effects listed in [`super`]'s module doc, in one
//! Lua script, beginning with the shared checks of [`crate::coord::checks`].

use std::sync::LazyLock;

use redis::Script;

use crate::coord::checks::{CLAIM_CHECK, RUN_ENDED, TERM_CHECK};

pub(super) static FENCED_WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TERM_CHECK}{CLAIM_CHECK}{RUN_ENDED}{}",
        r#"
-- KEYS: lease, fence, open-runs index, requests, usage, run index, tasks stream, a run's task
--       hash (the task's, for a task's write; the ending run's, for a run's end; else unused),
--       the write's answer kept for a resend (with a write id; else unused),
--       keys to set..., keys to delete...
-- ARGV: owner, token, number of keys to set, create ('1': only if no key to set exists),
--       number of index additions, of index removals, of request clearings,
--       quota of keys and of bytes ('' and '': the keys to set are not counted),
--       number of run-index additions, the task group, a task's claim (entry, consumer,
--       deliveries, task id, run attempt; '' when the write is a step's), '1' when the write
--       ends a run (its tasks' entries are acknowledged and deleted), the write's id ('': none),
--       values... (one per key to set), periods to add to the index...,
--       periods to remove from it..., (period, request id) pairs to clear..., periods to add
--       to the run index...
local K, A = 9, 18
local refused, fence_token = term_check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refused then
  return refused
end
-- A write with an id answers a resend of itself (a client that lost the reply and sent the
-- call again) as it answered the first time, without applying it twice.
local function applied(kind, a, b)
  if ARGV[18] ~= '' then
    redis.call('SET', KEYS[9], kind .. '|' .. a .. '|' .. b, 'PX', 60000)
  end
  return {1, kind, a, b}
end
if ARGV[18] ~= '' then
  local prior = redis.call('GET', KEYS[9])
  if prior then
    local kind, a, b = string.match(prior, '^([^|]*)|([^|]*)|(.*)$')
    return {1, kind, a, b}
  end
end
-- A task's write also needs its run to be open (not ended, not run again), and the worker's
-- claim on the task's current entry.
if ARGV[12] ~= '' then
  local raw = redis.call('HGET', KEYS[8], 't:' .. ARGV[15])
  local rec = raw and cjson.decode(raw)
  if run_ended(rec, ARGV[16]) then
    return {0, 'run-ended', fence_token or '', ARGV[15]}
  end
  if rec.entry ~= ARGV[12] or rec.state ~= 'queued'
      or not claim_holds(KEYS[7], ARGV[11], ARGV[12], ARGV[13], ARGV[14]) then
    return {0, 'claim-lost', fence_token or '', ARGV[13]}
  end
end
local token = tonumber(ARGV[2])
if (not fence_token) or token > tonumber(fence_token) then
  redis.call('HSET', KEYS[2], 'token', ARGV[2], 'holder', ARGV[1])
end
local sets = tonumber(ARGV[3])
if ARGV[4] == '1' then
  for i = 1, sets do
    if redis.call('EXISTS', KEYS[K + i]) == 1 then
      return applied('exists', '', '')
    end
  end
end
-- The storage quota: count what the keys to set add, refuse (nothing written) if it would
-- take the job past its quota in a dimension the write grows.
local usage = {'', ''}
if ARGV[8] ~= '' then
  local dkeys, dbytes = 0, 0
  for i = 1, sets do
    local k = KEYS[K + i]
    if redis.call('EXISTS', k) == 0 then
      dkeys = dkeys + 1
      dbytes = dbytes + #k
    end
    dbytes = dbytes + #ARGV[A + i] - redis.call('STRLEN', k)
  end
  -- A key deleted comes off the count (its full key and its value).
  for i = sets + 1, #KEYS - K do
    local k = KEYS[K + i]
    if redis.call('EXISTS', k) == 1 then
      dkeys = dkeys - 1
      dbytes = dbytes - #k - redis.call('STRLEN', k)
    end
  end
  local keys = tonumber(redis.call('HGET', KEYS[5], 'keys') or '0') + dkeys
  local bytes = tonumber(redis.call('HGET', KEYS[5], 'bytes') or '0') + dbytes
  if keys < 0 then
    keys = 0
  end
  if bytes < 0 then
    bytes = 0
  end
  if (dkeys > 0 and keys > tonumber(ARGV[8])) or (dbytes > 0 and bytes > tonumber(ARGV[9])) then
    return {0, 'quota', string.format('%.0f', keys), string.format('%.0f', bytes)}
  end
  redis.call('HSET', KEYS[5], 'keys', string.format('%.0f', keys), 'bytes', string.format('%.0f', bytes))
  usage = {string.format('%.0f', keys), string.format('%.0f', bytes)}
end
-- A run that ends ends its tasks: every entry still queued is acknowledged and deleted, so no
-- worker's claim on it holds and no worker fetches it (their records go with the run's keys).
if ARGV[17] == '1' then
  -- Its tasks' payloads and outputs come off the job's storage count.
  local counted = tonumber(redis.call('HGET', KEYS[8], 'n:bytes') or '0')
  if counted > 0 then
    local left = tonumber(redis.call('HGET', KEYS[5], 'bytes') or '0') - counted
    if left < 0 then
      left = 0
    end
    redis.call('HSET', KEYS[5], 'bytes', string.format('%.0f', left))
  end
  local all = redis.call('HGETALL', KEYS[8])
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 't:' then
      local rec = cjson.decode(all[i + 1])
      if rec.state == 'queued' and rec.entry then
        redis.call('XACK', KEYS[7], ARGV[11], rec.entry)
        redis.call('XDEL', KEYS[7], rec.entry)
      end
    end
  end
end
local deleted = 0
for i = 1, #KEYS - K do
  if i <= sets then
    redis.call('SET', KEYS[K + i], ARGV[A + i])
  else
    deleted = deleted + redis.call('DEL', KEYS[K + i])
  end
end
local a = A + sets
for i = 1, tonumber(ARGV[5]) do
  redis.call('SADD', KEYS[3], ARGV[a + i])
end
a = a + tonumber(ARGV[5])
for i = 1, tonumber(ARGV[6]) do
  redis.call('SREM', KEYS[3], ARGV[a + i])
end
a = a + tonumber(ARGV[6])
-- A request is cleared only if it is still the one served: an operator's newer request (a new
-- id) survives a leader's clearing of an older one.
for i = 1, tonumber(ARGV[7]) do
  local period, id = ARGV[a + 2 * i - 1], ARGV[a + 2 * i]
  local v = redis.call('HGET', KEYS[4], period)
  if v and (v == id or string.sub(v, 1, #id + 1) == id .. ' ') then
    redis.call('HDEL', KEYS[4], period)
  end
end
a = a + 2 * tonumber(ARGV[7])
-- The run index: every period with a record (or a record moved aside), for the run history.
for i = 1, tonumber(ARGV[10]) do
  redis.call('ZADD', KEYS[6], 0, ARGV[a + i])
end
return applied(tostring(deleted), usage[1], usage[2])
"#
    ))
});
