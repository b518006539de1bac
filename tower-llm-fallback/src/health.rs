//! Opt-in health-aware ordering of the alternates (seed 001, "Provider
//! health scoring").

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

const SLOTS: usize = 10;

/// Success rate and latency of one link over a rolling window.
#[derive(Debug)]
pub(crate) struct Health {
    origin: Instant,
    slot_len: Duration,
    slots: Mutex<[(u64, u32, u32, u64); SLOTS]>,
}

impl Health {
    pub(crate) fn new(window: Duration) -> Self {
        Health {
            origin: Instant::now(),
            slot_len: (window / SLOTS as u32).max(Duration::from_millis(1)),
            slots: Mutex::new([(0, 0, 0, 0); SLOTS]),
        }
    }

    fn epoch(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_nanos() / self.slot_len.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records one call to this link.
    pub(crate) fn record(&self, success: bool, latency: Duration) {
        let epoch = self.epoch();
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = &mut slots[(epoch % SLOTS as u64) as usize];
        if slot.0 != epoch {
            *slot = (epoch, 0, 0, 0);
        }
        slot.1 = slot.1.saturating_add(1);
        slot.2 = slot.2.saturating_add(u32::from(success));
        slot.3 = slot
            .3
            .saturating_add(u64::try_from(latency.as_millis()).unwrap_or(u64::MAX));
    }

    /// The score in `[0, 1]`: success rate weighted 4:1 over a latency score
    /// (`1 / (1 + mean seconds)`). A link with no calls in the window scores
    /// a neutral 0.5.
    pub(crate) fn score(&self) -> f64 {
        let epoch = self.epoch();
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut calls, mut ok, mut ms) = (0u64, 0u64, 0u64);
        for (e, c, s, l) in slots.iter() {
            if epoch.wrapping_sub(*e) < SLOTS as u64 {
                calls += u64::from(*c);
                ok += u64::from(*s);
                ms = ms.saturating_add(*l);
            }
        }
        if calls == 0 {
            return 0.5;
        }
        let success_rate = ok as f64 / calls as f64;
        let mean_secs = ms as f64 / calls as f64 / 1000.0;
        let latency_score = 1.0 / (1.0 + mean_secs);
        (4.0 * success_rate + latency_score) / 5.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn scores() {
        let h = Health::new(Duration::from_secs(60));
        assert_eq!(h.score(), 0.5);
        h.record(true, Duration::ZERO);
        assert_eq!(h.score(), 1.0);
        h.record(false, Duration::from_secs(2));
        // 50 % success, mean 1 s: (4 * 0.5 + 0.5) / 5
        assert!((h.score() - 0.5).abs() < 1e-9);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(h.score(), 0.5, "the window forgets");
    }
}
