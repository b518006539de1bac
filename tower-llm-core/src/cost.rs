//! What calls cost: [`Cost`] (an amount of money), [`Price`] (a model's
//! price per million tokens), and the two values that travel with a call
//! so a cost layer can hold it to a limit: its [`Budget`] and its
//! [`Tenant`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Nano-units in one unit of money.
const NANOS: u64 = 1_000_000_000;

/// An amount of money, in the currency of the price table (US dollars in
/// every example), kept exactly as a whole number of billionths
/// (nano-dollars): adding and comparing costs never rounds.
///
/// On the wire (serde, headers, the policy file) it is a decimal number of
/// dollars (`0.0125`); a string holding one (`"0.0125"`) is read too.
/// Parsing refuses a negative, non-finite or absurd (over
/// [`Cost::MAX_DOLLARS`]) amount.
///
/// ```
/// use tower_llm_core::Cost;
///
/// let c = Cost::from_dollars(0.0125).unwrap();
/// assert_eq!(c.nanos(), 12_500_000);
/// assert_eq!(c.to_string(), "0.0125");
/// assert_eq!("1.5".parse::<Cost>().unwrap(), Cost::from_nanos(1_500_000_000));
/// assert!(Cost::from_dollars(-1.0).is_none());
/// assert!("1e300".parse::<Cost>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cost(u64);

impl Cost {
    /// Nothing.
    pub const ZERO: Cost = Cost(0);

    /// The largest amount parsing accepts: one billion dollars.
    pub const MAX_DOLLARS: f64 = 1e9;

    /// `nanos` billionths of a dollar.
    pub const fn from_nanos(nanos: u64) -> Self {
        Cost(nanos)
    }

    /// The amount in billionths of a dollar.
    pub const fn nanos(self) -> u64 {
        self.0
    }

    /// `dollars`, rounded to the nearest billionth; `None` when negative,
    /// not finite, or over [`MAX_DOLLARS`](Self::MAX_DOLLARS).
    pub fn from_dollars(dollars: f64) -> Option<Self> {
        if !dollars.is_finite() || !(0.0..=Self::MAX_DOLLARS).contains(&dollars) {
            return None;
        }
        // In range: at most 1e18 nano-dollars, below u64::MAX.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some(Cost((dollars * NANOS as f64).round() as u64))
    }

    /// The amount in dollars (as a float, for display and metrics).
    #[allow(clippy::cast_precision_loss)]
    pub fn dollars(self) -> f64 {
        self.0 as f64 / NANOS as f64
    }

    /// `self + other`, saturating.
    #[must_use]
    pub const fn saturating_add(self, other: Cost) -> Cost {
        Cost(self.0.saturating_add(other.0))
    }

    /// `self - other`, or zero.
    #[must_use]
    pub const fn saturating_sub(self, other: Cost) -> Cost {
        Cost(self.0.saturating_sub(other.0))
    }
}

impl fmt::Display for Cost {
    /// Dollars with up to nine decimals, trailing zeros trimmed (`0.0125`,
    /// `3`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / NANOS;
        let frac = self.0 % NANOS;
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let digits = format!("{frac:09}");
        write!(f, "{whole}.{}", digits.trim_end_matches('0'))
    }
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${self}")
    }
}

/// A string that is not an amount [`Cost`] accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCost(String);

impl fmt::Display for InvalidCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not an amount of money (a decimal number of dollars, 0 to {})",
            self.0,
            Cost::MAX_DOLLARS
        )
    }
}

impl std::error::Error for InvalidCost {}

impl std::str::FromStr for Cost {
    type Err = InvalidCost;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let shown = || InvalidCost(s.chars().take(40).collect());
        let t = s.trim();
        if t.is_empty() || t.len() > 40 {
            return Err(shown());
        }
        t.parse::<f64>()
            .ok()
            .and_then(Cost::from_dollars)
            .ok_or_else(shown)
    }
}

impl Serialize for Cost {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.dollars())
    }
}

impl<'de> Deserialize<'de> for Cost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Amount;
        impl Visitor<'_> for Amount {
            type Value = Cost;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an amount of dollars from 0 to {}", Cost::MAX_DOLLARS)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Cost, E> {
                Cost::from_dollars(v)
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Float(v), &self))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Cost, E> {
                #[allow(clippy::cast_precision_loss)]
                Cost::from_dollars(v as f64)
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Cost, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Cost, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(Amount)
    }
}

/// A model's price, in dollars per million tokens: input, output and
/// cached input (prompt-cache reads; the input price when not given).
///
/// ```
/// use tower_llm_core::{Cost, Price, Usage};
///
/// // gpt-4o-mini: $0.15 in, $0.60 out, $0.075 cached, per million tokens.
/// let price: Price = serde_json::from_str(
///     r#"{ "input": 0.15, "output": 0.60, "cached_input": 0.075 }"#,
/// ).unwrap();
/// let usage = Usage { prompt_tokens: 1_000, completion_tokens: 500, cached_input_tokens: 400 };
/// // 600 × 0.15 + 400 × 0.075 + 500 × 0.60, per million.
/// assert_eq!(price.cost(&usage), Cost::from_nanos(90_000 + 30_000 + 300_000));
/// assert!(serde_json::from_str::<Price>(r#"{ "input": -1, "output": 1 }"#).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, try_from = "PriceFields")]
pub struct Price {
    /// Dollars per million input tokens.
    pub input: Cost,
    /// Dollars per million output tokens.
    pub output: Cost,
    /// Dollars per million cached input tokens (prompt-cache reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<Cost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFields {
    input: Cost,
    output: Cost,
    #[serde(default)]
    cached_input: Option<Cost>,
}

impl TryFrom<PriceFields> for Price {
    type Error = InvalidPrice;

    fn try_from(f: PriceFields) -> Result<Self, Self::Error> {
        Price::new(f.input, f.output, f.cached_input)
    }
}

/// A price [`Price::new`] refuses: one of its amounts is over
/// [`Price::MAX_PER_MILLION`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPrice {
    field: &'static str,
    amount: Cost,
}

impl fmt::Display for InvalidPrice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} dollars per million tokens is absurd (at most {})",
            self.field,
            self.amount,
            Price::MAX_PER_MILLION
        )
    }
}

impl std::error::Error for InvalidPrice {}

impl Price {
    /// The highest price per million tokens a price may name: $10,000
    /// (the dearest models of 2026 cost under $1,000).
    pub const MAX_PER_MILLION: Cost = Cost(10_000 * NANOS);

    /// A price of `input`, `output` and `cached_input` dollars per million
    /// tokens.
    ///
    /// # Errors
    ///
    /// An amount over [`MAX_PER_MILLION`](Self::MAX_PER_MILLION).
    pub fn new(
        input: Cost,
        output: Cost,
        cached_input: Option<Cost>,
    ) -> Result<Self, InvalidPrice> {
        let fields = [
            ("input", Some(input)),
            ("output", Some(output)),
            ("cached_input", cached_input),
        ];
        for (field, amount) in fields {
            if let Some(amount) = amount.filter(|a| *a > Self::MAX_PER_MILLION) {
                return Err(InvalidPrice { field, amount });
            }
        }
        Ok(Price {
            input,
            output,
            cached_input,
        })
    }

    /// What `input` fresh input tokens, `cached` cached ones and `output`
    /// output tokens cost, rounded up to the next nano-dollar.
    pub fn tokens(&self, input: u64, cached: u64, output: u64) -> Cost {
        let cached_price = self.cached_input.unwrap_or(self.input);
        // Exact in 64 bits for any real call; 128 bits past that.
        let fast = input
            .checked_mul(self.input.0)
            .and_then(|a| a.checked_add(cached.checked_mul(cached_price.0)?))
            .and_then(|a| a.checked_add(output.checked_mul(self.output.0)?));
        if let Some(per_million) = fast {
            return Cost(per_million.div_ceil(1_000_000));
        }
        let per_million = u128::from(input) * u128::from(self.input.0)
            + u128::from(cached) * u128::from(cached_price.0)
            + u128::from(output) * u128::from(self.output.0);
        Cost(u64::try_from(per_million.div_ceil(1_000_000)).unwrap_or(u64::MAX))
    }
}

/// A limit on what one logical call may spend, across all its attempts
/// (retries, failovers, hedges). It travels in the call's
/// [`Call`](crate::Call), like the deadline; clones share one account.
///
/// A cost layer *holds* each attempt's worst case before sending it and
/// settles the hold to the attempt's real cost when it ends; what is
/// [`left`](Self::left) is the limit less what is spent and held. So
/// concurrent attempts (a hedge) can never together pass the limit.
///
/// Storing a budget in a call that has one keeps the lower limit: a
/// caller may lower a route's budget, never raise it.
///
/// ```
/// use tower_llm_core::{Budget, ChatRequest, Cost, Message};
///
/// let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
/// Budget::new(Cost::from_nanos(1_000)).store(&mut req);
/// Budget::new(Cost::from_nanos(5_000)).store(&mut req); // cannot raise it
/// let budget = Budget::of(&req).unwrap();
/// assert_eq!(budget.limit(), Cost::from_nanos(1_000));
///
/// let hold = budget.hold(Cost::from_nanos(800)).unwrap();
/// assert_eq!(budget.hold(Cost::from_nanos(300)).unwrap_err(), Cost::from_nanos(200));
/// hold.settle(Cost::from_nanos(100));
/// assert_eq!((budget.spent(), budget.left()), (Cost::from_nanos(100), Cost::from_nanos(900)));
/// ```
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Account>,
}

struct Account {
    limit: u64,
    /// Spent plus held.
    used: AtomicU64,
    spent: AtomicU64,
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("limit", &self.limit())
            .field("spent", &self.spent())
            .field("left", &self.left())
            .finish()
    }
}

impl Budget {
    /// A budget of `limit`, nothing spent.
    pub fn new(limit: Cost) -> Self {
        Budget {
            inner: Arc::new(Account {
                limit: limit.0,
                used: AtomicU64::new(0),
                spent: AtomicU64::new(0),
            }),
        }
    }

    /// The limit.
    pub fn limit(&self) -> Cost {
        Cost(self.inner.limit)
    }

    /// What settled attempts spent.
    pub fn spent(&self) -> Cost {
        Cost(self.inner.spent.load(Ordering::Acquire))
    }

    /// What attempts still running hold.
    pub fn held(&self) -> Cost {
        let used = self.inner.used.load(Ordering::Acquire);
        Cost(used.saturating_sub(self.inner.spent.load(Ordering::Acquire)))
    }

    /// The limit less what is spent and held.
    pub fn left(&self) -> Cost {
        Cost(
            self.inner
                .limit
                .saturating_sub(self.inner.used.load(Ordering::Acquire)),
        )
    }

    /// Holds `amount` for an attempt about to start, or returns what is
    /// left when that is less than `amount` (nothing is held then).
    ///
    /// # Errors
    ///
    /// What is left, when it cannot cover `amount`.
    pub fn hold(&self, amount: Cost) -> Result<BudgetHold, Cost> {
        let used = &self.inner.used;
        let mut now = used.load(Ordering::Acquire);
        loop {
            let left = self.inner.limit.saturating_sub(now);
            if amount.0 > left {
                return Err(Cost(left));
            }
            match used.compare_exchange_weak(
                now,
                now + amount.0,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(BudgetHold {
                        budget: Some(self.clone()),
                        amount: amount.0,
                    });
                }
                Err(seen) => now = seen,
            }
        }
    }
}

/// An amount a [`Budget`] holds for one attempt until it is settled.
/// Dropping it unsettled releases it (charges nothing).
#[derive(Debug)]
#[must_use = "a hold is released (charged nothing) when dropped"]
pub struct BudgetHold {
    /// The budget, until the hold is settled.
    budget: Option<Budget>,
    amount: u64,
}

impl BudgetHold {
    /// The amount held.
    pub fn amount(&self) -> Cost {
        Cost(self.amount)
    }

    /// Charges `cost` (at most the amount held; more is cut to it) and
    /// releases the rest. Returns what was charged.
    pub fn settle(mut self, cost: Cost) -> Cost {
        let charged = cost.0.min(self.amount);
        if let Some(budget) = self.budget.take() {
            let account = &budget.inner;
            account.spent.fetch_add(charged, Ordering::AcqRel);
            account
                .used
                .fetch_sub(self.amount - charged, Ordering::AcqRel);
        }
        Cost(charged)
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        if let Some(budget) = self.budget.take() {
            budget.inner.used.fetch_sub(self.amount, Ordering::AcqRel);
        }
    }
}

/// Who a call is for, as far as quotas go: an opaque id (the gateway's
/// `x-tenant-id` header's raw bytes), compared byte for byte and never
/// decoded. It travels in the call's [`Call`](crate::Call).
///
/// ```
/// use tower_llm_core::{ChatRequest, Message, Tenant};
///
/// let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
/// Tenant::new(&b"caf\xe9"[..]).store(&mut req);
/// assert_eq!(Tenant::of(&req).unwrap().as_bytes(), b"caf\xe9");
/// assert_eq!(format!("{:?}", Tenant::of(&req).unwrap()), r#"Tenant("caf\xe9")"#);
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(Arc<[u8]>);

impl Tenant {
    /// The tenant `id`.
    pub fn new(id: impl Into<Arc<[u8]>>) -> Self {
        Tenant(id.into())
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tenant(\"{}\")", self.0.escape_ascii())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_round_trips_through_its_text() {
        for nanos in [0, 1, 999, 1_000_000_000, 1_234_567_891, 42 * NANOS] {
            let c = Cost(nanos);
            assert_eq!(c.to_string().parse::<Cost>(), Ok(c), "{c}");
        }
    }

    #[test]
    fn a_cost_refuses_what_is_not_money() {
        for bad in [
            "",
            "-0.5",
            "NaN",
            "inf",
            "1e10",
            "abc",
            "1.0.0",
            &"9".repeat(41),
        ] {
            assert!(bad.parse::<Cost>().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<Cost>("-1").is_err());
        assert!(serde_json::from_str::<Cost>("\"x\"").is_err());
        assert_eq!(
            serde_json::from_str::<Cost>("\"0.5\"").ok(),
            Cost::from_dollars(0.5)
        );
        assert_eq!(
            serde_json::from_str::<Cost>("2").ok(),
            Cost::from_dollars(2.0)
        );
    }

    #[test]
    fn a_price_rounds_up_and_refuses_absurd_amounts() {
        let price = Price::new(Cost::from_nanos(1), Cost::ZERO, None).unwrap();
        // One token at a billionth of a dollar per million: rounds up.
        assert_eq!(price.tokens(1, 0, 0), Cost::from_nanos(1));
        assert_eq!(price.tokens(0, 0, 0), Cost::ZERO);
        let err = serde_json::from_str::<Price>(r#"{"input": 1, "output": 20000}"#).unwrap_err();
        assert!(err.to_string().contains("output"), "{err}");
        assert!(serde_json::from_str::<Price>(r#"{"input": 1, "output": 2, "x": 1}"#).is_err());
        let huge = Price::new(Price::MAX_PER_MILLION, Price::MAX_PER_MILLION, None).unwrap();
        assert!(huge.tokens(u64::MAX, u64::MAX, u64::MAX) == Cost(u64::MAX));
        // 10^9 tokens at 10^13 nano-dollars per million: 10^22 before the
        // division (past 64 bits: the 128-bit path), 10^16 after.
        assert_eq!(
            huge.tokens(1_000_000_000, 0, 0),
            Cost(10_000_000_000_000_000)
        );
    }

    #[test]
    fn a_dropped_hold_is_released_and_a_settled_one_charges_at_most_its_amount() {
        let budget = Budget::new(Cost(100));
        let a = budget.hold(Cost(60)).unwrap();
        assert_eq!(budget.hold(Cost(41)).unwrap_err(), Cost(40));
        drop(a);
        assert_eq!(budget.left(), Cost(100));
        let b = budget.hold(Cost(60)).unwrap();
        assert_eq!(b.settle(Cost(1_000)), Cost(60));
        assert_eq!(
            (budget.spent(), budget.held(), budget.left()),
            (Cost(60), Cost::ZERO, Cost(40))
        );
    }
}
