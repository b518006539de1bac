//! Scripted providers and a composed chain, shared by the fallback tests.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, service_fn};
use tower_llm_breaker::BreakerLayer;
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Message, Usage};
use tower_llm_deadline::DeadlineLayer;
use tower_llm_fallback::{FallbackLayer, LinkSpec};
use tower_llm_retry::{FixedFraction, RetryLayer};

pub type Svc = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

/// One scripted answer: after `delay`, succeed or fail with a status.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub delay: Duration,
    pub status: u16,
    pub retry_after: Option<u64>,
}

pub const fn now(status: u16) -> Step {
    Step {
        delay: Duration::ZERO,
        status,
        retry_after: None,
    }
}

/// A scripted provider: plays its steps in order (the last repeats) and
/// records when each call started.
#[derive(Clone)]
pub struct Provider {
    pub name: &'static str,
    steps: Arc<Mutex<VecDeque<Step>>>,
    calls: Arc<Mutex<Vec<Instant>>>,
}

impl Provider {
    pub fn new(name: &'static str, steps: &[Step]) -> Self {
        Provider {
            name,
            steps: Arc::new(Mutex::new(steps.iter().copied().collect())),
            calls: Arc::default(),
        }
    }

    pub fn calls(&self) -> usize {
        self.calls.lock().expect("lock").len()
    }

    pub fn call_times(&self) -> Vec<Instant> {
        self.calls.lock().expect("lock").clone()
    }

    pub fn service(&self) -> Svc {
        let p = self.clone();
        BoxCloneSyncService::new(service_fn(move |req: ChatRequest| {
            p.calls.lock().expect("lock").push(Instant::now());
            let step = {
                let mut steps = p.steps.lock().expect("lock");
                if steps.len() > 1 {
                    steps.pop_front().expect("step")
                } else {
                    *steps.front().expect("step")
                }
            };
            let name = p.name;
            async move {
                tokio::time::sleep(step.delay).await;
                let status = StatusCode::from_u16(step.status).expect("status");
                let class = match step.status {
                    200 => {
                        return Ok(ChatResponse {
                            id: "id".into(),
                            model: req.model.to_string(),
                            provider: name.into(),
                            fallback_position: 0,
                            degraded: false,
                            idempotent_replayed: false,
                            cache: None,
                            choices: vec![],
                            usage: Usage::default(),
                            latency: Duration::ZERO,
                            attempts: vec![],
                        });
                    }
                    400 => FailureClass::BadRequest,
                    401 | 403 => FailureClass::Auth,
                    404 => FailureClass::NotFound,
                    413 => FailureClass::ContextWindowExceeded,
                    429 => FailureClass::RateLimited,
                    _ => FailureClass::Transient,
                };
                let mut f = Failure::new(class).with_status(status);
                if let Some(s) = step.retry_after {
                    f = f.with_retry_after(Duration::from_secs(s));
                }
                Err(f)
            }
        }))
    }

    /// retry (3 attempts, fixed jitter) → breaker → this provider.
    pub fn link(&self, breaker: &BreakerLayer) -> Svc {
        BoxCloneSyncService::new(
            ServiceBuilder::new()
                .layer(RetryLayer::new().with_rng(FixedFraction(0.5)))
                .layer(breaker.clone())
                .service(self.service()),
        )
    }
}

pub fn req() -> ChatRequest {
    ChatRequest::new("alias", vec![Message::user("hi")])
}

/// deadline → fallback(primary, alternates...) with retry → breaker per link.
pub fn chain(
    deadline: Duration,
    primary: &Provider,
    alternates: &[&Provider],
) -> (Svc, BreakerLayer) {
    let breaker = BreakerLayer::new();
    let mut builder = FallbackLayer::builder(
        LinkSpec::new(primary.name, format!("{}-model", primary.name)).rewrite_model(),
    );
    for p in alternates {
        builder = builder.or(
            LinkSpec::new(p.name, format!("{}-model", p.name)).rewrite_model(),
            p.link(&breaker),
        );
    }
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(deadline))
        .layer(builder.build().expect("valid chain"))
        .service(primary.link(&breaker));
    (BoxCloneSyncService::new(svc), breaker)
}
