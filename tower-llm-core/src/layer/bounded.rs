//! A future cut off at an instant, with a lazily armed timer.

use std::future::Future;
use std::pin::Pin;

use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};

pin_project! {
    /// Runs `inner` until `until`: resolves to `Some(output)` if it finishes
    /// first (an answer ready in the same poll as the instant wins), or to
    /// `None` when the instant passes.
    ///
    /// On `None`, `inner` is still alive: the owner records whatever it
    /// must (an attempt record, say) and then calls
    /// [`cancel`](Bounded::cancel), so that `inner`'s own drop logic sees
    /// the record. Dropping the `Bounded` cancels it too.
    ///
    /// The timer is held inline (no allocation, as `tower-http`'s timeout
    /// does) and armed only on the first poll that finds `inner` pending,
    /// so an answer that is ready at once never touches tokio's timer.
    /// Polled again after it resolved, it resolves to `None`.
    ///
    /// The deadline layer and the retry layer's per-attempt timeout are
    /// both built on it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tower_llm_core::layer::Bounded;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let soon = Instant::now() + Duration::from_secs(1);
    /// assert_eq!(Bounded::new(async { 7 }, soon).await, Some(7));
    /// let slow = std::pin::pin!(Bounded::new(tokio::time::sleep(Duration::from_secs(5)), soon));
    /// let mut slow = slow;
    /// assert_eq!(slow.as_mut().await, None);
    /// assert_eq!(Instant::now(), soon);
    /// slow.cancel(); // drop the sleep now
    /// # }
    /// ```
    #[derive(Debug)]
    pub struct Bounded<F> {
        #[pin]
        inner: Option<F>,
        // Armed only when `inner` is pending (a real network call).
        #[pin]
        sleep: Option<Sleep>,
        until: Instant,
        expired: bool,
    }
}

impl<F> Bounded<F> {
    /// `inner`, cut off at `until`.
    pub fn new(inner: F, until: Instant) -> Self {
        Bounded {
            inner: Some(inner),
            sleep: None,
            until,
            expired: false,
        }
    }

    /// A bounded future with nothing to run: resolves to `None` at once.
    pub fn expired(until: Instant) -> Self {
        Bounded {
            inner: None,
            sleep: None,
            until,
            expired: false,
        }
    }

    /// The instant it is cut off at.
    pub fn until(&self) -> Instant {
        self.until
    }

    /// Drops `inner` now (cancelling it).
    pub fn cancel(self: Pin<&mut Self>) {
        self.project().inner.set(None);
    }
}

impl<F: Future> Future for Bounded<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        // Polled again after resolving to `None`: stay expired.
        if *this.expired {
            return Poll::Ready(None);
        }
        if let Poll::Ready(output) = inner.poll(cx) {
            this.inner.set(None);
            return Poll::Ready(Some(output));
        }
        if this.sleep.is_none() {
            this.sleep.set(Some(sleep_until(*this.until)));
        }
        if let Some(sleep) = this.sleep.as_pin_mut() {
            ready!(sleep.poll(cx));
        }
        *this.expired = true;
        Poll::Ready(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn same_instant_answer_wins_and_expired_is_immediate() {
        let at = Instant::now() + Duration::from_secs(2);
        let answer = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            "done"
        };
        assert_eq!(Bounded::new(answer, at).await, Some("done"));
        let start = Instant::now();
        assert_eq!(Bounded::<std::future::Pending<()>>::expired(at).await, None);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
