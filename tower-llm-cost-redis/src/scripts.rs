//! The server-side scripts: a reserve and a settle are each one atomic
//! Lua script, so replicas never together pass a limit.
//!
//! Layout, per tenant and window: `KEYS[1]` is the tenant's base,
//! `{prefix}{t<hex of the id>}:`, and the scripts add the window index:
//!
//! - `{base}{window}:h`, a hash: `sc` and `st` (cost in nano-dollars and
//!   tokens spent), `hc` and `ht` (held by open holds), `h:<id>` per open
//!   hold (`"<cost> <tokens>"`, or `x` once it expired unsettled), and
//!   `p:<id>` per push of spend counted while Redis was down (so a push
//!   retried counts once);
//! - `{base}{window}:z`, a sorted set of open hold ids scored by their
//!   expiry (server time, ms).
//!
//! Per window, `{prefix}tenants:{window}` (`KEYS[2]` is its prefix) is the
//! set of the tenant ids counted apart in it: a reserve (or a push) of a
//! tenant not in it, not named, when it holds `max_tenants` ids already,
//! goes to the overflow tenant's keys (`KEYS[3]`, the base of
//! [`OVERFLOW_TENANT`](tower_llm_cost::OVERFLOW_TENANT)) and the tenant is
//! not added. Every check is O(1) (`SISMEMBER`, `SCARD`, `SADD`).
//!
//! All expire one window after their window ends. Time is the server's
//! (`TIME`): replicas' clocks do not matter.

/// What every script that reads the current window runs first: the purge
/// (holds past their expiry stop counting: their field becomes `x`, so a
/// late settle still adds its spend once) and the server's clock.
const CLOCK: &str = r"
local function purge(h, z, now)
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  if #gone == 0 then return end
  for _, id in ipairs(gone) do
    local a = redis.call('HGET', h, 'h:' .. id)
    if a and a ~= 'x' then
      local c, t = string.match(a, '^(%d+) (%d+)$')
      if c and c ~= '0' then redis.call('HINCRBY', h, 'hc', '-' .. c) end
      if t and t ~= '0' then redis.call('HINCRBY', h, 'ht', '-' .. t) end
      redis.call('HSET', h, 'h:' .. id, 'x')
    end
  end
  redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
end
local t = redis.call('TIME')
local secs = tonumber(t[1])
local now = secs * 1000 + math.floor(tonumber(t[2]) / 1000)
local len = tonumber(ARGV[1])
local w = math.floor(secs / len)
local ws = string.format('%d', w)
local ends = (w + 1) * len * 1000
";

/// The read every script that reads the current window of `base` runs,
/// after [`CLOCK`] (and, for a reserve, [`ROUTE`]): the purge, then spent
/// and held.
const READ: &str = r"
local h = base .. ws .. ':h'
local z = base .. ws .. ':z'
purge(h, z, now)
local v = redis.call('HMGET', h, 'sc', 'st', 'hc', 'ht')
local sc, st = tonumber(v[1] or '0'), tonumber(v[2] or '0')
local hc, ht = tonumber(v[3] or '0'), tonumber(v[4] or '0')
";

/// Which keys a reserve counts in: the tenant's (`KEYS[1]`) if it is in
/// the window's set of tenants counted apart (`KEYS[2]` .. window), or is
/// named (`ARGV[9]` = `1`), or the set holds fewer than `ARGV[11]`
/// (`max_tenants`) ids, and then it is added; else the overflow tenant's
/// (`KEYS[3]`), `o` = 1. `ARGV[10]`: the tenant id.
const ROUTE: &str = r"
local base, o = KEYS[1], 0
local n = KEYS[2] .. ws
if redis.call('SISMEMBER', n, ARGV[10]) == 0 then
  if ARGV[9] ~= '1' and redis.call('SCARD', n) >= tonumber(ARGV[11]) then
    base, o = KEYS[3], 1
  else
    redis.call('SADD', n, ARGV[10])
    redis.call('PEXPIREAT', n, ends + len * 1000)
  end
end
";

/// `KEYS`: the tenant's base, the prefix of the windows' sets of tenants,
/// the overflow tenant's base. `ARGV`: window length (s), hold time (ms),
/// hold id, ask cost, ask tokens, cost limit and token limit (`''`:
/// none), shadow (`1`/`0`), named (`1`/`0`), the tenant id,
/// `max_tenants`.
///
/// Replies `{held, window, used cost, used tokens, ms until the window
/// ends, exhausted, overflow}`: `held` 1 or 0; `used` is spent plus held
/// before this ask; `exhausted` 0 (fits), 1 (the cost limit) or 2 (the
/// token limit); `overflow` 1 when the tenant is counted with the others
/// past `max_tenants` (the hold is in the overflow tenant's keys). In
/// shadow mode it holds even when `exhausted` is not 0.
const RESERVE: &str = r"
local uc, ut = sc + hc, st + ht
local ac, at = tonumber(ARGV[4]), tonumber(ARGV[5])
local ex = 0
if ARGV[6] ~= '' and ac > math.max(tonumber(ARGV[6]) - uc, 0) then
  ex = 1
elseif ARGV[7] ~= '' and at > math.max(tonumber(ARGV[7]) - ut, 0) then
  ex = 2
end
if ex ~= 0 and ARGV[8] ~= '1' then
  return {0, w, uc, ut, ends - now, ex, o}
end
redis.call('HSET', h, 'h:' .. ARGV[3], ARGV[4] .. ' ' .. ARGV[5])
if ARGV[4] ~= '0' then redis.call('HINCRBY', h, 'hc', ARGV[4]) end
if ARGV[5] ~= '0' then redis.call('HINCRBY', h, 'ht', ARGV[5]) end
redis.call('ZADD', z, now + tonumber(ARGV[2]), ARGV[3])
local expire = ends + len * 1000
redis.call('PEXPIREAT', h, expire)
redis.call('PEXPIREAT', z, expire)
return {1, w, uc, ut, ends - now, ex, o}
";

/// `KEYS[1]`: the tenant's base (its own keys, never the overflow
/// tenant's). `ARGV`: window length (s). Replies `{window, spent cost,
/// spent tokens, held cost, held tokens}` of the current window.
const USAGE: &str = r"
return {w, sc, st, hc, ht}
";

/// `KEYS[1]`: the tenant's base (a push: and the prefix of the windows'
/// sets of tenants, the overflow tenant's base). `ARGV`: window, window
/// length (s), id, spent cost, spent tokens, mode (`h`: settle hold `id`;
/// `p`: push number `id`; a push: and named (`1`/`0`), the tenant id,
/// `max_tenants`).
///
/// `h`: if hold `id` is open, releases it; if it is open or expired
/// unsettled, adds the spend (so a settle retried counts once); the hold
/// names the keys it was taken in. `p`: adds the spend unless push `id`
/// was counted, to the keys a reserve of the tenant in that window would
/// count in (as [`ROUTE`] picks them: a push never counts a tenant apart
/// past `max_tenants`; retried, it picks the same keys, since a window's
/// set only grows). Replies 1 if it added.
const SETTLE: &str = r"
local base = KEYS[1]
if ARGV[6] == 'p' then
  local n = KEYS[2] .. ARGV[1]
  if redis.call('SISMEMBER', n, ARGV[8]) == 0 then
    if ARGV[7] ~= '1' and redis.call('SCARD', n) >= tonumber(ARGV[9]) then
      base = KEYS[3]
    else
      redis.call('SADD', n, ARGV[8])
      redis.call('PEXPIREAT', n, (tonumber(ARGV[1]) + 2) * tonumber(ARGV[2]) * 1000)
    end
  end
end
local h = base .. ARGV[1] .. ':h'
local z = base .. ARGV[1] .. ':z'
local add = false
if ARGV[6] == 'p' then
  add = redis.call('HSETNX', h, 'p:' .. ARGV[3], '1') == 1
else
  local a = redis.call('HGET', h, 'h:' .. ARGV[3])
  if a then
    add = true
    redis.call('HDEL', h, 'h:' .. ARGV[3])
    if a ~= 'x' then
      local c, t = string.match(a, '^(%d+) (%d+)$')
      if c and c ~= '0' then redis.call('HINCRBY', h, 'hc', '-' .. c) end
      if t and t ~= '0' then redis.call('HINCRBY', h, 'ht', '-' .. t) end
      redis.call('ZREM', z, ARGV[3])
    end
  end
end
if not add then return 0 end
if ARGV[4] ~= '0' then redis.call('HINCRBY', h, 'sc', ARGV[4]) end
if ARGV[5] ~= '0' then redis.call('HINCRBY', h, 'st', ARGV[5]) end
redis.call('PEXPIREAT', h, (tonumber(ARGV[1]) + 2) * tonumber(ARGV[2]) * 1000)
return 1
";

/// What [`RESERVE`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reserved {
    /// The hold was taken.
    pub(crate) held: bool,
    /// The window (by the server's clock).
    pub(crate) window: u64,
    /// Spent plus held before the ask: cost (nanos), tokens.
    pub(crate) used: (u64, u64),
    /// Milliseconds until the window ends.
    pub(crate) resets_in_ms: u64,
    /// 0 fits, 1 cost limit, 2 token limit.
    pub(crate) exhausted: u8,
    /// Counted with the tenants past `max_tenants`: the hold is the
    /// overflow tenant's.
    pub(crate) overflow: bool,
}

impl Reserved {
    /// Parses a reply of [`RESERVE`]; `None` if malformed.
    pub(crate) fn parse(v: &[i64]) -> Option<Reserved> {
        let [held, window, cost, tokens, resets, exhausted, overflow] = v else {
            return None;
        };
        let n = |x: i64| u64::try_from(x).ok();
        Some(Reserved {
            held: match held {
                0 => false,
                1 => true,
                _ => return None,
            },
            window: n(*window)?,
            used: (n(*cost)?, n(*tokens)?),
            resets_in_ms: n(*resets)?,
            exhausted: match exhausted {
                0..=2 => u8::try_from(*exhausted).ok()?,
                _ => return None,
            },
            overflow: match overflow {
                0 => false,
                1 => true,
                _ => return None,
            },
        })
    }
}

/// What [`USAGE`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    pub(crate) window: u64,
    pub(crate) spent: (u64, u64),
    pub(crate) held: (u64, u64),
}

impl Counted {
    /// Parses a reply of [`USAGE`]; `None` if malformed.
    pub(crate) fn parse(v: &[i64]) -> Option<Counted> {
        let [window, sc, st, hc, ht] = v else {
            return None;
        };
        let n = |x: i64| u64::try_from(x).ok();
        Some(Counted {
            window: n(*window)?,
            spent: (n(*sc)?, n(*st)?),
            held: (n(*hc)?, n(*ht)?),
        })
    }
}

/// The scripts, hashed once per store (`EVALSHA`, loaded again by the
/// `redis` crate after a server restart).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) reserve: redis::Script,
    pub(crate) usage: redis::Script,
    pub(crate) settle: redis::Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            reserve: redis::Script::new(&format!("{CLOCK}{ROUTE}{READ}{RESERVE}")),
            usage: redis::Script::new(&format!("{CLOCK}local base = KEYS[1]\n{READ}{USAGE}")),
            settle: redis::Script::new(SETTLE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Counted, Reserved};

    #[test]
    fn replies_parse_and_malformed_ones_do_not() {
        assert_eq!(
            Reserved::parse(&[1, 7, 10, 20, 500, 0, 0]),
            Some(Reserved {
                held: true,
                window: 7,
                used: (10, 20),
                resets_in_ms: 500,
                exhausted: 0,
                overflow: false,
            })
        );
        assert_eq!(
            Reserved::parse(&[0, 7, 10, 20, 500, 2, 1]).map(|r| (r.held, r.exhausted, r.overflow)),
            Some((false, 2, true))
        );
        assert_eq!(Reserved::parse(&[2, 7, 10, 20, 500, 0, 0]), None);
        assert_eq!(Reserved::parse(&[1, 7, 10, 20, 500, 3, 0]), None);
        assert_eq!(Reserved::parse(&[1, 7, 10, 20, 500, 0, 2]), None);
        assert_eq!(Reserved::parse(&[1, -7, 10, 20, 500, 0, 0]), None);
        assert_eq!(Reserved::parse(&[1, 7, 10, 20, 500, 0]), None);
        assert_eq!(Reserved::parse(&[1, 7, 10]), None);
        assert_eq!(
            Counted::parse(&[3, 1, 2, 3, 4]),
            Some(Counted {
                window: 3,
                spent: (1, 2),
                held: (3, 4),
            })
        );
        assert_eq!(Counted::parse(&[3, 1, 2, 3]), None);
    }
}
