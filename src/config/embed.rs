//! A route's embeddings stack: the same deadline, fallback, retry and
//! breaker as its chat stack, over its links' embeddings services.

use std::time::Duration;

use tower::ServiceBuilder;
use tower::util::BoxCloneSyncService;
use tower_llm_breaker::BreakerLayer;
use tower_llm_core::{EmbeddingRequest, Link, Metrics};
use tower_llm_deadline::DeadlineLayer;
use tower_llm_fallback::{FallbackLayer, LinkSpec};
use tower_llm_retry::{RetryConfig, RetryLayer};

use crate::ServiceBuilderExt;

use super::{ConfigError, EmbeddingService, LinkConfig, Policy, ProviderConfig, RouteConfig};

impl Policy {
    /// The embeddings stack of `route`, when every link it may call can
    /// embed: deadline → fallback along its chain (the model rewritten to
    /// each link's) → per link retry (its own attempts and attempt
    /// timeout) → breaker → the embeddings service `provider` gives for
    /// the link (`None`: the link's provider has no embeddings API).
    ///
    /// The route's deadline, retry, breaker and fallback settings are its
    /// chat stack's, and its circuits the same (the breaker keys are the
    /// links'): an embeddings failure counts against the link as a chat
    /// failure does. What only chat has is left out: hedging, pools,
    /// idempotency, prices and quotas, admission rules and the degraded
    /// answer.
    ///
    /// `Ok(None)` when a link has no embeddings service or is a pool: the
    /// route does not serve embeddings.
    ///
    /// ```
    /// use tower::ServiceExt;
    /// use tower_llm::breaker::BreakerLayer;
    /// use tower_llm::config::{EmbeddingService, Policy};
    /// use tower_llm::{EmbeddingRequest, EmbeddingResponse, Failure, Metrics};
    ///
    /// let policy = Policy::from_toml(r#"
    ///     [[providers]]
    ///     name = "a"
    ///     kind = "openai"
    ///     api_key_env = "A_KEY"
    ///
    ///     [[routes]]
    ///     model = "embed"
    ///     chain = [{ provider = "a", model = "text-embedding-3-small" }]
    /// "#).unwrap();
    /// let route = policy.route("embed").unwrap();
    /// let svc = policy
    ///     .build_embedding_route(route, &BreakerLayer::new(), Metrics::disabled(), |_p, link| {
    ///         let model = link.model.clone();
    ///         Some(EmbeddingService::new(tower::service_fn(move |req: EmbeddingRequest| {
    ///             let model = model.clone();
    ///             async move {
    ///                 assert_eq!(&*req.model, model);
    ///                 Ok::<_, Failure>(EmbeddingResponse {
    ///                     model,
    ///                     provider: "a".into(),
    ///                     embeddings: vec![vec![0.5; 4]; req.input.len()],
    ///                     prompt_tokens: 2,
    ///                     latency: std::time::Duration::ZERO,
    ///                     attempts: Vec::new(),
    ///                 })
    ///             }
    ///         })))
    ///     })
    ///     .unwrap()
    ///     .expect("every link can embed");
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let res = svc.oneshot(EmbeddingRequest::new("embed", vec!["hi".into()])).await.unwrap();
    /// assert_eq!(res.embeddings.len(), 1);
    /// assert_eq!(res.attempts.len(), 1);
    /// # });
    /// ```
    ///
    /// # Errors
    ///
    /// As [`build_route`](Self::build_route): an unknown provider (never
    /// for a validated policy) or a chain the fallback layer refuses.
    pub fn build_embedding_route(
        &self,
        route: &RouteConfig,
        breaker: &BreakerLayer,
        metrics: Metrics,
        mut provider: impl FnMut(&ProviderConfig, &LinkConfig) -> Option<EmbeddingService>,
    ) -> Result<Option<EmbeddingService>, ConfigError> {
        let r = self.resolve(route)?;
        if r.chain.iter().any(|l| self.pool(&l.provider).is_some()) {
            return Ok(None);
        }
        let min_attempt = r
            .retry
            .min_attempt_ms
            .unwrap_or_else(|| 1_000.min(r.total_ms / 4));
        let mut retry = RetryLayer::new()
            .with_config(&RetryConfig {
                min_attempt_ms: Some(min_attempt),
                ..r.retry
            })
            .map_err(|e| ConfigError::new(format!("route \"{}\": retry: {e}", route.model)))?;
        if let Some(failures) = r.retry_failures {
            retry = retry.with_failure_policy(failures);
        }
        let breaker = breaker
            .clone()
            .with_config(r.breaker)
            .map_err(|e| ConfigError::new(format!("route \"{}\": {e}", route.model)))?
            .with_key_fn(self.breaker_key_fn(&r.chain));
        let mut links = Vec::with_capacity(r.chain.len());
        for link in &r.chain {
            let config = self.provider(&link.provider).ok_or_else(|| {
                ConfigError::new(format!("unknown provider \"{}\"", link.provider))
            })?;
            let Some(svc) = provider(config, link) else {
                return Ok(None);
            };
            let mut link_retry = retry.clone();
            if let Some(n) = link.max_attempts {
                link_retry = link_retry.with_max_attempts(n);
            }
            if let Some(ms) = link.attempt_timeout_ms {
                link_retry = link_retry.with_attempt_timeout(Duration::from_millis(ms));
            }
            let svc: EmbeddingService = BoxCloneSyncService::new(
                ServiceBuilder::new()
                    .llm_retry(link_retry)
                    .llm_breaker(breaker.clone())
                    .service(svc),
            );
            let spec = LinkSpec::new(link.provider.as_str(), link.model.as_str()).with_rewrite(
                |req: &mut EmbeddingRequest, link: &Link| {
                    if *req.model != *link.model() {
                        req.model = link.model_arc().clone();
                    }
                },
            );
            links.push((spec, svc));
        }
        let mut links = links.into_iter();
        let Some((primary_spec, primary)) = links.next() else {
            return Err(ConfigError::new(format!(
                "route \"{}\" has an empty chain",
                route.model
            )));
        };
        let mut chain = FallbackLayer::builder(primary_spec);
        for (spec, svc) in links {
            chain = chain.or(spec, svc);
        }
        if let Some(failures) = r.fallback_failures {
            chain = chain.with_failure_policy(failures);
        }
        let fallback = chain
            .build()
            .map_err(|e| ConfigError::new(format!("route \"{}\": {e}", route.model)))?;
        let deadline =
            DeadlineLayer::new(Duration::from_millis(r.total_ms)).with_metrics(metrics.clone());
        Ok(Some(BoxCloneSyncService::new(
            ServiceBuilder::new()
                .layer(deadline)
                .llm_fallback(fallback)
                .service(primary),
        )))
    }
}
