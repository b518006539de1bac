//! How long an open takes to reach another replica, over many trips.
//!
//! Two stores on one Redis (two replicas in one process, each with its own
//! connections and background tasks). For each trip, replica B first
//! serves a fresh key (so it holds that circuit), then replica A's only
//! call on it fails (threshold 1) and opens it; the time until B's circuit
//! reads open is one sample. Prints p50, p99 and max.
//!
//! ```text
//! redis-server --port 6399 --save '' --appendonly no &
//! cargo run --release -p tower-llm-breaker-redis --example propagation -- redis://127.0.0.1:6399 1000
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower::{Layer, ServiceExt, service_fn};
use tower_llm_breaker::{BreakerConfig, BreakerKey, BreakerLayer, CircuitState};
use tower_llm_breaker_redis::RedisBreakerStore;
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Link, Message};

fn ok(req: &ChatRequest) -> ChatResponse {
    ChatResponse {
        id: "id".into(),
        model: req.model.to_string(),
        provider: "p".into(),
        ..ChatResponse::default()
    }
}

fn req(model: &str) -> ChatRequest {
    let mut r = ChatRequest::new(model.to_owned(), vec![Message::user("hi")]);
    Link::new("p", model.to_owned()).store(&mut r);
    r
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let trips: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(1000);
    let config = BreakerConfig {
        consecutive_failures: 1,
        cooldown: Duration::from_secs(60),
        ..BreakerConfig::default()
    };
    let prefix = format!("propagation-{}:", std::process::id());
    let store = |_: ()| -> Result<Arc<RedisBreakerStore>, Box<dyn std::error::Error>> {
        Ok(Arc::new(
            RedisBreakerStore::builder(&url)?
                .with_breaker_config(config)
                .with_prefix(prefix.clone())
                .with_key_ttl(Duration::from_secs(5))
                .build()?,
        ))
    };
    let (a, b) = (store(())?, store(())?);
    let started = Instant::now();
    while !(a.is_up() && b.is_up()) {
        if started.elapsed() > Duration::from_secs(5) {
            return Err("Redis did not answer within 5 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let layer = |s: &Arc<RedisBreakerStore>| {
        BreakerLayer::new()
            .with_config(config)
            .map(|l| l.with_store(s.clone()))
    };
    let (layer_a, layer_b) = (layer(&a)?, layer(&b)?);
    let handle_b = layer_b.handle();
    let failing = layer_a.layer(service_fn(|_: ChatRequest| async {
        Err::<ChatResponse, _>(Failure::new(FailureClass::Transient))
    }));
    let healthy = layer_b.layer(service_fn(|r: ChatRequest| async move {
        Ok::<_, Failure>(ok(&r))
    }));

    let mut samples = Vec::with_capacity(trips);
    for i in 0..trips {
        let model = format!("m{i}");
        let key = BreakerKey::new("p", model.clone());
        healthy.clone().oneshot(req(&model)).await?;
        let t0 = Instant::now();
        let _ = failing.clone().oneshot(req(&model)).await;
        loop {
            if handle_b
                .get(&key)
                .is_some_and(|s| s.state == CircuitState::Open)
            {
                samples.push(t0.elapsed());
                break;
            }
            if t0.elapsed() > Duration::from_secs(1) {
                return Err(format!("trip {i}: not adopted within 1 s").into());
            }
            tokio::task::yield_now().await;
        }
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    println!(
        "{} trips: p50 {:?}, p99 {:?}, max {:?}",
        samples.len(),
        at(0.50),
        at(0.99),
        samples[samples.len() - 1]
    );
    Ok(())
}
