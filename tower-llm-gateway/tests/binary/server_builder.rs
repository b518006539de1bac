//! The gateway's server builder in-process (what the binary runs): two
//! workers on one port, both serving one gateway, and a shutdown that lets
//! a call in flight finish before `serve` returns. Real threads and real
//! time (the workers run runtimes of their own): bounded waits only.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower_llm::providers::ApiKey;
use tower_llm_gateway::{Gateway, GatewayConfig, GatewayServer, KeySource};
use tower_llm_providers::mock::{MockServer, Reply};

use crate::support::send;

const HELLO: &str = r#"{"model": "smart", "messages": [{"role": "user", "content": "Hello"}]}"#;

async fn gateway(upstream: &MockServer) -> Arc<Gateway> {
    let config = GatewayConfig::from_toml(&format!(
        r#"
        [deadline]
        total_ms = 5000
        [retry]
        max_attempts = 1
        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "UNUSED"
        [[routes]]
        model = "smart"
        chain = [{{ provider = "primary", model = "gpt-4o-mini" }}]
        "#,
        upstream.url()
    ))
    .expect("a valid config");
    let keys: KeySource = Arc::new(|_| Ok(Some(ApiKey::new("sk-test"))));
    let transport =
        tower_llm::providers::https::client_with_connect_timeout(Duration::from_secs(5));
    Gateway::new(config, transport, keys).expect("a gateway")
}

async fn chat(client: &Client<HttpConnector, Full<Bytes>>, url: &str) -> (u16, String) {
    send(client, "POST", &format!("{url}/v1/chat/completions"), HELLO).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_serve_one_gateway_and_shutdown_lets_a_call_in_flight_finish() {
    let upstream = MockServer::start(Reply::openai_text("hi"))
        .await
        .expect("upstream");
    let server = GatewayServer::new(gateway(&upstream).await)
        .with_workers(NonZeroUsize::new(2).expect("two"))
        .bind("127.0.0.1:0")
        .await
        .expect("bound");
    let url = format!("http://{}", server.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    // A connection per call, so both workers' listeners take some.
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    for _ in 0..20 {
        let (status, body) = chat(&client, &url).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(upstream.received().len(), 20);

    // A slow call, then the shutdown while it is in flight.
    upstream.push(Reply::openai_text("late").after(Duration::from_millis(500)));
    let in_flight = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { chat(&client, &url).await })
    };
    tokio::time::timeout(Duration::from_secs(5), async {
        while upstream.received().len() < 21 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the slow call reached the upstream");
    stop.send(()).expect("the server is running");
    let (status, body) = in_flight.await.expect("the call");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("late"), "{body}");
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("serve returns once the call is done")
        .expect("its task")
        .expect("served");
    // Nothing listens any more.
    assert!(
        tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
            .await
            .is_err()
    );
}
