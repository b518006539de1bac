//! Breaker settings.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Open on a failure ratio over a rolling window (off by default).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatioTrigger {
    /// Open when at least this share of calls failed, in `(0, 1]`.
    pub ratio: f64,
    /// ...among at least this many calls in the window.
    pub min_calls: u32,
    /// The rolling window.
    #[serde(rename = "window_ms", with = "tower_llm_core::layer::serde_millis")]
    pub window: Duration,
}

/// What one outcome counted by a breaker stands for (`count` in a config
/// file).
///
/// The breaker sits inside the retry layer (`deadline → fallback → retry →
/// breaker`), so by default it sees, and counts, every **attempt**: with
/// 3 attempts per call, a `consecutive_failures` threshold of 5 opens the
/// circuit during the 2nd failed call (its 2nd attempt is the 5th failure;
/// its 3rd attempt is refused and the call fails over). With
/// [`Calls`](BreakerCount::Calls) it counts one outcome per logical call
/// per link instead (seed 000): the same threshold opens during the 5th
/// failed call (on its first attempt, after 4 × 3 + 1 = 13 attempts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerCount {
    /// Every attempt the breaker admits counts (the default).
    #[default]
    Attempts,
    /// One outcome per logical call per link, read from the call's
    /// attempt log: the first tripping failure of a call on a link counts
    /// (at once, so a circuit can open while the call is still retrying);
    /// further failures of the same call on that link count nothing; a
    /// success counts (it resets the consecutive count). So a call whose
    /// 3 attempts all fail is one failure, and a call that recovers on a
    /// retry is one failure then one success (which a ratio trigger sees as
    /// two calls). Without an attempt log (no tower-llm layer outside made
    /// one) each attempt is a call.
    Calls,
}

/// When a circuit opens, how long it stays open, and how it probes.
///
/// Field names are the same in Rust and in TOML/JSON (durations in
/// milliseconds, `*_ms`).
///
/// ```
/// use tower_llm_breaker::BreakerConfig;
///
/// let cfg: BreakerConfig = serde_json::from_str(r#"{
///     "consecutive_failures": 3,
///     "cooldown_ms": 10000,
///     "failure_ratio": {"ratio": 0.5, "min_calls": 20, "window_ms": 30000}
/// }"#).unwrap();
/// assert_eq!(cfg.consecutive_failures, 3);
/// assert_eq!(cfg.half_open_probes, 1); // defaults fill the rest
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Open after this many consecutive tripping failures (default 5; 0
    /// turns this trigger off).
    pub consecutive_failures: u32,
    /// Also open on a failure ratio (default off).
    pub failure_ratio: Option<RatioTrigger>,
    /// Count a call slower than this as a failure, for the breaker only
    /// (default off).
    #[serde(rename = "slow_call_ms", with = "opt_millis")]
    pub slow_call: Option<Duration>,
    /// How long a circuit stays open before probing (default 30 s).
    #[serde(rename = "cooldown_ms", with = "tower_llm_core::layer::serde_millis")]
    pub cooldown: Duration,
    /// Cooldown multiplier for each consecutive re-open (default 1: fixed).
    pub cooldown_growth: f64,
    /// The longest cooldown after growth (default 5 min).
    #[serde(
        rename = "max_cooldown_ms",
        with = "tower_llm_core::layer::serde_millis"
    )]
    pub max_cooldown: Duration,
    /// Probes admitted in half-open, and successes needed to close
    /// (default 1).
    pub half_open_probes: u32,
    /// Hold a key for a 429's `Retry-After` (default on): new attempts on
    /// the key are refused until the hold ends (as circuit open when links
    /// follow in the fallback chain, so the call goes to the next one; as
    /// rate limited with the rest of the hold otherwise, so the retry layer
    /// waits it out), then everyone is let through again. A hold is not a state change: a closed circuit stays closed
    /// (no half-open probing after it), and a held 429 does not count as a
    /// failure toward opening.
    pub rate_limit_hold: bool,
    /// Holds shorter than this are no hold at all (default 1 s): the retry
    /// layer's wait handles them, and the 429 counts as an ordinary
    /// rate-limited failure, as one without `Retry-After` does.
    #[serde(
        rename = "min_rate_limit_hold_ms",
        with = "tower_llm_core::layer::serde_millis"
    )]
    pub min_rate_limit_hold: Duration,
    /// The longest hold (default 5 min): a longer `Retry-After` holds this
    /// long.
    #[serde(
        rename = "max_rate_limit_hold_ms",
        with = "tower_llm_core::layer::serde_millis"
    )]
    pub max_rate_limit_hold: Duration,
    /// What one counted outcome stands for: every attempt (default) or
    /// one per logical call per link (`count = "calls"`); see
    /// [`BreakerCount`].
    pub count: BreakerCount,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            failure_ratio: None,
            slow_call: None,
            cooldown: Duration::from_secs(30),
            cooldown_growth: 1.0,
            max_cooldown: Duration::from_secs(300),
            half_open_probes: 1,
            rate_limit_hold: true,
            min_rate_limit_hold: Duration::from_secs(1),
            max_rate_limit_hold: Duration::from_secs(300),
            count: BreakerCount::Attempts,
        }
    }
}

impl BreakerConfig {
    /// The cooldown after `reopens` consecutive re-opens.
    pub fn cooldown_after(&self, reopens: u32) -> Duration {
        let growth = if self.cooldown_growth.is_finite() && self.cooldown_growth >= 1.0 {
            self.cooldown_growth
        } else {
            1.0
        };
        let exp = i32::try_from(reopens).unwrap_or(i32::MAX);
        let secs = self.cooldown.as_secs_f64() * growth.powi(exp);
        let max = self.max_cooldown.max(self.cooldown);
        Duration::try_from_secs_f64(secs).map_or(max, |d| d.min(max))
    }

    /// The hold a 429 with `retry_after` puts on its key: none when holds
    /// are off, without a `Retry-After`, or below
    /// [`min_rate_limit_hold`](Self::min_rate_limit_hold); capped at
    /// [`max_rate_limit_hold`](Self::max_rate_limit_hold).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_llm_breaker::BreakerConfig;
    ///
    /// let cfg = BreakerConfig::default();
    /// assert_eq!(cfg.hold_for(Some(Duration::from_millis(50))), None); // the retry layer waits
    /// assert_eq!(cfg.hold_for(Some(Duration::from_secs(5))), Some(Duration::from_secs(5)));
    /// assert_eq!(cfg.hold_for(Some(Duration::from_secs(900))), Some(Duration::from_secs(300)));
    /// ```
    pub fn hold_for(&self, retry_after: Option<Duration>) -> Option<Duration> {
        retry_after
            .filter(|h| self.rate_limit_hold && *h >= self.min_rate_limit_hold)
            .map(|h| h.min(self.max_rate_limit_hold))
            // A zero hold holds nothing: that 429 is an ordinary failure.
            .filter(|h| !h.is_zero())
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A message naming the first bad field: a zero cooldown, zero probes,
    /// a growth that is NaN or below 1, a ratio outside `(0, 1]`, a zero
    /// window, a minimum rate-limit hold above the maximum.
    pub fn validate(&self) -> Result<(), String> {
        if self.cooldown.is_zero() {
            return Err("cooldown_ms must be above zero".into());
        }
        if self.half_open_probes == 0 {
            return Err("half_open_probes must be at least 1".into());
        }
        if !self.cooldown_growth.is_finite() || self.cooldown_growth < 1.0 {
            return Err("cooldown_growth must be a finite number >= 1".into());
        }
        if self.min_rate_limit_hold > self.max_rate_limit_hold {
            return Err("min_rate_limit_hold_ms must not be above max_rate_limit_hold_ms".into());
        }
        if self.rate_limit_hold && self.max_rate_limit_hold.is_zero() {
            return Err(
                "max_rate_limit_hold_ms must be above zero while rate_limit_hold is on".into(),
            );
        }
        if let Some(r) = self.failure_ratio {
            if !(r.ratio > 0.0 && r.ratio <= 1.0) {
                return Err("failure_ratio.ratio must be within (0, 1]".into());
            }
            if r.window < Duration::from_millis(10) {
                return Err("failure_ratio.window_ms must be at least 10".into());
            }
        }
        Ok(())
    }
}

mod opt_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooldown_growth_is_capped() {
        let cfg = BreakerConfig {
            cooldown_growth: 2.0,
            max_cooldown: Duration::from_secs(100),
            ..BreakerConfig::default()
        };
        assert_eq!(cfg.cooldown_after(0), Duration::from_secs(30));
        assert_eq!(cfg.cooldown_after(1), Duration::from_secs(60));
        assert_eq!(cfg.cooldown_after(2), Duration::from_secs(100));
        assert_eq!(cfg.cooldown_after(u32::MAX), Duration::from_secs(100));
        assert_eq!(
            BreakerConfig::default().cooldown_after(9),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn validation_names_the_field() {
        let bad = |f: fn(&mut BreakerConfig)| {
            let mut c = BreakerConfig::default();
            f(&mut c);
            c.validate().expect_err("invalid")
        };
        assert!(bad(|c| c.cooldown = Duration::ZERO).contains("cooldown_ms"));
        assert!(bad(|c| c.half_open_probes = 0).contains("half_open_probes"));
        assert!(bad(|c| c.cooldown_growth = f64::NAN).contains("cooldown_growth"));
        assert!(
            bad(|c| c.failure_ratio = Some(RatioTrigger {
                ratio: 1.5,
                min_calls: 1,
                window: Duration::from_secs(1)
            }))
            .contains("ratio")
        );
        assert!(
            bad(|c| c.min_rate_limit_hold = Duration::from_secs(301))
                .contains("min_rate_limit_hold_ms")
        );
        assert!(
            bad(|c| {
                c.min_rate_limit_hold = Duration::ZERO;
                c.max_rate_limit_hold = Duration::ZERO;
            })
            .contains("max_rate_limit_hold_ms")
        );
        // Holds on from 0 s: a `Retry-After: 0` still holds nothing.
        let from_zero = BreakerConfig {
            min_rate_limit_hold: Duration::ZERO,
            ..BreakerConfig::default()
        };
        assert_eq!(from_zero.hold_for(Some(Duration::ZERO)), None);
        assert_eq!(
            from_zero.hold_for(Some(Duration::from_millis(50))),
            Some(Duration::from_millis(50))
        );
        assert!(BreakerConfig::default().validate().is_ok());
    }

    #[test]
    fn round_trips_through_json() {
        let cfg = BreakerConfig {
            slow_call: Some(Duration::from_millis(1500)),
            ..BreakerConfig::default()
        };
        let json = serde_json::to_value(cfg).expect("json");
        assert_eq!(json["slow_call_ms"], 1500);
        assert_eq!(json["cooldown_ms"], 30000);
        assert_eq!(json["min_rate_limit_hold_ms"], 1000);
        let back: BreakerConfig = serde_json::from_value(json).expect("back");
        assert_eq!(back, cfg);
        assert!(serde_json::from_str::<BreakerConfig>(r#"{"cooldown": 5}"#).is_err());
    }
}
