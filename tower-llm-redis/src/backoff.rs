//! Waits between reconnection attempts.

use std::time::Duration;

/// Waits between reconnection attempts: 25 ms, doubling up to a maximum,
/// and 25 ms again after a success ([`reset`](Backoff::reset)).
///
/// ```
/// use std::time::Duration;
/// use tower_llm_redis::Backoff;
///
/// let mut backoff = Backoff::new(Duration::from_millis(80));
/// let waits: Vec<_> = (0..4).map(|_| backoff.next_wait().as_millis()).collect();
/// assert_eq!(waits, [25, 50, 80, 80]);
/// backoff.reset();
/// assert_eq!(backoff.next_wait(), Backoff::FIRST);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// The first wait, and the least `max` can be: 25 ms.
    pub const FIRST: Duration = Duration::from_millis(25);

    /// Waits from [`FIRST`](Backoff::FIRST) doubling up to `max` (at least
    /// `FIRST`).
    pub fn new(max: Duration) -> Self {
        Backoff {
            next: Backoff::FIRST,
            max: max.max(Backoff::FIRST),
        }
    }

    /// The wait before the next attempt; the one after it is twice as
    /// long, up to the maximum.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (wait * 2).min(self.max);
        wait
    }

    /// Starts again from [`FIRST`](Backoff::FIRST) (an attempt succeeded).
    pub fn reset(&mut self) {
        self.next = Backoff::FIRST;
    }
}
