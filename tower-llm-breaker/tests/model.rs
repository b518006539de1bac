//! A proptest state-machine test: random sequences of calls (succeeding,
//! failing, neutral, or dropped before they end) and clock advances run
//! through a real `BreakerLayer` and through a reference model written
//! from the documented rules; every call must be admitted or refused as
//! the model says, with the same `retry_after`.
//!
//! `FUZZ_CASES` sets the number of sequences (default 2,000).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use tower::{Service, ServiceExt, service_fn};
use tower_llm_breaker::{BreakerConfig, BreakerLayer};
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Message};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Succeed,
    Fail,
    /// A client error: neither a success nor a failure to the breaker.
    Neutral,
    /// Admitted, then dropped before it ends.
    Drop,
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Succeed),
        4 => Just(Op::Fail),
        1 => Just(Op::Neutral),
        1 => Just(Op::Drop),
        3 => (1u64..3_000).prop_map(Op::Advance),
    ]
}

/// The documented rules, sequential calls only.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Model {
    Closed { consecutive: u32 },
    Open { until: u64, reopens: u32 },
    HalfOpen { successes: u32, reopens: u32 },
}

/// What one call saw.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Seen {
    Admitted,
    Refused(Option<Duration>),
}

impl Model {
    fn call(&mut self, op: Op, now: u64, cfg: &BreakerConfig) -> Seen {
        if let Model::Open { until, reopens } = *self {
            if now < until {
                return Seen::Refused(Some(Duration::from_millis(until - now)));
            }
            *self = Model::HalfOpen {
                successes: 0,
                reopens,
            };
        }
        match (*self, op) {
            (Model::Closed { .. }, Op::Succeed) => *self = Model::Closed { consecutive: 0 },
            (Model::Closed { consecutive }, Op::Fail) => {
                let consecutive = consecutive + 1;
                *self = if consecutive >= cfg.consecutive_failures {
                    Model::Open {
                        until: now + ms(cfg.cooldown_after(0)),
                        reopens: 0,
                    }
                } else {
                    Model::Closed { consecutive }
                };
            }
            (Model::HalfOpen { successes, reopens }, Op::Succeed) => {
                let successes = successes + 1;
                *self = if successes >= cfg.half_open_probes {
                    Model::Closed { consecutive: 0 }
                } else {
                    Model::HalfOpen { successes, reopens }
                };
            }
            (Model::HalfOpen { reopens, .. }, Op::Fail) => {
                let reopens = reopens + 1;
                *self = Model::Open {
                    until: now + ms(cfg.cooldown_after(reopens)),
                    reopens,
                };
            }
            // Neutral outcomes and dropped calls change nothing (a dropped
            // probe frees its slot).
            _ => {}
        }
        Seen::Admitted
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn answer() -> ChatResponse {
    ChatResponse {
        id: "1".into(),
        model: "m".into(),
        provider: "p".into(),
        ..ChatResponse::default()
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("FUZZ_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(2_000),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/model.txt"),
        )),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_breaker_follows_the_reference_model(
        threshold in 1u32..4,
        cooldown_ms in 100u64..2_000,
        growth in prop_oneof![Just(1.0), Just(2.0)],
        probes in 1u32..3,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let cfg = BreakerConfig {
            consecutive_failures: threshold,
            cooldown: Duration::from_millis(cooldown_ms),
            cooldown_growth: growth,
            max_cooldown: Duration::from_secs(10),
            half_open_probes: probes,
            rate_limit_hold: false,
            ..BreakerConfig::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let plan = Arc::new(std::sync::Mutex::new(Op::Succeed));
            let calls = Arc::new(AtomicUsize::new(0));
            let (p, c) = (plan.clone(), calls.clone());
            let inner = service_fn(move |_req: ChatRequest| {
                c.fetch_add(1, Ordering::SeqCst);
                let op = *p.lock().expect("plan");
                async move {
                    match op {
                        Op::Succeed => Ok(answer()),
                        Op::Fail => Err(Failure::new(FailureClass::Transient)),
                        Op::Neutral => Err(Failure::new(FailureClass::BadRequest)),
                        Op::Drop | Op::Advance(_) => std::future::pending().await,
                    }
                }
            });
            let mut svc = BreakerLayer::new().with_config(cfg).expect("valid").layer(inner);
            let start = tokio::time::Instant::now();
            let mut model = Model::Closed { consecutive: 0 };
            for (step, op) in ops.iter().enumerate() {
                if let Op::Advance(d) = op {
                    tokio::time::advance(Duration::from_millis(*d)).await;
                    continue;
                }
                let now = ms(start.elapsed());
                let expected = model.call(*op, now, &cfg);
                *plan.lock().expect("plan") = *op;
                let before = calls.load(Ordering::SeqCst);
                let req = ChatRequest::new("m", vec![Message::user("hi")]);
                let seen = if *op == Op::Drop {
                    let mut fut = std::pin::pin!(svc.ready().await.expect("ready").call(req));
                    let mut cx = Context::from_waker(Waker::noop());
                    match fut.as_mut().poll(&mut cx) {
                        Poll::Ready(Err(e)) if e.is_circuit_open() => Seen::Refused(e.retry_after()),
                        Poll::Pending => Seen::Admitted,
                        other => panic!("step {step}: {other:?}"),
                    }
                    // Dropped here, before it ends.
                } else {
                    match svc.ready().await.expect("ready").call(req).await {
                        Err(e) if e.is_circuit_open() => Seen::Refused(e.retry_after()),
                        _ => Seen::Admitted,
                    }
                };
                let called = calls.load(Ordering::SeqCst) > before;
                assert_eq!(seen, expected, "step {step} ({op:?}) at {now} ms: {ops:?}");
                assert_eq!(called, expected == Seen::Admitted, "step {step}: the provider called iff admitted");
            }
        });
    }
}

use tower::Layer as _;
