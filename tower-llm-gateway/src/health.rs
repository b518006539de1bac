//! Background health probes of the providers: each provider with a
//! `health_url` is probed with a `GET`, all at once, each within
//! `[health] probe_timeout_ms`; the results feed `GET /health/providers`
//! and the `provider_up` gauge.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tower::ServiceExt;
use tower_llm::providers::RequestBody;

use crate::Gateway;
use crate::state::Probe;
use crate::transport::Transport;

impl Gateway {
    /// Probes every provider with a `health_url` once, concurrently, each
    /// within `[health] probe_timeout_ms` (a probe that takes longer is
    /// down); results at `GET /health/providers` and in the `provider_up`
    /// gauge. Returns when every probe has ended.
    pub async fn probe_once(&self) {
        let routes = self.routes.load_full();
        let policy = &routes.policy;
        let limit = Duration::from_millis(routes.settings.health.probe_timeout_ms);
        let mut probes = tokio::task::JoinSet::new();
        for provider in policy.providers.iter().cloned() {
            let Some(url) = provider.health_url.clone() else {
                continue;
            };
            let transport = self.transport.clone();
            probes.spawn(async move { (provider.name, probe(transport, url, limit).await) });
        }
        while let Some(done) = probes.join_next().await {
            if let Ok((name, probe)) = done {
                self.probes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(name, probe);
            }
        }
    }

    /// The last probe of each provider, by name.
    pub fn probes(&self) -> std::collections::HashMap<String, Probe> {
        self.probes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// One probe of `url`.
async fn probe(transport: Transport, url: String, limit: Duration) -> Probe {
    let started = tokio::time::Instant::now();
    let req = match http::Request::get(&url).body(RequestBody::new(Bytes::new())) {
        Ok(req) => req,
        Err(e) => {
            return Probe {
                ok: false,
                status: None,
                latency_ms: 0,
                error: Some(e.to_string()),
            };
        }
    };
    let answer = tokio::time::timeout(limit, transport.oneshot(req)).await;
    let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match answer {
        Ok(Ok(res)) => Probe {
            ok: res.status().is_success(),
            status: Some(res.status().as_u16()),
            latency_ms,
            error: None,
        },
        Ok(Err(e)) => Probe {
            ok: false,
            status: None,
            latency_ms,
            error: Some(e.to_string()),
        },
        Err(_) => Probe {
            ok: false,
            status: None,
            latency_ms,
            error: Some(format!("timed out after {} ms", limit.as_millis())),
        },
    }
}

/// Probes the providers every `[health] probe_interval_ms` of the running
/// policy, read again after each round (so a reload changes it; 0 pauses
/// the probes and the interval is read again a second later). Never ends:
/// spawn it.
pub async fn probe_loop(gateway: Arc<Gateway>) {
    loop {
        let every = gateway.routes.load().settings.health.probe_interval_ms;
        if every == 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let started = tokio::time::Instant::now();
        gateway.probe_once().await;
        tokio::time::sleep_until(started + Duration::from_millis(every)).await;
    }
}
