//! Checking a whole policy at load.

use std::collections::HashSet;

use tower_llm_hedge::HedgeConfig;

use super::{AdmitRule, ConfigError, HedgeTarget, Policy, ProviderKind};

impl Policy {
    /// Checks everything a policy promises: timeouts non-zero and in
    /// order, attempts within the cap, a valid backoff, unique provider
    /// and route names, chains that are non-empty, name known providers
    /// and repeat no link.
    ///
    /// # Errors
    ///
    /// Every problem found, not just the first.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Vec::new();
        if let Err(e) = self.deadline.validate() {
            p.push(format!("deadline.{e}"));
        }
        let r = &self.retry;
        if let Err(e) = r.validate() {
            p.extend(e.problems().iter().map(|e| format!("retry.{e}")));
        }
        // Only values written in the file are checked against each other:
        // an unset key's default always fits (see `RetryConfig`).
        if let (Some(attempt), Some(total)) = (r.attempt_timeout_ms, self.deadline.total_ms) {
            if attempt > 0 && total > 0 && attempt > total {
                p.push(format!(
                    "retry.attempt_timeout_ms ({attempt}) is longer than deadline.total_ms ({total})"
                ));
            }
        }
        if let (Some(min), Some(total)) = (r.min_attempt_ms, self.deadline.total_ms) {
            if min >= total {
                p.push(format!(
                    "retry.min_attempt_ms ({min}) leaves no room for a retry within deadline.total_ms ({total})"
                ));
            }
        }
        if let Err(e) = self.breaker.validate() {
            p.push(format!("breaker.{e}"));
        }
        if let Err(e) = self.stream.validate() {
            p.push(format!("stream.{e}"));
        }
        let mut names = HashSet::new();
        if let Some(Err(e)) = self.cache.as_ref().map(|c| c.validate()) {
            p.push(format!("cache: {e}"));
        }
        if let Some(Err(e)) = self.complete.as_ref().map(|c| c.validate()) {
            p.push(format!("complete: {e}"));
        }
        for provider in &self.providers {
            if let Some(Err(e)) = provider.silence.as_ref().map(|g| g.validate()) {
                p.push(format!("provider \"{}\": silence: {e}", provider.name));
            }
            if provider.name.is_empty() {
                p.push("a provider has an empty name".to_owned());
            }
            if !names.insert(provider.name.as_str()) {
                p.push(format!("duplicate provider \"{}\"", provider.name));
            }
            for (key, value) in [
                ("connect_timeout_ms", provider.connect_timeout_ms),
                ("first_token_timeout_ms", provider.first_token_timeout_ms),
                ("idle_timeout_ms", provider.idle_timeout_ms),
            ] {
                if value == Some(0) {
                    p.push(format!(
                        "provider \"{}\": {key} must be above 0",
                        provider.name
                    ));
                }
            }
            if provider.burst_ms.is_some_and(|b| b == 0 || b > 60_000) {
                p.push(format!(
                    "provider \"{}\": burst_ms must be 1 to 60000 (a minute's worth at most)",
                    provider.name
                ));
            }
            if provider.rpm == Some(0) || provider.tpm == Some(0) {
                p.push(format!(
                    "provider \"{}\": rpm and tpm must be above 0 (leave them out for no limit)",
                    provider.name
                ));
            }
            if provider.max_concurrency == Some(0) {
                p.push(format!(
                    "provider \"{}\": max_concurrency must be above 0",
                    provider.name
                ));
            }
            for (key, url) in [
                ("base_url", &provider.base_url),
                ("health_url", &provider.health_url),
            ] {
                if let Some(url) = url {
                    if !is_http_url(url) {
                        p.push(format!(
                            "provider \"{}\": {key} {url:?} is not an http(s) URL",
                            provider.name
                        ));
                    }
                }
            }
            if provider.kind == ProviderKind::Azure && provider.base_url.is_none() {
                p.push(format!(
                    "provider \"{}\": base_url (the resource's endpoint, https://NAME.openai.azure.com) is required for azure",
                    provider.name
                ));
            }
            if provider.api_version.is_some() && provider.kind != ProviderKind::Azure {
                p.push(format!(
                    "provider \"{}\": api_version is for azure only",
                    provider.name
                ));
            }
            if provider.kind != ProviderKind::Bedrock && provider.api_key_env.is_none() {
                p.push(format!(
                    "provider \"{}\": api_key_env is required for {:?}",
                    provider.name, provider.kind
                ));
            }
        }
        // A policy without routes answers every model with 404: refused, so
        // that an empty or truncated file never replaces a working one.
        if self.routes.is_empty() {
            p.push("the policy has no routes ([[routes]])".to_owned());
        }
        if self.breaker_key.is_empty() {
            p.push("breaker_key is empty (a circuit needs a key)".to_owned());
        }
        let mut parts = HashSet::new();
        for part in &self.breaker_key {
            if !parts.insert(part) {
                p.push(format!("breaker_key names {part:?} twice"));
            }
        }
        let mut seen = HashSet::new();
        for op in &self.retry_policies {
            if !seen.insert(op.operation.as_str()) {
                p.push(format!("duplicate retry policy \"{}\"", op.operation));
            }
        }
        let mut seen = HashSet::new();
        for doc in &self.fallback_policies {
            if !seen.insert(doc.fallback_id.as_str()) {
                p.push(format!("duplicate fallback policy \"{}\"", doc.fallback_id));
            }
        }
        for (name, breaker) in &self.breaker_policies {
            if let Err(e) = breaker.validate() {
                p.push(format!("breaker_policies.{name}.{e}"));
            }
        }
        if let Some(idempotency) = &self.idempotency {
            if let Err(e) = idempotency.validate() {
                p.push(format!("idempotency: {e}"));
            }
        }
        let mut routes = HashSet::new();
        for route in &self.routes {
            if !routes.insert(route.model.as_str()) {
                p.push(format!("duplicate route \"{}\"", route.model));
            }
            if route.chain.is_empty() {
                p.push(format!("route \"{}\" has an empty chain", route.model));
            }
            if route.health_ordering_ms == Some(0) {
                p.push(format!(
                    "route \"{}\": health_ordering_ms must be above 0",
                    route.model
                ));
            }
            if route.deadline_ms == Some(0) {
                p.push(format!(
                    "route \"{}\": deadline_ms must be above 0",
                    route.model
                ));
            }
            if let Some(Err(e)) = route.cache.as_ref().map(|c| c.validate()) {
                p.push(format!("route \"{}\": cache: {e}", route.model));
            }
            if let Some(Err(e)) = route.resume.as_ref().map(|c| c.validate()) {
                p.push(format!("route \"{}\": resume: {e}", route.model));
            }
            if let Some(Err(e)) = route.complete.as_ref().map(|c| c.validate()) {
                p.push(format!("route \"{}\": complete: {e}", route.model));
            }
            if let Some(Err(e)) = route.hedge.as_ref().map(HedgeConfig::validate) {
                p.push(format!("route \"{}\": hedge: {e}", route.model));
            }
            if route.hedge_to.is_some() && route.hedge.is_none() {
                let hedged_link = route.chain.iter().any(|l| l.hedge.is_some());
                if !hedged_link {
                    p.push(format!(
                        "route \"{}\": hedge_to needs a hedge (on the route or a link)",
                        route.model
                    ));
                }
            }
            if let Some(rule) = &route.degraded_admit {
                check_rule(
                    rule,
                    &format!("route \"{}\": degraded_admit", route.model),
                    &mut p,
                );
            }
            let resolved = match self.resolve(route) {
                Ok(r) => r,
                Err(e) => {
                    p.extend(e.problems().iter().map(ToString::to_string));
                    continue;
                }
            };
            if route.retry_policy.is_some() {
                if let Err(e) = resolved.retry.validate() {
                    p.extend(
                        e.problems()
                            .iter()
                            .map(|e| format!("route \"{}\": retry policy: {e}", route.model)),
                    );
                }
            }
            let mut links = HashSet::new();
            let last = resolved.chain.len().saturating_sub(1);
            for (i, link) in resolved.chain.iter().enumerate() {
                let at = format!(
                    "route \"{}\": link {}/{}",
                    route.model, link.provider, link.model
                );
                if let Some(n) = link.max_attempts {
                    if n == 0 || usize::from(n) > tower_llm_core::MAX_ATTEMPTS_PER_CALL {
                        p.push(format!(
                            "{at}: max_attempts must be 1 to {}, not {n}",
                            tower_llm_core::MAX_ATTEMPTS_PER_CALL
                        ));
                    }
                }
                match link.attempt_timeout_ms {
                    Some(0) => p.push(format!("{at}: attempt_timeout_ms must be above 0")),
                    Some(attempt) if resolved.deadline_written && attempt > resolved.total_ms => {
                        p.push(format!(
                            "{at}: attempt_timeout_ms ({attempt}) is longer than the route's deadline ({})",
                            resolved.total_ms
                        ));
                    }
                    _ => {}
                }
                for (key, value) in [
                    ("connect_timeout_ms", link.connect_timeout_ms),
                    ("first_token_timeout_ms", link.first_token_timeout_ms),
                    ("idle_timeout_ms", link.idle_timeout_ms),
                ] {
                    if value == Some(0) {
                        p.push(format!("{at}: {key} must be above 0"));
                    }
                }
                if let Some(rule) = &link.admit {
                    check_rule(rule, &format!("{at}: admit"), &mut p);
                }
                if let Some(Err(e)) = link.hedge.as_ref().map(HedgeConfig::validate) {
                    p.push(format!("{at}: hedge: {e}"));
                }
                let hedged = link.hedge.is_some() || route.hedge.is_some();
                match (&link.hedge_to, hedged) {
                    (Some(_), false) => p.push(format!(
                        "{at}: hedge_to needs a hedge (on the link or its route)"
                    )),
                    (Some(HedgeTarget::Next), true) if i == last => p.push(format!(
                        "{at}: hedge_to = \"next\" on the last link (no link follows it)"
                    )),
                    _ => {}
                }
                if let Some(HedgeTarget::Link { provider, model }) =
                    link.hedge_to.as_ref().or(route.hedge_to.as_ref())
                {
                    if !names.contains(provider.as_str()) {
                        p.push(format!("{at}: hedge_to: unknown provider \"{provider}\""));
                    }
                    if model.is_empty() {
                        p.push(format!("{at}: hedge_to: the model is empty"));
                    }
                }
                if !names.contains(link.provider.as_str()) && self.pool(&link.provider).is_none() {
                    p.push(format!(
                        "route \"{}\": unknown provider \"{}\"",
                        route.model, link.provider
                    ));
                }
                if !links.insert((link.provider.as_str(), link.model.as_str())) {
                    p.push(format!(
                        "route \"{}\": duplicate link {}/{}",
                        route.model, link.provider, link.model
                    ));
                }
            }
            self.check_costs(route, &resolved, &mut p);
        }
        self.check_pools(&names, &mut p);
        for (provider, models) in &self.prices {
            if !names.contains(provider.as_str()) && self.pool(provider).is_none() {
                p.push(format!(
                    "prices.{provider}: unknown provider \"{provider}\""
                ));
            }
            if models.keys().any(String::is_empty) {
                p.push(format!("prices.{provider}: a model name is empty"));
            }
        }
        if let Some(Err(e)) = self
            .quotas
            .as_ref()
            .map(tower_llm_cost::QuotaConfig::validate)
        {
            p.push(format!("quotas.{e}"));
        }
        ConfigError::check(p)
    }

    /// `true` when every link `route` may call (its chain and hedge
    /// targets) is priced and it has an output cap: a call on it can be
    /// held to a budget (a caller's `x-llm-max-cost`).
    pub fn holds_budgets(
        &self,
        route: &super::RouteConfig,
        resolved: &super::ResolvedRoute,
    ) -> bool {
        route.max_output_tokens.is_some()
            && called_links(route, resolved)
                .into_iter()
                .all(|(p, m)| self.price(p, m).is_some())
    }

    /// A route held to a budget (its `max_total_cost`) or to `[quotas]`
    /// needs every link it may call priced and an output cap.
    fn check_costs(
        &self,
        route: &super::RouteConfig,
        resolved: &super::ResolvedRoute,
        p: &mut Vec<String>,
    ) {
        let at = format!("route \"{}\"", route.model);
        if route.max_total_cost == Some(tower_llm_core::Cost::ZERO) {
            p.push(format!(
                "{at}: max_total_cost = 0 would refuse every call (leave it out for no limit)"
            ));
        }
        if route.max_output_tokens == Some(0) {
            p.push(format!("{at}: max_output_tokens must be above 0"));
        }
        let why = match (resolved.max_total_cost.is_some(), self.quotas.is_some()) {
            (true, _) => "max_total_cost",
            (false, true) => "[quotas]",
            (false, false) => return,
        };
        if route.max_output_tokens.is_none() {
            p.push(format!(
                "{at}: {why} needs max_output_tokens (the most output one attempt may hold)"
            ));
        }
        let called = called_links(route, resolved);
        for (provider, model) in called {
            if self.price(provider, model).is_none() {
                p.push(format!(
                    "{at}: {why} needs every link priced: add [prices.{provider}.\"{model}\"]"
                ));
            }
        }
    }
}

/// Checks an admission rule.
/// The links a route may call: its chain and its links' hedge targets.
fn called_links<'a>(
    route: &'a super::RouteConfig,
    resolved: &'a super::ResolvedRoute,
) -> std::collections::BTreeSet<(&'a str, &'a str)> {
    let mut called: std::collections::BTreeSet<(&str, &str)> = resolved
        .chain
        .iter()
        .map(|l| (l.provider.as_str(), l.model.as_str()))
        .collect();
    for link in &resolved.chain {
        if let Some(HedgeTarget::Link { provider, model }) =
            link.hedge_to.as_ref().or(route.hedge_to.as_ref())
        {
            called.insert((provider.as_str(), model.as_str()));
        }
    }
    called
}

fn check_rule(rule: &AdmitRule, at: &str, p: &mut Vec<String>) {
    if http::HeaderName::from_bytes(rule.header.as_bytes()).is_err() {
        p.push(format!(
            "{at}.header {:?} is not a header name",
            rule.header
        ));
    }
    if rule.any_of.is_empty() {
        p.push(format!("{at}.any_of is empty (no request could pass)"));
    }
}

/// `true` for an absolute `http://` or `https://` URL that `http` accepts.
fn is_http_url(url: &str) -> bool {
    url.parse::<http::Uri>()
        .is_ok_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some())
}
