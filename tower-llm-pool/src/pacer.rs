//! [`Pacer`]: one deployment's request and token buckets.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
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
    /// How much of its rate the request bucket holds, in milliseconds
    /// (default 60,000: a minute's worth, a burst of `rpm` at once; at
    /// least one request). A provider that enforces its per-minute limit
    /// over shorter periods (OpenAI may enforce 60,000 a minute as 1,000
    /// a second) wants a short one: at most `rpm / 60,000 × (burst_ms +
    /// W)` requests go in any window of `W` ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_ms: Option<u32>,
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
/// # Shared across replicas
///
/// A pacer's buckets are its process's: two replicas each allow the whole
/// of a deployment's limits. [`with_shared`](Self::with_shared) adds the
/// fleet's buckets (a [`SharedPacing`] store, such as
/// `tower-llm-pool-redis`'s `RedisPacing`): [`take`](Self::take) takes
/// from this pacer first (what the provider's headers say, read per
/// replica), then from the fleet's buckets of the configured limits, and
/// the ticket's [`settle`](PaceTicket::settle) gives back to both what the
/// request did not use. Without a shared store, `take` is `try_take`:
/// nothing is awaited or allocated.
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
/// let pacer = Pacer::new(PaceLimits { rpm: Some(60), tpm: Some(6_000), burst_ms: None });
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
    /// The fleet's buckets, when shared across replicas.
    fleet: Option<Fleet>,
}

/// A pacer's shared store and the name its deployment has there.
#[derive(Debug, Clone)]
struct Fleet {
    store: Arc<dyn SharedPacing>,
    deployment: Arc<str>,
}

/// The fleet's buckets of one deployment, shared by every replica (every
/// process) that sends to it: [`Pacer::with_shared`].
///
/// A store keeps, per deployment name, a request bucket and a token
/// bucket refilling continuously at their per-minute limit over 60 s
/// (their capacity is that limit, a limit of 0 counts as 1, a limit not
/// set is not paced), like a [`Pacer`]'s, and takes from both at once or
/// from neither. A request larger than a bucket's capacity goes through
/// when the bucket is full.
///
/// Implementations must answer `take` within a bounded time (a store
/// that cannot reach its backend paces in-process, at a stated share of
/// the limits, and says so with a [`SharedTicket::local`] ticket).
pub trait SharedPacing: Send + Sync + fmt::Debug {
    /// Takes one request and `tokens` (estimated) from `deployment`'s
    /// buckets of `limits` (the pacer's configured limits), or says when
    /// they will have room.
    ///
    /// A take whose future is dropped before it resolves may keep what
    /// it took (the buckets refill within 60 s).
    ///
    /// # Errors
    ///
    /// The instant at which the buckets will have room for this request:
    /// nothing was taken.
    fn take<'a>(&'a self, deployment: &'a str, limits: PaceLimits, tokens: u64) -> SharedTake<'a>;

    /// Gives `tokens` back to `deployment`'s token bucket (never past its
    /// capacity, from `limits`): what a request took and did not use.
    /// Never waits (a store queues it, or drops it: a bucket short of
    /// tokens refills within 60 s).
    fn give_back(&self, deployment: &str, limits: PaceLimits, tokens: u64);
}

/// What [`SharedPacing::take`] returns.
pub type SharedTake<'a> = Pin<Box<dyn Future<Output = Result<SharedTicket, Instant>> + Send + 'a>>;

/// What a [`SharedPacing`] store took for one request.
#[derive(Debug)]
#[must_use = "a ticket is settled to what the request used"]
pub struct SharedTicket {
    tokens: u64,
    local: Option<PaceTicket>,
}

impl SharedTicket {
    /// `tokens` were taken from the shared token bucket (at most what was
    /// asked): what the request does not use of them goes back through
    /// [`SharedPacing::give_back`].
    pub fn shared(tokens: u64) -> Self {
        SharedTicket {
            tokens,
            local: None,
        }
    }

    /// Taken from an in-process pacer instead (the store's own, while its
    /// backend does not answer): settled there.
    pub fn local(ticket: PaceTicket) -> Self {
        SharedTicket {
            tokens: ticket.tokens(),
            local: Some(ticket),
        }
    }

    /// The tokens taken.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// `true` when taken in-process ([`local`](Self::local)).
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// Gives back what the request did not use of it.
    fn settle(self, fleet: Fleet, limits: PaceLimits, used_tokens: u64) {
        match self.local {
            Some(ticket) => ticket.settle(used_tokens),
            None => {
                let back = self.tokens.saturating_sub(used_tokens);
                if back > 0 {
                    fleet.store.give_back(&fleet.deployment, limits, back);
                }
            }
        }
    }
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
    /// How much of its rate a full bucket holds, in ms (`None`: a
    /// minute's).
    burst_ms: Option<u32>,
    /// No room before this (the provider said none is left until its
    /// reset).
    blocked_until: Option<Instant>,
}

impl Bucket {
    fn new(configured: Option<u32>, burst_ms: Option<u32>) -> Self {
        let configured = configured.map(|c| u64::from(c.max(1)));
        let mut bucket = Bucket {
            configured,
            capacity: configured,
            level: 0,
            burst_ms,
            blocked_until: None,
        };
        bucket.level = bucket.full();
        bucket
    }

    /// What a full bucket holds, scaled: a minute of the limit, or
    /// `burst_ms` of it (at least one unit).
    fn full(&self) -> u128 {
        self.capacity.map_or(0, |c| {
            let minute = u128::from(c) * SCALE;
            match self.burst_ms {
                None => minute,
                Some(ms) => (minute * u128::from(ms) / 60_000).max(SCALE),
            }
        })
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
            let need = (u128::from(units) * SCALE).min(self.full());
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
            let newly = self.capacity.is_none();
            self.capacity = Some(capacity);
            if newly {
                // Newly paced: full, until `remaining` says otherwise.
                self.level = self.full();
            }
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
    /// What the request bucket gave, scaled (0 when not paced).
    request: u128,
    /// What the token bucket gave, scaled (less than `tokens` when the
    /// request was larger than the bucket).
    taken: u128,
    shared: Arc<Shared>,
    /// What the fleet's buckets gave ([`Pacer::take`] of a shared pacer).
    fleet: Option<Box<FleetTicket>>,
}

/// A shared ticket and where to give it back.
#[derive(Debug)]
struct FleetTicket {
    ticket: SharedTicket,
    fleet: Fleet,
    limits: PaceLimits,
}

impl PaceTicket {
    /// The tokens taken.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// `true` when the fleet's buckets were taken from too
    /// ([`Pacer::take`] of a shared pacer).
    pub fn is_shared(&self) -> bool {
        self.fleet.is_some()
    }

    /// Gives back what the request did not use of what was taken (never
    /// more than was taken, never past the bucket's capacity), to this
    /// pacer and, when shared, to the fleet's buckets (queued: never
    /// waits).
    pub fn settle(mut self, used_tokens: u64) {
        if let Some(f) = self.fleet.take() {
            let FleetTicket {
                ticket,
                fleet,
                limits,
            } = *f;
            ticket.settle(fleet, limits, used_tokens);
        }
        let used = u128::from(used_tokens).saturating_mul(SCALE);
        if used > self.taken {
            // The request used more than was taken for it (it named no
            // output cap): the rest comes out of the bucket now.
            self.take_more(used - self.taken);
        } else {
            self.give_back(0, self.taken - used);
        }
    }

    /// Takes `tokens` more (scaled) from the token bucket, down to empty.
    fn take_more(&self, tokens: u128) {
        let mut state = lock(&self.shared.state);
        state.refill(Instant::now());
        state.tokens.level = state.tokens.level.saturating_sub(tokens);
    }

    /// Gives everything back (the request was never sent): the request
    /// and its tokens.
    fn cancel(self) {
        self.give_back(self.request, self.taken);
    }

    fn give_back(&self, request: u128, tokens: u128) {
        if request == 0 && tokens == 0 {
            return;
        }
        let mut state = lock(&self.shared.state);
        let now = Instant::now();
        state.refill(now);
        let full = state.requests.full();
        state.requests.level = state.requests.level.saturating_add(request).min(full);
        let full = state.tokens.full();
        state.tokens.level = state.tokens.level.saturating_add(tokens).min(full);
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

/// A local ticket given back if the fleet's take is dropped before it
/// answers.
struct CancelOnDrop(Option<PaceTicket>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(ticket) = self.0.take() {
            ticket.cancel();
        }
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
                    requests: Bucket::new(limits.rpm, limits.burst_ms),
                    tokens: Bucket::new(limits.tpm, None),
                }),
                warned: AtomicU8::new(0),
            }),
            fleet: None,
        }
    }

    /// Also paced by the fleet's buckets of this deployment in `store`,
    /// under the name `deployment` (every replica sending to the
    /// deployment must give it the same name, and the same limits), of
    /// the configured limits: see [`take`](Self::take). A pacer with no
    /// configured limit never asks the store.
    #[must_use]
    pub fn with_shared(
        mut self,
        store: Arc<dyn SharedPacing>,
        deployment: impl Into<Arc<str>>,
    ) -> Self {
        if self.limits.rpm.is_some() || self.limits.tpm.is_some() {
            self.fleet = Some(Fleet {
                store,
                deployment: deployment.into(),
            });
        }
        self
    }

    /// `true` when the fleet's buckets pace this deployment too
    /// ([`with_shared`](Self::with_shared)).
    pub fn is_shared(&self) -> bool {
        self.fleet.is_some()
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
        let request = state.requests.take(1);
        let taken = state.tokens.take(tokens);
        drop(state);
        Ok(PaceTicket {
            tokens,
            request,
            taken,
            shared: self.shared.clone(),
            fleet: None,
        })
    }

    /// Takes room for one request of `tokens` (estimated) here
    /// ([`try_take`](Self::try_take): what this replica knows, the
    /// provider's headers included), then, when shared
    /// ([`with_shared`](Self::with_shared)), from the fleet's buckets of
    /// the configured limits; or says when there will be room. When the
    /// fleet has no room, what was taken here is given back.
    ///
    /// Not shared, it is `try_take`: resolved at its first poll, with no
    /// allocation.
    ///
    /// # Errors
    ///
    /// The instant at which there will be room for this request, here or
    /// in the fleet's buckets: nothing was taken.
    pub async fn take(&self, tokens: u64) -> Result<PaceTicket, Instant> {
        let ticket = self.try_take(tokens)?;
        let Some(fleet) = &self.fleet else {
            return Ok(ticket);
        };
        // Dropped while the fleet answers (the caller left): this
        // replica's room goes back.
        let mut local = CancelOnDrop(Some(ticket));
        let shared = fleet
            .store
            .take(&fleet.deployment, self.limits, tokens)
            .await;
        let mut ticket = local
            .0
            .take()
            .expect("taken above, given back only when dropped");
        match shared {
            Ok(shared) => {
                ticket.fleet = Some(Box::new(FleetTicket {
                    ticket: shared,
                    fleet: fleet.clone(),
                    limits: self.limits,
                }));
                Ok(ticket)
            }
            Err(room_at) => {
                ticket.cancel();
                Err(room_at)
            }
        }
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
                burst_ms: self.limits.burst_ms,
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
