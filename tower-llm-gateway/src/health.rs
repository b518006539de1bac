//! Background health probes of the providers.

use std::time::Duration;

use bytes::Bytes;
use std::sync::PoisonError;
use tower::ServiceExt;
use tower_llm::providers::RequestBody;

use crate::Gateway;

/// The result of the last background probe of a provider.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Probe {
    /// `true` for a 2xx answer.
    pub ok: bool,
    /// The HTTP status, if an answer came.
    pub status: Option<u16>,
    /// Round-trip time.
    pub latency_ms: u64,
    /// The error, if no answer came.
    pub error: Option<String>,
}

impl Gateway {
    /// Probes every provider with a `health_url` once; results at
    /// `GET /health/providers`.
    pub async fn probe_once(&self) {
        let providers = self.routes.load().policy.providers.clone();
        for provider in providers {
            let Some(url) = provider.health_url.clone() else {
                continue;
            };
            let started = tokio::time::Instant::now();
            let req = http::Request::get(&url).body(RequestBody::new(Bytes::new()));
            let probe = match req {
                Err(e) => Probe {
                    ok: false,
                    status: None,
                    latency_ms: 0,
                    error: Some(e.to_string()),
                },
                Ok(req) => {
                    let answer = tokio::time::timeout(
                        Duration::from_secs(5),
                        self.transport.clone().oneshot(req),
                    )
                    .await;
                    let latency_ms =
                        u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
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
                            error: Some("timed out after 5 s".into()),
                        },
                    }
                }
            };
            self.probes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(provider.name, probe);
        }
    }
}
