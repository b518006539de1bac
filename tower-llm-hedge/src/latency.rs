//! The learned hedge delay: a quantile of recent latencies, lock-free.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Buckets per doubling of latency: bucket bounds grow by 2^(1/4), about
/// 19 %, so a learned delay is at most that far above the true quantile.
const PER_OCTAVE: f64 = 4.0;
/// 64 buckets from 1 ms: the last one holds everything over 2^(63/4) ms
/// (about 55 s).
const BUCKETS: usize = 64;
/// How long one generation of counts lasts; the window is the current and
/// the previous generation (10 to 20 s).
const PERIOD: Duration = Duration::from_secs(10);
/// The delay is recomputed every this many samples (and on every sample
/// while none is learned).
const RECOMPUTE_EVERY: u32 = 8;

/// Latencies in log-scale buckets, two generations (the current one and
/// the one before), each bucket one atomic counter. Recording is one
/// `fetch_add` (plus, every few samples, a scan of 128 counters to
/// recompute the cached delay); reading the delay is one atomic load.
/// A generation change zeroes the older counts without a lock: a sample
/// recorded concurrently with the change may be lost, which a quantile
/// estimate can afford.
#[derive(Debug)]
pub(crate) struct Learned {
    quantile: f64,
    floor: Duration,
    min_samples: u64,
    counts: [[AtomicU32; BUCKETS]; 2],
    /// The generation `counts[generation % 2]` holds.
    generation: AtomicU64,
    origin: Instant,
    /// Samples recorded, ever (it paces the recomputation).
    recorded: AtomicU32,
    /// The delay in force, in microseconds (0: not learned yet).
    cached_micros: AtomicU64,
}

/// The upper bound of bucket `i`, in milliseconds.
fn upper_bound_ms(i: usize) -> f64 {
    ((i + 1) as f64 / PER_OCTAVE).exp2()
}

fn bucket_of(latency: Duration) -> usize {
    let ms = latency.as_secs_f64() * 1_000.0;
    if ms <= 1.0 {
        return 0;
    }
    ((ms.log2() * PER_OCTAVE) as usize).min(BUCKETS - 1)
}

impl Learned {
    pub(crate) fn new(quantile: f64, floor: Duration, min_samples: u32) -> Self {
        Learned {
            quantile,
            floor,
            min_samples: u64::from(min_samples.max(1)),
            counts: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU32::new(0))),
            generation: AtomicU64::new(0),
            origin: Instant::now(),
            recorded: AtomicU32::new(0),
            cached_micros: AtomicU64::new(0),
        }
    }

    /// The learned delay, or `None` while fewer than `min_samples`
    /// latencies are in the window.
    pub(crate) fn delay(&self) -> Option<Duration> {
        match self.cached_micros.load(Ordering::Relaxed) {
            0 => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    /// Records one latency.
    pub(crate) fn record(&self, latency: Duration) {
        let generation = self.rotate();
        let slot = (generation % 2) as usize;
        self.counts[slot][bucket_of(latency)].fetch_add(1, Ordering::Relaxed);
        let n = self
            .recorded
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1);
        if n % RECOMPUTE_EVERY == 0 || self.cached_micros.load(Ordering::Relaxed) == 0 {
            self.recompute();
        }
    }

    /// Moves to the current generation, zeroing counts older than the
    /// previous one; returns the current generation.
    fn rotate(&self) -> u64 {
        let now = Instant::now().saturating_duration_since(self.origin);
        let current = (now.as_nanos() / PERIOD.as_nanos()) as u64;
        let seen = self.generation.load(Ordering::Acquire);
        if current <= seen {
            // Another thread has moved on already (its clock read later):
            // never move the window backwards.
            return seen;
        }
        if self
            .generation
            .compare_exchange(seen, current, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // The slot `current` takes over held generation `current - 2`
            // (or older): it starts empty. When more than one period passed,
            // the other slot is stale too.
            let stale: &[usize] = if current - seen >= 2 {
                &[0, 1]
            } else {
                &[(current % 2) as usize]
            };
            for &s in stale {
                for c in &self.counts[s] {
                    c.store(0, Ordering::Relaxed);
                }
            }
        }
        current
    }

    fn recompute(&self) {
        let mut per_bucket = [0u64; BUCKETS];
        let mut total = 0u64;
        for slot in &self.counts {
            for (i, c) in slot.iter().enumerate() {
                let n = u64::from(c.load(Ordering::Relaxed));
                per_bucket[i] += n;
                total += n;
            }
        }
        if total < self.min_samples {
            self.cached_micros.store(0, Ordering::Relaxed);
            return;
        }
        // The smallest bucket whose cumulative count reaches the quantile.
        let target = (self.quantile * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        let mut at = BUCKETS - 1;
        for (i, n) in per_bucket.iter().enumerate() {
            seen += n;
            if seen >= target {
                at = i;
                break;
            }
        }
        let delay = Duration::from_secs_f64(upper_bound_ms(at) / 1_000.0).max(self.floor);
        self.cached_micros
            .store(delay.as_micros().max(1) as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_grow_by_a_quarter_octave() {
        assert_eq!(bucket_of(Duration::from_micros(500)), 0);
        assert_eq!(bucket_of(Duration::from_millis(2)), 4);
        assert_eq!(bucket_of(Duration::from_millis(100)), 26);
        assert!((upper_bound_ms(26) - 107.6).abs() < 0.1);
        assert_eq!(bucket_of(Duration::from_secs(3600)), BUCKETS - 1);
    }

    #[tokio::test(start_paused = true)]
    async fn learns_the_quantile_after_min_samples_and_forgets_old_latencies() {
        let learned = Learned::new(0.9, Duration::from_millis(50), 20);
        for _ in 0..19 {
            learned.record(Duration::from_millis(100));
        }
        assert_eq!(learned.delay(), None, "19 of 20 samples");
        learned.record(Duration::from_millis(100));
        let delay = learned.delay().expect("learned");
        assert!(
            delay >= Duration::from_millis(100) && delay < Duration::from_millis(120),
            "{delay:?}"
        );
        // 90 % fast, 10 % slow: the 0.9 quantile is the fast bucket.
        for _ in 0..60 {
            learned.record(Duration::from_millis(100));
        }
        for _ in 0..8 {
            learned.record(Duration::from_secs(10));
        }
        assert!(learned.delay().expect("learned") < Duration::from_millis(120));
        // Mostly slow: the quantile moves up.
        for _ in 0..800 {
            learned.record(Duration::from_secs(2));
        }
        let slow = learned.delay().expect("learned");
        assert!(
            slow >= Duration::from_secs(2) && slow < Duration::from_millis(2_400),
            "{slow:?}"
        );
        // Two periods later the old latencies are gone.
        tokio::time::advance(PERIOD * 2).await;
        for _ in 0..20 {
            learned.record(Duration::from_millis(10));
        }
        assert_eq!(
            learned.delay(),
            Some(Duration::from_millis(50)),
            "the floor"
        );
    }
}
