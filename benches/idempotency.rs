//! The idempotency layer's cost, side by side with the bare service in one
//! run, on a typed `ChatRequest` (20 messages) against a service that
//! answers at once:
//!
//! - no key: the layer must be free when unused (target ≤ 50 ns);
//! - a key seen for the first time (a miss: fingerprint, reserve, store);
//! - a key already stored (a hit: fingerprint, replay a copy).
//!
//! ```text
//! cargo bench --bench idempotency
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use tower::{Service, ServiceBuilder, service_fn};
use tower_llm::idempotency::{IdempotencyConfig, IdempotencyLayer};
use tower_llm::{ChatRequest, ChatResponse, Failure, IdempotencyKey, Message, Metrics};

mod support;
use support::{current_thread, paired_typed as paired};

fn answer() -> ChatResponse {
    ChatResponse {
        id: "1".into(),
        model: "m".into(),
        provider: "mock".into(),
        ..ChatResponse::default()
    }
}

fn bare() -> impl Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone {
    service_fn(|_req: ChatRequest| std::future::ready(Ok::<_, Failure>(answer())))
}

fn layered() -> impl Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone {
    ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(IdempotencyConfig::default())
                .expect("valid")
                .with_metrics(Metrics::disabled()),
        )
        .service(bare())
}

fn main() {
    let rt = current_thread();
    let _guard = rt.enter();
    let messages: Vec<_> = (0..20)
        .map(|i| Message::user(format!("question {i}: what does idempotency buy?")))
        .collect();
    let base = ChatRequest::new("gpt-4o", messages);
    let plain = {
        let base = base.clone();
        move || base.clone()
    };
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let miss = {
        let base = base.clone();
        move || {
            let mut req = base.clone();
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            IdempotencyKey::new(format!("key-{n}")).store(&mut req);
            req
        }
    };
    let hit = {
        let base = base.clone();
        move || {
            let mut req = base.clone();
            IdempotencyKey::new("the-same-key").store(&mut req);
            req
        }
    };
    println!("per call, paired medians against the bare service in the same rounds:");
    for (name, mut make) in [
        (
            "no key",
            Box::new(plain.clone()) as Box<dyn FnMut() -> ChatRequest>,
        ),
        ("a new key (miss: reserve, call, store)", Box::new(miss)),
        ("a stored key (hit: replay)", Box::new(hit)),
    ] {
        let mut bare_svc = bare();
        let mut ours = layered();
        let mut plain = plain.clone();
        let (b, v) = paired(&mut bare_svc, &mut plain, &mut ours, &mut make);
        println!(
            "  {name:<42} {v:>8.0} ns  (bare {b:.0} ns, +{:.0} ns)",
            v - b
        );
    }
}
