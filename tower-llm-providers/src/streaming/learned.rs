//! [`FirstTokenLimit`]: a first-token limit learned from a link's own
//! times to first content frame.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How many recent times to first content frame a [`FirstTokenLimit`]
/// keeps: the latest 256 (2 KiB per link), however old.
pub const FIRST_TOKEN_WINDOW: usize = 256;

/// A slot of the window not written yet.
const EMPTY: u64 = u64::MAX;

/// The settings of a learned first-token limit; the field names are the
/// policy file's. The limit is `quantile × factor` of the link's recent
/// times to first content frame, never below `floor_ms` nor above
/// `cap_ms`, once `min_samples` were seen (before that, the fixed
/// first-token timeout).
///
/// The defaults, and why:
///
/// - `quantile = 0.99`, `factor = 2.0`: twice the time that 99 % of the
///   link's streams took. A healthy stream is almost never cut (it would
///   need to be twice as slow as the 1 % slowest), while an upstream that
///   has gone silent is given up after seconds instead of the fixed 30 s.
/// - `floor_ms = 2000`: a run of fast streams (a cache, a small model)
///   must not make the limit so tight that a little queueing upstream
///   fails over streams that would have come.
/// - `cap_ms` unset: the fixed first-token timeout of the service
///   ([`StreamTimeouts::first_token`](crate::StreamTimeouts::first_token),
///   30 s by default), so learning can only tighten the limit.
/// - `min_samples = 20`: below that a quantile says little; with 20 the
///   0.99 quantile is the slowest stream seen.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_providers::streaming::FirstTokenLimitConfig;
///
/// let config: FirstTokenLimitConfig =
///     serde_json::from_str(r#"{"quantile": 0.95, "cap_ms": 10000}"#).unwrap();
/// config.validate().unwrap();
/// assert_eq!(config.factor, 2.0); // the default
/// assert_eq!(config.cap(), Some(Duration::from_secs(10)));
/// let bad = FirstTokenLimitConfig { factor: 1.0, ..config };
/// assert_eq!(bad.validate().unwrap_err().field(), "factor");
/// assert!(serde_json::from_str::<FirstTokenLimitConfig>(r#"{"floor": 1}"#).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FirstTokenLimitConfig {
    /// The quantile of the recent times to first content frame, in
    /// (0, 1] (`1` is the slowest in the window). Default `0.99`.
    pub quantile: f64,
    /// What the quantile is multiplied by: a finite number above 1.
    /// Default `2.0`.
    pub factor: f64,
    /// The least the learned limit may be, in milliseconds (at least 1).
    /// Default 2,000.
    pub floor_ms: u64,
    /// The most the learned limit may be, in milliseconds (at least
    /// `floor_ms`). Default: unset, the service's fixed first-token
    /// timeout.
    pub cap_ms: Option<u64>,
    /// How many times to first content frame to see before the learned
    /// limit replaces the fixed one, from 1 to [`FIRST_TOKEN_WINDOW`].
    /// Default 20.
    pub min_samples: u32,
}

impl Default for FirstTokenLimitConfig {
    fn default() -> Self {
        FirstTokenLimitConfig {
            quantile: 0.99,
            factor: 2.0,
            floor_ms: 2_000,
            cap_ms: None,
            min_samples: 20,
        }
    }
}

impl FirstTokenLimitConfig {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A `quantile` outside (0, 1]; a `factor` that is not a finite number
    /// above 1 (a limit at or under the quantile it learned from could
    /// never grow back after the link slows down, see [`FirstTokenLimit`]);
    /// a `floor_ms` of 0; a `cap_ms` under `floor_ms`; a `min_samples`
    /// of 0 or over [`FIRST_TOKEN_WINDOW`]. Each error names its field.
    pub fn validate(&self) -> Result<(), InvalidFirstTokenLimit> {
        let invalid = |field, reason| Err(InvalidFirstTokenLimit { field, reason });
        if !(self.quantile > 0.0 && self.quantile <= 1.0) {
            return invalid("quantile", "must be above 0 and at most 1");
        }
        if !(self.factor.is_finite() && self.factor > 1.0) {
            return invalid(
                "factor",
                "must be a finite number above 1 (a limit at or under the quantile could not grow back after a slowdown)",
            );
        }
        if self.floor_ms == 0 {
            return invalid("floor_ms", "must be at least 1");
        }
        if self.cap_ms.is_some_and(|cap| cap < self.floor_ms) {
            return invalid("cap_ms", "must be at least floor_ms");
        }
        if self.min_samples == 0 || self.min_samples as usize > FIRST_TOKEN_WINDOW {
            return invalid("min_samples", "must be from 1 to 256");
        }
        Ok(())
    }

    /// The floor of the learned limit.
    pub fn floor(&self) -> Duration {
        Duration::from_millis(self.floor_ms)
    }

    /// The cap of the learned limit, when set.
    pub fn cap(&self) -> Option<Duration> {
        self.cap_ms.map(Duration::from_millis)
    }
}

/// A [`FirstTokenLimitConfig`] that
/// [`validate`](FirstTokenLimitConfig::validate) refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidFirstTokenLimit {
    field: &'static str,
    reason: &'static str,
}

impl InvalidFirstTokenLimit {
    /// The offending field, by its policy-file name.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for InvalidFirstTokenLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid learned first-token limit: `{}` {}",
            self.field, self.reason
        )
    }
}

impl std::error::Error for InvalidFirstTokenLimit {}

/// A first-token limit learned from one link's own times to first content
/// frame; give it to
/// [`Streaming::with_learned_first_token`](crate::Streaming::with_learned_first_token).
///
/// A cheap handle: its clones share one window of the latest
/// [`FIRST_TOKEN_WINDOW`] samples, so every clone of the streaming
/// service of a link (and every service given a clone of the handle)
/// learns together. Give each link its own: the distribution is the
/// link's. Keep the handle across a configuration reload to keep what
/// was learned.
///
/// The streaming service records each stream's time from sending to its
/// first content frame, and the limit in force at each first-token
/// timeout (the stream would have taken at least that long: so when the
/// link slows down, its timeouts push the quantile up and the limit grows,
/// by `factor` each time they are more than `1 − quantile` of the window,
/// up to the cap; a factor above 1 is what makes this work). A stream cut
/// by the call's deadline, or failing otherwise, records nothing.
///
/// The limit in force is the fixed first-token timeout while fewer than
/// `min_samples` were recorded, then `quantile × factor` of the window
/// (the nearest-rank quantile: a sample that was seen), at least the floor
/// and at most the cap (the cap wins when the floor is above it).
///
/// Recording is a few atomic operations and a selection over at most 256
/// numbers (once per stream, not per chunk); reading the limit is one
/// atomic load. No lock: a sample recorded while another thread reads the
/// window may be missed by that read, which an estimate can afford.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_providers::streaming::{FirstTokenLimit, FirstTokenLimitConfig};
///
/// let limit = FirstTokenLimit::new(FirstTokenLimitConfig::default()).unwrap();
/// let fixed = Duration::from_secs(30);
/// assert_eq!(limit.limit(fixed), fixed); // nothing learned yet
/// for _ in 0..20 {
///     limit.record(Duration::from_millis(1_500));
/// }
/// assert_eq!(limit.limit(fixed), Duration::from_secs(3)); // p99 × 2
/// ```
#[derive(Clone)]
pub struct FirstTokenLimit {
    inner: Arc<Inner>,
}

struct Inner {
    config: FirstTokenLimitConfig,
    /// The latest samples, in microseconds ([`EMPTY`]: none yet).
    window: Box<[AtomicU64]>,
    /// Samples recorded, ever: the next one goes to `next % window.len()`.
    next: AtomicU64,
    /// `quantile × factor` of the window in microseconds, before the
    /// floor and cap (0: fewer than `min_samples`).
    learned_micros: AtomicU64,
}

impl fmt::Debug for FirstTokenLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FirstTokenLimit")
            .field("config", &self.inner.config)
            .field("samples", &self.samples())
            .field("learned", &self.learned())
            .finish()
    }
}

impl FirstTokenLimit {
    /// A limit learning with `config`, having seen nothing yet.
    ///
    /// # Errors
    ///
    /// The settings [`validate`](FirstTokenLimitConfig::validate) refuses.
    pub fn new(config: FirstTokenLimitConfig) -> Result<Self, InvalidFirstTokenLimit> {
        config.validate()?;
        Ok(FirstTokenLimit {
            inner: Arc::new(Inner {
                config,
                window: (0..FIRST_TOKEN_WINDOW)
                    .map(|_| AtomicU64::new(EMPTY))
                    .collect(),
                next: AtomicU64::new(0),
                learned_micros: AtomicU64::new(0),
            }),
        })
    }

    /// The settings.
    pub fn config(&self) -> &FirstTokenLimitConfig {
        &self.inner.config
    }

    /// The limit in force for a service whose fixed first-token timeout is
    /// `fixed`: `fixed` until `min_samples` were recorded, then the learned
    /// limit within the floor and the cap (`cap_ms`, else `fixed`).
    pub fn limit(&self, fixed: Duration) -> Duration {
        let Some(learned) = self.learned() else {
            return fixed;
        };
        let cap = self.inner.config.cap().unwrap_or(fixed);
        learned.max(self.inner.config.floor()).min(cap)
    }

    /// `quantile × factor` of the window, before the floor and the cap;
    /// `None` while fewer than `min_samples` were recorded.
    pub fn learned(&self) -> Option<Duration> {
        match self.inner.learned_micros.load(Ordering::Relaxed) {
            0 => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    /// How many samples the window holds (at most [`FIRST_TOKEN_WINDOW`]).
    pub fn samples(&self) -> usize {
        let recorded = self.inner.next.load(Ordering::Relaxed);
        usize::try_from(recorded).map_or(FIRST_TOKEN_WINDOW, |n| n.min(FIRST_TOKEN_WINDOW))
    }

    /// Records one time to first content frame (the streaming service
    /// does, at each commit and at each first-token timeout; call it
    /// yourself to start from times known from elsewhere).
    pub fn record(&self, time_to_first_token: Duration) {
        let inner = &*self.inner;
        // Saturating: 584,000 years are as good as forever (and never
        // EMPTY).
        let micros = u64::try_from(time_to_first_token.as_micros())
            .unwrap_or(EMPTY - 1)
            .min(EMPTY - 1);
        let n = inner.next.fetch_add(1, Ordering::Relaxed);
        let slot = (n % inner.window.len() as u64) as usize;
        inner.window[slot].store(micros, Ordering::Relaxed);
        inner.recompute();
    }
}

impl Inner {
    fn recompute(&self) {
        let mut samples = [0u64; FIRST_TOKEN_WINDOW];
        let mut len = 0;
        for slot in self.window.iter() {
            let micros = slot.load(Ordering::Relaxed);
            if micros != EMPTY {
                samples[len] = micros;
                len += 1;
            }
        }
        if len < self.config.min_samples as usize {
            self.learned_micros.store(0, Ordering::Relaxed);
            return;
        }
        let samples = &mut samples[..len];
        // The nearest rank: the smallest sample with at least `quantile`
        // of the window at or below it.
        let rank = ((self.config.quantile * len as f64).ceil() as usize).clamp(1, len);
        let (_, quantile, _) = samples.select_nth_unstable(rank - 1);
        // `as` saturates; the factor is finite and above 1.
        let learned = ((*quantile as f64) * self.config.factor).round() as u64;
        self.learned_micros.store(learned.max(1), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(config: FirstTokenLimitConfig) -> FirstTokenLimit {
        FirstTokenLimit::new(config).expect("valid")
    }

    #[test]
    fn each_bad_field_is_named() {
        let base = FirstTokenLimitConfig::default;
        let bad = [
            (
                FirstTokenLimitConfig {
                    quantile: 0.0,
                    ..base()
                },
                "quantile",
            ),
            (
                FirstTokenLimitConfig {
                    quantile: f64::NAN,
                    ..base()
                },
                "quantile",
            ),
            (
                FirstTokenLimitConfig {
                    quantile: 1.01,
                    ..base()
                },
                "quantile",
            ),
            (
                FirstTokenLimitConfig {
                    factor: 1.0,
                    ..base()
                },
                "factor",
            ),
            (
                FirstTokenLimitConfig {
                    factor: f64::INFINITY,
                    ..base()
                },
                "factor",
            ),
            (
                FirstTokenLimitConfig {
                    floor_ms: 0,
                    ..base()
                },
                "floor_ms",
            ),
            (
                FirstTokenLimitConfig {
                    cap_ms: Some(1_999),
                    ..base()
                },
                "cap_ms",
            ),
            (
                FirstTokenLimitConfig {
                    min_samples: 0,
                    ..base()
                },
                "min_samples",
            ),
            (
                FirstTokenLimitConfig {
                    min_samples: 257,
                    ..base()
                },
                "min_samples",
            ),
        ];
        for (config, field) in bad {
            let err = FirstTokenLimit::new(config).expect_err(field);
            assert_eq!(err.field(), field);
            assert!(err.to_string().contains(field), "{err}");
        }
        FirstTokenLimitConfig {
            quantile: 1.0,
            cap_ms: Some(2_000),
            min_samples: 256,
            ..base()
        }
        .validate()
        .expect("the edges are valid");
    }

    #[test]
    fn the_quantile_is_a_sample_of_the_window_by_nearest_rank() {
        let l = limit(FirstTokenLimitConfig {
            quantile: 0.9,
            factor: 1.5,
            floor_ms: 1,
            min_samples: 10,
            ..FirstTokenLimitConfig::default()
        });
        for s in 1..=9 {
            l.record(Duration::from_secs(s));
        }
        assert_eq!(l.learned(), None, "9 of 10 samples");
        l.record(Duration::from_secs(10));
        // 10 samples, 1 s to 10 s: rank ceil(0.9 × 10) = 9, the 9 s one.
        assert_eq!(l.learned(), Some(Duration::from_millis(13_500)));
        assert_eq!(l.samples(), 10);
    }

    #[test]
    fn the_window_keeps_the_latest_samples_only() {
        let l = limit(FirstTokenLimitConfig {
            quantile: 1.0,
            floor_ms: 1,
            min_samples: 1,
            ..FirstTokenLimitConfig::default()
        });
        l.record(Duration::from_secs(60));
        assert_eq!(l.learned(), Some(Duration::from_secs(120)));
        for _ in 0..FIRST_TOKEN_WINDOW {
            l.record(Duration::from_millis(100));
        }
        // The 60 s sample has been overwritten.
        assert_eq!(l.learned(), Some(Duration::from_millis(200)));
        assert_eq!(l.samples(), FIRST_TOKEN_WINDOW);
    }

    #[test]
    fn the_cap_wins_over_the_floor_and_huge_samples_saturate() {
        let l = limit(FirstTokenLimitConfig {
            min_samples: 1,
            ..FirstTokenLimitConfig::default()
        });
        l.record(Duration::ZERO);
        // The floor (2 s) is above the fixed limit given: the cap wins.
        assert_eq!(l.limit(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(l.limit(Duration::from_secs(30)), Duration::from_secs(2));
        l.record(Duration::MAX);
        assert_eq!(l.limit(Duration::from_secs(30)), Duration::from_secs(30));
        assert_eq!(l.learned(), Some(Duration::from_micros(u64::MAX)));
    }
}
