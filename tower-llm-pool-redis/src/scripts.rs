//! The server-side scripts: a take and a give-back are each one atomic
//! Lua script on one key, so replicas share a deployment's buckets
//! exactly.
//!
//! A deployment's buckets are one hash, `{prefix}{deployment}`: `r` and
//! `t`, what the request and token buckets hold in units × 60,000 (a
//! bucket refilling at `limit` a minute gains exactly `limit` of those a
//! millisecond: integers throughout, exact in Lua's doubles for any
//! `u32` limit), and `at`, when they were last refilled (server time,
//! ms). A missing hash, or field, is a full bucket: after 60 s untouched
//! every bucket is full anyway, so the hash expires 60 s after its last
//! write ([`TTL_MS`]). Time is the server's (`TIME`): replicas' clocks
//! do not matter.

use redis::Script;

/// A missing hash is full buckets: any expiry of at least 60 s (a full
/// refill) is exact.
pub(crate) const TTL_MS: u64 = 60_000;

/// Every script's start: the limits (`ARGV[1]` requests, `ARGV[2]`
/// tokens per minute; `''` for a limit not set), the buckets refilled to
/// now (`r`, `t`), and `save`, which writes them back.
const REFILL: &str = r"
local k = KEYS[1]
local rc, tc = tonumber(ARGV[1]), tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local v = redis.call('HMGET', k, 'r', 't', 'at')
local elapsed = math.max(now - (tonumber(v[3]) or now), 0)
local function refilled(held, cap, full)
  if not cap then return 0 end
  local l = tonumber(held)
  if not l then return full end
  return math.min(l + elapsed * cap, full)
end
-- The request bucket holds `ARGV[#ARGV - 1]` ms of its rate (at least one
-- request; '' for a minute's), the token bucket a minute.
local burst = tonumber(ARGV[#ARGV - 1])
local rfull = rc and (burst and math.max(rc * burst, 60000) or rc * 60000) or 0
local tfull = tc and tc * 60000 or 0
local r, t = refilled(v[1], rc, rfull), refilled(v[2], tc, tfull)
local function save()
  local f = {'at', string.format('%.0f', now)}
  if rc then
    f[#f + 1] = 'r'
    f[#f + 1] = string.format('%.0f', r)
  end
  if tc then
    f[#f + 1] = 't'
    f[#f + 1] = string.format('%.0f', t)
  end
  redis.call('HSET', k, unpack(f))
  redis.call('PEXPIRE', k, ARGV[#ARGV])
end
";

/// `ARGV[3]`: the request's tokens (estimated); `ARGV[4]`: the request
/// bucket's burst (ms, or ''); `ARGV[5]`: the expiry.
/// Takes one request and the tokens (what the token bucket holds, at
/// most: a request larger than the bucket goes when it is full) from
/// both buckets, or from neither. Replies `{wait, taken}`: `wait` 0 and
/// the whole tokens taken, or the ms until both have room (at most
/// 60,000) and 0.
const TAKE: &str = r"
local tokens = tonumber(ARGV[3])
local function wait(held, cap, units, full)
  if not cap then return 0 end
  local need = math.min(units * 60000, full)
  if held >= need then return 0 end
  return math.ceil((need - held) / cap)
end
local w = math.max(wait(r, rc, 1, rfull), wait(t, tc, tokens, tfull))
if w > 0 then return {w, 0} end
local took = 0
if rc then r = r - 60000 end
if tc then
  took = math.min(math.min(tokens, tc) * 60000, t)
  t = t - took
end
save()
return {0, math.floor(took / 60000)}
";

/// `ARGV[3]`: requests, `ARGV[4]`: tokens given back; `ARGV[5]`: the
/// request bucket's burst; `ARGV[6]`: the expiry. Never past a bucket's capacity. Replies 1.
const GIVE_BACK: &str = r"
if rc then r = math.min(r + math.min(tonumber(ARGV[3]), rc) * 60000, rfull) end
if tc then t = math.min(t + math.min(tonumber(ARGV[4]), tc) * 60000, tfull) end
save()
return 1
";

/// The scripts, loaded on first use (and again after a restart: `EVALSHA`
/// falls back to `EVAL`).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) take: Script,
    pub(crate) give_back: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            take: Script::new(&format!("{REFILL}{TAKE}")),
            give_back: Script::new(&format!("{REFILL}{GIVE_BACK}")),
        }
    }
}

/// A limit as a script argument: `''` when not set, 0 as 1.
pub(crate) fn limit(limit: Option<u32>) -> String {
    limit.map(|l| l.max(1).to_string()).unwrap_or_default()
}

/// An amount as a script argument: more than any `u32` capacity counts
/// the same, and stays exact in Lua.
pub(crate) fn amount(n: u64) -> u64 {
    n.min(u64::from(u32::MAX))
}

/// A take's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Taken: the whole tokens the token bucket gave.
    Now(u64),
    /// No room for this many ms.
    In(u64),
}

impl Taken {
    pub(crate) fn parse(reply: &[i64]) -> Option<Self> {
        match *reply {
            [0, taken] => Some(Taken::Now(u64::try_from(taken).ok()?)),
            [wait, 0] if wait > 0 => Some(Taken::In(u64::try_from(wait).ok()?)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_and_arguments_are_bounded() {
        assert_eq!(Taken::parse(&[0, 12]), Some(Taken::Now(12)));
        assert_eq!(Taken::parse(&[1000, 0]), Some(Taken::In(1000)));
        assert_eq!(Taken::parse(&[-1, 0]), None);
        assert_eq!(Taken::parse(&[1]), None);
        assert_eq!(limit(None), "");
        assert_eq!(limit(Some(0)), "1");
        assert_eq!(limit(Some(60)), "60");
        assert_eq!(amount(u64::MAX), u64::from(u32::MAX));
    }
}
