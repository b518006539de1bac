//! The absolute deadline of one logical call.

use std::time::Duration;

use tokio::time::Instant;

/// How far ahead a deadline is put when `now + budget` would overflow the
/// clock (about 30 years, as tokio does for "never").
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The absolute point in time by which a logical call must finish.
///
/// The [deadline layer] stores one in the request's [`http::Extensions`]
/// before calling inward; every inner layer reads it with [`Deadline::of`]
/// and bounds its own waiting (retry sleeps, per-attempt timeouts, the next
/// fallback link) by [`remaining`](Deadline::remaining). It is a
/// [`tokio::time::Instant`], so tests drive it with paused virtual time.
///
/// [deadline layer]: https://docs.rs/tower-llm-deadline
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::Deadline;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let deadline = Deadline::after(Duration::from_secs(5));
/// let mut ext = http::Request::new(());
/// deadline.store(&mut ext);
/// assert_eq!(Deadline::remaining_in(&ext), Some(Duration::from_secs(5)));
/// // A per-attempt timeout never reaches past the call's deadline.
/// assert_eq!(deadline.clamp(Duration::from_secs(30)), Duration::from_secs(5));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant);

impl Deadline {
    /// A deadline at `instant`.
    pub const fn at(instant: Instant) -> Self {
        Deadline(instant)
    }

    /// A deadline `budget` from now. A budget too large for the clock means
    /// "about 30 years", never a panic.
    pub fn after(budget: Duration) -> Self {
        Deadline::after_from(Instant::now(), budget)
    }

    /// A deadline `budget` after `now` (saturating like [`Deadline::after`]).
    pub fn after_from(now: Instant, budget: Duration) -> Self {
        Deadline(
            now.checked_add(budget)
                .unwrap_or_else(|| now + FAR_FUTURE.min(budget)),
        )
    }

    /// The instant of the deadline.
    pub const fn instant(self) -> Instant {
        self.0
    }

    /// Time left until the deadline; zero once it has passed.
    pub fn remaining(self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// `true` once the deadline has passed (or is now).
    pub fn is_expired(self) -> bool {
        Instant::now() >= self.0
    }

    /// `wait` shortened so that it ends no later than the deadline:
    /// `min(wait, remaining)`.
    pub fn clamp(self, wait: Duration) -> Duration {
        wait.min(self.remaining())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn remaining_counts_down_and_saturates() {
        let d = Deadline::after(Duration::from_secs(2));
        assert_eq!(d.remaining(), Duration::from_secs(2));
        assert!(!d.is_expired());
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(d.remaining(), Duration::from_millis(500));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(d.remaining(), Duration::ZERO);
        assert!(d.is_expired());
        assert_eq!(d.clamp(Duration::from_secs(9)), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn huge_budget_does_not_panic() {
        let d = Deadline::after(Duration::MAX);
        assert!(d.remaining() >= Duration::from_secs(86_400 * 365));
    }

    #[tokio::test(start_paused = true)]
    async fn store_keeps_the_earlier_deadline() {
        let mut ext = http::Request::new(());
        let early = Deadline::after(Duration::from_secs(1));
        let late = Deadline::after(Duration::from_secs(9));
        assert_eq!(late.store(&mut ext), late);
        assert_eq!(early.store(&mut ext), early);
        assert_eq!(late.store(&mut ext), early);
        assert_eq!(Deadline::of(&ext), Some(early));
    }
}
