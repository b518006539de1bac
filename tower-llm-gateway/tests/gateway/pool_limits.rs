//! `[[pools]]` against an upstream that really enforces rate limits per
//! API key (`LimitedUpstream`): three keys of 5 requests (and 150
//! tokens) per 2 s each, a steady load of 3 calls a second (more than one
//! key takes, well within the three): paced by the pool, every call is
//! served, no key is sent more than its limit, and (almost) no call is
//! sent twice; the same load over a plain chain of the three keys meets
//! 429s. Real time (loopback HTTP does not hold a paused clock back):
//! each test takes about `LOAD_FOR`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower_llm::providers::ApiKey;
use tower_llm_gateway::{Gateway, GatewayConfig, KeySource};
use tower_llm_test_support::{KeyStats, LimitedUpstream, Limits};

use crate::support::HELLO;

/// Each key: 5 requests and 150 tokens (5 calls of 30) in any 2 s.
const REQUESTS: u32 = 5;
const TOKENS: u32 = 150;
const WINDOW: Duration = Duration::from_secs(2);
/// The keys, one provider each.
const KEYS: [&str; 3] = ["k1", "k2", "k3"];
/// The load: 3 calls a second for 10 s.
const RATE: u32 = 3;
const LOAD_FOR: Duration = Duration::from_secs(10);

/// Three OpenAI providers `k1`..`k3` on `upstream`, each with `extra`
/// lines (its `rpm`/`tpm`), then `rest` (pools and routes).
fn policy(upstream: &LimitedUpstream, extra: &str, rest: &str) -> String {
    let mut text = String::from(
        r#"
        [deadline]
        total_ms = 5000
        [retry]
        max_attempts = 1
        "#,
    );
    for key in KEYS {
        text.push_str(&format!(
            r#"
        [[providers]]
        name = "{key}"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "UNUSED"
        {extra}
        "#,
            upstream.url()
        ));
    }
    text.push_str(rest);
    text
}

/// One pool `keys` over the three providers; the route `smart` over it.
const POOLED: &str = r#"
        [[pools]]
        name = "keys"
        deployments = [{ provider = "k1" }, { provider = "k2" }, { provider = "k3" }]
        [[routes]]
        model = "smart"
        chain = [{ provider = "keys", model = "m" }]
        "#;

/// The route `smart` over the three keys in turn, no pool.
const CHAINED: &str = r#"
        [[routes]]
        model = "smart"
        chain = [
          { provider = "k1", model = "m" },
          { provider = "k2", model = "m" },
          { provider = "k3", model = "m" },
        ]
        "#;

/// The gateway of `policy` on loopback, each provider calling with its
/// own key: `sk-<provider name>`.
struct Harness {
    url: String,
    client: Client<HttpConnector, Full<Bytes>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(policy: &str) -> Harness {
    let config = GatewayConfig::from_toml(policy).expect("valid policy");
    let keys: KeySource = Arc::new(|p| Ok(Some(ApiKey::new(format!("sk-{}", p.name)))));
    let transport =
        tower_llm::providers::https::client_with_connect_timeout(Duration::from_secs(5));
    let gateway = Gateway::new(config, transport, keys).expect("gateway");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let router = gateway.clone().router();
    let limits = gateway.server_limits();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tower_llm_gateway::serve(listener, router, limits, async {
            let _ = stopped.await;
            Duration::from_secs(2)
        })
        .await;
    });
    Harness {
        url,
        client: Client::builder(TokioExecutor::new()).build_http(),
        _stop: stop,
    }
}

/// What a load run saw.
#[derive(Debug)]
struct Run {
    calls: usize,
    /// Client-visible failures (a status other than 200).
    errors: usize,
    /// Calls the upstream received (answered and 429).
    upstream: u64,
    rejected: u64,
    keys: Vec<(String, KeyStats)>,
}

impl Run {
    fn upstream_per_call(&self) -> f64 {
        self.upstream as f64 / self.calls as f64
    }

    /// The most requests any key was sent within one window.
    fn max_offered(&self) -> u32 {
        self.keys
            .iter()
            .map(|(_, s)| s.max_offered_in_window)
            .max()
            .unwrap_or(0)
    }

    fn print(&self, name: &str) {
        eprintln!(
            "{name}: {} calls, {} client errors, {} upstream calls ({:.3} per call), {} 429s, \
             max sent to one key in a {:?} window: {} (limit {REQUESTS})",
            self.calls,
            self.errors,
            self.upstream,
            self.upstream_per_call(),
            self.rejected,
            WINDOW,
            self.max_offered()
        );
        for (key, s) in &self.keys {
            eprintln!(
                "  {key}: {} answered, {} 429s, max sent in a window {}",
                s.answered, s.rejected, s.max_offered_in_window
            );
        }
    }
}

/// `RATE` calls a second for `LOAD_FOR`, each on a task of its own; every
/// answer awaited.
async fn load(h: &Harness, upstream: &LimitedUpstream) -> Run {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let n = (LOAD_FOR.as_millis() * u128::from(RATE) / 1000) as usize;
    let mut calls = Vec::with_capacity(n);
    for _ in 0..n {
        tick.tick().await;
        let client = h.client.clone();
        let req = http::Request::post(format!("{}/v1/chat/completions", h.url))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(HELLO.as_bytes())))
            .expect("request");
        calls.push(tokio::spawn(async move {
            let res = client.request(req).await.expect("an answer");
            let status = res.status().as_u16();
            let body = res.into_body().collect().await.expect("body").to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }));
    }
    let mut errors = 0;
    for call in calls {
        let (status, body) = call.await.expect("the call's task");
        if status != 200 {
            if errors == 0 {
                eprintln!("first client error: {status} {body}");
            }
            errors += 1;
        }
    }
    let total = upstream.total();
    Run {
        calls: n,
        errors,
        upstream: total.answered + total.rejected,
        rejected: total.rejected,
        keys: upstream.all_stats(),
    }
}

fn limited() -> Limits {
    Limits::new(REQUESTS, TOKENS, WINDOW)
}

/// The providers' `rpm`/`tpm`: the keys' limits per minute.
fn paced() -> String {
    let l = limited();
    format!(
        "rpm = {}\n        tpm = {}",
        l.per_minute(REQUESTS),
        l.per_minute(TOKENS)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_paced_under_each_key_s_limits_serves_a_steady_load_with_no_429_and_no_key_over() {
    let upstream = LimitedUpstream::start(limited()).await;
    let h = start(&policy(&upstream, &paced(), POOLED)).await;
    let run = load(&h, &upstream).await;
    run.print("pool, rpm/tpm and headers");
    assert_eq!(run.errors, 0, "{run:?}");
    assert!(run.upstream_per_call() <= 1.02, "{run:?}");
    assert!(
        run.max_offered() <= REQUESTS,
        "a key over its limit: {run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_without_rpm_or_tpm_is_paced_by_the_keys_rate_limit_headers_alone() {
    let upstream = LimitedUpstream::start(limited()).await;
    let h = start(&policy(&upstream, "", POOLED)).await;
    let run = load(&h, &upstream).await;
    run.print("pool, headers only");
    assert_eq!(run.errors, 0, "{run:?}");
    assert!(run.upstream_per_call() <= 1.02, "{run:?}");
    assert!(
        run.max_offered() <= REQUESTS,
        "a key over its limit: {run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_load_over_a_plain_chain_of_the_keys_meets_429s() {
    let upstream = LimitedUpstream::start(limited()).await;
    let h = start(&policy(&upstream, "", CHAINED)).await;
    let run = load(&h, &upstream).await;
    run.print("plain chain k1 > k2 > k3, no pool");
    // The first key takes all of it: more than its limit, 429s, calls
    // sent twice.
    assert!(run.max_offered() > REQUESTS, "{run:?}");
    assert!(run.rejected > 0, "{run:?}");
    assert!(run.upstream_per_call() > 1.02, "{run:?}");
}
