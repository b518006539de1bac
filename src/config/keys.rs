//! `breaker_key`: what a circuit is keyed by.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tower_llm_breaker::{BreakerKey, KeyFn};
use tower_llm_core::{Link, LlmRequest};

use super::{LinkConfig, Policy, ProviderKind};

/// One part of a circuit's key (`breaker_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyPart {
    /// The provider's `name`.
    Provider,
    /// The link's model.
    Model,
    /// The provider's credential: its `api_key_env` (Bedrock:
    /// `AWS_ACCESS_KEY_ID`).
    Credential,
    /// The provider's `region` (none for a provider without one).
    Region,
}

impl KeyPart {
    /// The default `breaker_key`: provider and model.
    pub fn default_key() -> Vec<KeyPart> {
        vec![KeyPart::Provider, KeyPart::Model]
    }
}

/// The breaker key function of a policy's route: the default
/// [`LinkKey`](tower_llm_breaker::LinkKey) (provider and model), or one
/// made from `breaker_key` for each of the route's links.
#[derive(Debug, Clone)]
pub struct PolicyKey {
    keys: Option<Arc<[LinkKeyEntry]>>,
}

/// A link (provider, model) and its circuit's key.
type LinkKeyEntry = (Arc<str>, Arc<str>, BreakerKey);

impl PolicyKey {
    fn of(&self, link: &Link) -> Option<&BreakerKey> {
        self.keys
            .as_deref()?
            .iter()
            .find_map(|(p, m, k)| (**p == *link.provider() && **m == *link.model()).then_some(k))
    }
}

impl<Req: LlmRequest> KeyFn<Req> for PolicyKey {
    fn key(&self, req: &Req, default: &Link) -> BreakerKey {
        let link = Link::of(req).unwrap_or(default);
        self.of(link)
            .cloned()
            .unwrap_or_else(|| BreakerKey::from_link(link))
    }

    fn with_key<R>(
        &self,
        req: &Req,
        default: &Link,
        f: impl FnOnce(tower_llm_breaker::KeyView<'_>) -> R,
    ) -> R {
        let link = Link::of(req).unwrap_or(default);
        match self.of(link) {
            Some(key) => f(key.view()),
            None => tower_llm_breaker::LinkKey.with_key(req, default, f),
        }
    }
}

impl Policy {
    /// The breaker key function for `chain` under `breaker_key`.
    pub fn breaker_key_fn(&self, chain: &[LinkConfig]) -> PolicyKey {
        if self.breaker_key == KeyPart::default_key() {
            return PolicyKey { keys: None };
        }
        let keys = chain
            .iter()
            .map(|link| {
                let provider = self.provider(&link.provider);
                let has = |part| self.breaker_key.contains(&part);
                let mut scope = Vec::new();
                if has(KeyPart::Credential) {
                    let credential = provider.and_then(|p| match p.kind {
                        ProviderKind::Bedrock => Some("AWS_ACCESS_KEY_ID"),
                        _ => p.api_key_env.as_deref(),
                    });
                    scope.push(format!("credential={}", credential.unwrap_or("")));
                }
                if has(KeyPart::Region) {
                    let region = provider.and_then(|p| p.region.as_deref());
                    scope.push(format!("region={}", region.unwrap_or("")));
                }
                let key = BreakerKey::new(
                    if has(KeyPart::Provider) {
                        link.provider.as_str()
                    } else {
                        "*"
                    },
                    if has(KeyPart::Model) {
                        link.model.as_str()
                    } else {
                        "*"
                    },
                );
                let key = if scope.is_empty() {
                    key
                } else {
                    key.with_scope(scope.join(","))
                };
                (
                    Arc::from(link.provider.as_str()),
                    Arc::from(link.model.as_str()),
                    key,
                )
            })
            .collect();
        PolicyKey { keys: Some(keys) }
    }
}
