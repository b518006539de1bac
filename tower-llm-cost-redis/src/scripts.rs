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
//! Both expire one window after their window ends. Time is the server's
//! (`TIME`): replicas' clocks do not matter.

/// The purge every script that reads a window runs first: holds past
/// their expiry stop counting (their field becomes `x`, so a late settle
/// still adds its spend once).
const PURGE: &str = r"
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
local h = KEYS[1] .. ws .. ':h'
local z = KEYS[1] .. ws .. ':z'
purge(h, z, now)
local v = redis.call('HMGET', h, 'sc', 'st', 'hc', 'ht')
local sc, st = tonumber(v[1] or '0'), tonumber(v[2] or '0')
local hc, ht = tonumber(v[3] or '0'), tonumber(v[4] or '0')
local ends = (w + 1) * len * 1000
";

/// `KEYS[1]`: the tenant's base. `ARGV`: window length (s), hold time
/// (ms), hold id, ask cost, ask tokens, cost limit and token limit (`''`:
/// none), shadow (`1`/`0`).
///
/// Replies `{held, window, used cost, used tokens, ms until the window
/// ends, exhausted}`: `held` 1 or 0; `used` is spent plus held before
/// this ask; `exhausted` 0 (fits), 1 (the cost limit) or 2 (the token
/// limit). In shadow mode it holds even when `exhausted` is not 0.
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
  return {0, w, uc, ut, ends - now, ex}
end
redis.call('HSET', h, 'h:' .. ARGV[3], ARGV[4] .. ' ' .. ARGV[5])
if ARGV[4] ~= '0' then redis.call('HINCRBY', h, 'hc', ARGV[4]) end
if ARGV[5] ~= '0' then redis.call('HINCRBY', h, 'ht', ARGV[5]) end
redis.call('ZADD', z, now + tonumber(ARGV[2]), ARGV[3])
local expire = ends + len * 1000
redis.call('PEXPIREAT', h, expire)
redis.call('PEXPIREAT', z, expire)
return {1, w, uc, ut, ends - now, ex}
";

/// `KEYS[1]`: the tenant's base. `ARGV`: window length (s). Replies
/// `{window, spent cost, spent tokens, held cost, held tokens}` of the
/// current window.
const USAGE: &str = r"
return {w, sc, st, hc, ht}
";

/// `KEYS[1]`: the tenant's base. `ARGV`: window, window length (s), id,
/// spent cost, spent tokens, mode (`h`: settle hold `id`; `p`: push
/// number `id`).
///
/// `h`: if hold `id` is open, releases it; if it is open or expired
/// unsettled, adds the spend (so a settle retried counts once). `p`: adds
/// the spend unless push `id` was counted. Replies 1 if it added.
const SETTLE: &str = r"
local h = KEYS[1] .. ARGV[1] .. ':h'
local z = KEYS[1] .. ARGV[1] .. ':z'
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
}

impl Reserved {
    /// Parses a reply of [`RESERVE`]; `None` if malformed.
    pub(crate) fn parse(v: &[i64]) -> Option<Reserved> {
        let [held, window, cost, tokens, resets, exhausted] = v else {
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
            reserve: redis::Script::new(&format!("{PURGE}{RESERVE}")),
            usage: redis::Script::new(&format!("{PURGE}{USAGE}")),
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
            Reserved::parse(&[1, 7, 10, 20, 500, 0]),
            Some(Reserved {
                held: true,
                window: 7,
                used: (10, 20),
                resets_in_ms: 500,
                exhausted: 0,
            })
        );
        assert_eq!(
            Reserved::parse(&[0, 7, 10, 20, 500, 2]).map(|r| (r.held, r.exhausted)),
            Some((false, 2))
        );
        assert_eq!(Reserved::parse(&[2, 7, 10, 20, 500, 0]), None);
        assert_eq!(Reserved::parse(&[1, 7, 10, 20, 500, 3]), None);
        assert_eq!(Reserved::parse(&[1, -7, 10, 20, 500, 0]), None);
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
