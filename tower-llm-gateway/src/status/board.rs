//! What `/status` shows, counted as calls end: per link, fifteen one-minute
//! windows of outcomes and latencies.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tower_llm::{AttemptOutcome, AttemptRecord, NextStep};

/// Links tracked at most (provider and model names come from the policy,
/// a closed set; this bounds memory whatever it says).
pub(crate) const MAX_LINKS: usize = 1024;

/// One-minute slots kept per link.
pub(super) const MINUTES: usize = 15;

/// Latency buckets: bucket `i` holds latencies up to 2^(i/2) ms (the last
/// one, everything over about 65 s).
const BUCKETS: usize = 33;

#[derive(Debug, Clone, Copy)]
struct Histogram {
    counts: [u32; BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: [0; BUCKETS],
        }
    }
}

impl Histogram {
    fn record(&mut self, d: Duration) {
        let ms = d.as_secs_f64() * 1_000.0;
        let i = if ms <= 1.0 {
            0
        } else {
            ((ms.log2() * 2.0).ceil() as usize).min(BUCKETS - 1)
        };
        self.counts[i] = self.counts[i].saturating_add(1);
    }

    /// The upper bound of the bucket holding quantile `q`, in ms.
    fn quantile(&self, q: f64) -> Option<f64> {
        let total: u64 = self.counts.iter().map(|&c| u64::from(c)).sum();
        if total == 0 {
            return None;
        }
        let target = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= target {
                return Some((i as f64 / 2.0).exp2());
            }
        }
        None
    }
}

#[derive(Debug, Clone, Default)]
struct Minute {
    /// Minutes since the board started; the slot is stale when older.
    epoch: u64,
    attempts: u32,
    failures: u32,
    failovers: u32,
    classes: BTreeMap<&'static str, u32>,
    latency: Histogram,
    ttft: Histogram,
}

#[derive(Debug, Default)]
struct Link {
    minutes: [Minute; MINUTES],
}

/// A link by its provider and model names.
type LinkName = (Arc<str>, Arc<str>);

/// A minute's p50 and p99, in ms (`None`: no answer that minute).
pub(super) type Quantiles = (Option<f64>, Option<f64>);

/// Per-link counts of the last 15 minutes.
#[derive(Debug)]
pub(crate) struct StatusBoard {
    links: Mutex<HashMap<LinkName, Link>>,
    origin: Instant,
}

impl Default for StatusBoard {
    fn default() -> Self {
        StatusBoard {
            links: Mutex::default(),
            origin: Instant::now(),
        }
    }
}

/// A link's counts over a number of minutes.
#[derive(Debug, Default, Clone)]
pub(super) struct Window {
    pub(super) attempts: u64,
    pub(super) failures: u64,
    pub(super) failovers: u64,
    pub(super) classes: BTreeMap<&'static str, u64>,
}

impl StatusBoard {
    pub(super) fn minute(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.origin)
            .as_secs()
            / 60
    }

    /// Counts the attempts of one finished call (`streamed`: its attempts'
    /// times are times to first token).
    pub(crate) fn observe(&self, records: &[AttemptRecord], streamed: bool) {
        if records.is_empty() {
            return;
        }
        let now = self.minute();
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        for r in records {
            if matches!(
                r.outcome,
                AttemptOutcome::SkippedByPolicy | AttemptOutcome::InFlight
            ) {
                continue;
            }
            let key = (r.provider.clone(), r.model.clone());
            if !links.contains_key(&key) && links.len() >= MAX_LINKS {
                continue;
            }
            let link = links.entry(key).or_default();
            let slot = &mut link.minutes[(now % MINUTES as u64) as usize];
            if slot.epoch != now {
                *slot = Minute {
                    epoch: now,
                    ..Minute::default()
                };
            }
            slot.attempts = slot.attempts.saturating_add(1);
            if r.next == NextStep::FailedOver {
                slot.failovers = slot.failovers.saturating_add(1);
            }
            match r.outcome {
                AttemptOutcome::Failed(class) => {
                    slot.failures = slot.failures.saturating_add(1);
                    *slot.classes.entry(class.as_metric_label()).or_default() += 1;
                }
                AttemptOutcome::Succeeded if streamed => slot.ttft.record(r.elapsed),
                AttemptOutcome::Succeeded => slot.latency.record(r.elapsed),
                _ => {}
            }
        }
    }

    /// Counts of `provider`/`model` over the last `minutes` minutes, and the
    /// p50/p99 latency and time to first token of each of the last 15.
    pub(super) fn read(&self, provider: &str, model: &str, now: u64) -> ([Window; 3], Series) {
        let links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        let mut windows: [Window; 3] = Default::default();
        let mut series = Series::default();
        let Some(link) = links.get(&(Arc::from(provider), Arc::from(model))) else {
            return (windows, series);
        };
        for age in 0..MINUTES as u64 {
            let Some(epoch) = now.checked_sub(age) else {
                break;
            };
            let slot = &link.minutes[(epoch % MINUTES as u64) as usize];
            let fresh = slot.epoch == epoch && slot.attempts > 0;
            let at = MINUTES - 1 - age as usize;
            if fresh {
                series.latency[at] = (slot.latency.quantile(0.5), slot.latency.quantile(0.99));
                series.ttft[at] = (slot.ttft.quantile(0.5), slot.ttft.quantile(0.99));
            }
            for (w, span) in windows.iter_mut().zip([1, 5, 15]) {
                if fresh && age < span {
                    w.attempts += u64::from(slot.attempts);
                    w.failures += u64::from(slot.failures);
                    w.failovers += u64::from(slot.failovers);
                    for (class, n) in &slot.classes {
                        *w.classes.entry(class).or_default() += u64::from(*n);
                    }
                }
            }
        }
        (windows, series)
    }
}

/// p50 and p99 per minute, oldest first (`None`: no answer that minute).
#[derive(Debug, Default)]
pub(super) struct Series {
    pub(super) latency: [Quantiles; MINUTES],
    pub(super) ttft: [Quantiles; MINUTES],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_bucket_bounds() {
        let mut h = Histogram::default();
        for _ in 0..99 {
            h.record(Duration::from_millis(20));
        }
        h.record(Duration::from_secs(3));
        // 20 ms falls in the bucket up to 2^(9/2) ≈ 22.6 ms.
        assert!((h.quantile(0.5).expect("some") - 22.6).abs() < 0.1);
        assert!(h.quantile(0.999).expect("some") >= 3_000.0);
        assert_eq!(Histogram::default().quantile(0.5), None);
    }
}
