//! How a pool chooses a deployment: weights, calls in flight, recent
//! failures (power of two choices), and keys (rendezvous affinity).
//! Seeded draws and virtual time: the counts are repeatable.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{ServiceExt, service_fn};
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Link, Message};
use tower_llm_pool::{Deployment, Pool};
use tower_llm_retry::SplitMix64;

type Svc = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

/// What a deployment does with its `n`th call (from 0): wait so many
/// milliseconds, then answer (`None`) or fail.
type Script = Arc<dyn Fn(usize, &ChatRequest) -> (u64, Option<Failure>) + Send + Sync>;

/// A mock deployment that answers with its name (as its [`Link`] says)
/// and counts its calls.
#[derive(Clone)]
struct Dep {
    name: &'static str,
    weight: u32,
    calls: Arc<AtomicUsize>,
    script: Script,
}

impl Dep {
    fn new(
        name: &'static str,
        script: impl Fn(usize, &ChatRequest) -> (u64, Option<Failure>) + Send + Sync + 'static,
    ) -> Self {
        Dep {
            name,
            weight: 1,
            calls: Arc::default(),
            script: Arc::new(script),
        }
    }

    /// Answers every call after `ms` milliseconds.
    fn answering_in(name: &'static str, ms: u64) -> Self {
        Dep::new(name, move |_, _| (ms, None))
    }

    fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn deployment(&self) -> Deployment<Svc> {
        let dep = self.clone();
        let service = BoxCloneSyncService::new(service_fn(move |req: ChatRequest| {
            let n = dep.calls.fetch_add(1, Ordering::SeqCst);
            let (wait, failure) = (dep.script)(n, &req);
            async move {
                if wait > 0 {
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
                match failure {
                    Some(f) => Err(f),
                    None => {
                        let served_by = Link::of(&req).map(|l| l.provider().to_owned());
                        Ok(ChatResponse::builder(req.model.to_string())
                            .text(served_by.unwrap_or_default())
                            .build())
                    }
                }
            }
        }));
        Deployment::new(self.name, service).with_weight(self.weight)
    }
}

/// The affinity key a request carries.
#[derive(Clone, Copy)]
struct Key(u64);

fn req() -> ChatRequest {
    ChatRequest::new("gpt-4o", vec![Message::user("hi")])
}

fn keyed(key: u64) -> ChatRequest {
    let mut r = req();
    r.extensions.insert(Key(key));
    r
}

fn pool(deps: &[&Dep], seed: u64) -> Pool<Svc> {
    Pool::new(deps.iter().map(|d| d.deployment()).collect())
        .with_random(Arc::new(SplitMix64::seeded(seed)))
        .with_affinity(|r: &ChatRequest| r.extensions.get::<Key>().map(|k| k.0))
}

fn transient() -> Failure {
    Failure::new(FailureClass::Transient).with_status(StatusCode::SERVICE_UNAVAILABLE)
}

/// Weights 3:1, one call at a time, every call instant (no load to tell
/// the two apart): the heavier gets 3 calls in 4, within 72 % to 78 % over
/// 4,000 calls (the binomial's standard deviation is 0.7 %).
#[tokio::test(start_paused = true)]
async fn weights_three_to_one_split_idle_calls_three_to_one() {
    let heavy = Dep::answering_in("heavy", 0).weight(3);
    let light = Dep::answering_in("light", 0);
    let pool = pool(&[&heavy, &light], 42);
    for _ in 0..4_000 {
        pool.clone().oneshot(req()).await.expect("answers");
    }
    let share = heavy.calls() as f64 / 4_000.0;
    eprintln!(
        "weights 3:1 -> heavy {} / light {} ({:.1} %)",
        heavy.calls(),
        light.calls(),
        share * 100.0
    );
    assert!((0.72..=0.78).contains(&share), "heavy share {share}");
}

/// Equal deployments, equally slow, 40 calls sent at once: each new call
/// goes to the deployment with fewer calls in flight, so they split
/// exactly 20 / 20.
#[tokio::test(start_paused = true)]
async fn two_choices_balance_calls_in_flight() {
    let a = Dep::answering_in("a", 100);
    let b = Dep::answering_in("b", 100);
    let pool = pool(&[&a, &b], 7);
    let calls: Vec<_> = (0..40)
        .map(|_| tokio::spawn(pool.clone().oneshot(req())))
        .collect();
    tokio::task::yield_now().await;
    let status = pool.status();
    assert_eq!(
        (status[0].load.in_flight, status[1].load.in_flight),
        (20, 20)
    );
    for call in calls {
        call.await.expect("joins").expect("answers");
    }
    assert_eq!((a.calls(), b.calls()), (20, 20));
}

/// Calls held open on one deployment (a key keeps them there): the next
/// 100 drawn calls all go to the two that hold none.
#[tokio::test(start_paused = true)]
async fn two_choices_avoid_a_deployment_holding_calls() {
    // `busy` holds keyed calls for a minute, answers others at once.
    let busy = Dep::new("busy", |_, r| {
        let held = r.extensions.get::<Key>().is_some();
        (if held { 60_000 } else { 0 }, None)
    });
    let free_1 = Dep::answering_in("free-1", 0);
    let free_2 = Dep::answering_in("free-2", 0);
    let pool = pool(&[&busy, &free_1, &free_2], 11);

    let key = key_for(&["busy", "free-1", "free-2"], "busy").await;
    let held: Vec<_> = (0..4)
        .map(|_| tokio::spawn(pool.clone().oneshot(keyed(key))))
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(pool.status()[0].load.in_flight, 4);
    let busy_before = busy.calls();

    for _ in 0..100 {
        pool.clone().oneshot(req()).await.expect("answers");
    }
    assert_eq!(busy.calls(), busy_before, "no drawn call goes to busy");
    assert_eq!(free_1.calls() + free_2.calls(), 100);
    eprintln!(
        "held on busy: 4; next 100 -> free-1 {} / free-2 {}",
        free_1.calls(),
        free_2.calls()
    );

    tokio::time::sleep(Duration::from_secs(61)).await;
    for call in held {
        call.await.expect("joins").expect("answers");
    }
    assert!(pool.status().iter().all(|s| s.load.in_flight == 0));
}

/// A key that a pool of deployments named `names` (weight 1) sends to
/// `target` first.
async fn key_for(names: &[&'static str], target: &str) -> u64 {
    let probes: Vec<Dep> = names.iter().map(|n| Dep::answering_in(n, 0)).collect();
    let probe = pool(&probes.iter().collect::<Vec<_>>(), 0);
    for key in 0..1_000 {
        let answer = probe.clone().oneshot(keyed(key)).await.expect("answers");
        if answer.text() == target {
            return key;
        }
    }
    panic!("no key lands on {target}");
}

/// A deployment that fails every call (a 503 after as long as the healthy
/// one takes to answer) gets fewer calls than the healthy one once the
/// moving average of its failures has warmed up.
#[tokio::test(start_paused = true)]
async fn a_failing_deployment_gets_fewer_calls_after_warm_up() {
    let failing = Dep::new("failing", |_, _| (50, Some(transient())));
    let healthy = Dep::answering_in("healthy", 50);
    let other = Dep::answering_in("other", 50);
    let pool = pool(&[&failing, &healthy, &other], 5);
    // Warm up under load: 60 calls, 6 in flight at a time.
    run_in_waves(&pool, 10, 6).await;
    let (f0, h0, o0) = (failing.calls(), healthy.calls(), other.calls());
    run_in_waves(&pool, 50, 6).await;
    let (f, h, o) = (
        failing.calls() - f0,
        healthy.calls() - h0,
        other.calls() - o0,
    );
    eprintln!("after warm-up, 300 calls: failing {f}, healthy {h}, other {o}");
    assert!(
        f * 4 < h && f * 4 < o,
        "failing {f}, healthy {h}, other {o}"
    );
    assert!(pool.status()[0].load.failure_rate > 0.5);
}

/// As above, but the failing deployment fails at once (a connection
/// refused, an instant 503) while the healthy ones take 50 ms to answer.
#[tokio::test(start_paused = true)]
async fn a_fast_failing_deployment_gets_fewer_calls_after_warm_up() {
    let failing = Dep::new("failing", |_, _| (0, Some(transient())));
    let healthy = Dep::answering_in("healthy", 50);
    let other = Dep::answering_in("other", 50);
    let pool = pool(&[&failing, &healthy, &other], 5);
    run_in_waves(&pool, 10, 6).await;
    let (f0, h0, o0) = (failing.calls(), healthy.calls(), other.calls());
    run_in_waves(&pool, 50, 6).await;
    let (f, h, o) = (
        failing.calls() - f0,
        healthy.calls() - h0,
        other.calls() - o0,
    );
    eprintln!("fast failing, after warm-up, 300 calls: failing {f}, healthy {h}, other {o}");
    assert!(
        f * 4 < h && f * 4 < o,
        "failing {f}, healthy {h}, other {o}"
    );
}

/// `waves` rounds of `width` calls sent together, each round waited out.
async fn run_in_waves(pool: &Pool<Svc>, waves: usize, width: usize) {
    for _ in 0..waves {
        let calls: Vec<_> = (0..width)
            .map(|_| tokio::spawn(pool.clone().oneshot(req())))
            .collect();
        for call in calls {
            call.await.expect("joins").expect("some deployment answers");
        }
    }
}

/// Who serves each of `keys`, by name.
async fn landing(pool: &Pool<Svc>, keys: std::ops::Range<u64>) -> HashMap<u64, String> {
    let mut out = HashMap::new();
    for key in keys {
        let answer = pool.clone().oneshot(keyed(key)).await.expect("answers");
        out.insert(key, answer.text().to_owned());
    }
    out
}

/// The same key always lands on the same deployment: 1,000 keys, each
/// sent three times, and again through a second pool of the same
/// deployments with other draws (another replica) and other loads.
#[tokio::test(start_paused = true)]
async fn the_same_key_always_lands_on_the_same_deployment() {
    let deps: Vec<Dep> = ["east", "west", "north", "south"]
        .into_iter()
        .map(|n| Dep::answering_in(n, 0))
        .collect();
    let refs: Vec<&Dep> = deps.iter().collect();
    let pool_1 = pool(&refs, 1);
    let first = landing(&pool_1, 0..1_000).await;
    for _ in 0..2 {
        assert_eq!(landing(&pool_1, 0..1_000).await, first);
    }
    // Unkeyed load in between changes nothing.
    for _ in 0..100 {
        pool_1.clone().oneshot(req()).await.expect("answers");
    }
    assert_eq!(landing(&pool_1, 0..1_000).await, first);
    let pool_2 = pool(&refs, 99);
    assert_eq!(landing(&pool_2, 0..1_000).await, first, "replicas agree");
    let used: std::collections::HashSet<&String> = first.values().collect();
    assert_eq!(used.len(), 4, "keys reach every deployment");
}

/// Keys spread over deployments by weight: weights 1 : 2 : 1 over 4,000
/// keys give 25 % / 50 % / 25 %, each within 3 points.
#[tokio::test(start_paused = true)]
async fn keys_spread_over_deployments_by_weight() {
    let a = Dep::answering_in("a", 0);
    let b = Dep::answering_in("b", 0).weight(2);
    let c = Dep::answering_in("c", 0);
    let pool = pool(&[&a, &b, &c], 1);
    landing(&pool, 0..4_000).await;
    let shares = [a.calls(), b.calls(), c.calls()].map(|n| n as f64 / 4_000.0);
    eprintln!(
        "keys by weight 1:2:1 -> {:.1} % / {:.1} % / {:.1} %",
        shares[0] * 100.0,
        shares[1] * 100.0,
        shares[2] * 100.0
    );
    for (share, want) in shares.into_iter().zip([0.25, 0.5, 0.25]) {
        assert!((share - want).abs() <= 0.03, "{shares:?}");
    }
}

/// A key whose deployment answers 429 with `Retry-After: 5` goes to one
/// other deployment (always the same) while it cools, and back after.
#[tokio::test(start_paused = true)]
async fn a_key_goes_elsewhere_while_its_deployment_cools_and_comes_back() {
    let deps: Vec<Dep> = ["d0", "d1", "d2", "d3"]
        .into_iter()
        .map(|n| Dep::answering_in(n, 0))
        .collect();
    let refs: Vec<&Dep> = deps.iter().collect();
    let home = landing(&pool(&refs, 1), 0..1).await[&0].clone();

    // The same deployments, the key's home limited once.
    let limited_once = |name: &'static str| {
        let limit = name == home;
        Dep::new(name, move |n, _| {
            if limit && n == 0 {
                let f = Failure::new(FailureClass::RateLimited)
                    .with_retry_after(Duration::from_secs(5));
                (0, Some(f))
            } else {
                (0, None)
            }
        })
    };
    let deps: Vec<Dep> = ["d0", "d1", "d2", "d3"]
        .into_iter()
        .map(limited_once)
        .collect();
    let refs: Vec<&Dep> = deps.iter().collect();
    let pool = pool(&refs, 1);
    let t0 = Instant::now();

    let away = pool.clone().oneshot(keyed(0)).await.expect("moved");
    let away = away.text().to_owned();
    assert_ne!(away, home);
    let mut at = t0;
    while at < t0 + Duration::from_secs(5) {
        tokio::time::sleep_until(at).await;
        let answer = pool.clone().oneshot(keyed(0)).await.expect("answers");
        assert_eq!(answer.text(), away, "at {:?}", at - t0);
        at += Duration::from_millis(250);
    }
    tokio::time::sleep_until(t0 + Duration::from_secs(5)).await;
    let answer = pool.clone().oneshot(keyed(0)).await.expect("answers");
    assert_eq!(answer.text(), home, "back home at 5 s");
    let home_dep = deps.iter().find(|d| d.name == home).expect("home");
    assert_eq!(home_dep.calls(), 2, "the 429, then the call at 5 s");
}
