//! [`Pacer`]: one deployment's request and token buckets.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::headers::{HeaderIssue, HeaderIssues, LimitHeaders, MAX_HEADER_WAIT, RateLimitHeaders};

/// A deployment's configured limits: requests and tokens per minute.
/// A limit left out is not paced (until a provider's headers say one).
///
/// A configured limit is the most the operator allows: a provider's
/// headers may lower a bucket's capacity below it, never raise it above.
/// A limit of 0 is taken as 1 (a full bucket always lets one request
/// through).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaceLimits {
    /// Requests per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    /// Tokens (input and output) per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<u32>,
}

/// A bucket level is kept in units × nanoseconds-per-minute: refilling at
/// `capacity` units a minute adds exactly `capacity` per nanosecond, so
/// every wait is computed exactly, in whole nanoseconds.
const SCALE: u128 = 60_000_000_000;

/// One deployment's pacing: a request bucket and a token bucket, each
/// refilling continuously at its per-minute limit over 60 s (its
/// capacity is that limit), fed by the configured [`PaceLimits`] and by
/// what the provider's rate-limit headers say ([`observe`](Self::observe)).
///
/// [`try_take`](Self::try_take) takes one request and the request's
/// estimated tokens from both buckets at once, or says when both will
/// have room. A request larger than a bucket's capacity goes through when
/// the bucket is full (it would wait forever otherwise).
///
/// Headers are bounded: they can lower a capacity (never above the
/// configured limit) and lower what a bucket holds (never raise it), and
/// no header nor [`hold_off`](Self::hold_off) makes `try_take` wait past
/// now + [`MAX_HEADER_WAIT`]. Values that are not believed are ignored
/// and logged (`warn`) once per kind per pacer.
///
/// One short mutex per call; no allocation.
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tower_llm_pool::{PaceLimits, Pacer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // 60 requests and 6000 tokens a minute: one request a second, 100
/// // tokens a second.
/// let pacer = Pacer::new(PaceLimits { rpm: Some(60), tpm: Some(6_000) });
/// let ticket = pacer.try_take(4_000).unwrap();
/// // The answer used 1000 tokens: 3000 go back (5000 left).
/// ticket.settle(1_000);
/// let start = Instant::now();
/// // 6000 tokens: room once 1000 more have refilled, in 10 s.
/// assert_eq!(pacer.try_take(6_000).unwrap_err(), start + Duration::from_secs(10));
/// tokio::time::sleep(Duration::from_secs(10)).await;
/// let _ticket = pacer.try_take(6_000).unwrap();
///
/// // What the provider says: OpenAI-style headers.
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-ratelimit-limit-requests", "30".parse().unwrap());
/// headers.insert("x-ratelimit-remaining-requests", "0".parse().unwrap());
/// headers.insert("x-ratelimit-reset-requests", "1s".parse().unwrap());
/// pacer.observe(&headers);
/// assert_eq!(pacer.snapshot().limits.rpm, Some(30));
/// // Nothing left until the reset; then the bucket refills at 30 a
/// // minute (one every 2 s).
/// let now = Instant::now();
/// assert_eq!(pacer.try_take(0).unwrap_err(), now + Duration::from_secs(2));
/// # }
/// ```
#[derive(Debug)]
pub struct Pacer {
    limits: PaceLimits,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The [`HeaderIssue`] kinds already logged.
    warned: AtomicU8,
}

#[derive(Debug)]
struct State {
    /// When the buckets were last refilled.
    last: Instant,
    /// No room before this ([`Pacer::hold_off`]).
    hold_until: Option<Instant>,
    requests: Bucket,
    tokens: Bucket,
}

#[derive(Debug)]
struct Bucket {
    /// The operator's limit per minute.
    configured: Option<u64>,
    /// The limit per minute in force (`None`: not paced).
    capacity: Option<u64>,
    /// What the bucket holds, in units × [`SCALE`].
    level: u128,
    /// No room before this (the provider said none is left until its
    /// reset).
    blocked_until: Option<Instant>,
}

impl Bucket {
    fn new(configured: Option<u32>) -> Self {
        let configured = configured.map(|c| u64::from(c.max(1)));
        Bucket {
            configured,
            capacity: configured,
            level: configured.map_or(0, |c| u128::from(c) * SCALE),
            blocked_until: None,
        }
    }

    fn full(&self) -> u128 {
        self.capacity.map_or(0, |c| u128::from(c) * SCALE)
    }

    fn refill(&mut self, elapsed: Duration) {
        if let Some(c) = self.capacity {
            let added = elapsed.as_nanos().saturating_mul(u128::from(c));
            self.level = self.level.saturating_add(added).min(self.full());
        }
    }

    /// When the bucket has room for `units` (`None`: now).
    fn room_at(&self, units: u64, now: Instant) -> Option<Instant> {
        let blocked = self.blocked_until.filter(|t| *t > now);
        let refilled = self.capacity.and_then(|c| {
            let need = u128::from(units.min(c)) * SCALE;
            let missing = need.checked_sub(self.level).filter(|m| *m > 0)?;
            // At most 60 s (from empty to full): fits in u64 nanoseconds.
            let wait = missing.div_ceil(u128::from(c));
            Some(now + Duration::from_nanos(u64::try_from(wait).unwrap_or(u64::MAX)))
        });
        match (blocked, refilled) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes `units` (what the bucket holds at most); returns what was
    /// taken, scaled.
    fn take(&mut self, units: u64) -> u128 {
        if self.capacity.is_none() {
            return 0;
        }
        let taken = (u128::from(units) * SCALE).min(self.level);
        self.level -= taken;
        taken
    }

    /// What a provider's headers say of this limit.
    fn observe(&mut self, seen: &LimitHeaders, now: Instant) {
        if let Some(limit) = seen.limit {
            let capacity = self.configured.map_or(limit, |c| c.min(limit));
            if self.capacity.is_none() {
                // Newly paced: full, until `remaining` says otherwise.
                self.level = u128::from(capacity) * SCALE;
            }
            self.capacity = Some(capacity);
            self.level = self.level.min(self.full());
        }
        if let Some(remaining) = seen.remaining {
            if self.capacity.is_some() {
                self.level = self.level.min(u128::from(remaining) * SCALE);
            }
            if remaining == 0 {
                if let Some(reset) = seen.reset.filter(|r| !r.is_zero()) {
                    let until = now + reset.min(MAX_HEADER_WAIT);
                    self.blocked_until = Some(match self.blocked_until {
                        Some(t) if t > now => t.max(until),
                        _ => until,
                    });
                }
            }
        }
    }

    fn limit(&self) -> Option<u32> {
        self.capacity.map(|c| u32::try_from(c).unwrap_or(u32::MAX))
    }

    fn available(&self) -> Option<u64> {
        self.capacity
            .map(|_| u64::try_from(self.level / SCALE).unwrap_or(u64::MAX))
    }
}

/// What a pacer holds now ([`Pacer::snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaceSnapshot {
    /// The limits in force: the configured ones, lowered (or, where none
    /// is configured, set) by the provider's headers.
    pub limits: PaceLimits,
    /// Whole requests in the request bucket (`None`: not paced).
    pub requests: Option<u64>,
    /// Whole tokens in the token bucket (`None`: not paced).
    pub tokens: Option<u64>,
    /// No room before this (a hold-off, or a provider's reset).
    pub held_until: Option<Instant>,
}

/// Room taken for one request; [`settle`](Self::settle) it to what the
/// request used (dropping it keeps what was taken).
#[derive(Debug)]
#[must_use = "a ticket is settled to what the request used"]
pub struct PaceTicket {
    tokens: u64,
    /// What the token bucket gave, scaled (less than `tokens` when the
    /// request was larger than the bucket).
    taken: u128,
    shared: Arc<Shared>,
}

impl PaceTicket {
    /// The tokens taken.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Gives back what the request did not use of what was taken (never
    /// more than was taken, never past the bucket's capacity).
    pub fn settle(self, used_tokens: u64) {
        let back = self
            .taken
            .saturating_sub(u128::from(used_tokens).saturating_mul(SCALE));
        if back == 0 {
            return;
        }
        let mut state = lock(&self.shared.state);
        let now = Instant::now();
        state.refill(now);
        let full = state.tokens.full();
        state.tokens.level = state.tokens.level.saturating_add(back).min(full);
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last);
        self.requests.refill(elapsed);
        self.tokens.refill(elapsed);
        self.last = self.last.max(now);
    }
}

impl Pacer {
    /// A pacer of `limits`, its buckets full.
    pub fn new(limits: PaceLimits) -> Self {
        Pacer {
            limits,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    last: Instant::now(),
                    hold_until: None,
                    requests: Bucket::new(limits.rpm),
                    tokens: Bucket::new(limits.tpm),
                }),
                warned: AtomicU8::new(0),
            }),
        }
    }

    /// The configured limits.
    pub fn limits(&self) -> PaceLimits {
        self.limits
    }

    /// Takes room for one request of `tokens` (estimated), or says when
    /// there will be room.
    ///
    /// # Errors
    ///
    /// The instant at which the deployment will have room for this request
    /// (later than now, at most now + 60 s, or a hold-off's end): nothing
    /// was taken.
    pub fn try_take(&self, tokens: u64) -> Result<PaceTicket, Instant> {
        let now = Instant::now();
        let mut state = lock(&self.shared.state);
        state.refill(now);
        let held = state.hold_until.filter(|t| *t > now);
        let room_at = [
            held,
            state.requests.room_at(1, now),
            state.tokens.room_at(tokens, now),
        ]
        .into_iter()
        .flatten()
        .max();
        if let Some(at) = room_at {
            return Err(at);
        }
        state.requests.take(1);
        let taken = state.tokens.take(tokens);
        drop(state);
        Ok(PaceTicket {
            tokens,
            taken,
            shared: self.shared.clone(),
        })
    }

    /// What a provider's answer says of its limits (rate-limit headers,
    /// see [`RateLimitHeaders`]): a bucket's capacity follows the
    /// provider's limit (never above the configured one), and what it
    /// holds is lowered to the provider's `remaining` when that is lower.
    /// When nothing remains, there is no room before the reset (at most
    /// [`MAX_HEADER_WAIT`] away).
    ///
    /// Cheap when no rate-limit header is present.
    pub fn observe(&self, headers: &http::HeaderMap) {
        self.apply(&RateLimitHeaders::parse(headers));
    }

    /// Like [`observe`](Self::observe), of headers already read.
    pub fn apply(&self, seen: &RateLimitHeaders) {
        for issue in seen.issues.iter() {
            self.warn_once(issue, seen.issue_header(issue));
        }
        if seen.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut state = lock(&self.shared.state);
        state.refill(now);
        state.requests.observe(&seen.requests, now);
        state.tokens.observe(&seen.tokens, now);
    }

    /// The provider said wait (`Retry-After` on a 429): no room before
    /// `wait` has passed (at most [`MAX_HEADER_WAIT`]; a longer wait is
    /// cut to it and logged once).
    pub fn hold_off(&self, wait: Duration) {
        let wait = if wait > MAX_HEADER_WAIT {
            self.warn_once(HeaderIssue::HoldOffTooLong, None);
            MAX_HEADER_WAIT
        } else {
            wait
        };
        let until = Instant::now() + wait;
        let mut state = lock(&self.shared.state);
        state.hold_until = Some(state.hold_until.map_or(until, |t| t.max(until)));
    }

    /// What the pacer holds now.
    pub fn snapshot(&self) -> PaceSnapshot {
        let now = Instant::now();
        let mut state = lock(&self.shared.state);
        state.refill(now);
        let held_until = [
            state.hold_until,
            state.requests.blocked_until,
            state.tokens.blocked_until,
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .max();
        PaceSnapshot {
            limits: PaceLimits {
                rpm: state.requests.limit(),
                tpm: state.tokens.limit(),
            },
            requests: state.requests.available(),
            tokens: state.tokens.available(),
            held_until,
        }
    }

    /// The kinds of untrustworthy header this pacer has met (each logged
    /// once, when first met).
    pub fn issues_seen(&self) -> HeaderIssues {
        HeaderIssues::from_bits(self.shared.warned.load(Ordering::Relaxed))
    }

    fn warn_once(&self, issue: HeaderIssue, header: Option<&'static str>) {
        let bit = issue.bit();
        if self.shared.warned.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            tracing::warn!(
                header = header.unwrap_or(""),
                "{} (logged once per deployment)",
                issue.describe()
            );
        }
    }
}
