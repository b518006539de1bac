//! The server-side scripts: every change of a shared circuit is one atomic
//! Lua script, so counts from all replicas add up exactly.
//!
//! Layout (all keys under the store's prefix):
//! - `{prefix}{id}`: a hash: `st` (`closed`, `open`, `isolated`; absent =
//!   closed), `until` (server milliseconds an open circuit cools down
//!   until), `re` (consecutive re-opens), `f` (consecutive failures), `ok`
//!   (probe successes this half-open), `gen` (bumped on every state change,
//!   never below the server's clock in ms, so it survives the key's
//!   expiry), `why` (the reason of the last change), `seq` (probe token
//!   counter), and `we<i>`/`wc<i>`/`wf<i>` (the ten slots of the ratio
//!   window: epoch, calls, failures).
//! - `{prefix}{id}:probes`: a sorted set of the probe tokens handed out in
//!   this half-open period, scored by the server time they expire at (one
//!   cooldown after they were reserved): a probe lost with its replica
//!   frees its slot then.
//! - `{prefix}events`: the pub/sub channel; a message is
//!   `gen|state|rest_ms|reopens|reason|id`.
//!
//! Times are the server's (`TIME`), so replicas' clocks never matter: a
//! reply carries the rest of a cooldown, not an instant.
//!
//! Every script replies with an array of strings: `S gen state rest_ms
//! reopens reason` (the circuit's shared state), `C failures` (a failure
//! counted), `R gen cooldown_ms token...` (probe tokens reserved) or `N`.

/// Common to every script. `KEYS`: hash, probe set. `ARGV`: channel, id,
/// key TTL (ms), threshold, ratio (0 = off), min calls, window (ms), base
/// cooldown (ms), growth, max cooldown (ms), probes; then the script's own.
const PRELUDE: &str = r#"
local h, z = KEYS[1], KEYS[2]
local chan, id = ARGV[1], ARGV[2]
local ttl = tonumber(ARGV[3])
local threshold = tonumber(ARGV[4])
local ratio = tonumber(ARGV[5])
local min_calls = tonumber(ARGV[6])
local window = tonumber(ARGV[7])
local base, growth, maxcd = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local k = tonumber(ARGV[11])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function num(v) return tonumber(v or 0) or 0 end
local function fmt(n) return string.format('%d', n) end
local function cooldown(re)
  local c = base * (growth ^ re)
  if c > maxcd then c = maxcd end
  return math.floor(c)
end
local function bump()
  local g = math.max(num(redis.call('HGET', h, 'gen')) + 1, now)
  redis.call('HSET', h, 'gen', fmt(g))
  return g
end
local function state()
  local v = redis.call('HMGET', h, 'st', 'until', 're', 'gen', 'why')
  local st = v[1] or 'closed'
  local rest = 0
  if st == 'open' then rest = math.max(0, num(v[2]) - now) end
  return {'S', fmt(num(v[4])), st, fmt(rest), fmt(num(v[3])), v[5] or 'none'}
end
local function announce(st, rest, re, why, g)
  redis.call('PUBLISH', chan, fmt(g) .. '|' .. st .. '|' .. fmt(rest) .. '|' .. fmt(re) .. '|' .. why .. '|' .. id)
  return {'S', fmt(g), st, fmt(rest), fmt(re), why}
end
local function clear_window()
  for i = 0, 9 do redis.call('HDEL', h, 'we' .. i, 'wc' .. i, 'wf' .. i) end
end
local function open(why)
  local re = num(redis.call('HGET', h, 're'))
  local cd = cooldown(re)
  local g = bump()
  redis.call('HSET', h, 'st', 'open', 'until', fmt(now + cd), 'f', '0', 'ok', '0', 'why', why)
  clear_window()
  redis.call('DEL', z)
  redis.call('PEXPIRE', h, cd + ttl)
  return announce('open', cd, re, why, g)
end
local function close(why)
  local g = bump()
  redis.call('HSET', h, 'st', 'closed', 'f', '0', 'ok', '0', 're', '0', 'why', why)
  redis.call('HDEL', h, 'until')
  clear_window()
  redis.call('DEL', z)
  redis.call('PEXPIRE', h, ttl)
  return announce('closed', 0, 0, why, g)
end
local function window_add(calls, fails)
  if ratio <= 0 then return false end
  local slot = math.max(1, math.floor(window / 10))
  local e = math.floor(now / slot)
  local i = e % 10
  if num(redis.call('HGET', h, 'we' .. i)) ~= e then
    redis.call('HSET', h, 'we' .. i, fmt(e), 'wc' .. i, '0', 'wf' .. i, '0')
  end
  if calls > 0 then redis.call('HINCRBY', h, 'wc' .. i, calls) end
  if fails > 0 then redis.call('HINCRBY', h, 'wf' .. i, fails) end
  local c, f = 0, 0
  for j = 0, 9 do
    local v = redis.call('HMGET', h, 'we' .. j, 'wc' .. j, 'wf' .. j)
    if e - num(v[1]) < 10 then
      c = c + num(v[2])
      f = f + num(v[3])
    end
  end
  return c >= min_calls and f >= ratio * c
end
local function cold(st) return st == 'open' or st == 'isolated' end
"#;

/// A tripping failure in the closed state. `ARGV[12]`: successes not yet
/// written (counted in the ratio window first).
const FAILURE: &str = r#"
local st = redis.call('HGET', h, 'st')
if cold(st) then return state() end
local f = redis.call('HINCRBY', h, 'f', 1)
local by_ratio = window_add(tonumber(ARGV[12]) + 1, 1)
if threshold > 0 and f >= threshold then return open('consecutive_failures') end
if by_ratio then return open('failure_ratio') end
redis.call('PEXPIRE', h, ttl)
if f == 1 then
  redis.call('PUBLISH', chan, fmt(num(redis.call('HGET', h, 'gen'))) .. '|failing|0|0|none|' .. id)
end
return {'C', fmt(f)}
"#;

/// Successes in the closed state. `ARGV[12]`: how many (for the ratio
/// window, which they may complete: a batch of successes arriving after
/// the failures can open it); `ARGV[13]`: `1` to reset the consecutive
/// count.
const SUCCESS: &str = r#"
local st = redis.call('HGET', h, 'st')
if cold(st) then return state() end
if ARGV[13] == '1' and redis.call('EXISTS', h) == 1 then redis.call('HSET', h, 'f', '0') end
local n = tonumber(ARGV[12])
if n > 0 and ratio > 0 then
  -- Late successes complete the window: failures already counted may now
  -- reach the minimum number of calls.
  if window_add(n, 0) then return open('failure_ratio') end
  redis.call('PEXPIRE', h, ttl)
end
return {'N'}
"#;

/// A replica's own circuit opened (or re-opened): open the shared one
/// unless it already is. `ARGV[12]`: the reason.
const TRIP: &str = r#"
local st = redis.call('HGET', h, 'st')
if cold(st) then return state() end
if ARGV[12] == 'probe_failed' then redis.call('HINCRBY', h, 're', 1) end
return open(ARGV[12])
"#;

/// Reserves up to `ARGV[12]` probe slots of an open circuit whose cooldown
/// is over; tokens are named `ARGV[13]:<n>`.
const RESERVE: &str = r#"
local v = redis.call('HMGET', h, 'st', 'until')
if v[1] ~= 'open' or now < num(v[2]) then return state() end
redis.call('ZREMRANGEBYSCORE', z, '-inf', fmt(now))
local free = k - redis.call('ZCARD', z)
local n = math.min(tonumber(ARGV[12]), free)
local cd = cooldown(num(redis.call('HGET', h, 're')))
local out = {'R', fmt(num(redis.call('HGET', h, 'gen'))), fmt(cd)}
for i = 1, n do
  local tok = ARGV[13] .. ':' .. fmt(redis.call('HINCRBY', h, 'seq', 1))
  redis.call('ZADD', z, fmt(now + cd), tok)
  out[#out + 1] = tok
end
redis.call('PEXPIRE', z, cd + ttl)
return out
"#;

/// A probe holding token `ARGV[12]` ended: `ARGV[13]` is `ok`, `fail` or
/// `release`. A token no longer in the set (expired, or from an earlier
/// half-open period) counts nothing.
const PROBE: &str = r#"
local removed = redis.call('ZREM', z, ARGV[12])
if ARGV[13] == 'release' or removed == 0 then return {'N'} end
local v = redis.call('HMGET', h, 'st', 'until')
if v[1] ~= 'open' or now < num(v[2]) then return state() end
if ARGV[13] == 'ok' then
  if redis.call('HINCRBY', h, 'ok', 1) >= k then return close('probes_succeeded') end
  return {'N'}
end
redis.call('HINCRBY', h, 're', 1)
return open('probe_failed')
"#;

/// Closes the shared circuit and forgets its counts. `ARGV[12]`: the
/// reason.
const CLOSE: &str = r#"
return close(ARGV[12])
"#;

/// Isolates the shared circuit (opened by hand until closed by hand).
const ISOLATE: &str = r#"
if redis.call('HGET', h, 'st') == 'isolated' then return state() end
local g = bump()
redis.call('HSET', h, 'st', 'isolated', 'f', '0', 'ok', '0', 'why', 'isolated')
redis.call('DEL', z)
redis.call('PEXPIRE', h, ttl)
return announce('isolated', 0, num(redis.call('HGET', h, 're')), 'isolated', g)
"#;

/// Reads the shared state.
const READ: &str = r#"
return state()
"#;

/// The scripts, compiled once per store.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) failure: redis::Script,
    pub(crate) success: redis::Script,
    pub(crate) trip: redis::Script,
    pub(crate) reserve: redis::Script,
    pub(crate) probe: redis::Script,
    pub(crate) close: redis::Script,
    pub(crate) isolate: redis::Script,
    pub(crate) read: redis::Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let make = |body: &str| redis::Script::new(&format!("{PRELUDE}{body}"));
        Scripts {
            failure: make(FAILURE),
            success: make(SUCCESS),
            trip: make(TRIP),
            reserve: make(RESERVE),
            probe: make(PROBE),
            close: make(CLOSE),
            isolate: make(ISOLATE),
            read: make(READ),
        }
    }
}
