//! The whole stack on typed requests, side by side with the bare service
//! and the peers in one run:
//!
//! - requests: a `ChatRequest` of 20 short messages, and one with a single
//!   100 KB system prompt (plus one user message);
//! - the terminal pends once before it answers, as a real provider does, so
//!   every timer of every layer is really armed;
//! - variants: bare; `tower::timeout` + `tower::retry` (a policy that keeps
//!   a copy of the request, as any retrying policy must); the
//!   `tower-resilience` crate's time limiter → retry → circuit breaker; and
//!   tower-llm's full stack (deadline → fallback of 3 → retry → breaker,
//!   per-call metrics on); and that stack with cost layers (priced; with a
//!   per-call budget; with a tenant quota in memory), paired against it.
//!
//! Each call clones a prepared request (as a caller that keeps its own
//! copy does); the bare service pays the same clone, so "over bare" is what
//! the stack adds. Times are paired medians (41 alternating rounds);
//! allocations and bytes are counted with `stats_alloc`.
//!
//! ```text
//! cargo bench --bench typed
//! ```
//!
//! `TYPED_PROFILE=variant:calls` makes only that many calls of one variant
//! (`bare`, `healthy`, `open`, `tower`, `resilience`, `priced`, `budget`,
//! `quota`, `pool`, `paced`) on the 20-message
//! request and exits, for `valgrind --tool=callgrind` (instruction counts
//! do not drift with the VM; see `scripts/instructions.py`).

use std::alloc::System;
use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::layer::util::Identity;
use tower::{Service, ServiceBuilder};
use tower_llm::breaker::BreakerLayer;
use tower_llm::cost::{BudgetLayer, CostLayer, Limits, MemoryQuota, QuotaConfig, QuotaStore};
use tower_llm::deadline::DeadlineLayer;
use tower_llm::fallback::{FallbackLayer, LinkSpec};
use tower_llm::pool::{Deployment, PaceLimits, Pacer, Pool};
use tower_llm::retry::RetryLayer;
use tower_llm::{
    ChatRequest, ChatResponse, Choice, Cost, Failure, FinishReason, Message, Metrics, Price,
    ServiceBuilderExt, Usage,
};

mod support;
use support::{NeverRetry, current_thread};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// A terminal that answers on its second poll (it wakes itself at once).
#[derive(Clone)]
struct PendOnce {
    provider: Arc<str>,
}

struct PendOnceFuture {
    polled: bool,
    provider: Arc<str>,
}

impl Future for PendOnceFuture {
    type Output = Result<ChatResponse, Failure>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if !self.polled {
            self.polled = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Ok(ChatResponse {
            id: String::new(),
            model: String::new(),
            provider: self.provider.clone(),
            fallback_position: 0,
            degraded: false,
            idempotent_replayed: false,
            cache: None,
            choices: vec![Choice {
                index: 0,
                text: String::new(),
                tool_calls: Vec::new(),
                finish_reason: FinishReason::Stop,
            }],
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
                cached_input_tokens: 0,
            },
            latency: Duration::ZERO,
            attempts: Vec::new(),
        }))
    }
}

impl Service<ChatRequest> for PendOnce {
    type Response = ChatResponse;
    type Error = Failure;
    type Future = PendOnceFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ChatRequest) -> Self::Future {
        black_box(&req);
        PendOnceFuture {
            polled: false,
            provider: self.provider.clone(),
        }
    }
}

fn bare() -> PendOnce {
    PendOnce {
        provider: Arc::from("openai"),
    }
}

/// deadline (30 s, metrics on) → fallback (3 links) → retry → breaker.
fn full_stack() -> impl Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone {
    full_stack_with(BreakerLayer::new())
}

/// The full stack with the primary's circuit open: each call fails fast
/// into the second link.
fn fast_failing() -> impl Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone {
    let breaker = BreakerLayer::new();
    let handle = breaker.handle();
    let mut svc = full_stack_with(breaker);
    let req = ChatRequest::new("gpt-4o", vec![Message::user("hi")]);
    call(&mut svc, &req);
    assert!(handle.isolate(&tower_llm::breaker::BreakerKey::new("openai", "gpt-4o")));
    svc
}

fn full_stack_with(
    breaker: BreakerLayer,
) -> impl Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone {
    stack!(breaker, Identity::new(), Identity::new())
}

/// The full stack (deadline → `$outer` → fallback of 3 → per link retry →
/// `$link` → breaker → the terminal), with layers of the caller's in the
/// two places cost layers go (`Identity` for none: the same types).
macro_rules! stack {
    ($breaker:expr, $link:expr, $outer:expr) => {{
        let breaker = $breaker;
        let link_layer = $link;
        let link = || {
            ServiceBuilder::new()
                .llm_retry(RetryLayer::new())
                .layer(link_layer.clone())
                .llm_breaker(breaker.clone())
                .service(bare())
        };
        let fallback = FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o"))
            .or(LinkSpec::new("anthropic", "claude-sonnet-4-5"), link())
            .or(LinkSpec::new("bedrock", "nova-pro"), link())
            .build()
            .expect("valid chain");
        ServiceBuilder::new()
            .layer(DeadlineLayer::new(Duration::from_secs(30)).with_metrics(Metrics::global()))
            .layer($outer)
            .llm_fallback(fallback)
            .service(link())
    }};
}
use stack;

/// $2.50 / $10 per million tokens.
fn price() -> Price {
    Price::new(
        Cost::from_dollars(2.5).expect("a price"),
        Cost::from_dollars(10.0).expect("a price"),
        None,
    )
    .expect("a price")
}

/// The full stack with a cost layer per link (each answer priced, nothing
/// held).
fn priced() -> impl Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone {
    let cost = CostLayer::new(price()).with_max_output_tokens(1_024);
    stack!(BreakerLayer::new(), cost, Identity::new())
}

/// Priced, and each call held to a budget (`BudgetLayer`).
fn budgeted() -> impl Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone {
    let cost = CostLayer::new(price()).with_max_output_tokens(1_024);
    let budget = BudgetLayer::new(Cost::from_dollars(1.0).expect("a budget"));
    stack!(BreakerLayer::new(), cost, budget)
}

/// The full stack whose links are each a pool of three deployments of
/// the terminal (power of two choices; `paced`: each with a pacer of
/// limits it never reaches).
fn pooled(
    paced: bool,
) -> impl Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone {
    let breaker = BreakerLayer::new();
    let deployments = |_: ()| {
        let limits = PaceLimits {
            rpm: Some(u32::MAX),
            tpm: Some(u32::MAX),
            burst_ms: None,
        };
        Pool::new(
            ["east", "west", "north"]
                .into_iter()
                .map(|name| {
                    let d = Deployment::new(name, bare());
                    if paced {
                        d.with_pacer(Arc::new(Pacer::new(limits)))
                    } else {
                        d
                    }
                })
                .collect(),
        )
    };
    let link = || {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::new())
            .llm_breaker(breaker.clone())
            .service(deployments(()))
    };
    let fallback = FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o"))
        .or(LinkSpec::new("anthropic", "claude-sonnet-4-5"), link())
        .or(LinkSpec::new("bedrock", "nova-pro"), link())
        .build()
        .expect("valid chain");
    ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)).with_metrics(Metrics::global()))
        .llm_fallback(fallback)
        .service(link())
}

/// Priced, and each attempt held to a tenant quota in memory.
fn quota() -> impl Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone {
    let quota: Arc<dyn QuotaStore> = Arc::new(MemoryQuota::new(QuotaConfig::new(
        Duration::from_secs(86_400),
        Limits {
            max_cost: Cost::from_dollars(1e6),
            max_tokens: None,
        },
    )));
    let cost = CostLayer::new(price())
        .with_max_output_tokens(1_024)
        .with_quota(quota);
    stack!(BreakerLayer::new(), cost, Identity::new())
}

fn tower_peer() -> impl Service<ChatRequest, Response = ChatResponse> {
    ServiceBuilder::new()
        .timeout(Duration::from_secs(30))
        .retry(NeverRetry)
        .service(bare())
}

fn resilience_peer() -> impl Service<ChatRequest, Response = ChatResponse> {
    support::resilience_stack!(bare(), ChatRequest, ChatResponse)
}

/// One call with a clone of `req`: readiness, then the response future
/// polled until it answers (a no-op waker; the terminal pends once).
fn call<S: Service<ChatRequest>>(svc: &mut S, req: &ChatRequest) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    match svc.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        _ => return false,
    }
    let mut fut = std::pin::pin!(svc.call(black_box(req.clone())));
    for _ in 0..8 {
        if let Poll::Ready(res) = fut.as_mut().poll(&mut cx) {
            return res.is_ok();
        }
    }
    panic!("the benchmarked service answers on its second poll")
}

/// Median nanoseconds per call of `a` and `b`, timed alternately.
fn paired<A, B>(a: &mut A, b: &mut B, req: &ChatRequest) -> (f64, f64)
where
    A: Service<ChatRequest>,
    B: Service<ChatRequest>,
{
    const N: u32 = 5_000;
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..41 {
        let t = std::time::Instant::now();
        for _ in 0..N {
            black_box(call(a, req));
        }
        ta.push(t.elapsed().as_nanos() as f64 / f64::from(N));
        let t = std::time::Instant::now();
        for _ in 0..N {
            black_box(call(b, req));
        }
        tb.push(t.elapsed().as_nanos() as f64 / f64::from(N));
    }
    ta.sort_by(f64::total_cmp);
    tb.sort_by(f64::total_cmp);
    (ta[20], tb[20])
}

/// Allocations and bytes per call over 2,000 calls.
fn allocations<S: Service<ChatRequest>>(svc: &mut S, req: &ChatRequest) -> (f64, f64) {
    const N: usize = 2_000;
    call(svc, req);
    let region = Region::new(GLOBAL);
    for _ in 0..N {
        call(svc, req);
    }
    let stats = region.change();
    (
        (stats.allocations + stats.reallocations) as f64 / N as f64,
        stats.bytes_allocated as f64 / N as f64,
    )
}

fn requests() -> [(&'static str, ChatRequest); 2] {
    let twenty = (0..20)
        .map(|i| {
            if i % 2 == 0 {
                Message::user(format!("question {i}: what does a circuit breaker do?"))
            } else {
                Message::assistant(format!(
                    "answer {i}: it fails fast while a provider is sick."
                ))
            }
        })
        .collect();
    let big = vec![
        Message::system("x".repeat(100 * 1024)),
        Message::user("summarise the above"),
    ];
    [
        ("20 messages", ChatRequest::new("gpt-4o", twenty)),
        ("100 KB prompt", ChatRequest::new("gpt-4o", big)),
    ]
}

/// `TYPED_PROFILE=variant:calls`: makes `calls` calls of one variant on
/// the 20-message request and exits.
fn profile_only() {
    let Ok(spec) = std::env::var("TYPED_PROFILE") else {
        return;
    };
    let (variant, calls) = spec.split_once(':').unwrap_or((&spec, "1000"));
    let calls: usize = calls.parse().expect("TYPED_PROFILE=variant:calls");
    let [(_, req), _] = requests();
    fn run<S: Service<ChatRequest>>(mut svc: S, req: &ChatRequest, calls: usize) {
        for _ in 0..calls {
            black_box(call(&mut svc, req));
        }
    }
    fn size<S: Service<ChatRequest>>(mut svc: S, req: &ChatRequest) -> usize {
        std::mem::size_of_val(&svc.call(req.clone()))
    }
    if variant == "sizes" {
        println!("request {}", std::mem::size_of::<ChatRequest>());
        println!("sleep {}", std::mem::size_of::<tokio::time::Sleep>());
        println!("bare {}", size(bare(), &req));
        println!("healthy {}", size(full_stack(), &req));
        println!("priced {}", size(priced(), &req));
        println!("budgeted {}", size(budgeted(), &req));
        println!("resilience {}", size(resilience_peer(), &req));
        let breaker = BreakerLayer::new();
        println!(
            "config {} policy {}",
            std::mem::size_of::<tower_llm::breaker::BreakerConfig>(),
            std::mem::size_of::<tower_llm::FailurePolicy>()
        );
        let svc = ServiceBuilder::new()
            .llm_breaker(breaker.clone())
            .service(bare());
        println!("breaker service {}", std::mem::size_of_val(&svc));
        let svc = ServiceBuilder::new()
            .llm_retry(RetryLayer::new())
            .llm_breaker(breaker.clone())
            .service(bare());
        println!("retry service {}", std::mem::size_of_val(&svc));
        println!(
            "breaker {}",
            size(
                ServiceBuilder::new()
                    .llm_breaker(breaker.clone())
                    .service(bare()),
                &req
            )
        );
        println!(
            "retry+breaker {}",
            size(
                ServiceBuilder::new()
                    .llm_retry(RetryLayer::new())
                    .llm_breaker(breaker.clone())
                    .service(bare()),
                &req
            )
        );
        println!(
            "deadline+retry+breaker {}",
            size(
                ServiceBuilder::new()
                    .layer(DeadlineLayer::new(Duration::from_secs(30)))
                    .llm_retry(RetryLayer::new())
                    .llm_breaker(breaker.clone())
                    .service(bare()),
                &req
            )
        );
        std::process::exit(0);
    }
    match variant {
        "bare" => run(bare(), &req, calls),
        "healthy" => run(full_stack(), &req, calls),
        "open" => run(fast_failing(), &req, calls),
        "tower" => run(tower_peer(), &req, calls),
        "resilience" => run(resilience_peer(), &req, calls),
        "priced" => run(priced(), &req, calls),
        "budget" => run(budgeted(), &req, calls),
        "quota" => run(quota(), &req, calls),
        "pool" => run(pooled(false), &req, calls),
        "paced" => run(pooled(true), &req, calls),
        other => panic!("unknown TYPED_PROFILE variant {other:?}"),
    }
    std::process::exit(0);
}

/// One row: `with`, paired against the full stack without cost layers.
fn cost_row<S: Service<ChatRequest>>(variant: &str, mut with: S, req: &ChatRequest) {
    let mut without = full_stack();
    let (b, v) = paired(&mut without, &mut with, req);
    let (a0, _) = allocations(&mut without, req);
    let (a1, _) = allocations(&mut with, req);
    println!(
        "  full stack + {variant:<34} {v:>8.0} ns  (full stack {b:.0} ns, +{:.0} ns, +{:.1} allocations)",
        v - b,
        a1 - a0
    );
}

fn main() {
    let rt = current_thread();
    let _guard = rt.enter();
    profile_only();
    for (name, req) in requests() {
        let mut plain = bare();
        let mut ours = full_stack();
        let mut failing = fast_failing();
        let mut tower_stack = tower_peer();
        let mut resilience = resilience_peer();
        println!("\n{name}: per call, paired medians against the bare service in the same rounds");
        let rows: [(&str, (f64, f64)); 4] = [
            ("tower-llm full stack", paired(&mut plain, &mut ours, &req)),
            (
                "tower-llm, primary circuit open",
                paired(&mut plain, &mut failing, &req),
            ),
            (
                "tower::timeout + tower::retry",
                paired(&mut plain, &mut tower_stack, &req),
            ),
            (
                "tower-resilience limiter + retry + breaker",
                paired(&mut plain, &mut resilience, &req),
            ),
        ];
        for (variant, (b, v)) in rows {
            println!(
                "  {variant:<44} {v:>8.0} ns  (bare {b:.0} ns, +{:.0} ns)",
                v - b
            );
        }
        // What cost layers add to the full stack, paired against it.
        cost_row("priced (a cost layer per link)", priced(), &req);
        cost_row("priced + a per-call budget", budgeted(), &req);
        cost_row("priced + a tenant quota in memory", quota(), &req);
        cost_row("a pool of 3 per link (unpaced)", pooled(false), &req);
        cost_row("a pool of 3 per link, paced", pooled(true), &req);
        let (ba, bb) = allocations(&mut plain, &req);
        println!("  allocations per call over bare ({ba:.1} allocations, {bb:.0} bytes):");
        for (variant, (a, bytes)) in [
            ("tower-llm full stack", allocations(&mut ours, &req)),
            (
                "tower-llm, primary circuit open",
                allocations(&mut failing, &req),
            ),
            (
                "tower::timeout + tower::retry",
                allocations(&mut tower_stack, &req),
            ),
            (
                "tower-resilience limiter + retry + breaker",
                allocations(&mut resilience, &req),
            ),
        ] {
            println!(
                "  {variant:<44} +{:>5.1} allocations, +{:>9.0} bytes",
                a - ba,
                bytes - bb
            );
        }
    }
}
