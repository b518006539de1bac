//! Loom model of the breaker's half-open admission: however calls race
//! for the probe slots, at most `half_open_probes` are let through, and a
//! probe dropped before it ends frees its slot.
//!
//! ```text
//! RUSTFLAGS="--cfg tower_llm_loom" cargo test -p tower-llm-breaker --test loom
//! ```
#![cfg(tower_llm_loom)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tower::{Layer, Service, service_fn};
use tower_llm_breaker::{BreakerConfig, BreakerLayer};
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Message};

type Fut = Pin<Box<dyn Future<Output = Result<ChatResponse, Failure>> + Send>>;

fn req() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

/// Polls once: `Some(true)` admitted (the inner call pends), `Some(false)`
/// refused as open.
fn poll_once<F: Future<Output = Result<ChatResponse, Failure>>>(fut: Pin<&mut F>) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    match fut.poll(&mut cx) {
        Poll::Pending => true,
        Poll::Ready(Err(e)) if e.is_circuit_open() => false,
        Poll::Ready(other) => panic!("unexpected {other:?}"),
    }
}

#[test]
fn half_open_admits_at_most_k_probes_and_a_dropped_probe_frees_its_slot() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(|| {
        let layer = BreakerLayer::new()
            .with_config(BreakerConfig {
                consecutive_failures: 1,
                // Real time (loom does not model it): a probe still
                // running counts as lost after a full cooldown, so the
                // cooldown is far longer than the racers take, even on a
                // loaded machine (1 ms made the second racer a probe too
                // whenever the first was descheduled for a millisecond).
                cooldown: Duration::from_millis(50),
                half_open_probes: 1,
                rate_limit_hold: false,
                ..BreakerConfig::default()
            })
            .expect("valid");
        // The first call fails (the circuit opens); every later one pends.
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let svc = layer.layer(service_fn(move |_req: ChatRequest| -> Fut {
            if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                Box::pin(async { Err(Failure::new(FailureClass::Transient)) })
            } else {
                Box::pin(std::future::pending())
            }
        }));
        let mut first = svc.clone();
        let mut fut = std::pin::pin!(first.call(req()));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(Err(_))));
        // The cooldown (50 ms) ends: the next calls race for one probe slot.
        std::thread::sleep(Duration::from_millis(55));
        // Each racer keeps its call (admitted or not) until both have
        // tried: a probe still running holds its slot.
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let mut svc = svc.clone();
                loom::thread::spawn(move || {
                    let mut fut = Box::pin(svc.call(req()));
                    let admitted = poll_once(fut.as_mut());
                    (admitted, fut)
                })
            })
            .collect();
        let racers: Vec<_> = threads
            .into_iter()
            .map(|t| t.join().expect("joined"))
            .collect();
        let admitted = racers.iter().filter(|(a, _)| *a).count();
        assert_eq!(admitted, 1, "exactly one probe at a time");
        // Both end without an outcome (dropped): the slot is free again.
        drop(racers);
        // Both dropped: the slot is free again.
        let mut again = svc.clone();
        let mut fut = std::pin::pin!(again.call(req()));
        assert!(poll_once(fut.as_mut()), "a dropped probe frees its slot");
    });
}
