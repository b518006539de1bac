//! No hold outlives its attempt: random calls through the cost layer
//! (a shared call budget and a `MemoryQuota`), whose provider answers with
//! or without usage, fails, hangs, panics or streams (whole, cut, dropped),
//! and whose callers leave at random times. When everything has ended
//! nothing is held, and what was spent is exactly the sum of what the
//! attempts were charged, within every limit.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use proptest::prelude::*;
use tower::{Layer, ServiceExt, service_fn};
use tower_llm_core::layer::{AttemptLogExt as _, AttemptRecordExt as _};
use tower_llm_core::{
    AttemptLog, AttemptRecord, Budget, ChatChunk, ChatRequest, ChatResponse, ChatStream, Cost,
    Failure, FailureClass, FinishReason, Link, LlmRequest as _, Tenant,
};
use tower_llm_cost::{Ask, CostLayer, Limits, MemoryQuota, QuotaConfig};

mod common;
use common::*;

/// What the provider does with one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Answers with this usage (sometimes more than the bounds).
    Usage(u32, u32),
    /// Answers without usage.
    NoUsage,
    /// Fails with an HTTP status.
    Status(u16),
    /// Fails without an answer (a reset).
    Reset,
    /// Never answers.
    Hang,
    /// Panics while the call is in flight.
    PanicInFlight,
    /// Panics when called.
    PanicAtCall,
    /// Streams `n` text chunks then ends, with or without usage.
    StreamWhole(u8, bool),
    /// Streams `n` text chunks then an error.
    StreamCut(u8),
    /// Streams `n` text chunks; the reader drops it after `k`.
    StreamDropped(u8, u8),
}

impl Act {
    fn streams(self) -> bool {
        matches!(
            self,
            Act::StreamWhole(..) | Act::StreamCut(_) | Act::StreamDropped(..)
        )
    }
}

#[derive(Debug, Clone)]
struct Op {
    act: Act,
    /// Provider latency.
    delay_ms: u64,
    /// When the caller starts.
    start_ms: u64,
    /// The caller leaves after this long (dropping the call or the stream).
    leave_ms: Option<u64>,
    /// 0 and 1: named tenants; 2: no tenant.
    tenant: u8,
    /// The request's own `max_tokens`.
    own_max: Option<u32>,
}

#[derive(Debug, Clone)]
struct Case {
    budget: Option<u64>,
    max_cost: u64,
    max_tokens: Option<u64>,
    layer_cap: Option<u32>,
    ops: Vec<Op>,
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        (0..=35_u32, 0..=120_u32).prop_map(|(p, c)| Act::Usage(p, c)),
        Just(Act::NoUsage),
        prop_oneof![Just(429_u16), Just(500), Just(503), Just(400)].prop_map(Act::Status),
        Just(Act::Reset),
        Just(Act::Hang),
        Just(Act::PanicInFlight),
        Just(Act::PanicAtCall),
        (0..5_u8, any::<bool>()).prop_map(|(n, u)| Act::StreamWhole(n, u)),
        (0..5_u8).prop_map(Act::StreamCut),
        (1..5_u8, 0..5_u8).prop_map(|(n, k)| Act::StreamDropped(n, k.min(n - 1))),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    (
        act(),
        0..300_u64,
        0..300_u64,
        proptest::option::weighted(0.3, 0..600_u64),
        0..3_u8,
        proptest::option::weighted(0.3, 0..150_u32),
    )
        .prop_map(|(act, delay_ms, start_ms, leave_ms, tenant, own_max)| Op {
            act,
            delay_ms,
            start_ms,
            leave_ms,
            tenant,
            own_max,
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        proptest::option::weighted(0.8, 0..2_000_000_u64),
        0..2_000_000_u64,
        proptest::option::weighted(0.3, 0..1_000_u64),
        prop_oneof![Just(Some(CAP)), Just(None), (1..150_u32).prop_map(Some)],
        proptest::collection::vec(op(), 1..16),
    )
        .prop_map(|(budget, max_cost, max_tokens, layer_cap, ops)| Case {
            budget,
            max_cost,
            max_tokens,
            layer_cap,
            ops,
        })
}

const PANIC: &str = "the provider panicked (on purpose)";

/// Keeps the intended panics out of the test output.
fn quiet_intended_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&PANIC) {
                default(info);
            }
        }));
    });
}

fn text(t: &str) -> Result<ChatChunk, Failure> {
    Ok(ChatChunk {
        text: Some(t.into()),
        ..ChatChunk::default()
    })
}

/// The provider's unary answer to a call doing `act`.
async fn unary(act: Act, delay: Duration) -> Result<ChatResponse, Failure> {
    tokio::time::sleep(delay).await;
    match act {
        Act::Usage(p, c) => Ok(ChatResponse::builder("m")
            .text("an answer")
            .usage(usage(p, c))
            .build()),
        Act::NoUsage => Ok(ChatResponse::builder("m").text("an answer").build()),
        Act::Status(s) => {
            let class = match s {
                429 => FailureClass::RateLimited,
                400 => FailureClass::BadRequest,
                _ => FailureClass::Transient,
            };
            Err(status_failure(class, s))
        }
        Act::Reset => Err(Failure::new(FailureClass::Transient)),
        Act::Hang => std::future::pending().await,
        Act::PanicInFlight => panic!("{}", PANIC),
        _ => unreachable!("not a unary act: {act:?}"),
    }
}

/// The provider's stream for a call doing `act`: chunks 10 ms apart.
fn stream(act: Act) -> ChatStream {
    let mut items: Vec<Result<ChatChunk, Failure>> = Vec::new();
    let (n, end) = match act {
        Act::StreamWhole(n, with_usage) => (n, Some(with_usage)),
        Act::StreamCut(n) => (n, None),
        Act::StreamDropped(n, _) => (n, Some(true)),
        _ => unreachable!("not a stream act: {act:?}"),
    };
    for i in 0..n {
        items.push(text(&"x".repeat(usize::from(i) + 1)));
    }
    match end {
        Some(with_usage) => items.push(Ok(ChatChunk {
            finish_reason: Some(FinishReason::Stop),
            usage: with_usage.then(|| usage(20, u32::from(n))),
            ..ChatChunk::default()
        })),
        None => items.push(Err(Failure::new(FailureClass::Transient))),
    }
    let chunks = futures_util::stream::iter(items).then(|item| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        item
    });
    ChatStream::new("p", "m", chunks)
}

type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Begins the attempt's record, as a retry layer would, in the same poll
/// as the cost layer is called (a caller that leaves before its call
/// started leaves no record: its attempt never reached the layer).
fn begin(req: &ChatRequest) {
    AttemptLog::of(req)
        .expect("installed")
        .begin(AttemptRecord::begun(req.call(), &Link::new("p", "m")))
        .expect("room");
}

/// One caller: sends `req`, reads what comes back as `op` says, leaves
/// when `op` says (a hang is left after 2 s at the latest).
fn caller(case: &Case, op: &Op, req: ChatRequest, quota: &MemoryQuota) -> Call {
    let act = op.act;
    let delay = Duration::from_millis(op.delay_ms);
    let mut unary_layer = CostLayer::new(cheap()).with_quota(Arc::new(quota.clone()));
    if let Some(cap) = case.layer_cap {
        unary_layer = unary_layer.with_max_output_tokens(cap);
    }
    let stream_layer = unary_layer.clone();
    let work: Call = if act.streams() {
        let provider = service_fn(move |_: ChatRequest| async move {
            tokio::time::sleep(delay).await;
            Ok::<_, Failure>(stream(act))
        });
        let svc = stream_layer.layer(provider);
        Box::pin(async move {
            begin(&req);
            let Ok(mut s) = svc.oneshot(req).await else {
                return;
            };
            let read = match act {
                Act::StreamDropped(_, k) => usize::from(k),
                _ => usize::MAX,
            };
            let mut got = 0;
            while got < read {
                if s.next().await.is_none() {
                    break;
                }
                got += 1;
            }
        })
    } else {
        let provider = service_fn(move |_: ChatRequest| {
            if act == Act::PanicAtCall {
                panic!("{}", PANIC);
            }
            unary(act, delay)
        });
        let svc = unary_layer.layer(provider);
        Box::pin(async move {
            begin(&req);
            let _ = svc.oneshot(req).await;
        })
    };
    let leave = Duration::from_millis(op.leave_ms.unwrap_or(2_000));
    let start = Duration::from_millis(op.start_ms);
    Box::pin(async move {
        tokio::time::sleep(start).await;
        tokio::select! {
            () = work => {}
            () = tokio::time::sleep(leave) => {}
        }
    })
}

fn tenant_of(n: u8) -> Tenant {
    match n {
        0 => Tenant::new(&b"a"[..]),
        1 => Tenant::new(&b"b"[..]),
        _ => Tenant::new(Vec::new()),
    }
}

fn run(case: &Case) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let quota = MemoryQuota::new(QuotaConfig::new(
            Duration::from_secs(366 * 86_400),
            Limits {
                max_cost: Some(nanos(case.max_cost)),
                max_tokens: case.max_tokens,
            },
        ));
        let budget = case.budget.map(|n| Budget::new(nanos(n)));
        let mut logs = Vec::new();
        let mut tasks = Vec::new();
        for op in &case.ops {
            let mut r = req();
            r.max_tokens = op.own_max;
            if let Some(b) = &budget {
                b.clone().store(&mut r);
            }
            if op.tenant < 2 {
                tenant_of(op.tenant).store(&mut r);
            }
            logs.push(AttemptLog::install(&mut r).expect("a fresh log"));
            let call = caller(case, op, r, &quota);
            // Half the callers are observed through catch_unwind, half
            // through the task's JoinError.
            if op.start_ms % 2 == 0 {
                tasks.push(tokio::spawn(async move {
                    AssertUnwindSafe(call).catch_unwind().await.is_err()
                }));
            } else {
                tasks.push(tokio::spawn(async move {
                    call.await;
                    false
                }));
            }
        }
        for (task, op) in tasks.into_iter().zip(&case.ops) {
            let panicked = match task.await {
                Ok(caught) => caught,
                Err(join) => join.is_panic(),
            };
            if panicked {
                assert!(
                    matches!(op.act, Act::PanicAtCall | Act::PanicInFlight),
                    "{op:?} panicked"
                );
            }
        }

        let mut charged = Cost::ZERO;
        for (owned, op) in logs.iter().zip(&case.ops) {
            // No record: the caller left before its call started.
            let records = owned.take();
            assert!(records.len() <= 1, "{op:?}");
            if let Some(record) = records.first() {
                let cost = record
                    .cost
                    .unwrap_or_else(|| panic!("{op:?} was never settled"));
                charged = charged.saturating_add(cost);
            }
        }
        let mut used = Cost::ZERO;
        for t in 0..3 {
            let tenant = tenant_of(t);
            assert_eq!(quota.held(&tenant), Ask::default(), "{tenant:?} holds");
            let u = quota.used(&tenant);
            assert!(u.cost <= nanos(case.max_cost), "{tenant:?}: {u:?}");
            if let Some(max) = case.max_tokens {
                assert!(u.tokens <= max, "{tenant:?}: {u:?}");
            }
            used = used.saturating_add(u.cost);
        }
        assert_eq!(used, charged, "the quotas count what was charged");
        if let Some(budget) = &budget {
            assert_eq!(budget.held(), Cost::ZERO);
            assert_eq!(budget.spent(), charged);
            assert!(budget.spent() <= budget.limit());
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_hold_outlives_its_attempt_and_spent_is_the_sum_of_charges(case in case()) {
        quiet_intended_panics();
        run(&case);
    }
}

#[test]
fn every_kind_of_ending_at_once_leaves_nothing_held() {
    quiet_intended_panics();
    let acts = [
        Act::Usage(20, 10),
        Act::Usage(35, 10),
        Act::NoUsage,
        Act::Status(503),
        Act::Reset,
        Act::Hang,
        Act::PanicInFlight,
        Act::PanicAtCall,
        Act::StreamWhole(3, true),
        Act::StreamWhole(3, false),
        Act::StreamCut(2),
        Act::StreamDropped(4, 1),
    ];
    let mut ops = Vec::new();
    for (i, act) in acts.into_iter().enumerate() {
        for leave_ms in [None, Some(5), Some(105)] {
            ops.push(Op {
                act,
                delay_ms: 100,
                start_ms: i as u64,
                leave_ms,
                tenant: (i % 3) as u8,
                own_max: None,
            });
        }
    }
    run(&Case {
        budget: Some(1_000_000_000),
        max_cost: 1_000_000_000,
        max_tokens: None,
        layer_cap: Some(CAP),
        ops,
    });
}
