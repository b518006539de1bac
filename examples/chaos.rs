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
//! tokio's paused clock and every random choice (the retry jitter) comes
//! from one seed, so the run is deterministic (the same seed prints the
//! same table; `tests/chaos.rs` checks it) and takes seconds; latencies
//! are in that virtual time.
//!
//! ```text
//! cargo run --release --example chaos -- --seed 7 --svg chaos.svg
//! ```
//!
//! `--seed N` (default 1) seeds the jitter; `--svg FILE` writes the latency
//! distribution of both runs (a CDF on a log axis) as an SVG picture.

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
use tower_llm::retry::SplitMix64;
use tower_llm_providers::mock::{MockServer, Recorded, Reply};

/// Calls per run when run as an example.
pub const CALLS: usize = 3_000;
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

/// What one run measured.
#[derive(Debug)]
pub struct Report {
    name: &'static str,
    calls: usize,
    ok: usize,
    /// Every call's latency, in the order the calls ended.
    pub latencies: Vec<Duration>,
    /// The latencies of the calls that succeeded.
    pub answered: Vec<Duration>,
    upstream: usize,
    failovers: usize,
    transitions: usize,
}

impl Report {
    /// The latency at quantile `p`.
    pub fn percentile(&self, p: f64) -> Duration {
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
    calls: usize,
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
            while next.fetch_add(1, Ordering::Relaxed) < calls {
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
        calls,
        ok: 0,
        latencies: Vec::new(),
        answered: Vec::new(),
        upstream: 0,
        failovers: 0,
        transitions: 0,
    };
    for w in workers {
        for (ok, latency, failovers) in w.await.unwrap_or_default() {
            report.ok += usize::from(ok);
            report.latencies.push(latency);
            if ok {
                report.answered.push(latency);
            }
            report.failovers += failovers;
        }
    }
    let after: usize = servers.iter().map(|s| s.received().len()).sum();
    report.upstream = after - before;
    report.transitions = transitions.load(Ordering::Relaxed);
    report
}

/// Runs `calls` calls through the bare provider, then through the full
/// stack, with the retry jitter seeded by `seed`; returns both reports.
pub fn chaos(seed: u64, calls: usize) -> [Report; 2] {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let primary_server = MockServer::start(Reply::With(primary))
            .await
            .expect("server");
        let backup_server = MockServer::start(Reply::With(backup))
            .await
            .expect("server");
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
            calls,
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
            .with_attempt_timeout(Duration::from_secs(2))
            .with_rng(SplitMix64::seeded(seed));
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
            calls,
            stack,
            &[&primary_server, &backup_server],
            transitions,
        )
        .await;
        [bare, full]
    })
}

/// The reports as a Markdown table.
pub fn table(reports: &[Report]) -> String {
    let mut out = String::from(
        "| | success | p50 | p99 | p99.9 | upstream calls per call | failovers | breaker transitions |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        out.push_str(&format!(
            "| {} | {:.1} % | {} ms | {} ms | {} ms | {:.2} | {} | {} |\n",
            r.name,
            100.0 * r.ok as f64 / r.calls.max(1) as f64,
            r.percentile(0.5).as_millis(),
            r.percentile(0.99).as_millis(),
            r.percentile(0.999).as_millis(),
            r.upstream as f64 / r.calls.max(1) as f64,
            r.failovers,
            r.transitions,
        ));
    }
    out
}

/// The latency distributions of `reports` as an SVG picture: for each
/// latency (x, log scale, 1 ms to 10 s), the share of calls answered
/// successfully by then
/// (y, on a percentile scale: 0, 90, 99, 99.9 % equally spaced, so the
/// tail shows), one line per report.
pub fn svg(reports: &[Report]) -> String {
    const W: f64 = 720.0;
    const H: f64 = 400.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 40.0;
    const BOTTOM: f64 = 50.0;
    let (x0, x1) = (0.0_f64, 4.0_f64); // log10 of 1 ms .. 10 s
    let px =
        |ms: f64| LEFT + (ms.max(1.0).log10().clamp(x0, x1) - x0) / (x1 - x0) * (W - LEFT - RIGHT);
    // -log10(1 - share): 0 % at 0, 90 % at 1, 99 % at 2, 99.9 % at 3.
    let nines = |share: f64| (-(1.0 - share).max(1e-4).log10()).clamp(0.0, 4.0);
    let py = |share: f64| TOP + (1.0 - nines(share) / 4.0) * (H - TOP - BOTTOM);
    let colours = ["#c0392b", "#2471a3"];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"22\" font-size=\"14\">Chaos run: share of calls answered successfully by each latency (virtual time)</text>\n"
    );
    for (i, label) in ["1 ms", "10 ms", "100 ms", "1 s", "10 s"]
        .iter()
        .enumerate()
    {
        let x = px(10f64.powi(i as i32));
        out.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>\n",
            H - BOTTOM,
            H - BOTTOM + 18.0
        ));
    }
    for (share, label) in [
        (0.0, "0 %"),
        (0.9, "90 %"),
        (0.99, "99 %"),
        (0.999, "99.9 %"),
        (0.9999, "99.99 %"),
    ] {
        let y = py(share);
        out.push_str(&format!(
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>\n",
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
        ));
    }
    for (r, colour) in reports.iter().zip(colours) {
        // Failed calls are never "done": a line tops out at its success
        // rate.
        let mut sorted = r.answered.clone();
        sorted.sort();
        let n = r.calls.max(1) as f64;
        let mut points = String::new();
        for (i, l) in sorted.iter().enumerate() {
            let (x, y) = (px(l.as_secs_f64() * 1_000.0), py((i + 1) as f64 / n));
            points.push_str(&format!("{x:.1},{y:.1} "));
        }
        // The plateau: never more than the success rate.
        let last = py(sorted.len() as f64 / n);
        points.push_str(&format!("{:.1},{last:.1}", px(10_000.0)));
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{points}\"/>\n"
        ));
    }
    for (i, (r, colour)) in reports.iter().zip(colours).enumerate() {
        let y = H - BOTTOM - 44.0 + 18.0 * i as f64;
        out.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"14\" height=\"4\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            LEFT + 16.0,
            y - 4.0,
            LEFT + 36.0,
            y,
            r.name
        ));
    }
    out.push_str("</svg>\n");
    out
}

#[allow(dead_code)]
fn main() {
    let mut seed = 1u64;
    let mut svg_path = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seed" => match args.next().and_then(|s| s.parse().ok()) {
                Some(s) => seed = s,
                None => {
                    eprintln!("--seed needs a number");
                    std::process::exit(2);
                }
            },
            "--svg" => svg_path = args.next(),
            other => {
                eprintln!("unknown argument {other:?} (use --seed N, --svg FILE)");
                std::process::exit(2);
            }
        }
    }
    let reports = chaos(seed, CALLS);
    println!(
        "{CALLS} calls, {CONCURRENCY} at a time, virtual time, seed {seed}; primary: 503 bursts (8 %), 429 + Retry-After: 1 (twice),"
    );
    println!(
        "hangs (1 %), resets (1 %), down from 4 s to 7 s into the run; backup healthy, +40 ms.\n"
    );
    print!("{}", table(&reports));
    if let Some(path) = svg_path {
        if let Err(e) = std::fs::write(&path, svg(&reports)) {
            eprintln!("could not write {path}: {e}");
            std::process::exit(1);
        }
        println!("\nlatency picture written to {path}");
    }
}
