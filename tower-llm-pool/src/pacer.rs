//! [`Pacer`]: one deployment's request and token buckets.
//!
//! (The interface the pool uses; the buckets and what rate-limit headers
//! teach them land next.)

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// A deployment's configured limits: requests and tokens per minute.
/// A limit left out is not paced (until a provider's headers say one).
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

/// One deployment's pacing: room for a request of some tokens now, or the
/// time until there is.
#[derive(Debug)]
pub struct Pacer {
    limits: PaceLimits,
}

/// Room taken for one request; [`settle`](Self::settle) it to what the
/// request used (dropping it keeps what was taken).
#[derive(Debug)]
#[must_use = "a ticket is settled to what the request used"]
pub struct PaceTicket {
    tokens: u64,
}

impl PaceTicket {
    /// The tokens taken.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Gives back what the request did not use of what was taken.
    pub fn settle(self, _used_tokens: u64) {}
}

impl Pacer {
    /// A pacer of `limits`.
    pub fn new(limits: PaceLimits) -> Self {
        Pacer { limits }
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
    /// The instant at which the deployment will have room.
    pub fn try_take(&self, tokens: u64) -> Result<PaceTicket, Instant> {
        Ok(PaceTicket { tokens })
    }

    /// What a provider's answer says of its limits (rate-limit headers).
    pub fn observe(&self, _headers: &http::HeaderMap) {}

    /// The provider said wait (`Retry-After` on a 429): no room before
    /// `wait` has passed.
    pub fn hold_off(&self, _wait: Duration) {}
}
