//! [`LocalShare`]: what each replica enforces on its own while Redis is
//! down.

use std::fmt;

/// The share of every shared limit (a quota, a rate limit) each replica
/// enforces in process while Redis is down: above 0, at most 1. With N
/// replicas, `1 / N` keeps the fleet within the limits meanwhile.
///
/// ```
/// use tower_llm_redis::LocalShare;
///
/// let half = LocalShare::new(0.5).unwrap();
/// assert_eq!(half.scale(101), 50);
/// assert_eq!(LocalShare::of_replicas(4).get(), 0.25);
/// assert_eq!(LocalShare::WHOLE.scale(7), 7);
/// assert!(LocalShare::new(0.0).is_err() && LocalShare::new(f64::NAN).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalShare(f64);

impl LocalShare {
    /// The whole limit (one replica).
    pub const WHOLE: LocalShare = LocalShare(1.0);

    /// A share of `share`.
    ///
    /// # Errors
    ///
    /// A share not above 0 and at most 1 (or not a number).
    pub fn new(share: f64) -> Result<Self, InvalidShare> {
        if share > 0.0 && share <= 1.0 {
            Ok(LocalShare(share))
        } else {
            Err(InvalidShare(share))
        }
    }

    /// `1 / replicas` (at least one replica).
    pub fn of_replicas(replicas: u32) -> Self {
        LocalShare(1.0 / f64::from(replicas.max(1)))
    }

    /// The share, above 0 and at most 1.
    pub fn get(self) -> f64 {
        self.0
    }

    /// `limit` × the share, rounded down (the whole share: `limit`).
    pub fn scale(self, limit: u64) -> u64 {
        if self.0 >= 1.0 {
            return limit;
        }
        // In range: the product is at most `limit`.
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let scaled = (limit as f64 * self.0).floor() as u64;
        scaled
    }
}

/// A local share [`LocalShare::new`] refuses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InvalidShare(pub f64);

impl fmt::Display for InvalidShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "local_share = {}: must be above 0 and at most 1", self.0)
    }
}

impl std::error::Error for InvalidShare {}
