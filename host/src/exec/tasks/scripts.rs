//! The fan-out scripts, one per writer (see the module doc of [`super`] for who writes what).
//! Each begins with the shared checks of [`crate::coord::checks`].

use std::sync::LazyLock;

use redis::Script;

use crate::coord::checks::{CLAIM_CHECK, RUN_ENDED, TERM_CHECK};

pub(super) static SUBMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TERM_CHECK}{}",
        r#"
-- KEYS: lease, fence, tasks stream, the run's task hash, its data hash, the job's usage.
-- ARGV: owner, token, group, period, work channel, number of tasks, the run's component
--       version, its scheduled time, the most tasks a run may have, the run's attempt, the
--       job's quota of bytes, then (id, payload) pairs.
local refused = term_check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refused then
  return refused
end
-- The run's bound: nothing is added when the new tasks would take it past it.
local new, added_bytes = 0, 0
for i = 1, tonumber(ARGV[6]) do
  local id = ARGV[10 + 2 * i]
  if redis.call('HEXISTS', KEYS[4], 't:' .. id) == 0 then
    new = new + 1
    added_bytes = added_bytes + #id + #ARGV[11 + 2 * i]
  end
end
local submitted = tonumber(redis.call('HGET', KEYS[4], 'n:submitted') or '0')
if submitted + new > tonumber(ARGV[9]) then
  return {1, 'too-many', tostring(submitted), ''}
end
-- The payloads count against the job's storage quota (bytes) while the run keeps them; the
-- run's end takes them off again (the fenced write that ends it).
local bytes = tonumber(redis.call('HGET', KEYS[6], 'bytes') or '0') + added_bytes
if added_bytes > 0 and bytes > tonumber(ARGV[11]) then
  return {1, 'quota', string.format('%.0f', bytes), redis.call('HGET', KEYS[6], 'keys') or '0'}
end
if added_bytes > 0 then
  redis.call('HSET', KEYS[6], 'bytes', string.format('%.0f', bytes))
  redis.call('HINCRBY', KEYS[4], 'n:bytes', added_bytes)
end
-- The group exists from the first task on (an error when it already does is expected).
redis.pcall('XGROUP', 'CREATE', KEYS[3], ARGV[3], '0', 'MKSTREAM')
local added = 0
for i = 1, tonumber(ARGV[6]) do
  local id, payload = ARGV[10 + 2 * i], ARGV[11 + 2 * i]
  if redis.call('HEXISTS', KEYS[4], 't:' .. id) == 0 then
    local entry = redis.call('XADD', KEYS[3], '*', 'period', ARGV[4], 'id', id, 'attempt', '1',
      'token', ARGV[2], 'owner', ARGV[1], 'component', ARGV[7], 'scheduled', ARGV[8],
      'run', ARGV[10])
    redis.call('HSET', KEYS[4], 't:' .. id, cjson.encode({state = 'queued', attempt = 1,
      entry = entry, token = ARGV[2], owner = ARGV[1], component = ARGV[7],
      scheduled = ARGV[8], run = ARGV[10]}))
    redis.call('HSET', KEYS[5], 'p:' .. id, payload)
    redis.call('HINCRBY', KEYS[4], 'n:submitted', 1)
    added = added + 1
  end
end
if added > 0 then
  redis.call('PUBLISH', ARGV[5], 'tasks')
end
return {1, 'submitted', tostring(added), ''}
"#
    ))
});

pub(super) static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TERM_CHECK}{CLAIM_CHECK}{RUN_ENDED}{}",
        r#"
-- KEYS: lease, fence, tasks stream, the run's task hash, its data hash, the job's usage.
-- ARGV: owner, token (the submitting term's), group, entry, consumer, deliveries, id,
--       'ok', 'fail' or 'not-ready', output or error, attempts allowed, period, work channel,
--       notice channel, the run attempt the task was submitted for, the back-off (ms) before
--       the task runs again, the job's quota of bytes.
local refused = term_check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refused then
  return refused
end
local raw = redis.call('HGET', KEYS[4], 't:' .. ARGV[7])
local rec = raw and cjson.decode(raw)
if run_ended(rec, ARGV[14]) then
  -- The run is over (done, failed: its task records went with it) or was run again.
  redis.call('XACK', KEYS[3], ARGV[3], ARGV[4])
  redis.call('XDEL', KEYS[3], ARGV[4])
  return {0, 'run-ended', '', ARGV[7]}
end
if not claim_holds(KEYS[3], ARGV[3], ARGV[4], ARGV[5], ARGV[6]) then
  return {0, 'claim-lost', '', ARGV[5]}
end
if rec.entry ~= ARGV[4] or rec.state ~= 'queued' then
  -- Not this task's current attempt any more (adopted, requeued or finished): drop the entry.
  redis.call('XACK', KEYS[3], ARGV[3], ARGV[4])
  redis.call('XDEL', KEYS[3], ARGV[4])
  return {0, 'claim-lost', '', ARGV[5]}
end
redis.call('XACK', KEYS[3], ARGV[3], ARGV[4])
redis.call('XDEL', KEYS[3], ARGV[4])
local outcome
-- An output counts against the job's storage quota (bytes) while the run keeps it: one that
-- would take the job past it fails the task (retrying would fail the same way).
local output_bytes = #ARGV[7] + #ARGV[9]
local bytes = tonumber(redis.call('HGET', KEYS[6], 'bytes') or '0') + output_bytes
if ARGV[8] == 'ok' and bytes > tonumber(ARGV[16]) then
  rec.state = 'failed'
  rec.error = 'storage quota exceeded: its output of ' .. #ARGV[9] ..
    ' bytes would take the job to ' .. string.format('%.0f', bytes) ..
    ' bytes (the quota is ' .. ARGV[16] .. ' bytes)'
  redis.call('HINCRBY', KEYS[4], 'n:finished', 1)
  redis.call('HINCRBY', KEYS[4], 'n:failed', 1)
  outcome = 'failed'
elseif ARGV[8] == 'ok' then
  redis.call('HSET', KEYS[5], 'o:' .. ARGV[7], ARGV[9])
  redis.call('HSET', KEYS[6], 'bytes', string.format('%.0f', bytes))
  redis.call('HINCRBY', KEYS[4], 'n:bytes', output_bytes)
  rec.state = 'done'
  redis.call('HINCRBY', KEYS[4], 'n:finished', 1)
  outcome = 'done'
elseif ARGV[8] == 'not-ready' or rec.attempt < tonumber(ARGV[10]) then
  -- Queued again after the back-off: as the next attempt, or (not ready) the same one.
  if ARGV[8] == 'not-ready' then
    outcome = 'waiting'
  else
    rec.attempt = rec.attempt + 1
    outcome = 'retried'
  end
  rec.error = ARGV[9]
  local t = redis.call('TIME')
  rec.after = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[15])
  rec.entry = redis.call('XADD', KEYS[3], '*', 'period', ARGV[11], 'id', ARGV[7], 'attempt',
    tostring(rec.attempt), 'token', ARGV[2], 'owner', ARGV[1], 'component', rec.component,
    'scheduled', rec.scheduled, 'run', rec.run or '0', 'after', string.format('%d', rec.after))
  redis.call('PUBLISH', ARGV[12], 'tasks')
else
  rec.state = 'failed'
  rec.error = ARGV[9]
  redis.call('HINCRBY', KEYS[4], 'n:finished', 1)
  redis.call('HINCRBY', KEYS[4], 'n:failed', 1)
  outcome = 'failed'
end
-- The worker that ran this attempt, for `leasehold runs` and the HTTP API.
rec.worker = ARGV[5]
redis.call('HSET', KEYS[4], 't:' .. ARGV[7], cjson.encode(rec))
if outcome == 'done' or outcome == 'failed' then
  local n = redis.call('HMGET', KEYS[4], 'n:submitted', 'n:finished')
  if tonumber(n[2] or '0') >= tonumber(n[1] or '0') then
    redis.call('PUBLISH', ARGV[13], 'tasks-done')
  end
end
return {1, outcome, '', ''}
"#
    ))
});

pub(super) static ADOPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TERM_CHECK}{}",
        r#"
-- KEYS: lease, fence, tasks stream, the run's task hash.
-- ARGV: owner, token (the adopting term's), group, period, work channel.
local refused = term_check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refused then
  return refused
end
redis.pcall('XGROUP', 'CREATE', KEYS[3], ARGV[3], '0', 'MKSTREAM')
local all = redis.call('HGETALL', KEYS[4])
local adopted = 0
for i = 1, #all, 2 do
  local field = all[i]
  if string.sub(field, 1, 2) == 't:' then
    local rec = cjson.decode(all[i + 1])
    if rec.state == 'queued' and rec.owner ~= ARGV[1] then
      redis.call('XACK', KEYS[3], ARGV[3], rec.entry)
      redis.call('XDEL', KEYS[3], rec.entry)
      rec.token, rec.owner = ARGV[2], ARGV[1]
      rec.entry = redis.call('XADD', KEYS[3], '*', 'period', ARGV[4], 'id',
        string.sub(field, 3), 'attempt', tostring(rec.attempt), 'token', ARGV[2], 'owner', ARGV[1],
        'component', rec.component, 'scheduled', rec.scheduled, 'run', rec.run or '0',
        'after', string.format('%d', rec.after or 0))
      redis.call('HSET', KEYS[4], field, cjson.encode(rec))
      adopted = adopted + 1
    end
  end
end
if adopted > 0 then
  redis.call('PUBLISH', ARGV[5], 'tasks')
end
return {1, 'adopted', tostring(adopted), ''}
"#
    ))
});

pub(super) static FETCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: tasks stream.  ARGV: group, consumer, idle ms after which a claim lapses, count.
-- New entries first; else entries whose worker stopped refreshing its claim. Each with how
-- many times it has been delivered (this delivery included), whether it was taken over, and
-- Redis's clock (ms), against which an entry's `after` (its back-off) is read.
redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
local out = {}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function add(entries, reclaimed)
  for _, e in ipairs(entries) do
    if e[2] then
      local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
      table.insert(out, {e[1], e[2], p[1] and p[1][4] or 1, reclaimed, now})
    end
  end
end
local fresh = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[4], 'STREAMS',
  KEYS[1], '>')
if fresh then
  add(fresh[1][2], 0)
end
-- Lapsed claims anywhere in the pending list (XAUTOCLAIM looks at ten entries per COUNT a
-- call: walk on from its cursor, a bounded number of times).
local cursor, walked = '0-0', 0
while #out == 0 and walked < 100 do
  local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], cursor, 'COUNT',
    ARGV[4])
  add(claimed[2], 1)
  cursor, walked = claimed[1], walked + 1
  if cursor == '0-0' then
    break
  end
end
return out
"#,
    )
});

pub(super) static REFRESH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{CLAIM_CHECK}{RUN_ENDED}{}",
        r#"
-- KEYS: tasks stream, the run's task hash.  ARGV: group, entry, consumer, deliveries, id, run.
-- Resets the entry's idle time while this worker still holds it (JUSTID: not a delivery);
-- 2 when the task's run has ended, 0 when the claim is another's.
local raw = redis.call('HGET', KEYS[2], 't:' .. ARGV[5])
if run_ended(raw and cjson.decode(raw), ARGV[6]) then
  return 2
end
if not claim_holds(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[2], 'JUSTID')
return 1
"#
    ))
});

pub(super) static DROP_STALE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
-- KEYS: tasks stream, the run's task hash.  ARGV: group, entry, id.
-- An entry that is not its task's current attempt (the run ended, the task was adopted or
-- finished) is dropped; nothing else is touched.
local raw = redis.call('HGET', KEYS[2], 't:' .. ARGV[3])
if raw and cjson.decode(raw).entry == ARGV[2] then
  return 0
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
"#,
    )
});

pub(super) static GIVE_BACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{CLAIM_CHECK}{}",
        r#"
-- KEYS: tasks stream.  ARGV: group, entry, consumer, deliveries, idle ms to set, work channel.
-- A stopping worker's task, given back: its entry stays pending with this worker but idle as
-- if its claim had lapsed long ago, with the delivery undone (a graceful stop does not count
-- towards the delivery cap), and the workers are told. 0 when the claim is not this worker's.
if not claim_holds(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[2], 'IDLE', ARGV[5], 'RETRYCOUNT',
  math.max(tonumber(ARGV[4]) - 1, 0), 'JUSTID')
redis.call('PUBLISH', ARGV[6], 'tasks')
return 1
"#
    ))
});
