//! The server-side scripts: each step of a key's life is one atomic Lua
//! script, so replicas never both lead, and a lease that no longer holds
//! changes nothing.
//!
//! Layout: one hash per key, `{prefix}{key}`, with `fp` (the request's
//! fingerprint, hex) and either `lease` (reserved: a call is producing
//! the answer; the key expires after the lease TTL) or `answer` (the
//! stored answer, `serde_json` of `Stored`; the key expires after the
//! answer's TTL). The channel `{prefix}notices` carries the key (without
//! the prefix) each time a reservation ends, stored or given up.

/// `KEYS[1]`: the key. `ARGV`: fingerprint, lease, lease TTL (ms).
/// Replies `{'replay', answer}`, `{'mismatch'}`, `{'busy'}` or `{'lead'}`.
const BEGIN: &str = r#"
local v = redis.call('HMGET', KEYS[1], 'fp', 'lease', 'answer')
if v[3] then
  if v[1] == ARGV[1] then return {'replay', v[3]} end
  return {'mismatch'}
end
if v[2] then
  if v[1] == ARGV[1] then return {'busy'} end
  return {'mismatch'}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'lease', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'lead'}
"#;

/// `KEYS[1]`: the key. `ARGV`: lease, answer, TTL (ms), channel, notice.
/// Stores the answer only if the lease still holds; replies 1 if stored.
const COMPLETE: &str = r#"
if redis.call('HGET', KEYS[1], 'lease') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'lease')
redis.call('HSET', KEYS[1], 'answer', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"#;

/// `KEYS[1]`: the key. `ARGV`: lease, channel, notice. Gives the key up
/// only if the lease still holds; replies 1 if it did.
const RELEASE: &str = r#"
if redis.call('HGET', KEYS[1], 'lease') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"#;

/// What [`BEGIN`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Lead,
    Replay(String),
    Mismatch,
    Busy,
}

impl Reply {
    /// Parses a reply of [`BEGIN`]; `None` if malformed.
    pub(crate) fn parse(mut v: Vec<String>) -> Option<Reply> {
        let answer = if v.len() == 2 { v.pop() } else { None };
        match (v.as_slice(), answer) {
            ([tag], None) if tag == "lead" => Some(Reply::Lead),
            ([tag], None) if tag == "mismatch" => Some(Reply::Mismatch),
            ([tag], None) if tag == "busy" => Some(Reply::Busy),
            ([tag], Some(answer)) if tag == "replay" => Some(Reply::Replay(answer)),
            _ => None,
        }
    }
}

/// The scripts, hashed once per store (`EVALSHA`, loaded again by the
/// `redis` crate after a server restart).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) begin: redis::Script,
    pub(crate) complete: redis::Script,
    pub(crate) release: redis::Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            begin: redis::Script::new(BEGIN),
            complete: redis::Script::new(COMPLETE),
            release: redis::Script::new(RELEASE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Reply;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn replies_parse_and_malformed_ones_do_not() {
        assert_eq!(Reply::parse(strings(&["lead"])), Some(Reply::Lead));
        assert_eq!(Reply::parse(strings(&["busy"])), Some(Reply::Busy));
        assert_eq!(Reply::parse(strings(&["mismatch"])), Some(Reply::Mismatch));
        assert_eq!(
            Reply::parse(strings(&["replay", "{}"])),
            Some(Reply::Replay("{}".to_owned()))
        );
        assert_eq!(Reply::parse(strings(&["replay"])), None);
        assert_eq!(Reply::parse(strings(&["lead", "x"])), None);
        assert_eq!(Reply::parse(strings(&["what"])), None);
        assert_eq!(Reply::parse(Vec::new()), None);
    }
}
