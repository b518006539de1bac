//! `Transport`: per-thread pools keep each thread's connections its own;
//! a shared client keeps one pool for every caller.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_llm_gateway::Transport;
use tower_llm_providers::mock::{MockServer, Reply};

/// One call through `transport`, its answer read whole.
async fn call(transport: &Transport, url: &str) {
    let req = http::Request::post(format!("{url}/v1/chat/completions"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    let res = transport.clone().oneshot(req).await.expect("an answer");
    assert_eq!(res.status(), 200);
    res.into_body().collect().await.expect("the body");
}

/// Three calls, one after the other, through `transport` from a new thread
/// with a single-threaded runtime of its own.
fn three_calls_from_a_thread(transport: Transport, url: String) {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            for _ in 0..3 {
                call(&transport, &url).await;
            }
        });
    })
    .join()
    .expect("the thread");
}

async fn connections_made_by_two_threads(transport: Transport) -> usize {
    let upstream = MockServer::start(Reply::openai_text("hi"))
        .await
        .expect("upstream");
    for _ in 0..2 {
        let (transport, url) = (transport.clone(), upstream.url());
        tokio::task::spawn_blocking(move || three_calls_from_a_thread(transport, url))
            .await
            .expect("the calls");
    }
    upstream.connections()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_thread_pools_are_each_threads_own() {
    let per_thread = Transport::per_thread(Duration::from_secs(5));
    assert_eq!(per_thread.connect_timeout(), Some(Duration::from_secs(5)));
    // Each thread's three calls reuse one connection: two threads, two.
    assert_eq!(connections_made_by_two_threads(per_thread).await, 2);

    // A shared client: one pool, whichever task calls.
    let client = tower_llm::providers::https::client_with_connect_timeout(Duration::from_secs(5));
    let shared = Transport::shared(client);
    assert_eq!(shared.connect_timeout(), None);
    let upstream = MockServer::start(Reply::openai_text("hi"))
        .await
        .expect("upstream");
    for _ in 0..2 {
        let (transport, url) = (shared.clone(), upstream.url());
        tokio::spawn(async move {
            for _ in 0..3 {
                call(&transport, &url).await;
            }
        })
        .await
        .expect("the calls");
    }
    assert_eq!(upstream.received().len(), 6);
}
