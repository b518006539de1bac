//! The response cache's cost, side by side with the bare service in one
//! run, on a typed `ChatRequest` (20 messages) against a service that
//! answers at once:
//!
//! - a hit: fingerprint, key, look up, rebuild the answer (what a cached
//!   call costs instead of a provider call);
//! - a miss: the same, then the provider and a store;
//! - `no-store` ... is a miss without the store: not measured apart.
//!
//! ```text
//! cargo bench --bench cache
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tower::{Service, ServiceBuilder, service_fn};
use tower_llm::cache::{CacheConfig, CacheLayer, MemoryCache};
use tower_llm::{ChatRequest, ChatResponse, Failure, Message, Metrics};

mod support;
use support::{current_thread, paired_typed as paired};

fn answer() -> ChatResponse {
    ChatResponse::builder("m")
        .text("The capital of France is Paris.")
        .build()
}

type Ready = std::future::Ready<Result<ChatResponse, Failure>>;

fn bare()
-> impl Service<ChatRequest, Response = ChatResponse, Error = Failure, Future = Ready> + Clone {
    service_fn(|_req: ChatRequest| std::future::ready(Ok::<_, Failure>(answer())))
}

fn layered() -> impl Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone {
    ServiceBuilder::new()
        .layer(
            CacheLayer::new(CacheConfig::default())
                .expect("valid")
                .with_store(Arc::new(MemoryCache::new(256 << 20)))
                .with_metrics(Metrics::disabled()),
        )
        .service(bare())
}

fn main() {
    let rt = current_thread();
    let _guard = rt.enter();
    let messages: Vec<_> = (0..20)
        .map(|i| Message::user(format!("question {i}: what does a cache buy?")))
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
            Arc::make_mut(&mut req.messages).push(Message::user(format!("and {n}?")));
            req
        }
    };
    println!("per call, paired medians against the bare service in the same rounds:");
    for (name, mut make) in [
        (
            "a stored request (hit)",
            Box::new(plain.clone()) as Box<dyn FnMut() -> ChatRequest>,
        ),
        ("a new request (miss: call, store)", Box::new(miss)),
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
