//! Tenant quotas: the [`QuotaStore`] contract, what one attempt asks of a
//! quota ([`Ask`]), what a store holds for it ([`QuotaHold`]) or why it
//! refuses ([`QuotaRefusal`]), and the limits ([`QuotaConfig`]).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_llm_core::{Cost, Tenant};

/// What one attempt asks of (or, settled, spent from) a tenant's quota:
/// money and tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ask {
    /// Money.
    pub cost: Cost,
    /// Tokens, input and output together.
    pub tokens: u64,
}

/// A tenant's limits over one window: money, tokens, or both. A limit
/// left out is not enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The most a tenant may spend in one window, in dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<Cost>,
    /// The most tokens (input and output) a tenant may use in one window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
}

impl Limits {
    /// `true` when `held_and_spent + ask` stays within both limits.
    pub fn admits(&self, used: Ask, ask: Ask) -> bool {
        self.refusal(used, ask).is_none()
    }

    /// Which limit `used + ask` would pass, and what is left of it.
    fn refusal(&self, used: Ask, ask: Ask) -> Option<(Exhausted, Ask)> {
        let left = self.left(used);
        if self.max_cost.is_some() && ask.cost > left.cost {
            return Some((Exhausted::Cost, left));
        }
        if self.max_tokens.is_some() && ask.tokens > left.tokens {
            return Some((Exhausted::Tokens, left));
        }
        None
    }

    /// What is left after `used` (`u64::MAX` tokens / the largest cost for
    /// a limit not set).
    pub fn left(&self, used: Ask) -> Ask {
        Ask {
            cost: self
                .max_cost
                .map_or(Cost::from_nanos(u64::MAX), |m| m.saturating_sub(used.cost)),
            tokens: self
                .max_tokens
                .map_or(u64::MAX, |m| m.saturating_sub(used.tokens)),
        }
    }

    /// `true` when no limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.max_cost.is_none() && self.max_tokens.is_none()
    }
}

/// Which limit refused an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Exhausted {
    /// The money limit (`max_cost`).
    Cost,
    /// The token limit (`max_tokens`).
    Tokens,
}

/// The tenant quotas of a cost layer: every tenant gets [`limits`](Self::limits)
/// over each window of [`window_secs`](Self::window_secs) (windows are
/// aligned to the Unix epoch: a day is a UTC day), unless
/// [`tenants`](Self::tenants) names its own. A call without a tenant id is
/// counted as the tenant with the empty id (dropping the header never
/// escapes a quota).
///
/// In the policy file, `[quotas]`:
///
/// ```
/// use tower_llm_cost::QuotaConfig;
///
/// let config: QuotaConfig = toml::from_str(r#"
///     window_secs = 86400
///     max_cost = 10.0          # dollars per tenant per UTC day
///     max_tokens = 2000000
///     [tenants.acme]
///     max_cost = 250.0
/// "#).unwrap();
/// config.validate().unwrap();
/// assert_eq!(config.limits_of(b"acme").max_cost.unwrap().to_string(), "250");
/// assert_eq!(config.limits_of(b"anyone").max_tokens, Some(2_000_000));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// The length of a window, in seconds (at least 1, at most 366 days).
    pub window_secs: u64,
    /// The limits of every tenant not named in `tenants`.
    #[serde(flatten)]
    pub limits: Limits,
    /// Limits of named tenants (by their id's UTF-8 text), in place of
    /// the default ones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, Limits>,
    /// Count and log what would be refused, refuse nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    /// How long a store keeps an attempt's hold when nobody settles it (a
    /// replica that crashed mid-call), in seconds (default 900). An
    /// attempt still running past it keeps running; its hold no longer
    /// counts against others, its spend is still settled.
    #[serde(default = "default_hold_secs")]
    pub hold_secs: u64,
    /// The most tenants counted apart in one window (default 100,000):
    /// past it, every tenant not yet counted in the window is counted
    /// with the others like it, together, under the default limits (a
    /// tenant named in `tenants` is always counted apart). Tenant ids come
    /// from clients: this bounds the memory (or Redis keys) they can make
    /// a store hold.
    #[serde(default = "default_max_tenants")]
    pub max_tenants: u64,
}

const fn default_max_tenants() -> u64 {
    100_000
}

/// The id under which the tenants past `max_tenants` are counted
/// together: it holds a line feed, which no HTTP header value can, so no
/// caller can name it.
pub const OVERFLOW_TENANT: &[u8] = b"\n(tenants past max_tenants)";

const fn default_hold_secs() -> u64 {
    900
}

/// The longest window: 366 days.
const MAX_WINDOW_SECS: u64 = 366 * 86_400;

impl QuotaConfig {
    /// Quotas of `limits` per tenant over windows of `window`.
    pub fn new(window: Duration, limits: Limits) -> Self {
        QuotaConfig {
            window_secs: window.as_secs(),
            limits,
            tenants: BTreeMap::new(),
            shadow: false,
            hold_secs: default_hold_secs(),
            max_tenants: default_max_tenants(),
        }
    }

    /// The same, in shadow mode: counts and logs, refuses nothing.
    #[must_use]
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The same, with `tenant`'s own limits.
    #[must_use]
    pub fn with_tenant(mut self, tenant: impl Into<String>, limits: Limits) -> Self {
        self.tenants.insert(tenant.into(), limits);
        self
    }

    /// `true` when `tenant` has limits of its own in `tenants`.
    pub fn is_named(&self, tenant: &[u8]) -> bool {
        std::str::from_utf8(tenant).is_ok_and(|t| self.tenants.contains_key(t))
    }

    /// The limits of `tenant`.
    pub fn limits_of(&self, tenant: &[u8]) -> Limits {
        std::str::from_utf8(tenant)
            .ok()
            .and_then(|t| self.tenants.get(t))
            .copied()
            .unwrap_or(self.limits)
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_secs(self.window_secs)
    }

    /// How long an unsettled hold lasts.
    pub fn hold_ttl(&self) -> Duration {
        Duration::from_secs(self.hold_secs)
    }

    /// The window `unix_secs` falls in, and the time until it ends.
    pub fn window_at(&self, unix_secs: u64) -> (u64, Duration) {
        let len = self.window_secs.max(1);
        let index = unix_secs / len;
        let ends = (index + 1) * len;
        (index, Duration::from_secs(ends - unix_secs))
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A window of zero or over 366 days, or a hold time of zero.
    pub fn validate(&self) -> Result<(), InvalidQuota> {
        if self.window_secs == 0 || self.window_secs > MAX_WINDOW_SECS {
            return Err(InvalidQuota(format!(
                "window_secs = {}: must be 1 to {MAX_WINDOW_SECS} (366 days)",
                self.window_secs
            )));
        }
        if self.max_tenants == 0 {
            return Err(InvalidQuota(
                "max_tenants = 0: must be at least 1".to_owned(),
            ));
        }
        if self.hold_secs == 0 || self.hold_secs > MAX_WINDOW_SECS {
            return Err(InvalidQuota(format!(
                "hold_secs = {}: must be 1 to {MAX_WINDOW_SECS}",
                self.hold_secs
            )));
        }
        Ok(())
    }
}

/// Quota settings [`QuotaConfig::validate`] refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidQuota(String);

impl fmt::Display for InvalidQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidQuota {}

/// What a [`QuotaStore`] holds for one attempt, until the attempt is
/// settled ([`QuotaStore::settle`]).
///
/// A store makes it with [`QuotaHold::new`]: the tenant, the window the
/// hold was taken in (a settle lands there even when the window has
/// ended since), the store's id for it, and the amount held. Not
/// `Clone`: a hold is settled exactly once.
#[derive(Debug, PartialEq, Eq)]
pub struct QuotaHold {
    tenant: Tenant,
    window: u64,
    id: u64,
    held: Ask,
    over: Option<QuotaRefusal>,
}

impl QuotaHold {
    /// A hold of `held` for `tenant` in window `window`, known to its
    /// store as `id`.
    pub fn new(tenant: Tenant, window: u64, id: u64, held: Ask) -> Self {
        QuotaHold {
            tenant,
            window,
            id,
            held,
            over: None,
        }
    }

    /// The same hold, taken in shadow mode although it passes a limit:
    /// `refusal` is what an enforcing store would have said.
    #[must_use]
    pub fn over_limit(mut self, refusal: QuotaRefusal) -> Self {
        self.over = Some(refusal);
        self
    }

    /// The tenant.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    /// The window the hold was taken in.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// The store's id for the hold.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The amount held.
    pub fn held(&self) -> Ask {
        self.held
    }

    /// In shadow mode, the refusal an enforcing store would have made.
    pub fn shadow_refusal(&self) -> Option<&QuotaRefusal> {
        self.over.as_ref()
    }
}

/// Why a store refused a hold: which limit, what is left of the window,
/// and when the window ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaRefusal {
    /// The limit that refused.
    pub exhausted: Exhausted,
    /// What is left of the tenant's window (spent and held subtracted).
    pub left: Ask,
    /// Time until the window ends and the quota is whole again.
    pub resets_in: Duration,
}

impl fmt::Display for QuotaRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.exhausted {
            Exhausted::Cost => write!(f, "{} dollars left", self.left.cost),
            Exhausted::Tokens => write!(f, "{} tokens left", self.left.tokens),
        }?;
        write!(
            f,
            " of the tenant's quota; it resets in {} s",
            self.resets_in.as_secs()
        )
    }
}

impl QuotaRefusal {
    /// The refusal `limits` make of `ask` after `used`, if any.
    pub fn of(limits: &Limits, used: Ask, ask: Ask, resets_in: Duration) -> Option<Self> {
        limits
            .refusal(used, ask)
            .map(|(exhausted, left)| QuotaRefusal {
                exhausted,
                left,
                resets_in,
            })
    }
}

/// What [`QuotaStore::reserve`] returns.
pub type Reserve = Pin<Box<dyn Future<Output = Result<QuotaHold, QuotaRefusal>> + Send>>;

/// Where tenants' quotas are counted: in this process ([`MemoryQuota`](crate::MemoryQuota))
/// or shared by every replica (`tower_llm_cost_redis::RedisQuota`).
///
/// The contract a store keeps (the cost layer relies on it):
///
/// - [`reserve`](Self::reserve) holds `ask` for `tenant` in the current
///   window if the tenant's spent and held amounts plus `ask` stay within
///   its [`Limits`]; otherwise it holds nothing and says why. In shadow
///   mode it always holds, marking a hold that passes a limit
///   ([`QuotaHold::over_limit`]).
/// - A reserve future dropped before it resolves leaves nothing held (a
///   store that may have reserved releases it).
/// - [`settle`](Self::settle) releases the hold and adds `spent` to the
///   tenant's spend in the hold's window. It never waits: a store that
///   must talk to a server does it in the background. Every hold is
///   settled exactly once.
/// - A hold nobody settles stops counting after the config's
///   [`hold_ttl`](QuotaConfig::hold_ttl).
pub trait QuotaStore: Send + Sync + fmt::Debug + 'static {
    /// Holds `ask` for `tenant`, or refuses.
    fn reserve(&self, tenant: &Tenant, ask: Ask) -> Reserve;

    /// Releases `hold` and counts `spent` (the attempt's real cost and
    /// tokens; at most what was held).
    fn settle(&self, hold: QuotaHold, spent: Ask);
}
