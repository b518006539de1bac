//! Hedging a slow tail: time to first token with and without a hedge.
//!
//! ```text
//! cargo run --release --example hedge
//! ```
//!
//! The primary (a real loopback HTTP server streaming OpenAI's format)
//! sends its first token after 150 to 250 ms, except on 5 % of calls, where
//! it takes 10 s; the backup (another server) always takes 150 to 250 ms.
//! 2,000 streamed calls, 20 at a time, first straight to the primary
//! (deadline → retry → breaker), then with a cross-provider hedge to the
//! backup (delay learned as the 0.9 quantile of recent times to first
//! token, at least 50 ms; budget 10 %). Time is tokio's paused clock and
//! every random choice comes from a seeded generator, so the run is
//! deterministic and takes seconds; latencies are in that virtual time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_llm::Link;
use tower_llm::hedge::{HedgeConfig, HedgeLayer};
use tower_llm::prelude::*;
use tower_llm::providers::https::{HttpsClient, client_with_connect_timeout};
use tower_llm::providers::{ApiKey, OpenAi, OpenAiConfig};
use tower_llm::retry::{RandomSource, SplitMix64};
use tower_llm_providers::mock::{MockServer, Recorded, Reply, Step, openai_stream_steps};

const CALLS: usize = 2_000;
const CONCURRENCY: usize = 20;

static PRIMARY: AtomicUsize = AtomicUsize::new(0);
static BACKUP: AtomicUsize = AtomicUsize::new(0);

/// The `n`th reply of a server seeded `seed`: a stream whose first token
/// comes after 150 to 250 ms, or after 10 s with probability `slow`.
fn reply(seed: u64, n: usize, slow: f64) -> Reply {
    let rng = SplitMix64::seeded(seed.wrapping_mul(1_000_003).wrapping_add(n as u64));
    let wait = if rng.next_fraction() < slow {
        Duration::from_secs(10)
    } else {
        Duration::from_millis(150 + (rng.next_fraction() * 100.0) as u64)
    };
    let mut steps = vec![Step::Pause(wait)];
    steps.extend(openai_stream_steps(&["hello", " world"], true));
    Reply::sse_steps(steps)
}

fn primary_reply(_: &Recorded) -> Reply {
    reply(1, PRIMARY.fetch_add(1, Ordering::SeqCst), 0.05)
}

fn backup_reply(_: &Recorded) -> Reply {
    reply(2, BACKUP.fetch_add(1, Ordering::SeqCst), 0.0)
}

fn openai(server: &MockServer) -> tower_llm::providers::Streaming<OpenAi<HttpsClient>> {
    OpenAi::new(
        client_with_connect_timeout(Duration::from_secs(5)),
        OpenAiConfig::new(ApiKey::new("demo")).with_base_url(&server.url()),
    )
    .streaming()
}

/// Times to first token of `CALLS` calls, `CONCURRENCY` at a time.
async fn run<S>(svc: S) -> Vec<Duration>
where
    S: Service<ChatRequest, Response = ChatStream, Error = Failure> + Clone + Send + 'static,
    S::Future: Send,
{
    let next = std::sync::Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let svc = svc.clone();
            let next = next.clone();
            tokio::spawn(async move {
                let mut ttft = Vec::new();
                while next.fetch_add(1, Ordering::SeqCst) < CALLS {
                    let start = Instant::now();
                    let req = ChatRequest::new("m", vec![Message::user("hi")]);
                    if svc.clone().oneshot(req).await.is_ok() {
                        ttft.push(start.elapsed());
                    }
                }
                ttft
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap_or_default());
    }
    all.sort();
    all
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
    sorted.get(i).copied().unwrap_or_default()
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let primary = MockServer::start(Reply::With(primary_reply)).await?;
    let backup = MockServer::start(Reply::With(backup_reply)).await?;
    primary.keep_last_request_only();
    backup.keep_last_request_only();

    let link = |server: &MockServer| {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::new())
            .llm_breaker(BreakerLayer::new())
            .service(openai(server))
    };

    let bare = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .service(link(&primary));
    let without = run(bare).await;
    let without_calls = PRIMARY.swap(0, Ordering::SeqCst);

    let hedge = HedgeLayer::new(HedgeConfig {
        quantile: Some(0.9),
        floor_ms: 50,
        delay_ms: 500,
        budget_ratio: 0.1,
        ..HedgeConfig::default()
    })?;
    let hedged = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .layer(hedge.clone().to(Link::new("backup", "m"), link(&backup)))
        .service(link(&primary));
    let with = run(hedged).await;
    let with_calls = PRIMARY.load(Ordering::SeqCst) + BACKUP.load(Ordering::SeqCst);

    let ms = |d: Duration| d.as_secs_f64() * 1_000.0;
    println!("{CALLS} streamed calls, {CONCURRENCY} at a time (virtual time)\n");
    println!("| | p50 time to first token | p99 time to first token | upstream calls per call |");
    println!("|---|---|---|---|");
    for (name, ttft, calls) in [
        ("primary alone", &without, without_calls),
        ("with a hedge to the backup", &with, with_calls),
    ] {
        println!(
            "| {name} | {:.0} ms | {:.0} ms | {:.3} |",
            ms(quantile(ttft, 0.5)),
            ms(quantile(ttft, 0.99)),
            calls as f64 / CALLS as f64
        );
    }
    println!(
        "\np99 cut {:.1}×; learned hedge delay at the end: {:.0} ms",
        ms(quantile(&without, 0.99)) / ms(quantile(&with, 0.99)),
        ms(hedge.delay())
    );
    Ok(())
}
