//! Randomness for jitter: injectable, lock-free by default.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// A source of uniform random fractions in `[0, 1)` for backoff jitter.
///
/// Shared by every clone of a retry layer, so it takes `&self` and must be
/// cheap and safe to call from many threads. The default is [`SplitMix64`];
/// tests inject a seeded one (or their own) for exact, repeatable delays.
pub trait RandomSource: Send + Sync + fmt::Debug {
    /// The next fraction in `[0, 1)`.
    fn next_fraction(&self) -> f64;
}

/// The SplitMix64 generator over one atomic counter: lock-free, no global
/// state, about a nanosecond per draw. Not for cryptography.
///
/// ```
/// use tower_llm_retry::{RandomSource, SplitMix64};
///
/// let a = SplitMix64::seeded(7);
/// let b = SplitMix64::seeded(7);
/// assert_eq!(a.next_fraction(), b.next_fraction());
/// let r = a.next_fraction();
/// assert!((0.0..1.0).contains(&r));
/// ```
pub struct SplitMix64 {
    state: AtomicU64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    /// A generator seeded with `seed`: the same seed gives the same
    /// sequence (when drawn from one thread).
    pub const fn seeded(seed: u64) -> Self {
        SplitMix64 {
            state: AtomicU64::new(seed),
        }
    }

    /// A generator seeded from the process's random hash keys (so replicas
    /// do not jitter in lockstep).
    pub fn from_entropy() -> Self {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0x746f_7765_722d_6c6c);
        SplitMix64::seeded(h.finish())
    }

    /// The next raw 64-bit value.
    pub fn next_u64(&self) -> u64 {
        let mut z = self
            .state
            .fetch_add(GOLDEN_GAMMA, Ordering::Relaxed)
            .wrapping_add(GOLDEN_GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl RandomSource for SplitMix64 {
    fn next_fraction(&self) -> f64 {
        // The top 53 bits give every representable fraction in [0, 1).
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

impl Default for SplitMix64 {
    fn default() -> Self {
        SplitMix64::from_entropy()
    }
}

impl fmt::Debug for SplitMix64 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SplitMix64").finish_non_exhaustive()
    }
}

/// Always the same fraction: for tests that want one exact delay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FixedFraction(pub f64);

impl RandomSource for FixedFraction {
    fn next_fraction(&self) -> f64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_sequence_and_range() {
        // Reference values of SplitMix64 from seed 0.
        let g = SplitMix64::seeded(0);
        assert_eq!(g.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(g.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let g = SplitMix64::seeded(42);
        let mut lo: f64 = 1.0;
        let mut hi: f64 = 0.0;
        for _ in 0..10_000 {
            let r = g.next_fraction();
            assert!((0.0..1.0).contains(&r));
            lo = lo.min(r);
            hi = hi.max(r);
        }
        assert!(lo < 0.01 && hi > 0.99, "poorly spread: [{lo}, {hi}]");
    }
}
