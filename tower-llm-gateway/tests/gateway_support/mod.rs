//! The gateway harness shared by the gateway's tests: the library's
//! `Gateway` served on loopback in front of two `MockServer`
//! providers, and a real HTTP client.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_llm::providers::ApiKey;
use tower_llm_providers::mock::{MockServer, Reply};

use tower_llm_gateway::{Gateway, GatewayConfig, KeySource};

pub(crate) fn policy(primary: &MockServer, backup: &MockServer, extra: &str) -> GatewayConfig {
    GatewayConfig::from_toml(&policy_text(primary, backup, extra, FULL_CHAIN))
        .expect("valid policy")
}

pub(crate) const FULL_CHAIN: &str = r#"[{ provider = "primary", model = "gpt-4o-mini" }, { provider = "backup", model = "claude-x" }]"#;

pub(crate) fn policy_text(
    primary: &MockServer,
    backup: &MockServer,
    extra: &str,
    chain: &str,
) -> String {
    format!(
        r#"
        [deadline]
        total_ms = 2000
        [retry]
        max_attempts = 3
        attempt_timeout_ms = 2000
        base_ms = 100
        factor = 2
        max_ms = 400
        jitter = "none"
        [breaker]
        consecutive_failures = 5
        cooldown_ms = 30000
        {extra}
        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "UNUSED"
        [[providers]]
        name = "backup"
        kind = "anthropic"
        base_url = "{}"
        api_key_env = "UNUSED"
        [[routes]]
        model = "smart"
        chain = {chain}
        "#,
        primary.url(),
        backup.url()
    )
}

pub(crate) struct Harness {
    pub(crate) gateway: Arc<Gateway>,
    pub(crate) url: String,
    pub(crate) primary: MockServer,
    pub(crate) backup: MockServer,
    pub(crate) client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    /// Stops the server gracefully when sent (or dropped).
    pub(crate) stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The server's task: ends once it has stopped.
    pub(crate) served: Option<tokio::task::JoinHandle<()>>,
}

pub(crate) async fn start(primary: Reply, backup: Reply, extra: &str) -> Harness {
    start_with(primary, backup, extra, FULL_CHAIN).await
}

/// As [`start`], with the route's `chain` written out (TOML).
pub(crate) async fn start_with(primary: Reply, backup: Reply, extra: &str, chain: &str) -> Harness {
    start_text(primary, backup, |p, b| policy_text(p, b, extra, chain)).await
}

/// As [`start`], with the whole policy file written by `text` from the two
/// mock providers.
pub(crate) async fn start_text(
    primary: Reply,
    backup: Reply,
    text: impl FnOnce(&MockServer, &MockServer) -> String,
) -> Harness {
    start_policy(primary, backup, |p, b| {
        GatewayConfig::from_toml(&text(p, b)).expect("valid policy")
    })
    .await
}

/// As [`start`], with the policy made by `policy` from the two mock
/// providers.
pub(crate) async fn start_policy<C: Into<GatewayConfig>>(
    primary: Reply,
    backup: Reply,
    policy: impl FnOnce(&MockServer, &MockServer) -> C,
) -> Harness {
    let primary = MockServer::start(primary).await.expect("primary");
    let backup = MockServer::start(backup).await.expect("backup");
    let keys: KeySource = Arc::new(|_| Ok(Some(ApiKey::new("sk-test-key"))));
    let transport =
        tower_llm::providers::https::client_with_connect_timeout(Duration::from_secs(5));
    let policy = policy(&primary, &backup);
    let gateway = Gateway::new(policy, transport, keys).expect("gateway");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let router = gateway.clone().router();
    let limits = gateway.server_limits();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        tower_llm_gateway::serve(listener, router, limits, async {
            let _ = stopped.await;
            Duration::from_secs(2)
        })
        .await;
    });
    Harness {
        gateway,
        url,
        primary,
        backup,
        client: Client::builder(TokioExecutor::new()).build_http(),
        stop: Some(stop),
        served: Some(served),
    }
}

pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: String,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("a JSON body")
    }
}

impl Harness {
    pub(crate) async fn send(
        &self,
        method: &str,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url))
            .header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(body.to_owned())))
            .expect("request");
        let res = self.client.request(req).await.expect("an answer");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    pub(crate) async fn chat(&self, body: &str) -> Answer {
        self.send("POST", "/v1/chat/completions", body, &[]).await
    }
}

pub(crate) const HELLO: &str =
    r#"{"model": "smart", "messages": [{"role": "user", "content": "Hello"}]}"#;
pub(crate) const HELLO_STREAM: &str =
    r#"{"model": "smart", "stream": true, "messages": [{"role": "user", "content": "Hello"}]}"#;
