//! The server-side scripts: a put and a get are each one Lua script on
//! one key, so an answer and its stored-at time are written together and
//! read with the server's clock.
//!
//! Layout: one hash per key, `{prefix}{key}`, with `at` (the server's
//! clock when the answer was stored, in milliseconds since the epoch) and
//! `answer` (`serde_json` of `Stored`). The key expires `keep` after the
//! put (`PEXPIRE`). Only `KEYS[1]` is touched: it works unchanged on a
//! Redis Cluster.

use std::time::Duration;

use redis::Value;

/// `KEYS[1]`: the key. `ARGV`: the answer, how long to keep it (ms; `0`:
/// remove the key). Replaces whatever the key held (another type
/// included); replies 1 if stored, 0 if removed.
const PUT: &str = r"
local keep = tonumber(ARGV[2])
redis.call('DEL', KEYS[1])
if not keep or keep <= 0 then return 0 end
local t = redis.call('TIME')
local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'at', string.format('%d', at), 'answer', ARGV[1])
redis.call('PEXPIRE', KEYS[1], keep)
return 1
";

/// `KEYS[1]`: the key. Replies the server's clock (`TIME`: seconds,
/// microseconds) and, when the key holds an entry, its `at` and
/// `answer`: `{s, us}` (nothing there), `{s, us, at, answer}` (an entry),
/// `{s, us, ''}` (a key that is not one of ours: another type, or a hash
/// without both fields).
const GET: &str = r"
local t = redis.call('TIME')
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return {t[1], t[2]} end
if kind ~= 'hash' then return {t[1], t[2], ''} end
local v = redis.call('HMGET', KEYS[1], 'at', 'answer')
if not v[1] or not v[2] then return {t[1], t[2], ''} end
return {t[1], t[2], v[1], v[2]}
";

/// What [`GET`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// No entry under the key.
    Miss,
    /// An entry: its age by the server's clock (zero if it was stored
    /// "after" the server's now: the clock went back) and the answer's
    /// JSON, not yet decoded.
    Entry { age: Duration, answer: Vec<u8> },
    /// A reply, or an entry, that is not what [`GET`] and [`PUT`] make.
    Unreadable,
}

impl Found {
    /// Parses a reply of [`GET`]; anything malformed is
    /// [`Found::Unreadable`], never a panic.
    pub(crate) fn parse(reply: Value) -> Found {
        let Value::Array(items) = reply else {
            return Found::Unreadable;
        };
        let (clock, rest) = items.split_at(items.len().min(2));
        let [secs, micros] = clock else {
            return Found::Unreadable;
        };
        let (Some(secs), Some(micros)) = (number(secs), number(micros)) else {
            return Found::Unreadable;
        };
        let Some(now) = secs
            .checked_mul(1000)
            .and_then(|ms| ms.checked_add(micros / 1000))
        else {
            return Found::Unreadable;
        };
        match rest {
            [] => Found::Miss,
            [at, Value::BulkString(answer)] => match number(at) {
                Some(at) => Found::Entry {
                    age: Duration::from_millis(now.saturating_sub(at)),
                    answer: answer.clone(),
                },
                None => Found::Unreadable,
            },
            _ => Found::Unreadable,
        }
    }
}

/// A non-negative integer sent as a string (or as an integer).
fn number(v: &Value) -> Option<u64> {
    match v {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// The scripts, hashed once per store (`EVALSHA`, loaded again by the
/// `redis` crate after a server restart).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) put: redis::Script,
    pub(crate) get: redis::Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            put: redis::Script::new(PUT),
            get: redis::Script::new(GET),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Found, Value};
    use std::time::Duration;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn reply(items: &[&str]) -> Value {
        Value::Array(items.iter().map(|s| bulk(s)).collect())
    }

    #[test]
    fn a_clock_alone_is_a_miss() {
        assert_eq!(Found::parse(reply(&["1700000000", "123456"])), Found::Miss);
    }

    #[test]
    fn an_entry_is_aged_by_the_servers_clock() {
        // now = 1700000000123 ms (the microseconds round down).
        let found = Found::parse(reply(&["1700000000", "123999", "1699999995100", "{}"]));
        assert_eq!(
            found,
            Found::Entry {
                age: Duration::from_millis(5023),
                answer: b"{}".to_vec(),
            }
        );
    }

    #[test]
    fn an_entry_from_the_future_has_age_zero() {
        let found = Found::parse(reply(&["1700000000", "0", "1700000009000", "{}"]));
        assert_eq!(
            found,
            Found::Entry {
                age: Duration::ZERO,
                answer: b"{}".to_vec(),
            }
        );
    }

    #[test]
    fn malformed_replies_are_unreadable() {
        let cases = [
            Value::Nil,
            Value::Okay,
            bulk("1700000000"),
            reply(&[]),
            reply(&["1700000000"]),
            reply(&["x", "0"]),
            reply(&["1700000000", "-1"]),
            reply(&["1700000000", "0", ""]),
            reply(&["1700000000", "0", "soon", "{}"]),
            reply(&["1700000000", "0", "-5", "{}"]),
            reply(&["1700000000", "0", "1", "{}", "extra"]),
            reply(&["18446744073709551615", "0"]),
            Value::Array(vec![bulk("1"), bulk("0"), bulk("1"), Value::Nil]),
            Value::Array(vec![bulk("1"), bulk("0"), Value::Nil, bulk("{}")]),
        ];
        for case in cases {
            let shown = format!("{case:?}");
            assert_eq!(Found::parse(case), Found::Unreadable, "{shown}");
        }
    }

    #[test]
    fn integers_count_as_numbers() {
        let found = Found::parse(Value::Array(vec![
            Value::Int(2),
            Value::Int(0),
            Value::Int(1500),
            bulk("[]"),
        ]));
        assert_eq!(
            found,
            Found::Entry {
                age: Duration::from_millis(500),
                answer: b"[]".to_vec(),
            }
        );
    }
}
