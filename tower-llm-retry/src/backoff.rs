//! How long to wait before retry number `n`: a pure function.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How the exponential delay `e` is randomised.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Jitter {
    /// No randomness: exactly `e`.
    None,
    /// Uniform in `[e·(1−fraction), e·(1+fraction)]` (seed 002: ±20 %).
    Proportional {
        /// The half-width of the band, in `[0, 1]`.
        fraction: f64,
    },
    /// "Equal jitter": uniform in `[e/2, e]`.
    Equal,
    /// "Full jitter": uniform in `[0, e]`.
    Full,
}

/// A backoff schedule: `e = min(base · factor^n, max)` for retry `n`
/// (0 for the first retry), then [`Jitter`].
///
/// [`Backoff::delay`] is pure: the randomness comes in as a fraction in
/// `[0, 1)`, so tests assert exact values and production passes a cheap
/// lock-free generator.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_retry::{Backoff, Jitter};
///
/// let b = Backoff::seed_default(); // 200 ms, 800 ms, 3.2 s … ±20 %
/// assert_eq!(b.delay(0, 0.5), Duration::from_millis(200));
/// assert_eq!(b.delay(0, 0.0), Duration::from_millis(160));
/// assert_eq!(b.bounds(1), (Duration::from_millis(640), Duration::from_millis(960)));
///
/// let full = Backoff::exponential(
///     Duration::from_millis(250), 2.0, Duration::from_secs(3), Jitter::Full,
/// ).unwrap();
/// assert_eq!(full.bounds(2), (Duration::ZERO, Duration::from_secs(1)));
/// assert!(Backoff::exponential(Duration::from_secs(5), 2.0, Duration::from_secs(1), Jitter::None).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "BackoffConfig", into = "BackoffConfig")]
pub struct Backoff {
    base: Duration,
    factor: f64,
    max: Duration,
    jitter: Jitter,
}

/// Why a [`Backoff`] was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidBackoff {
    reason: &'static str,
}

impl fmt::Display for InvalidBackoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid backoff: {}", self.reason)
    }
}

impl std::error::Error for InvalidBackoff {}

impl Backoff {
    /// The seed-002 schedule and the default: 200 ms, then 800 ms (×4, capped
    /// at 3.2 s for any later retry), each ±20 % uniform.
    pub const fn seed_default() -> Self {
        Backoff {
            base: Duration::from_millis(200),
            factor: 4.0,
            max: Duration::from_millis(3200),
            jitter: Jitter::Proportional { fraction: 0.2 },
        }
    }

    /// `base · factor^n` capped at `max`, with `jitter`.
    ///
    /// # Errors
    ///
    /// When `factor` is NaN, infinite or below 1, `base > max`, or a
    /// proportional jitter fraction is NaN or outside `[0, 1]`.
    pub fn exponential(
        base: Duration,
        factor: f64,
        max: Duration,
        jitter: Jitter,
    ) -> Result<Self, InvalidBackoff> {
        let invalid = |reason| Err(InvalidBackoff { reason });
        if !factor.is_finite() || factor < 1.0 {
            return invalid("factor must be a finite number >= 1");
        }
        if base > max {
            return invalid("base must not exceed max");
        }
        if let Jitter::Proportional { fraction } = jitter {
            if !(0.0..=1.0).contains(&fraction) {
                return invalid("jitter fraction must be within [0, 1]");
            }
        }
        Ok(Backoff {
            base,
            factor,
            max,
            jitter,
        })
    }

    /// The same `delay` before every retry, with `jitter`.
    ///
    /// # Errors
    ///
    /// As [`Backoff::exponential`], for the jitter.
    pub fn constant(delay: Duration, jitter: Jitter) -> Result<Self, InvalidBackoff> {
        Backoff::exponential(delay, 1.0, delay, jitter)
    }

    /// The delay before retry `retry` (0 = the first retry), given a random
    /// fraction `rand01` in `[0, 1)` (values outside are clamped; NaN counts
    /// as 0.5).
    pub fn delay(&self, retry: u32, rand01: f64) -> Duration {
        let r = if rand01.is_nan() {
            0.5
        } else {
            rand01.clamp(0.0, 1.0)
        };
        let e = self.envelope(retry);
        let secs = match self.jitter {
            Jitter::None => e,
            Jitter::Proportional { fraction } => e * (1.0 + fraction * (2.0 * r - 1.0)),
            Jitter::Equal => e / 2.0 + e / 2.0 * r,
            Jitter::Full => e * r,
        };
        to_duration(secs)
    }

    /// The smallest and largest [`delay`](Self::delay) for retry `retry`.
    pub fn bounds(&self, retry: u32) -> (Duration, Duration) {
        (self.delay(retry, 0.0), self.delay(retry, 1.0))
    }

    /// `min(base · factor^n, max)` in seconds, never NaN or infinite.
    fn envelope(&self, retry: u32) -> f64 {
        let exp = i32::try_from(retry).unwrap_or(i32::MAX);
        let e = self.base.as_secs_f64() * self.factor.powi(exp);
        let max = self.max.as_secs_f64();
        if e.is_finite() { e.min(max) } else { max }
    }

    /// The first delay before jitter.
    pub fn base(&self) -> Duration {
        self.base
    }
    /// The growth factor.
    pub fn factor(&self) -> f64 {
        self.factor
    }
    /// The cap before jitter.
    pub fn max(&self) -> Duration {
        self.max
    }
    /// The jitter mode.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::seed_default()
    }
}

fn to_duration(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs.max(0.0)).unwrap_or(Duration::MAX)
}

/// The serialised form of a [`Backoff`] (`base_ms`, `factor`, `max_ms`,
/// `jitter`), validated when read.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackoffConfig {
    base_ms: u64,
    #[serde(default = "default_factor")]
    factor: f64,
    max_ms: u64,
    #[serde(default = "default_jitter")]
    jitter: Jitter,
}

fn default_factor() -> f64 {
    2.0
}

fn default_jitter() -> Jitter {
    Jitter::Full
}

impl TryFrom<BackoffConfig> for Backoff {
    type Error = InvalidBackoff;
    fn try_from(c: BackoffConfig) -> Result<Self, Self::Error> {
        Backoff::exponential(
            Duration::from_millis(c.base_ms),
            c.factor,
            Duration::from_millis(c.max_ms),
            c.jitter,
        )
    }
}

impl From<Backoff> for BackoffConfig {
    fn from(b: Backoff) -> Self {
        BackoffConfig {
            base_ms: u64::try_from(b.base.as_millis()).unwrap_or(u64::MAX),
            factor: b.factor,
            max_ms: u64::try_from(b.max.as_millis()).unwrap_or(u64::MAX),
            jitter: b.jitter,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RandomSource;
    use proptest::prelude::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn seed_schedule_bands() {
        let b = Backoff::seed_default();
        assert_eq!(b.bounds(0), (MS(160), MS(240)));
        assert_eq!(b.bounds(1), (MS(640), MS(960)));
        assert_eq!(b.bounds(2), (MS(2560), MS(3840)));
        assert_eq!(b.bounds(9), (MS(2560), MS(3840)));
        assert_eq!(b.delay(u32::MAX, 0.5), MS(3200));
    }

    #[test]
    fn jitter_modes() {
        let e = |j| Backoff::exponential(MS(100), 2.0, MS(1000), j).expect("valid");
        assert_eq!(e(Jitter::None).bounds(3), (MS(800), MS(800)));
        assert_eq!(e(Jitter::Equal).bounds(3), (MS(400), MS(800)));
        assert_eq!(e(Jitter::Full).bounds(3), (MS(0), MS(800)));
        assert_eq!(e(Jitter::Full).bounds(4), (MS(0), MS(1000)));
        assert_eq!(
            e(Jitter::Proportional { fraction: 0.0 }).bounds(0),
            (MS(100), MS(100))
        );
    }

    #[test]
    fn validation() {
        let ok = |f, j| Backoff::exponential(MS(1), f, MS(2), j).is_ok();
        assert!(!ok(f64::NAN, Jitter::None));
        assert!(!ok(f64::INFINITY, Jitter::None));
        assert!(!ok(0.5, Jitter::None));
        assert!(!ok(-2.0, Jitter::None));
        assert!(!ok(2.0, Jitter::Proportional { fraction: f64::NAN }));
        assert!(!ok(2.0, Jitter::Proportional { fraction: -0.1 }));
        assert!(!ok(2.0, Jitter::Proportional { fraction: 1.5 }));
        assert!(ok(1.0, Jitter::Proportional { fraction: 1.0 }));
        let err = Backoff::exponential(MS(3), 2.0, MS(2), Jitter::None).expect_err("min > max");
        assert_eq!(err.to_string(), "invalid backoff: base must not exceed max");
        assert!(Backoff::constant(Duration::ZERO, Jitter::Full).is_ok());
    }

    #[test]
    fn odd_random_fractions_are_tamed() {
        let b = Backoff::seed_default();
        assert_eq!(b.delay(0, f64::NAN), MS(200));
        assert_eq!(b.delay(0, -3.0), MS(160));
        assert_eq!(b.delay(0, 7.0), MS(240));
        let huge =
            Backoff::exponential(Duration::MAX, 2.0, Duration::MAX, Jitter::None).expect("valid");
        assert!(huge.delay(3, 0.5) >= Duration::from_secs(u64::MAX / 2));
    }

    #[test]
    fn serde_uses_milliseconds_and_validates() {
        let b: Backoff =
            serde_json::from_str(r#"{"base_ms": 250, "max_ms": 3000, "jitter": {"kind": "full"}}"#)
                .expect("valid");
        assert_eq!(b.base(), MS(250));
        assert_eq!(b.factor(), 2.0);
        assert_eq!(b.jitter(), Jitter::Full);
        let err =
            serde_json::from_str::<Backoff>(r#"{"base_ms": 5, "max_ms": 1}"#).expect_err("invalid");
        assert!(
            err.to_string().contains("base must not exceed max"),
            "{err}"
        );
        let json = serde_json::to_value(Backoff::seed_default()).expect("json");
        assert_eq!(json["base_ms"], 200);
        assert_eq!(json["jitter"]["fraction"], 0.2);
    }

    proptest! {
        #[test]
        fn seed_ac11_first_retry_in_band(seed in any::<u64>()) {
            let r = crate::SplitMix64::seeded(seed).next_fraction();
            let d = Backoff::seed_default().delay(0, r);
            prop_assert!(d >= MS(160) && d <= MS(240), "{d:?}");
        }

        #[test]
        fn seed_ac11_second_retry_in_band(seed in any::<u64>()) {
            let r = crate::SplitMix64::seeded(seed).next_fraction();
            let d = Backoff::seed_default().delay(1, r);
            prop_assert!(d >= MS(640) && d <= MS(960), "{d:?}");
        }

        #[test]
        fn zero_jitter_returns_the_envelope(seed in any::<u64>(), n in 0u32..8) {
            let b = Backoff::exponential(MS(200), 4.0, MS(3200), Jitter::Proportional { fraction: 0.0 })
                .expect("valid");
            let r = crate::SplitMix64::seeded(seed).next_fraction();
            prop_assert_eq!(b.delay(n, r), b.delay(n, 0.5));
            prop_assert_eq!(b.delay(0, r), MS(200));
        }

        #[test]
        fn any_config_never_panics(base in 0u64..u64::MAX, factor in any::<f64>(), max in 0u64..u64::MAX,
                                   frac in any::<f64>(), n in any::<u32>(), r in any::<f64>()) {
            if let Ok(b) = Backoff::exponential(MS(base), factor, MS(max), Jitter::Proportional { fraction: frac }) {
                let (lo, hi) = b.bounds(n);
                prop_assert!(lo <= hi);
                let _ = b.delay(n, r);
            }
        }
    }
}
