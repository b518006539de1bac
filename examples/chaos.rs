//! Chaos: a few thousand calls against fault-injecting mock providers, once
//! through the bare provider and once through the full stack, side by side.
//!
//! ```text
//! cargo run --release --example chaos
//! ```
//!
//! The primary (a real loopback HTTP server speaking OpenAI's format) fails
//! in bursts of 503s, twice answers 429 with `Retry-After: 1` (the
//! breaker then holds its circuit open for that second), hangs, resets
//! connections, and is down from 4 s to 7 s into the run, then back;
//! the backup (Anthropic's format) is healthy and 40 ms slower. Time is
//! tokio's paused clock, so the run is deterministic and takes seconds;
//! latencies are in that virtual time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm::Metrics;
use tower_llm::breaker::BreakerConfig;
use tower_llm::prelude::*;
use tower_llm::providers::https::{HttpsClient, client_with_connect_timeout};
use tower_llm::providers::{Anthropic, AnthropicConfig, ApiKey, OpenAi, OpenAiConfig};
use tower_llm_providers::mock::{MockServer, Recorded, Reply};

const CALLS: usize = 3_000;
const CONCURRENCY: usize = 5;

static PRIMARY_CALLS: AtomicUsize = AtomicUsize::new(0);

/// When the current run started (virtual time).
static STARTED: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

fn since_start() -> Duration {
    STARTED
        .lock()
        .ok()
        .and_then(|s| *s)
        .map_or(Duration::ZERO, |s| s.elapsed())
}

/// The primary's behaviour on its `n`-th request.
fn primary(_req: &Recorded) -> Reply {
    let n = PRIMARY_CALLS.fetch_add(1, Ordering::Relaxed);
    let ok = || Reply::openai_text("primary").after(Duration::from_millis(20));
    let down = (4..7).contains(&since_start().as_secs());
    match n {
        // Down from 4 s to 7 s into the run, then back.
        _ if down => Reply::openai_error(503, "server_error", "down"),
        // Before the bursts: both numbers are multiples of 50.
        300 | 2_200 => Reply::openai_error(429, "rate_limit_error", "slow down")
            .with_header("retry-after", "1"),
        _ if n % 97 == 0 => Reply::Hang,
        _ if n % 89 == 0 => Reply::Reset,
        _ if n % 50 < 4 => Reply::openai_error(503, "server_error", "burst"),
        _ => ok(),
    }
}

fn backup(_req: &Recorded) -> Reply {
    Reply::anthropic_text("backup").after(Duration::from_millis(60))
}

struct Report {
    name: &'static str,
    ok: usize,
    latencies: Vec<Duration>,
    upstream: usize,
    failovers: usize,
    transitions: usize,
}

impl Report {
    fn percentile(&self, p: f64) -> Duration {
        let mut l = self.latencies.clone();
        l.sort();
        let i = ((l.len() as f64 - 1.0) * p).round() as usize;
        l.get(i).copied().unwrap_or_default()
    }
}

fn client() -> HttpsClient {
    client_with_connect_timeout(Duration::from_secs(2))
}

async fn run<S>(
    name: &'static str,
    svc: S,
    servers: &[&MockServer],
    transitions: Arc<AtomicUsize>,
) -> Report
where
    S: tower::Service<ChatRequest, Response = ChatResponse, Error = Failure>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    PRIMARY_CALLS.store(0, Ordering::Relaxed);
    if let Ok(mut started) = STARTED.lock() {
        *started = Some(Instant::now());
    }
    let before: usize = servers.iter().map(|s| s.received().len()).sum();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let svc = svc.clone();
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < CALLS {
                let req = ChatRequest::new("m", vec![Message::user("hi")]);
                let start = Instant::now();
                // The caller's own patience: 10 s (a bare hang never ends).
                let result =
                    tokio::time::timeout(Duration::from_secs(10), svc.clone().oneshot(req)).await;
                let failovers = match &result {
                    Ok(Ok(res)) => usize::from(res.fallback_position > 0),
                    _ => 0,
                };
                out.push((matches!(result, Ok(Ok(_))), start.elapsed(), failovers));
            }
            out
        }));
    }
    let mut report = Report {
        name,
        ok: 0,
        latencies: Vec::new(),
        upstream: 0,
        failovers: 0,
        transitions: 0,
    };
    for w in workers {
        for (ok, latency, failovers) in w.await.unwrap_or_default() {
            report.ok += usize::from(ok);
            report.latencies.push(latency);
            report.failovers += failovers;
        }
    }
    let after: usize = servers.iter().map(|s| s.received().len()).sum();
    report.upstream = after - before;
    report.transitions = transitions.load(Ordering::Relaxed);
    report
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let primary_server = MockServer::start(Reply::With(primary)).await.expect("server");
        let backup_server = MockServer::start(Reply::With(backup)).await.expect("server");
        let key = || ApiKey::new("mock");
        let openai = OpenAi::new(
            client(),
            OpenAiConfig::new(key()).with_base_url(&format!("{}/v1", primary_server.url())),
        );
        let anthropic = Anthropic::new(
            client(),
            AnthropicConfig::new(key()).with_base_url(&backup_server.url()),
        );

        // (a) The bare provider.
        let bare = run(
            "bare provider",
            openai.clone(),
            &[&primary_server],
            Arc::default(),
        )
        .await;

        // (b) The full stack.
        let transitions = Arc::new(AtomicUsize::new(0));
        let counted = transitions.clone();
        let breaker = BreakerLayer::new()
            .with_config(BreakerConfig {
                consecutive_failures: 5,
                cooldown: Duration::from_secs(5),
                ..BreakerConfig::default()
            })
            .expect("config")
            .on_transition(move |_t| {
                counted.fetch_add(1, Ordering::Relaxed);
            });
        let retry = RetryLayer::new()
            .with_max_attempts(3)
            .with_attempt_timeout(Duration::from_secs(2));
        let backup_link = ServiceBuilder::new()
            .llm_retry(retry.clone())
            .llm_breaker(breaker.clone())
            .service(anthropic);
        let primary_link = ServiceBuilder::new()
            .llm_retry(retry)
            .llm_breaker(breaker)
            .service(openai);
        let chain = FallbackLayer::builder(LinkSpec::new("primary", "m"))
            .or(LinkSpec::new("backup", "m"), backup_link)
            .with_metrics(Metrics::disabled())
            .build()
            .expect("chain");
        let stack = ServiceBuilder::new()
            .layer(DeadlineLayer::new(Duration::from_secs(8)).with_metrics(Metrics::disabled()))
            .llm_fallback(chain)
            .service(primary_link);
        let full = run(
            "full stack",
            stack,
            &[&primary_server, &backup_server],
            transitions,
        )
        .await;

        println!("{CALLS} calls, {CONCURRENCY} at a time, virtual time; primary: 503 bursts (8 %), 429 + Retry-After: 1 (twice),");
        println!("hangs (1 %), resets (1 %), down from 4 s to 7 s into the run; backup healthy, +40 ms.\n");
        println!(
            "| | success | p50 | p99 | p99.9 | upstream calls per call | failovers | breaker transitions |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for r in [&bare, &full] {
            println!(
                "| {} | {:.1} % | {} ms | {} ms | {} ms | {:.2} | {} | {} |",
                r.name,
                100.0 * r.ok as f64 / CALLS as f64,
                r.percentile(0.5).as_millis(),
                r.percentile(0.99).as_millis(),
                r.percentile(0.999).as_millis(),
                r.upstream as f64 / CALLS as f64,
                r.failovers,
                r.transitions,
            );
        }
    });
}
