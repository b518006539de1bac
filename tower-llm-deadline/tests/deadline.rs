//! Behaviour of the deadline layer under virtual time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready_err, assert_ready_ok, task};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt, service_fn};
use tower_llm_core::layer::AttemptLogExt as _;
use tower_llm_core::{
    AttemptLog, AttemptOutcome, AttemptRecord, Attempts, ChatRequest, ChatResponse, Deadline,
    Failure, FailureClass, Link, Message, Usage,
};
use tower_llm_deadline::{DeadlineLayer, EnforceDeadline};

/// Sets its flag when dropped: proves the inner future was cancelled.
struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

type Seen = Arc<std::sync::Mutex<Option<Deadline>>>;

type Http = BoxCloneService<http::Request<()>, http::Response<()>, Failure>;

/// An inner service that records the deadline it saw, then answers after
/// `delay`; the flag tells whether its future was dropped.
fn fixture(delay: Duration) -> (Seen, Arc<AtomicBool>, Http) {
    let seen = Seen::default();
    let dropped = Arc::new(AtomicBool::new(false));
    let (s, d) = (seen.clone(), dropped.clone());
    let svc = service_fn(move |req: http::Request<()>| {
        *s.lock().expect("lock") = Deadline::of(&req);
        let guard = DropFlag(d.clone());
        async move {
            let _guard = guard;
            tokio::time::sleep(delay).await;
            Ok::<_, Failure>(http::Response::new(()))
        }
    });
    (seen, dropped, BoxCloneService::new(svc))
}

#[tokio::test(start_paused = true)]
async fn seed_ac8_caller_deadline_5s_inner_10s() {
    let (seen, dropped, inner) = fixture(Duration::from_secs(10));
    let svc = DeadlineLayer::new(Duration::from_secs(30)).layer(inner);
    let start = Instant::now();
    let mut req = http::Request::new(());
    Deadline::at(start + Duration::from_secs(5)).store(&mut req);

    let err = svc.oneshot(req).await.expect_err("deadline exceeded");

    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert_eq!(err.class(), FailureClass::DeadlineExceeded);
    // Virtual time: exactly 5 s, well within the 50 ms allowance.
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(dropped.load(Ordering::SeqCst), "inner future still alive");
    assert_eq!(
        *seen.lock().expect("lock"),
        Some(Deadline::at(start + Duration::from_secs(5)))
    );
}

#[tokio::test(start_paused = true)]
async fn inner_is_dropped_when_the_deadline_fires_not_later() {
    let (_, dropped, inner) = fixture(Duration::from_secs(10));
    let svc = DeadlineLayer::new(Duration::from_secs(1)).layer(inner);
    let mut fut = task::spawn(svc.oneshot(http::Request::new(())));
    assert_pending!(fut.poll());
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_pending!(fut.poll());
    assert!(!dropped.load(Ordering::SeqCst));
    tokio::time::advance(Duration::from_millis(1)).await;
    let err = assert_ready_err!(fut.poll());
    assert!(err.is_deadline_exceeded());
    // The future itself is still held by `fut`, yet the inner call is gone.
    assert!(dropped.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn budget_wins_when_tightest() {
    let (seen, _, inner) = fixture(Duration::from_secs(10));
    let svc = DeadlineLayer::new(Duration::from_secs(2)).layer(inner);
    let start = Instant::now();
    let mut req = http::Request::new(());
    Deadline::at(start + Duration::from_secs(8)).store(&mut req);
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("4S"));
    let err = svc.oneshot(req).await.expect_err("deadline");
    assert!(err.is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(
        *seen.lock().expect("lock"),
        Some(Deadline::at(start + Duration::from_secs(2)))
    );
}

#[tokio::test(start_paused = true)]
async fn caller_deadline_wins_when_tightest() {
    let (seen, _, inner) = fixture(Duration::from_secs(10));
    let svc = DeadlineLayer::new(Duration::from_secs(30)).layer(inner);
    let start = Instant::now();
    let mut req = http::Request::new(());
    Deadline::at(start + Duration::from_millis(1500)).store(&mut req);
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("4S"));
    let err = svc.oneshot(req).await.expect_err("deadline");
    assert!(err.is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    assert_eq!(
        *seen.lock().expect("lock"),
        Some(Deadline::at(start + Duration::from_millis(1500)))
    );
}

#[tokio::test(start_paused = true)]
async fn grpc_timeout_wins_when_tightest() {
    let (seen, _, inner) = fixture(Duration::from_secs(10));
    let svc = DeadlineLayer::new(Duration::from_secs(30)).layer(inner);
    let start = Instant::now();
    let mut req = http::Request::new(());
    Deadline::at(start + Duration::from_secs(8)).store(&mut req);
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("750m"));
    let err = svc.oneshot(req).await.expect_err("deadline");
    assert!(err.is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::from_millis(750));
    assert_eq!(
        *seen.lock().expect("lock"),
        Some(Deadline::at(start + Duration::from_millis(750)))
    );
}

#[tokio::test(start_paused = true)]
async fn request_timeout_ms_header_is_honoured_and_garbage_ignored() {
    let (_, _, inner) = fixture(Duration::from_secs(10));
    let svc = DeadlineLayer::new(Duration::from_secs(3)).layer(inner);
    let start = Instant::now();
    let mut req = http::Request::new(());
    req.headers_mut().insert(
        "x-request-timeout-ms",
        http::HeaderValue::from_static("250"),
    );
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("1x"));
    assert!(
        svc.clone()
            .oneshot(req)
            .await
            .expect_err("deadline")
            .is_deadline_exceeded()
    );
    assert_eq!(start.elapsed(), Duration::from_millis(250));

    let start = Instant::now();
    let mut req = http::Request::new(());
    req.headers_mut()
        .insert("x-request-timeout-ms", http::HeaderValue::from_static("-5"));
    assert!(
        svc.oneshot(req)
            .await
            .expect_err("deadline")
            .is_deadline_exceeded()
    );
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn answer_ready_in_the_same_poll_as_the_deadline_wins() {
    let (_, _, inner) = fixture(Duration::from_secs(5));
    let svc = DeadlineLayer::new(Duration::from_secs(5)).layer(inner);
    let start = Instant::now();
    svc.oneshot(http::Request::new(()))
        .await
        .expect("answer at the deadline wins");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn expired_deadline_never_calls_inner() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = service_fn(move |_: http::Request<()>| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Failure>(http::Response::new(())) }
    });
    let svc = DeadlineLayer::new(Duration::from_secs(30)).layer(inner);
    let mut req = http::Request::new(());
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("0m"));
    let start = Instant::now();
    let err = svc.oneshot(req).await.expect_err("expired");
    assert!(err.is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn readiness_passes_through() {
    let (mock, mut handle) = tower_test::mock::pair::<http::Request<()>, http::Response<()>>();
    let mut svc =
        tower_test::mock::Spawn::new(DeadlineLayer::new(Duration::from_secs(1)).layer(mock));

    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());

    let fut = svc.call(http::Request::new(()));
    let (_req, send) = handle.next_request().await.expect("request");
    send.send_response(http::Response::new(()));
    fut.await.expect("response");

    // A readiness error is converted, never panics.
    handle.allow(1);
    handle.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    let err = assert_ready_err!(svc.poll_ready());
    assert!(err.is_transient());
}

#[tokio::test(start_paused = true)]
async fn inner_failures_pass_through_with_their_class() {
    let inner = service_fn(|_: http::Request<()>| async {
        Err::<http::Response<()>, _>(
            Failure::new(FailureClass::RateLimited).with_retry_after(Duration::from_secs(3)),
        )
    });
    let err = DeadlineLayer::new(Duration::from_secs(1))
        .layer(inner)
        .oneshot(http::Request::new(()))
        .await
        .expect_err("inner error");
    assert!(err.is_rate_limited());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));

    let io = service_fn(|_: http::Request<()>| async {
        Err::<http::Response<()>, _>(std::io::Error::from(std::io::ErrorKind::TimedOut))
    });
    let err = DeadlineLayer::new(Duration::from_secs(1))
        .layer(io)
        .oneshot(http::Request::new(()))
        .await
        .expect_err("io error");
    assert!(err.is_timeout());
}

fn record(n: u8) -> AttemptRecord {
    AttemptRecord::new(
        &Link::new("mock", "m"),
        n,
        AttemptOutcome::Failed(FailureClass::Transient),
        Duration::from_millis(10),
    )
}

/// An inner layer that appends one record per call, as retry will; `None`
/// from `answer` means "never answer".
fn appending<F>(answer: F) -> Http
where
    F: Fn() -> Option<Result<http::Response<()>, Failure>> + Clone + Send + 'static,
{
    BoxCloneService::new(service_fn(move |req: http::Request<()>| {
        let log = AttemptLog::of(&req).cloned();
        let answer = answer.clone();
        async move {
            log.expect("the deadline layer installs a log")
                .push(record(1))
                .expect("push");
            match answer() {
                Some(result) => result,
                None => std::future::pending().await,
            }
        }
    }))
}

#[tokio::test(start_paused = true)]
async fn attempts_reach_the_response_the_error_and_the_deadline_error() {
    // An http::Response gets the records only when its request asks.
    let ok = DeadlineLayer::new(Duration::from_secs(1))
        .layer(appending(|| Some(Ok(http::Response::new(())))))
        .oneshot(kept())
        .await
        .expect("ok");
    assert_eq!(
        ok.extensions().get::<Attempts>(),
        Some(&Attempts(vec![record(1)]))
    );
    let plain = DeadlineLayer::new(Duration::from_secs(1))
        .layer(appending(|| Some(Ok(http::Response::new(())))))
        .oneshot(http::Request::new(()))
        .await
        .expect("ok");
    assert!(plain.extensions().is_empty(), "no map unless asked");

    let err = DeadlineLayer::new(Duration::from_secs(1))
        .layer(appending(|| {
            Some(Err(Failure::new(FailureClass::BadRequest)))
        }))
        .oneshot(http::Request::new(()))
        .await
        .expect_err("bad request");
    assert!(err.is_bad_request());
    assert_eq!(err.attempts(), &[record(1)]);

    let err = DeadlineLayer::new(Duration::from_secs(1))
        .layer(appending(|| None))
        .oneshot(http::Request::new(()))
        .await
        .expect_err("hangs");
    assert!(err.is_deadline_exceeded());
    assert_eq!(err.attempts(), &[record(1)]);
}

#[tokio::test(start_paused = true)]
async fn nested_deadlines_attach_the_log_once_and_keep_the_earliest() {
    let inner = appending(|| Some(Ok(http::Response::new(()))));
    let svc = DeadlineLayer::new(Duration::from_secs(1))
        .layer(DeadlineLayer::new(Duration::from_secs(9)).layer(inner));
    let res = svc.oneshot(kept()).await.expect("ok");
    // One record: the inner deadline layer did not create a second log.
    assert_eq!(
        res.extensions().get::<Attempts>().map(|a| a.0.len()),
        Some(1)
    );

    let (seen, _, slow) = fixture(Duration::from_secs(10));
    let start = Instant::now();
    let svc = DeadlineLayer::new(Duration::from_secs(1))
        .layer(DeadlineLayer::new(Duration::from_secs(9)).layer(slow));
    assert!(
        svc.oneshot(http::Request::new(()))
            .await
            .expect_err("deadline")
            .is_deadline_exceeded()
    );
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(
        *seen.lock().expect("lock"),
        Some(Deadline::at(start + Duration::from_secs(1)))
    );
}

#[tokio::test(start_paused = true)]
async fn typed_chat_requests_work_too() {
    let inner = service_fn(|req: ChatRequest| async move {
        let remaining = Deadline::remaining_in(&req).expect("deadline set");
        assert_eq!(remaining, Duration::from_secs(2));
        AttemptLog::of(&req).expect("log").push(record(1))?;
        Ok::<_, Failure>(ChatResponse {
            id: "1".into(),
            model: req.model.to_string(),
            provider: "mock".into(),
            fallback_position: 0,
            degraded: false,
            idempotent_replayed: false,
            cache: None,
            choices: vec![],
            usage: Usage::default(),
            latency: Duration::ZERO,
            attempts: vec![],
        })
    });
    let svc = EnforceDeadline::new(inner, Duration::from_secs(2));
    let res = svc
        .oneshot(ChatRequest::new("m", vec![Message::user("hi")]))
        .await
        .expect("ok");
    assert_eq!(res.attempts, vec![record(1)]);
}

/// A request that asks for the attempt records on its response.
fn kept() -> http::Request<()> {
    let mut req = http::Request::new(());
    req.extensions_mut().insert(tower_llm_core::KeepAttempts);
    req
}
