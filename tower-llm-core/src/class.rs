//! The closed set of failure classes and what each one means for the layers.

use std::time::Duration;

use http::StatusCode;
use serde::{Deserialize, Serialize};

/// Why a call failed, as far as resilience decisions are concerned.
///
/// Every failure any tower-llm layer or provider produces is exactly one
/// of these. The set may grow in a minor release (as `Conflict` did), so
/// it is `#[non_exhaustive]`: a `match` outside this crate needs a
/// wildcard arm (ask the class's [`Disposition`] rather than listing
/// classes where you can). Each class answers three questions through its
/// [`Disposition`]: retry on the same link? count against the circuit
/// breaker? fail over to the next link? The defaults ([`FailureClass::default_disposition`])
/// follow the project's seeds; a [`FailurePolicy`] overrides them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureClass {
    /// A server-side fault that time may fix: HTTP 5xx, a connect error, a
    /// connection reset, an overloaded provider (Anthropic's 529).
    Transient,
    /// HTTP 429 or a provider throttling error; may carry a `Retry-After`.
    RateLimited,
    /// The account's quota or spend limit is used up (OpenAI
    /// `insufficient_quota`, Anthropic spend limit). Retrying the same link is
    /// pointless; another link may still serve.
    QuotaExhausted,
    /// One attempt took longer than its per-attempt timeout (or HTTP 408).
    Timeout,
    /// The circuit breaker refused the call without calling the provider; may
    /// carry the rest of the cooldown as `retry_after`.
    CircuitOpen,
    /// HTTP 400 and other client errors: the request itself is wrong.
    BadRequest,
    /// The prompt does not fit the model's context window.
    ContextWindowExceeded,
    /// HTTP 401 or 403: the credentials are wrong or lack permission.
    Auth,
    /// HTTP 404: the model or endpoint does not exist at this provider.
    NotFound,
    /// HTTP 409: the request conflicts with the resource's current state
    /// (a version or lock conflict). It needs a re-read and a new request,
    /// not the same request again (seed 004), so by default it is neither
    /// retried nor failed over and does not trip a breaker; a
    /// [`FailurePolicy`] can make it retryable.
    Conflict,
    /// The provider's safety filter refused the request or the answer.
    ContentFiltered,
    /// The provider answered with something we cannot use: malformed JSON, a
    /// missing required field, a body over the size cap.
    InvalidResponse,
    /// The caller went away (the call's future was dropped or cancelled).
    Cancelled,
    /// The call's deadline passed before it finished.
    DeadlineExceeded,
    /// What is left of the call's cost [`Budget`](crate::Budget) cannot
    /// cover this attempt's worst case: it was never sent. Another
    /// (cheaper) link may still fit.
    CostBudgetExhausted,
    /// The tenant's quota (spend or tokens over a window) cannot cover
    /// this attempt's worst case: it was never sent. `retry_after` is the
    /// time until the window ends. Another (cheaper) link may still fit.
    TenantQuotaExhausted,
}

impl FailureClass {
    /// Every class, in declaration order.
    pub const ALL: [FailureClass; 16] = [
        FailureClass::Transient,
        FailureClass::RateLimited,
        FailureClass::QuotaExhausted,
        FailureClass::Timeout,
        FailureClass::CircuitOpen,
        FailureClass::BadRequest,
        FailureClass::ContextWindowExceeded,
        FailureClass::Auth,
        FailureClass::NotFound,
        FailureClass::Conflict,
        FailureClass::ContentFiltered,
        FailureClass::InvalidResponse,
        FailureClass::Cancelled,
        FailureClass::DeadlineExceeded,
        FailureClass::CostBudgetExhausted,
        FailureClass::TenantQuotaExhausted,
    ];

    /// A stable, lower-case label for metrics and logs.
    ///
    /// These strings are part of the public contract: they never change
    /// between releases and never come from `Debug`.
    pub const fn as_metric_label(self) -> &'static str {
        match self {
            FailureClass::Transient => "transient",
            FailureClass::RateLimited => "rate_limited",
            FailureClass::QuotaExhausted => "quota_exhausted",
            FailureClass::Timeout => "timeout",
            FailureClass::CircuitOpen => "circuit_open",
            FailureClass::BadRequest => "bad_request",
            FailureClass::ContextWindowExceeded => "context_window_exceeded",
            FailureClass::Auth => "auth",
            FailureClass::NotFound => "not_found",
            FailureClass::Conflict => "conflict",
            FailureClass::ContentFiltered => "content_filtered",
            FailureClass::InvalidResponse => "invalid_response",
            FailureClass::Cancelled => "cancelled",
            FailureClass::DeadlineExceeded => "deadline_exceeded",
            FailureClass::CostBudgetExhausted => "cost_budget_exhausted",
            FailureClass::TenantQuotaExhausted => "tenant_quota_exhausted",
        }
    }

    /// The default answer to "retry? trip the breaker? fail over?".
    ///
    /// | class | retry | breaker | failover |
    /// |---|---|---|---|
    /// | transient, rate limited, timeout | yes | yes | yes |
    /// | quota exhausted | no | yes | yes |
    /// | invalid response | no | yes | yes |
    /// | circuit open | no | no | yes |
    /// | cost budget exhausted, tenant quota exhausted | no | no | yes |
    /// | bad request, context window, auth, not found, conflict (409), content filtered | no | no | no |
    /// | cancelled, deadline exceeded | no | no | no |
    ///
    /// Client errors (4xx) never count against a breaker: the provider
    /// answered, so they say nothing about its health (seeds 001 and 004).
    /// An open circuit is never retried on the same link; it moves to the
    /// next link at once (seed 002, DESIGN.md).
    pub const fn default_disposition(self) -> Disposition {
        const fn d(retry: bool, trip_breaker: bool, failover: bool) -> Disposition {
            Disposition {
                retry,
                trip_breaker,
                failover,
            }
        }
        match self {
            FailureClass::Transient | FailureClass::RateLimited | FailureClass::Timeout => {
                d(true, true, true)
            }
            FailureClass::QuotaExhausted | FailureClass::InvalidResponse => d(false, true, true),
            FailureClass::CircuitOpen
            | FailureClass::CostBudgetExhausted
            | FailureClass::TenantQuotaExhausted => d(false, false, true),
            FailureClass::BadRequest
            | FailureClass::ContextWindowExceeded
            | FailureClass::Auth
            | FailureClass::NotFound
            | FailureClass::Conflict
            | FailureClass::ContentFiltered
            | FailureClass::Cancelled
            | FailureClass::DeadlineExceeded => d(false, false, false),
        }
    }

    /// `true` for the classes that come from the caller's own request
    /// (400, context window, 401/403, 404, 409, content filter): the
    /// outcome label `terminal_4xx` / `auth_error` of the call metrics.
    pub const fn is_client_error(self) -> bool {
        matches!(
            self,
            FailureClass::BadRequest
                | FailureClass::ContextWindowExceeded
                | FailureClass::Auth
                | FailureClass::NotFound
                | FailureClass::Conflict
                | FailureClass::ContentFiltered
        )
    }

    const fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            FailureClass::Transient => "transient provider failure",
            FailureClass::RateLimited => "rate limited",
            FailureClass::QuotaExhausted => "quota exhausted",
            FailureClass::Timeout => "attempt timed out",
            FailureClass::CircuitOpen => "circuit open",
            FailureClass::BadRequest => "bad request",
            FailureClass::ContextWindowExceeded => "context window exceeded",
            FailureClass::Auth => "authentication or permission failure",
            FailureClass::NotFound => "model or endpoint not found",
            FailureClass::Conflict => "conflict with the resource's current state",
            FailureClass::ContentFiltered => "content filtered",
            FailureClass::InvalidResponse => "invalid provider response",
            FailureClass::Cancelled => "cancelled",
            FailureClass::DeadlineExceeded => "deadline exceeded",
            FailureClass::CostBudgetExhausted => "the call's cost budget is exhausted",
            FailureClass::TenantQuotaExhausted => "the tenant's quota is exhausted",
        };
        f.write_str(text)
    }
}

/// What the resilience layers do with one failure class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Disposition {
    /// Try the same link again (within its attempt limit and the deadline).
    pub retry: bool,
    /// Count the failure against the link's circuit breaker.
    pub trip_breaker: bool,
    /// Move on to the next link of a fallback chain.
    pub failover: bool,
}

/// A user-overridable table from [`FailureClass`] to [`Disposition`].
///
/// [`FailurePolicy::default`] holds each class's
/// [`default_disposition`](FailureClass::default_disposition).
/// Layers consult the policy they were given, so one override changes the
/// behaviour of retry, breaker and fallback consistently.
///
/// ```
/// use tower_llm_core::{Disposition, FailureClass, FailurePolicy};
///
/// // Fail over (but never retry) when a prompt is too long for the model.
/// let policy = FailurePolicy::default().with(
///     FailureClass::ContextWindowExceeded,
///     Disposition { retry: false, trip_breaker: false, failover: true },
/// );
/// assert!(policy.get(FailureClass::ContextWindowExceeded).failover);
/// assert!(!policy.get(FailureClass::BadRequest).failover);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailurePolicy {
    table: [Disposition; FailureClass::ALL.len()],
}

impl FailurePolicy {
    /// The seed defaults for every class.
    pub const fn new() -> Self {
        let mut table = [Disposition {
            retry: false,
            trip_breaker: false,
            failover: false,
        }; FailureClass::ALL.len()];
        let mut i = 0;
        while i < FailureClass::ALL.len() {
            table[i] = FailureClass::ALL[i].default_disposition();
            i += 1;
        }
        FailurePolicy { table }
    }

    /// Replaces the disposition of one class.
    #[must_use]
    pub const fn with(mut self, class: FailureClass, disposition: Disposition) -> Self {
        self.table[class.index()] = disposition;
        self
    }

    /// The disposition of `class` under this policy.
    pub const fn get(&self, class: FailureClass) -> Disposition {
        self.table[class.index()]
    }

    /// The disposition for one classified failure: the class's entry, with a
    /// provider's explicit "do not retry" (`x-should-retry: false`) turning
    /// `retry` off. A provider's "do retry" never turns a terminal class
    /// into a retryable one.
    pub const fn disposition(&self, failed: &Classified) -> Disposition {
        let mut d = self.get(failed.class);
        if matches!(failed.should_retry, Some(false)) {
            d.retry = false;
        }
        d
    }
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self::new()
    }
}

/// A failure as the layers see it: its class plus the hints that shape what
/// happens next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    /// The failure class.
    pub class: FailureClass,
    /// How long the provider asked us to wait (`Retry-After`, `retry-after-ms`)
    /// or, for an open circuit, the rest of the cooldown.
    pub retry_after: Option<Duration>,
    /// The provider's own advice (`x-should-retry`). `Some(false)` vetoes a
    /// retry on the same link; see [`FailurePolicy::disposition`].
    pub should_retry: Option<bool>,
    /// The HTTP status of the failed answer, when there was one.
    pub http_status: Option<StatusCode>,
}

impl Classified {
    /// A classification with no hints.
    pub const fn new(class: FailureClass) -> Self {
        Classified {
            class,
            retry_after: None,
            should_retry: None,
            http_status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_class_in_index_order() {
        for (i, class) in FailureClass::ALL.iter().enumerate() {
            assert_eq!(class.index(), i);
        }
    }

    #[test]
    fn labels_are_unique_and_snake_case() {
        let mut labels: Vec<_> = FailureClass::ALL
            .iter()
            .map(|c| c.as_metric_label())
            .collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), FailureClass::ALL.len());
        for l in labels {
            assert!(l.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{l}");
        }
    }

    #[test]
    fn label_matches_serde_name() {
        for class in FailureClass::ALL {
            let json = serde_json::to_string(&class).expect("serialize");
            assert_eq!(json, format!("\"{}\"", class.as_metric_label()));
        }
    }

    #[test]
    fn seed_defaults() {
        use FailureClass::*;
        let p = FailurePolicy::default();
        // Retry only what time can fix.
        let retryable: Vec<_> = FailureClass::ALL
            .into_iter()
            .filter(|c| p.get(*c).retry)
            .collect();
        assert_eq!(retryable, vec![Transient, RateLimited, Timeout]);
        // 4xx never trips a breaker; nor do cancellation, deadline, or the breaker itself.
        let tripping: Vec<_> = FailureClass::ALL
            .into_iter()
            .filter(|c| p.get(*c).trip_breaker)
            .collect();
        assert_eq!(
            tripping,
            vec![
                Transient,
                RateLimited,
                QuotaExhausted,
                Timeout,
                InvalidResponse
            ]
        );
        let failover: Vec<_> = FailureClass::ALL
            .into_iter()
            .filter(|c| p.get(*c).failover)
            .collect();
        assert_eq!(
            failover,
            vec![
                Transient,
                RateLimited,
                QuotaExhausted,
                Timeout,
                CircuitOpen,
                InvalidResponse,
                CostBudgetExhausted,
                TenantQuotaExhausted
            ]
        );
    }

    #[test]
    fn a_conflict_is_terminal_by_default_and_retryable_by_override() {
        let d = FailurePolicy::default().get(FailureClass::Conflict);
        assert!(!d.retry && !d.trip_breaker && !d.failover);
        let retry = Disposition {
            retry: true,
            trip_breaker: false,
            failover: false,
        };
        let p = FailurePolicy::default().with(FailureClass::Conflict, retry);
        assert_eq!(p.get(FailureClass::Conflict), retry);
    }

    #[test]
    fn override_changes_only_that_class() {
        let d = Disposition {
            retry: true,
            trip_breaker: true,
            failover: true,
        };
        let p = FailurePolicy::default().with(FailureClass::NotFound, d);
        assert_eq!(p.get(FailureClass::NotFound), d);
        for class in FailureClass::ALL {
            if class != FailureClass::NotFound {
                assert_eq!(p.get(class), class.default_disposition());
            }
        }
    }
}
