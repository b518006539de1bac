//! Which failures after the commit point a stream is continued after.

use tower_llm_core::FailureClass;

/// The failure classes after which [`ResumeLayer`](crate::ResumeLayer)
/// continues a broken stream: those that say the *connection or the
/// provider* failed, not the request, the caller or a limit:
///
/// | class | why it is continued |
/// |---|---|
/// | `transient` | the connection broke off, the body ended before its finish reason, an in-band overloaded/server error |
/// | `timeout` | the stream stalled longer than its idle timeout |
/// | `invalid_response` | a malformed chunk (the next call may well be clean) |
/// | `rate_limited` | an in-band throttling event; the chain may serve from another link |
/// | `quota_exhausted` | the link's quota ran out mid-stream; another link may serve |
///
/// Never continued (the failure passes through as it is): `deadline_exceeded`
/// (no time is left), `cancelled` (the caller went away), `content_filtered`
/// (continuing would route around the provider's safety filter),
/// `bad_request`, `context_window_exceeded`, `auth`, `not_found`,
/// `conflict` (the request itself is refused; a continuation is a longer
/// request), `circuit_open`, `cost_budget_exhausted` and
/// `tenant_quota_exhausted` (a limit said stop), and any class added
/// later until it is listed here.
pub const RESUMABLE: [FailureClass; 5] = [
    FailureClass::Transient,
    FailureClass::Timeout,
    FailureClass::InvalidResponse,
    FailureClass::RateLimited,
    FailureClass::QuotaExhausted,
];

/// `true` for a class in [`RESUMABLE`].
///
/// ```
/// use tower_llm_core::FailureClass;
/// use tower_llm_resume::is_resumable;
///
/// assert!(is_resumable(FailureClass::Transient));
/// assert!(!is_resumable(FailureClass::DeadlineExceeded));
/// assert!(!is_resumable(FailureClass::ContentFiltered));
/// ```
pub const fn is_resumable(class: FailureClass) -> bool {
    matches!(
        class,
        FailureClass::Transient
            | FailureClass::Timeout
            | FailureClass::InvalidResponse
            | FailureClass::RateLimited
            | FailureClass::QuotaExhausted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resumable_set_is_exactly_the_listed_classes() {
        let resumable: Vec<_> = FailureClass::ALL
            .into_iter()
            .filter(|c| is_resumable(*c))
            .collect();
        assert_eq!(resumable.len(), RESUMABLE.len());
        for class in RESUMABLE {
            assert!(resumable.contains(&class), "{class:?}");
        }
        for never in [
            FailureClass::DeadlineExceeded,
            FailureClass::Cancelled,
            FailureClass::BadRequest,
            FailureClass::ContentFiltered,
            FailureClass::CostBudgetExhausted,
            FailureClass::TenantQuotaExhausted,
            FailureClass::ContextWindowExceeded,
            FailureClass::CircuitOpen,
        ] {
            assert!(!is_resumable(never), "{never:?}");
        }
    }
}
