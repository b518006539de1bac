//! A retry budget shared by every clone of one retry layer.

use std::fmt;
use std::time::Duration;

#[cfg(not(tower_llm_loom))]
use std::sync::atomic::{AtomicU64, Ordering};
// Model-checked with loom: `RUSTFLAGS="--cfg tower_llm_loom" cargo test
// -p tower-llm-retry --test loom --release`.
#[cfg(tower_llm_loom)]
use loom::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

/// The budget interface of `tower::retry::budget`: deposit on each first
/// attempt, withdraw before each retry. Any of tower's budgets
/// (`TpsBudget`) fits too.
pub use tower::retry::budget::Budget;

const SLOTS: usize = 10;
const FIELD_BITS: u32 = 20;
const FIELD_MAX: u64 = (1 << FIELD_BITS) - 1;
const EPOCH_MASK: u64 = (1 << 24) - 1;

/// Limits retries to a share of recent first attempts, so a failure storm
/// cannot multiply upstream load.
///
/// Within a sliding window (`ttl`, default 10 s), a retry is allowed while
/// `retries < max(percent × first attempts, min_per_sec × ttl)`: at least
/// the floor (so a quiet service can still retry now and then), and beyond
/// it at most `percent` extra load (default 20 %). Unlike tower's
/// `TpsBudget`, the floor is not added on top of the percentage, so under a
/// sustained storm upstream attempts per call stay at or below
/// `1 + percent`.
///
/// Lock-free: the window is ten slots, each one atomic word holding its
/// epoch and its two counters, updated by compare-and-swap. Counts saturate
/// at about a million per slot (`ttl / 10`). A withdrawal checks the
/// window and takes from the current slot in one compare-and-swap of that
/// slot, so concurrent withdrawals never pass the limit together (checked
/// by a loom model), except that two racing across a slot boundary (every
/// `ttl / 10`) may. It never blocks. Time is `tokio::time`, so tests run it
/// on virtual time.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_retry::{Budget, RetryBudget};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.2).unwrap();
/// for _ in 0..10 {
///     budget.deposit();
/// }
/// assert!(budget.withdraw()); // 1 of 2 allowed (20 % of 10)
/// assert!(budget.withdraw());
/// assert!(!budget.withdraw());
/// # }
/// ```
pub struct RetryBudget {
    slots: [AtomicU64; SLOTS],
    origin: Instant,
    slot_len: Duration,
    floor: u64,
    percent_milli: u64,
}

/// Why a [`RetryBudget`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidBudget {
    reason: &'static str,
}

impl fmt::Display for InvalidBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid retry budget: {}", self.reason)
    }
}

impl std::error::Error for InvalidBudget {}

#[derive(Clone, Copy)]
struct Slot {
    epoch: u64,
    deposits: u64,
    withdrawals: u64,
}

impl Slot {
    fn unpack(word: u64) -> Slot {
        Slot {
            epoch: word >> (2 * FIELD_BITS),
            deposits: (word >> FIELD_BITS) & FIELD_MAX,
            withdrawals: word & FIELD_MAX,
        }
    }

    fn pack(self) -> u64 {
        (self.epoch & EPOCH_MASK) << (2 * FIELD_BITS)
            | (self.deposits.min(FIELD_MAX) << FIELD_BITS)
            | self.withdrawals.min(FIELD_MAX)
    }
}

impl RetryBudget {
    /// A budget over a `ttl` window allowing `max(percent × first attempts,
    /// min_per_sec × ttl)` retries.
    ///
    /// # Errors
    ///
    /// When `ttl` is under 1 s or over 60 s, or `percent` is NaN, negative
    /// or above 10 (1,000 %).
    pub fn new(ttl: Duration, min_per_sec: u32, percent: f64) -> Result<Self, InvalidBudget> {
        let invalid = |reason| Err(InvalidBudget { reason });
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
            return invalid("ttl must be between 1 s and 60 s");
        }
        if !(0.0..=10.0).contains(&percent) {
            return invalid("percent must be within [0, 10]");
        }
        Ok(RetryBudget {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            origin: Instant::now(),
            slot_len: ttl / SLOTS as u32,
            floor: u64::from(min_per_sec).saturating_mul(ttl.as_secs()),
            // Truncating: the allowance never rounds up.
            percent_milli: (percent * 1000.0) as u64,
        })
    }

    /// The default: 10 s window, a floor of 1 retry per second, 20 %.
    pub fn seed_default() -> Self {
        RetryBudget {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            origin: Instant::now(),
            slot_len: Duration::from_secs(1),
            floor: 10,
            percent_milli: 200,
        }
    }

    fn epoch(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        // Whole milliseconds: slots are at least 100 ms long, and u64
        // division is several times cheaper than u128.
        let slot_ms =
            (self.slot_len.as_secs() * 1000 + u64::from(self.slot_len.subsec_millis())).max(1);
        let elapsed_ms = elapsed
            .as_secs()
            .saturating_mul(1000)
            .saturating_add(u64::from(elapsed.subsec_millis()));
        elapsed_ms / slot_ms
    }

    /// Deposits and withdrawals within the window ending at `epoch`.
    fn window(&self, epoch: u64) -> (u64, u64) {
        self.window_except(epoch, usize::MAX)
    }

    /// As [`window`](Self::window), leaving out slot `skip`.
    fn window_except(&self, epoch: u64, skip: usize) -> (u64, u64) {
        let current = epoch & EPOCH_MASK;
        let mut deposits = 0;
        let mut withdrawals = 0;
        for (i, slot) in self.slots.iter().enumerate() {
            if i == skip {
                continue;
            }
            let s = Slot::unpack(slot.load(Ordering::Acquire));
            // Epochs wrap at 2^24 slots; the age is taken modulo that.
            let age = current.wrapping_sub(s.epoch) & EPOCH_MASK;
            if age < SLOTS as u64 {
                deposits += s.deposits;
                withdrawals += s.withdrawals;
            }
        }
        (deposits, withdrawals)
    }

    /// Adds to the current slot, resetting it first if it holds an old epoch.
    fn add(&self, epoch: u64, deposit: u64, withdraw: u64) {
        let slot = &self.slots[(epoch % SLOTS as u64) as usize];
        let epoch = epoch & EPOCH_MASK;
        let mut word = slot.load(Ordering::Acquire);
        loop {
            let mut s = Slot::unpack(word);
            // A writer delayed past a whole window must not wipe a newer slot.
            let ahead = s.epoch.wrapping_sub(epoch) & EPOCH_MASK;
            if ahead != 0 && ahead < (1 << 23) {
                return;
            }
            if s.epoch != epoch {
                s = Slot {
                    epoch,
                    deposits: 0,
                    withdrawals: 0,
                };
            }
            s.deposits += deposit;
            s.withdrawals += withdraw;
            match slot.compare_exchange_weak(word, s.pack(), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    /// Retries the budget would allow right now, and those already taken.
    pub fn allowance(&self) -> (u64, u64) {
        let (deposits, withdrawals) = self.window(self.epoch());
        let allowed = (deposits.saturating_mul(self.percent_milli) / 1000).max(self.floor);
        (allowed, withdrawals)
    }
}

impl Budget for RetryBudget {
    fn deposit(&self) {
        self.add(self.epoch(), 1, 0);
    }

    fn withdraw(&self) -> bool {
        let epoch = self.epoch();
        let index = (epoch % SLOTS as u64) as usize;
        let tagged = epoch & EPOCH_MASK;
        let slot = &self.slots[index];
        let mut word = slot.load(Ordering::Acquire);
        loop {
            let mut s = Slot::unpack(word);
            let ahead = s.epoch.wrapping_sub(tagged) & EPOCH_MASK;
            if ahead != 0 && ahead < (1 << 23) {
                // This thread's clock reading is already stale: refuse.
                return false;
            }
            if s.epoch != tagged {
                s = Slot {
                    epoch: tagged,
                    deposits: 0,
                    withdrawals: 0,
                };
            }
            // The window with this slot as read: the check and the take
            // are one compare-and-swap of the slot every concurrent
            // withdrawal of this epoch writes.
            let (others_in, others_out) = self.window_except(epoch, index);
            let (deposits, withdrawals) = (others_in + s.deposits, others_out + s.withdrawals);
            let allowed = (deposits.saturating_mul(self.percent_milli) / 1000).max(self.floor);
            if withdrawals >= allowed || s.withdrawals >= FIELD_MAX {
                // (A slot's count saturates: past it, refuse rather than
                // take without counting.)
                return false;
            }
            s.withdrawals += 1;
            match slot.compare_exchange(word, s.pack(), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(actual) => word = actual,
            }
        }
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        RetryBudget::seed_default()
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (allowed, taken) = self.allowance();
        f.debug_struct("RetryBudget")
            .field("window", &(self.slot_len * SLOTS as u32))
            .field("floor", &self.floor)
            .field("percent", &(self.percent_milli as f64 / 1000.0))
            .field("allowed", &allowed)
            .field("taken", &taken)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn floor_allows_retries_without_traffic() {
        let b = RetryBudget::new(Duration::from_secs(10), 1, 0.2).expect("valid");
        for _ in 0..10 {
            assert!(b.withdraw());
        }
        assert!(!b.withdraw());
        // The withdrawals age out with the window.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(b.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn percentage_is_not_added_to_the_floor() {
        let b = RetryBudget::new(Duration::from_secs(10), 1, 0.2).expect("valid");
        for _ in 0..100 {
            b.deposit();
        }
        // max(20, 10) = 20, not 30.
        let granted = (0..100).filter(|_| b.withdraw()).count();
        assert_eq!(granted, 20);
    }

    #[tokio::test(start_paused = true)]
    async fn deposits_expire_slot_by_slot() {
        let b = RetryBudget::new(Duration::from_secs(10), 0, 1.0).expect("valid");
        b.deposit();
        tokio::time::advance(Duration::from_secs(5)).await;
        b.deposit();
        assert_eq!(b.allowance(), (2, 0));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(b.allowance(), (1, 0));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(b.allowance(), (0, 0));
        assert!(!b.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_idle_gap_forgets_everything() {
        let b = RetryBudget::new(Duration::from_secs(1), 0, 1.0).expect("valid");
        b.deposit();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(b.allowance(), (0, 0));
    }

    #[test]
    fn validation() {
        assert!(RetryBudget::new(Duration::from_millis(999), 1, 0.2).is_err());
        assert!(RetryBudget::new(Duration::from_secs(61), 1, 0.2).is_err());
        assert!(RetryBudget::new(Duration::from_secs(10), 1, f64::NAN).is_err());
        assert!(RetryBudget::new(Duration::from_secs(10), 1, -0.1).is_err());
        assert!(RetryBudget::new(Duration::from_secs(10), u32::MAX, 10.0).is_ok());
    }

    #[test]
    fn slot_packing_round_trips_and_saturates() {
        let s = Slot {
            epoch: 123_456,
            deposits: 7,
            withdrawals: FIELD_MAX + 5,
        };
        let back = Slot::unpack(s.pack());
        assert_eq!(
            (back.epoch, back.deposits, back.withdrawals),
            (123_456, 7, FIELD_MAX)
        );
    }
}
