//! A pool whose deployments' pacers are shared across replicas
//! (`Pacer::with_shared`): the pool takes from the replica's buckets
//! first, then from the fleet's (an in-memory `SharedPacing` here), skips
//! a deployment the fleet has no room for, and gives back to the fleet
//! what a request did not use. Virtual time throughout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{ServiceExt, service_fn};
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Message, Usage};
use tower_llm_pool::{Deployment, PaceLimits, Pacer, Pool, SharedPacing, SharedTake, SharedTicket};

type Svc = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

/// The fleet's buckets, in memory and never refilled: what is left per
/// deployment, and every take and give-back seen.
#[derive(Debug, Default)]
struct Fleet {
    left: Mutex<HashMap<String, (u64, u64)>>,
    takes: Mutex<Vec<(String, PaceLimits, u64)>>,
    given_back: Mutex<Vec<(String, u64)>>,
}

/// When a fleet with no room says there will be room: 7 s from now.
const ROOM_IN: Duration = Duration::from_secs(7);

impl Fleet {
    fn with(deployment: &str, requests: u64, tokens: u64) -> Arc<Self> {
        let fleet = Fleet::default();
        fleet
            .left
            .lock()
            .expect("lock")
            .insert(deployment.to_owned(), (requests, tokens));
        Arc::new(fleet)
    }

    fn left(&self, deployment: &str) -> (u64, u64) {
        self.left.lock().expect("lock")[deployment]
    }
}

impl SharedPacing for Fleet {
    fn take<'a>(&'a self, deployment: &'a str, limits: PaceLimits, tokens: u64) -> SharedTake<'a> {
        Box::pin(async move {
            // A round trip to the store.
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.takes
                .lock()
                .expect("lock")
                .push((deployment.to_owned(), limits, tokens));
            let mut left = self.left.lock().expect("lock");
            let (requests, available) = left.get_mut(deployment).expect("a known deployment");
            if *requests == 0 || *available < tokens {
                return Err(Instant::now() + ROOM_IN);
            }
            *requests -= 1;
            *available -= tokens;
            Ok(SharedTicket::shared(tokens))
        })
    }

    fn give_back(&self, deployment: &str, _limits: PaceLimits, tokens: u64) {
        self.given_back
            .lock()
            .expect("lock")
            .push((deployment.to_owned(), tokens));
        let mut left = self.left.lock().expect("lock");
        if let Some((_, available)) = left.get_mut(deployment) {
            *available += tokens;
        }
    }
}

/// A deployment that answers at once, having used `used` tokens, and
/// counts its calls.
fn answering(calls: &Arc<AtomicUsize>, used: u32) -> Svc {
    let calls = calls.clone();
    BoxCloneSyncService::new(service_fn(move |_req: ChatRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        let usage = Usage {
            prompt_tokens: used / 2,
            completion_tokens: used - used / 2,
            cached_input_tokens: 0,
        };
        async move { Ok(ChatResponse::builder("m").text("ok").usage(usage).build()) }
    }))
}

/// A request estimated at its input bound plus 100 tokens of output.
fn hello() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")]).with_max_tokens(100)
}

fn estimate() -> u64 {
    use tower_llm_pool::PoolRequest as _;
    hello().estimated_tokens().expect("an estimate")
}

const LIMITS: PaceLimits = PaceLimits {
    rpm: Some(100),
    tpm: Some(100_000),
    burst_ms: None,
};

#[tokio::test(start_paused = true)]
async fn the_pool_takes_from_the_fleet_after_the_replica_and_gives_back_what_was_not_used() {
    let fleet = Fleet::with("key-a", 2, 10_000);
    let store: Arc<dyn SharedPacing> = fleet.clone();
    let pacer = Arc::new(Pacer::new(LIMITS).with_shared(store, "key-a"));
    assert!(pacer.is_shared());
    let calls = Arc::new(AtomicUsize::new(0));
    let pool: Pool<Svc> = Pool::new(vec![
        Deployment::new("a", answering(&calls, 30)).with_pacer(pacer.clone()),
    ])
    .with_queue(0, Duration::ZERO);

    let est = estimate();
    pool.clone().oneshot(hello()).await.expect("room");
    // The fleet was asked, with the configured limits and the estimate,
    // under the deployment's shared name.
    assert_eq!(
        *fleet.takes.lock().expect("lock"),
        [("key-a".to_owned(), LIMITS, est)]
    );
    // What the answer did not use went back to the fleet's bucket (and to
    // the replica's).
    assert_eq!(
        *fleet.given_back.lock().expect("lock"),
        [("key-a".to_owned(), est - 30)]
    );
    assert_eq!(fleet.left("key-a"), (1, 10_000 - 30));
    // (The replica's bucket refilled a little over the fleet's 1 ms.)
    let tokens = pacer.snapshot().tokens.expect("paced");
    assert!((100_000 - 30..100_000 - 27).contains(&tokens), "{tokens}");

    pool.clone().oneshot(hello()).await.expect("room");
    assert_eq!(fleet.left("key-a"), (0, 10_000 - 60));

    // The replica has room (98 requests), the fleet none: the call fails
    // as rate limited, with the fleet's time to room, and what the
    // replica took for it is given back.
    let before = pacer.snapshot();
    let failure = pool.clone().oneshot(hello()).await.expect_err("paced");
    assert_eq!(failure.class(), FailureClass::RateLimited);
    let wait = failure.retry_after().expect("a wait");
    assert!(
        wait <= ROOM_IN && wait >= ROOM_IN - Duration::from_millis(2),
        "{wait:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2, "not sent");
    let after = pacer.snapshot();
    assert_eq!(after.requests, before.requests);
    assert!(after.tokens >= before.tokens, "{before:?} {after:?}");
    assert_eq!(fleet.given_back.lock().expect("lock").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_deployment_the_fleet_has_no_room_for_is_skipped() {
    // `a` has no room left in the fleet; `b` does.
    let fleet = Fleet::with("key-a", 0, 10_000);
    fleet
        .left
        .lock()
        .expect("lock")
        .insert("key-b".to_owned(), (5, 10_000));
    let store: Arc<dyn SharedPacing> = fleet.clone();
    let calls = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let pool: Pool<Svc> = Pool::new(vec![
        Deployment::new("a", answering(&calls[0], 10)).with_pacer(Arc::new(
            Pacer::new(LIMITS).with_shared(store.clone(), "key-a"),
        )),
        Deployment::new("b", answering(&calls[1], 10))
            .with_pacer(Arc::new(Pacer::new(LIMITS).with_shared(store, "key-b"))),
    ]);
    for _ in 0..4 {
        pool.clone().oneshot(hello()).await.expect("b has room");
    }
    assert_eq!(calls[0].load(Ordering::SeqCst), 0);
    assert_eq!(calls[1].load(Ordering::SeqCst), 4);
    assert_eq!(fleet.left("key-b").0, 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_call_gives_back_all_it_took_and_an_unpaced_pacer_never_asks_the_fleet() {
    let fleet = Fleet::with("key-a", 5, 10_000);
    let store: Arc<dyn SharedPacing> = fleet.clone();
    let failing: Svc = BoxCloneSyncService::new(service_fn(|_req: ChatRequest| async {
        Err::<ChatResponse, _>(
            Failure::new(FailureClass::BadRequest).with_status(http::StatusCode::BAD_REQUEST),
        )
    }));
    let pool: Pool<Svc> = Pool::new(vec![Deployment::new("a", failing).with_pacer(Arc::new(
        Pacer::new(LIMITS).with_shared(store.clone(), "key-a"),
    ))]);
    pool.oneshot(hello()).await.expect_err("refused");
    // A provider's refusal used no tokens: all of them go back.
    assert_eq!(
        *fleet.given_back.lock().expect("lock"),
        [("key-a".to_owned(), estimate())]
    );
    assert_eq!(fleet.left("key-a"), (4, 10_000));

    // No configured limit: nothing to share.
    let unpaced = Pacer::new(PaceLimits::default()).with_shared(store, "key-a");
    assert!(!unpaced.is_shared());
    let ticket = unpaced.take(10).await.expect("room");
    assert!(!ticket.is_shared());
    ticket.settle(0);
    assert_eq!(fleet.takes.lock().expect("lock").len(), 1);
}

/// A fleet store that never answers (a frozen one, seen from a caller
/// that leaves first).
#[derive(Debug)]
struct Silent;

impl SharedPacing for Silent {
    fn take<'a>(&'a self, _: &'a str, _: PaceLimits, _: u64) -> SharedTake<'a> {
        Box::pin(std::future::pending())
    }

    fn give_back(&self, _: &str, _: PaceLimits, _: u64) {}
}

#[tokio::test(start_paused = true)]
async fn a_take_dropped_while_the_fleet_answers_gives_this_replica_s_room_back() {
    let pacer = Pacer::new(PaceLimits {
        rpm: Some(60),
        tpm: Some(6_000),
        burst_ms: None,
    })
    .with_shared(Arc::new(Silent), "k1");
    let before = pacer.snapshot();
    let take = pacer.take(500);
    let left = tokio::time::timeout(Duration::from_millis(10), take).await;
    assert!(left.is_err(), "the fleet never answered");
    let after = pacer.snapshot();
    assert_eq!(
        (after.requests, after.tokens),
        (before.requests, before.tokens)
    );
}
