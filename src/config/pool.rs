//! `[[pools]]`: one model spread over several providers' deployments, and
//! the pacers of the providers in them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use tower_llm_pool::{DeploymentLoad, PaceLimits, Pacer, PoolStatus, SharedPacing};

use super::{LinkConfig, Policy, ProviderConfig};

/// One `[[pools]]` entry: deployments of one model (each a provider of
/// `[[providers]]`: its own key, region or endpoint) that chains name as
/// if it were a provider.
///
/// ```
/// use tower_llm::config::Policy;
///
/// let policy = Policy::from_toml(r#"
///     [[providers]]
///     name = "oai-east"
///     kind = "openai"
///     api_key_env = "EAST_KEY"
///     rpm = 60
///     tpm = 40000
///
///     [[providers]]
///     name = "oai-west"
///     kind = "openai"
///     api_key_env = "WEST_KEY"
///
///     [[pools]]
///     name = "gpt4o"
///     deployments = [{ provider = "oai-east", weight = 2 }, { provider = "oai-west" }]
///
///     [[routes]]
///     model = "smart"
///     chain = [{ provider = "gpt4o", model = "gpt-4o" }]
/// "#).unwrap();
/// assert_eq!(policy.pool("gpt4o").unwrap().deployments.len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// `name`: what chains give as a link's `provider`; not a provider's
    /// name.
    pub name: String,
    /// `deployments`: the providers that serve the pool's model.
    pub deployments: Vec<DeploymentConfig>,
    /// `affinity_header`: requests with the same value of this header go
    /// to the same deployment while it can take them (a provider's prompt
    /// cache stays warm); default: none, every call is chosen by load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_header: Option<String>,
    /// `max_waiting`: when no deployment has room under its limits, at
    /// most this many calls wait for the soonest room (default 256); the
    /// others fail at once (rate limited) and fail over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting: Option<usize>,
    /// `max_wait_ms`: the longest a call waits for room (default 60,000;
    /// never past its deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
    /// `priority_header`: a request whose value of this header is `low`
    /// is background work: it never waits for room, so it is shed first
    /// (default: none, every call may wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_header: Option<String>,
    /// `adaptive_concurrency`: each deployment takes at most as many calls
    /// at once as an adaptive limit (AIMD: its own 429s, 5xx and overloads
    /// cut it by 30 %, successes raise it by one per limit's worth) that
    /// starts at, and never passes, this (default: none, off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_concurrency: Option<u32>,
}

/// One deployment of a `[[pools]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentConfig {
    /// `provider`: a provider's `name`.
    pub provider: String,
    /// `model`: the model id this deployment knows the link's model by (an
    /// Azure deployment name; default: the link's `model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `weight`: chosen this many times as often as a deployment of
    /// weight 1 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

impl Policy {
    /// The pool named `name`, if any.
    pub fn pool(&self, name: &str) -> Option<&PoolConfig> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// The links a link stands for: its pool's deployments (each with the
    /// deployment's provider and model), or the link itself.
    pub fn deployments_of(&self, link: &LinkConfig) -> Vec<LinkConfig> {
        match self.pool(&link.provider) {
            None => vec![link.clone()],
            Some(pool) => pool
                .deployments
                .iter()
                .map(|d| LinkConfig {
                    provider: d.provider.clone(),
                    model: d.model.clone().unwrap_or_else(|| link.model.clone()),
                    ..link.clone()
                })
                .collect(),
        }
    }

    pub(super) fn check_pools(&self, names: &std::collections::HashSet<&str>, p: &mut Vec<String>) {
        let mut seen = std::collections::HashSet::new();
        for pool in &self.pools {
            let at = format!("pool \"{}\"", pool.name);
            if pool.name.is_empty() {
                p.push("a pool has an empty name".to_owned());
            }
            if !seen.insert(pool.name.as_str()) {
                p.push(format!("duplicate {at}"));
            }
            if names.contains(pool.name.as_str()) {
                p.push(format!("{at}: a provider has the same name"));
            }
            if pool.deployments.is_empty() {
                p.push(format!("{at}: deployments is empty"));
            }
            if pool.deployments.len() > tower_llm_pool::MAX_DEPLOYMENTS {
                p.push(format!(
                    "{at}: {} deployments; at most {}",
                    pool.deployments.len(),
                    tower_llm_pool::MAX_DEPLOYMENTS
                ));
            }
            let mut providers = std::collections::HashSet::new();
            for d in &pool.deployments {
                if !names.contains(d.provider.as_str()) {
                    p.push(format!("{at}: unknown provider \"{}\"", d.provider));
                }
                if !providers.insert((d.provider.as_str(), d.model.as_deref())) {
                    p.push(format!("{at}: deployment {} twice", d.provider));
                }
                if d.weight == Some(0) {
                    p.push(format!(
                        "{at}: deployment {}: weight must be at least 1",
                        d.provider
                    ));
                }
                if d.model.as_deref() == Some("") {
                    p.push(format!(
                        "{at}: deployment {}: the model is empty",
                        d.provider
                    ));
                }
            }
            for (key, header) in [
                ("affinity_header", &pool.affinity_header),
                ("priority_header", &pool.priority_header),
            ] {
                if let Some(h) = header {
                    if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                        p.push(format!("{at}: {key} {h:?} is not a header name"));
                    }
                }
            }
            if pool.adaptive_concurrency == Some(0) {
                p.push(format!("{at}: adaptive_concurrency must be at least 1"));
            }
            if pool.max_wait_ms == Some(0) {
                p.push(format!(
                    "{at}: max_wait_ms must be above 0 (max_waiting = 0 waits never)"
                ));
            }
        }
    }
}

impl ProviderConfig {
    /// This provider's configured limits (`rpm`, `tpm`).
    pub fn pace_limits(&self) -> PaceLimits {
        PaceLimits {
            rpm: self.rpm,
            tpm: self.tpm,
            burst_ms: self.burst_ms,
        }
    }
}

/// What a policy's pools share across builds: the pacers of their
/// providers, one per provider (by name), kept across builds and reloads
/// while the provider's limits are unchanged (what a pacer has learned
/// from a provider's rate-limit headers stays), and each pool's status
/// handle as last built (for a status page). Cloning shares them.
#[derive(Clone, Default)]
pub struct Pools {
    inner: Arc<Mutex<Kept>>,
    /// Where the fleet's buckets are, when shared across replicas.
    shared: Arc<Mutex<Option<Arc<dyn SharedPacing>>>>,
    loads: Arc<Mutex<HashMap<String, Arc<DeploymentLoad>>>>,
    built: Arc<Mutex<std::collections::BTreeMap<String, PoolStatus>>>,
}

/// Each provider's pacer, with the limits it was made for.
type Kept = HashMap<String, (PaceLimits, Arc<Pacer>)>;

impl fmt::Debug for Pools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pools")
            .field("providers", &self.lock().len())
            .finish()
    }
}

impl Pools {
    /// No pacers yet.
    pub fn new() -> Self {
        Pools::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pacer of `provider`, made (or remade, when its limits
    /// changed) now if needed; paced with the fleet's buckets too when
    /// they are [shared](Self::share) (by the provider's name: every
    /// replica must give a provider the same limits).
    pub fn of(&self, provider: &ProviderConfig) -> Arc<Pacer> {
        let limits = provider.pace_limits();
        let shared = self
            .shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut kept = self.lock();
        match kept.get(&provider.name) {
            Some((l, pacer)) if *l == limits => pacer.clone(),
            _ => {
                let mut pacer = Pacer::new(limits);
                if let Some(store) = shared {
                    pacer = pacer.with_shared(store, provider.name.as_str());
                }
                let pacer = Arc::new(pacer);
                kept.insert(provider.name.clone(), (limits, pacer.clone()));
                pacer
            }
        }
    }

    /// Paces every provider with the fleet's buckets in `store` too (or,
    /// `None`, per replica only): pacers made before are made again.
    pub fn share(&self, store: Option<Arc<dyn SharedPacing>>) {
        *self.shared.lock().unwrap_or_else(PoisonError::into_inner) = store;
        self.lock().clear();
    }

    /// The load of the provider named `name` as a deployment (one per
    /// provider, shared by every pool and stack that sends to it).
    pub fn load_of(&self, name: &str) -> Arc<DeploymentLoad> {
        self.loads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// The pacer of the provider named `name`, if one was made.
    pub fn get(&self, name: &str) -> Option<Arc<Pacer>> {
        self.lock().get(name).map(|(_, p)| p.clone())
    }

    /// Notes the status handle of pool `name` as built last.
    pub fn built(&self, name: &str, status: PoolStatus) {
        self.built
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned(), status);
    }

    /// Each pool's status handle, by name, as built last.
    pub fn statuses(&self) -> Vec<(String, PoolStatus)> {
        self.built
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect()
    }
}
