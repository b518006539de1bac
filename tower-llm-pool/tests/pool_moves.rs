//! Which failures move a call to another deployment of the pool (at once,
//! no time passing), which return at once, what comes back when every
//! deployment fails, and how long a 429's `Retry-After` keeps its
//! deployment out of the choice. Virtual time throughout.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{ServiceExt, service_fn};
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Link, Message};
use tower_llm_pool::{Deployment, Pool};
use tower_llm_retry::SplitMix64;

type Svc = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

/// Makes one failure (a fresh one for each call).
type MakeFailure = fn() -> Failure;

/// What a deployment does with its `n`th call (from 0): wait so many
/// milliseconds, then answer (`None`) or fail.
type Script = Arc<dyn Fn(usize) -> (u64, Option<Failure>) + Send + Sync>;

/// A mock deployment: answers with its name (as its [`Link`] says), and
/// records each call, in order with the other deployments sharing `order`.
#[derive(Clone)]
struct Dep {
    name: &'static str,
    calls: Arc<Mutex<Vec<Instant>>>,
    order: Arc<Mutex<Vec<&'static str>>>,
    script: Script,
}

impl Dep {
    fn new(
        name: &'static str,
        order: &Arc<Mutex<Vec<&'static str>>>,
        script: impl Fn(usize) -> (u64, Option<Failure>) + Send + Sync + 'static,
    ) -> Self {
        Dep {
            name,
            calls: Arc::default(),
            order: order.clone(),
            script: Arc::new(script),
        }
    }

    fn calls(&self) -> usize {
        self.calls.lock().expect("lock").len()
    }

    fn service(&self) -> Svc {
        let dep = self.clone();
        BoxCloneSyncService::new(service_fn(move |req: ChatRequest| {
            let n = {
                let mut calls = dep.calls.lock().expect("lock");
                calls.push(Instant::now());
                calls.len() - 1
            };
            dep.order.lock().expect("lock").push(dep.name);
            let (wait, failure) = (dep.script)(n);
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
        }))
    }

    fn deployment(&self) -> Deployment<Svc> {
        Deployment::new(self.name, self.service())
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

/// A key that a pool of deployments named `names` (weight 1) sends to
/// `target` first.
async fn key_for(names: &[&'static str], target: &str) -> u64 {
    let order = Arc::default();
    let probes: Vec<Dep> = names
        .iter()
        .map(|n| Dep::new(n, &order, |_| (0, None)))
        .collect();
    let probe = pool(&probes.iter().collect::<Vec<_>>(), 0);
    for key in 0..1_000 {
        let answer = probe.clone().oneshot(keyed(key)).await.expect("answers");
        if answer.text() == target {
            return key;
        }
    }
    panic!("no key lands on {target}");
}

fn ok(_: usize) -> (u64, Option<Failure>) {
    (0, None)
}

/// A 429, a 503, an open circuit and a spent quota are the deployment's
/// faults: the call goes on to another deployment at once, within the same
/// call, and no time passes.
#[tokio::test(start_paused = true)]
async fn a_deployment_fault_moves_the_call_to_another_at_once() {
    let faults: [(&str, MakeFailure); 4] = [
        ("429", || {
            Failure::new(FailureClass::RateLimited).with_status(StatusCode::TOO_MANY_REQUESTS)
        }),
        ("503", || {
            Failure::new(FailureClass::Transient).with_status(StatusCode::SERVICE_UNAVAILABLE)
        }),
        ("circuit open", || {
            Failure::circuit_open(Some(Duration::from_secs(30)))
        }),
        ("quota", || Failure::new(FailureClass::QuotaExhausted)),
    ];
    let key = key_for(&["bad", "good-1", "good-2"], "bad").await;
    for (what, fault) in faults {
        let order = Arc::default();
        let bad = Dep::new("bad", &order, move |_| (0, Some(fault())));
        let good_1 = Dep::new("good-1", &order, ok);
        let good_2 = Dep::new("good-2", &order, ok);
        let pool = pool(&[&bad, &good_1, &good_2], 1);

        let before = Instant::now();
        let answer = pool.oneshot(keyed(key)).await.expect(what);
        assert_eq!(Instant::now(), before, "{what}: no time passes");
        assert!(answer.text().starts_with("good-"), "{what}: {answer:?}");
        assert_eq!(bad.calls(), 1, "{what}");
        assert_eq!(good_1.calls() + good_2.calls(), 1, "{what}: one other call");
        let order = order.lock().expect("lock").clone();
        assert_eq!(order[0], "bad", "{what}: the key's deployment first");
        assert_eq!(order[1], answer.text(), "{what}: then the one that served");
    }
}

/// A bad request, bad credentials, a prompt over the context window (and a
/// timeout of the attempt) are the call's own: they come back from the first
/// deployment, no other is tried.
#[tokio::test(start_paused = true)]
async fn a_call_fault_returns_at_once_without_another_deployment() {
    let faults: [(FailureClass, Option<StatusCode>); 4] = [
        (FailureClass::BadRequest, Some(StatusCode::BAD_REQUEST)),
        (FailureClass::Auth, Some(StatusCode::UNAUTHORIZED)),
        (FailureClass::ContextWindowExceeded, None),
        (FailureClass::Timeout, None),
    ];
    let key = key_for(&["first", "other-1", "other-2"], "first").await;
    for (class, status) in faults {
        let order = Arc::default();
        let first = Dep::new("first", &order, move |_| {
            let mut f = Failure::new(class);
            if let Some(s) = status {
                f = f.with_status(s);
            }
            (0, Some(f))
        });
        let other_1 = Dep::new("other-1", &order, ok);
        let other_2 = Dep::new("other-2", &order, ok);
        let pool = pool(&[&first, &other_1, &other_2], 1);

        let before = Instant::now();
        let err = pool.oneshot(keyed(key)).await.expect_err("fails");
        assert_eq!(Instant::now(), before);
        assert_eq!(err.class(), class);
        assert_eq!(err.http_status(), status);
        assert_eq!(first.calls(), 1, "{class:?}");
        assert_eq!(other_1.calls() + other_2.calls(), 0, "{class:?}: no other");
    }
}

/// When every deployment has a fault, each is called exactly once and the
/// last one's failure comes back (whatever order the draws chose).
#[tokio::test(start_paused = true)]
async fn when_every_deployment_fails_the_last_failure_returns_each_called_once() {
    for seed in 0..20 {
        let order: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let limited = Dep::new("limited", &order, |_| {
            (0, Some(Failure::new(FailureClass::RateLimited)))
        });
        let down = Dep::new("down", &order, |_| {
            let f = Failure::new(FailureClass::Transient).with_status(StatusCode::BAD_GATEWAY);
            (0, Some(f))
        });
        let spent = Dep::new("spent", &order, |_| {
            (0, Some(Failure::new(FailureClass::QuotaExhausted)))
        });
        let pool = Pool::new(vec![
            limited.deployment(),
            down.deployment(),
            spent.deployment(),
        ])
        .with_random(Arc::new(SplitMix64::seeded(seed)));

        let before = Instant::now();
        let err = pool.oneshot(req()).await.expect_err("all fail");
        assert_eq!(Instant::now(), before);
        assert_eq!((limited.calls(), down.calls(), spent.calls()), (1, 1, 1));
        let order = order.lock().expect("lock").clone();
        let expected = match *order.last().expect("calls") {
            "limited" => FailureClass::RateLimited,
            "down" => FailureClass::Transient,
            _ => FailureClass::QuotaExhausted,
        };
        assert_eq!(err.class(), expected, "seed {seed}: order {order:?}");
    }
}

/// A 429 with `Retry-After: 5` keeps its deployment out of every choice
/// (drawn or by affinity) for exactly 5 s, then it takes calls again.
#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_cools_its_deployment_for_that_long() {
    let key = key_for(&["a", "b"], "a").await;
    let order = Arc::default();
    let a = Dep::new("a", &order, |n| {
        if n == 0 {
            let f = Failure::new(FailureClass::RateLimited)
                .with_status(StatusCode::TOO_MANY_REQUESTS)
                .with_retry_after(Duration::from_secs(5));
            (0, Some(f))
        } else {
            (100, None)
        }
    });
    let b = Dep::new("b", &order, |_| (100, None));
    let pool = pool(&[&a, &b], 3);
    let t0 = Instant::now();

    // The key's deployment answers 429: the call moves to b.
    let answer = pool.clone().oneshot(keyed(key)).await.expect("b serves");
    assert_eq!(answer.text(), "b");
    assert_eq!((a.calls(), b.calls()), (1, 1));
    let cooling = pool.status()[0].cooling_for.expect("a cools");
    assert_eq!(cooling, Duration::from_millis(4_900), "5 s from the 429");

    // Under load, while a cools: every call goes to b.
    tokio::time::sleep_until(t0 + Duration::from_secs(1)).await;
    let burst: Vec<_> = (0..10)
        .map(|_| tokio::spawn(pool.clone().oneshot(req())))
        .collect();
    for call in burst {
        assert_eq!(call.await.expect("joins").expect("answers").text(), "b");
    }
    assert_eq!((a.calls(), b.calls()), (1, 11));

    // The key's own call, a moment before the 5 s are up: still b.
    tokio::time::sleep_until(t0 + Duration::from_millis(4_999)).await;
    let started = Instant::now();
    let call = tokio::spawn(pool.clone().oneshot(keyed(key)));
    tokio::task::yield_now().await;
    assert_eq!(
        (a.calls(), b.calls()),
        (1, 12),
        "a is not called at 4.999 s"
    );
    assert_eq!(call.await.expect("joins").expect("answers").text(), "b");
    assert_eq!(started.elapsed(), Duration::from_millis(100));

    // From 5 s on, a takes calls again: the key's first...
    tokio::time::sleep_until(t0 + Duration::from_secs(5)).await;
    assert_eq!(pool.status()[0].cooling_for, None);
    let answer = pool.clone().oneshot(keyed(key)).await.expect("a serves");
    assert_eq!(answer.text(), "a");
    assert_eq!((a.calls(), b.calls()), (2, 12));

    // ...and drawn ones, once b is busy.
    let burst: Vec<_> = (0..10)
        .map(|_| tokio::spawn(pool.clone().oneshot(req())))
        .collect();
    for call in burst {
        call.await.expect("joins").expect("answers");
    }
    assert!(a.calls() > 2, "a is drawn again: {} calls", a.calls());
    assert_eq!(a.calls() + b.calls(), 2 + 12 + 10);
}
