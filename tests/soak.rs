//! The chaos soak: many calls through the full stack (deadline →
//! idempotency → fallback of three → hedge (on the primary) → retry →
//! breaker, unary and streamed; one call in ten with an idempotency key)
//! over real loopback HTTP
//! against mock servers that inject every fault at once, then a total
//! outage. Asserts, and prints as a table:
//!
//! - no panic (a panic fails the test);
//! - every call ended by its deadline + 50 ms (the largest overshoot is
//!   printed);
//! - success ≥ 99.9 % while the backup is healthy (outside the outage
//!   and the breakers' cooldown after it);
//! - at most 1.2 upstream calls per call during the total outage (and
//!   that cooldown);
//! - no streamed chunk twice, none out of order;
//! - open file descriptors and live tasks at the end as after the
//!   warm-up (±10 %), resident memory within 10 % (+4 MiB).
//!
//! Time is tokio's paused clock: the soak takes seconds, not hours.
//! `SOAK_CALLS` sets the number of calls (default 100,000, about 100 s in a
//! debug build; more for a long run).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm::breaker::BreakerConfig;
use tower_llm::hedge::{HedgeConfig, HedgeLayer};
use tower_llm::idempotency::{IdempotencyConfig, IdempotencyLayer};
use tower_llm::prelude::*;
use tower_llm::providers::https::{HttpsClient, client_with_connect_timeout};
use tower_llm::providers::{Anthropic, AnthropicConfig, ApiKey, OpenAi, OpenAiConfig};
use tower_llm::retry::SplitMix64;
use tower_llm::{ChatChunk, IdempotencyKey, Metrics};
use tower_llm_providers::mock::{
    MockServer, Recorded, Reply, Step, anthropic_stream_steps, openai_stream_steps,
};

const CONCURRENCY: usize = 20;
const DEADLINE: Duration = Duration::from_secs(8);

static STARTED: Mutex<Option<Instant>> = Mutex::new(None);
static PRIMARY_CALLS: AtomicUsize = AtomicUsize::new(0);
static BACKUP_CALLS: AtomicUsize = AtomicUsize::new(0);

/// The total outage: every link down from `OUTAGE.0` to `OUTAGE.1`
/// seconds into the run (virtual time).
static OUTAGE: Mutex<(u64, u64)> = Mutex::new((u64::MAX, u64::MAX));

fn since_start() -> Duration {
    STARTED
        .lock()
        .ok()
        .and_then(|s| *s)
        .map_or(Duration::ZERO, |s| s.elapsed())
}

fn in_outage() -> bool {
    let now = since_start().as_secs();
    let (from, to) = *OUTAGE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    (from..to).contains(&now)
}

/// The outage and the breakers' cooldown after it (both circuits open
/// until their probes succeed): calls then may fail fast.
fn in_outage_phase() -> bool {
    let now = since_start().as_secs();
    let (from, to) = *OUTAGE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    (from..to.saturating_add(COOLDOWN_S + 2)).contains(&now)
}

const COOLDOWN_S: u64 = 5;

fn streamed(req: &Recorded) -> bool {
    req.body.windows(13).any(|w| w == b"\"stream\":true")
}

/// Numbered pieces: a duplicated or reordered chunk shows.
fn pieces() -> Vec<String> {
    (0..6).map(|i| format!("<{i}>")).collect()
}

fn primary(req: &Recorded) -> Reply {
    let n = PRIMARY_CALLS.fetch_add(1, Ordering::Relaxed);
    if in_outage() {
        return Reply::openai_error(503, "server_error", "down");
    }
    let p = pieces();
    let p: Vec<&str> = p.iter().map(String::as_str).collect();
    let stream = streamed(req);
    match n % 100 {
        // 503 bursts.
        0..=5 => Reply::openai_error(503, "server_error", "burst"),
        // 429 storms with Retry-After.
        6..=8 => Reply::openai_error(429, "rate_limit_error", "slow down")
            .with_header("retry-after", "1"),
        // Hangs.
        9 => Reply::Hang,
        // Resets.
        10 => Reply::Reset,
        // Mid-stream drops: one in 2,000 a stream that breaks off after a
        // few frames (committed or not: it ends with an error or fails
        // over, and never repeats a chunk), the others before any content
        // (the call fails over).
        _ if stream && n % 2_000 == 1_999 => {
            let mut steps = openai_stream_steps(&p, false);
            steps.truncate(3);
            steps.push(Step::Break);
            Reply::sse_steps(steps)
        }
        11 if stream => Reply::sse_steps(vec![
            Step::Send(bytes::Bytes::from_static(b": keep-alive\n\n")),
            Step::Break,
        ]),
        11 => Reply::stream(
            "application/json",
            vec![
                Step::Send(bytes::Bytes::from_static(b"{\"id\":")),
                Step::Break,
            ],
        ),
        // Slow bodies.
        12 if stream => {
            let steps = openai_stream_steps(&p, true)
                .into_iter()
                .flat_map(|s| [s, Step::Pause(Duration::from_millis(300))])
                .collect();
            Reply::sse_steps(steps)
        }
        12 => Reply::openai_text("slow").after(Duration::from_millis(1_500)),
        _ if stream => Reply::openai_stream(&p),
        _ => Reply::openai_text("primary").after(Duration::from_millis(20)),
    }
}

fn backup(req: &Recorded) -> Reply {
    BACKUP_CALLS.fetch_add(1, Ordering::Relaxed);
    if in_outage() {
        return Reply::openai_error(503, "server_error", "down");
    }
    if streamed(req) {
        let p = pieces();
        let p: Vec<&str> = p.iter().map(String::as_str).collect();
        Reply::sse_steps(anthropic_stream_steps(&p, true))
    } else {
        Reply::anthropic_text("backup").after(Duration::from_millis(60))
    }
}

fn client() -> HttpsClient {
    client_with_connect_timeout(Duration::from_secs(2))
}

/// Open file descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[derive(Default)]
struct Tally {
    calls: usize,
    ok: usize,
    healthy_calls: usize,
    healthy_ok: usize,
    outage_calls: usize,
    max_overshoot: Duration,
    duplicated: usize,
    replayed: usize,
    hedged: usize,
}

#[test]
fn soak_under_every_fault_at_once() {
    let calls: usize = std::env::var("SOAK_CALLS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let primary_server = MockServer::start(Reply::With(primary)).await.expect("server");
        let backup_server = MockServer::start(Reply::With(backup)).await.expect("server");
        let third_server = MockServer::start(Reply::With(backup)).await.expect("server");
        primary_server.keep_last_request_only();
        backup_server.keep_last_request_only();
        third_server.keep_last_request_only();
        let openai = OpenAi::new(
            client(),
            OpenAiConfig::new(ApiKey::new("k")).with_base_url(&format!("{}/v1", primary_server.url())),
        );
        let anthropic = Anthropic::new(
            client(),
            AnthropicConfig::new(ApiKey::new("k")).with_base_url(&backup_server.url()),
        );
        let third = Anthropic::new(
            client(),
            AnthropicConfig::new(ApiKey::new("k")).with_base_url(&third_server.url()),
        );
        // The primary's attempts are hedged (same link) after 300 ms; calls
        // with an idempotency key (one in ten, 200 keys) are answered once.
        let hedge = HedgeLayer::new(HedgeConfig {
            delay_ms: 300,
            ..HedgeConfig::default()
        })
        .expect("hedge")
        .with_metrics(Metrics::disabled());
        let idempotency = IdempotencyLayer::new(IdempotencyConfig::default())
            .expect("idempotency")
            .with_metrics(Metrics::disabled());
        let breaker = BreakerLayer::new()
            .with_config(BreakerConfig {
                consecutive_failures: 5,
                cooldown: Duration::from_secs(COOLDOWN_S),
                ..BreakerConfig::default()
            })
            .expect("config");
        let retry = RetryLayer::new()
            .with_max_attempts(3)
            .with_attempt_timeout(Duration::from_secs(2))
            .with_rng(SplitMix64::seeded(7));
        macro_rules! stack {
            ($primary:expr, $backup:expr, $third:expr) => {{
                let link = |name: &'static str| LinkSpec::new(name, "m");
                let chain = FallbackLayer::builder(link("primary"))
                    .or(
                        link("backup"),
                        ServiceBuilder::new()
                            .llm_retry(retry.clone())
                            .llm_breaker(breaker.clone())
                            .service($backup),
                    )
                    .or(
                        link("third"),
                        ServiceBuilder::new()
                            .llm_retry(retry.clone())
                            .llm_breaker(breaker.clone())
                            .service($third),
                    )
                    .with_metrics(Metrics::disabled())
                    .build()
                    .expect("chain");
                ServiceBuilder::new()
                    .layer(DeadlineLayer::new(DEADLINE).with_metrics(Metrics::disabled()))
                    .layer(idempotency.clone())
                    .llm_fallback(chain)
                    .service(
                        ServiceBuilder::new()
                            .llm_hedge(hedge.clone())
                            .llm_retry(retry.clone())
                            .llm_breaker(breaker.clone())
                            .service($primary),
                    )
            }};
        }
        let unary = stack!(openai.clone(), anthropic.clone(), third.clone());
        let streaming = stack!(openai.streaming(), anthropic.streaming(), third.streaming());

        if let Ok(mut s) = STARTED.lock() {
            *s = Some(Instant::now());
        }
        let next = Arc::new(AtomicUsize::new(0));
        let tally = Arc::new(Mutex::new(Tally::default()));
        let warmed = Arc::new(Mutex::new(None::<(usize, usize, u64)>));
        let metrics = tokio::runtime::Handle::current().metrics();
        let mut workers = Vec::new();
        for _ in 0..CONCURRENCY {
            let (unary, streaming, next, tally, warmed, metrics) = (
                unary.clone(),
                streaming.clone(),
                next.clone(),
                tally.clone(),
                warmed.clone(),
                metrics.clone(),
            );
            workers.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= calls {
                        break;
                    }
                    if i == calls / 10 {
                        // After the warm-up; then, for a few virtual
                        // seconds, the total outage.
                        if let Ok(mut w) = warmed.lock() {
                            *w = Some((open_fds(), metrics.num_alive_tasks(), rss_kib()));
                        }
                        let now = since_start().as_secs();
                        if let Ok(mut o) = OUTAGE.lock() {
                            *o = (now + 1, now + 5);
                        }
                    }
                    let start = Instant::now();
                    let started_in_outage = in_outage_phase();
                    let stream = i % 2 == 1;
                    let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
                    req.stream = stream;
                    if i % 10 == 0 {
                        // Unary and streamed calls never share a key.
                        IdempotencyKey::new(format!("k{}-{}", i % 200, stream)).store(&mut req);
                    }
                    let mut replayed = false;
                    let mut hedged = false;
                    let (ok, duplicated) = if stream {
                        match streaming.clone().oneshot(req).await {
                            Ok(s) => {
                                replayed = s.is_idempotent_replay();
                                hedged = s.attempts().iter().any(|r| r.hedge);
                                let mut seen = Vec::new();
                                let mut s = s;
                                let mut clean = true;
                                while let Some(item) = std::future::poll_fn(|cx| {
                                    futures_core::Stream::poll_next(std::pin::Pin::new(&mut s), cx)
                                })
                                .await
                                {
                                    match item {
                                        Ok(ChatChunk { text: Some(t), .. }) => seen.push(t),
                                        Ok(_) => {}
                                        Err(_) => clean = false,
                                    }
                                }
                                // Chunks in order, each once (a stream cut
                                // short ends with a failure, never a repeat).
                                let expected: Vec<String> = pieces().into_iter().take(seen.len()).collect();
                                (clean, usize::from(seen != expected))
                            }
                            Err(_) => (false, 0),
                        }
                    } else {
                        match unary.clone().oneshot(req).await {
                            Ok(res) => {
                                replayed = res.idempotent_replayed;
                                hedged = res.attempts.iter().any(|r| r.hedge);
                                (true, 0)
                            }
                            Err(_) => (false, 0),
                        }
                    };
                    let took = start.elapsed();
                    // A call is in the outage phase if it touched it.
                    let outage = in_outage_phase() || started_in_outage;
                    {
                    let mut t = tally.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    t.calls += 1;
                    t.ok += usize::from(ok);
                    t.duplicated += duplicated;
                    t.replayed += usize::from(replayed);
                    t.hedged += usize::from(hedged);
                    t.max_overshoot = t.max_overshoot.max(took.saturating_sub(DEADLINE));
                    if outage {
                        t.outage_calls += 1;
                    } else {
                        t.healthy_calls += 1;
                        t.healthy_ok += usize::from(ok);
                    }
                    }
                    // A steady offered load: about 250 calls per second.
                    tokio::time::sleep(Duration::from_millis(80)).await;
                }
            }));
        }
        // Count the upstream calls made during the outage phase.
        let counter = tokio::spawn(async {
            let mut at_start = None;
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let total = PRIMARY_CALLS.load(Ordering::Relaxed) + BACKUP_CALLS.load(Ordering::Relaxed);
                match (in_outage_phase(), at_start) {
                    (true, None) => at_start = Some(total),
                    (false, Some(start)) => return total - start,
                    _ => {}
                }
            }
        });
        for w in workers {
            w.await.expect("no worker panicked");
        }
        assert!(
            counter.is_finished(),
            "the run ended before the outage phase did: raise SOAK_CALLS"
        );
        let outage_upstream = counter.await.unwrap_or(0);
        // Let the background drains and idle connections settle.
        tokio::time::sleep(Duration::from_secs(120)).await;
        let end = (open_fds(), metrics.num_alive_tasks(), rss_kib());
        let t = tally.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (fds, tasks, rss) = warmed.lock().ok().and_then(|w| *w).expect("warmed up");
        let success = t.healthy_ok as f64 / t.healthy_calls.max(1) as f64;
        let per_call = outage_upstream as f64 / t.outage_calls.max(1) as f64;
        println!("| soak ({} calls, {CONCURRENCY} at a time, virtual time) | |", t.calls);
        println!("|---|---|");
        println!("| panics | 0 |");
        println!("| largest overshoot past the deadline | {} ms |", t.max_overshoot.as_millis());
        println!("| success while the backup is healthy | {:.3} % ({} / {}) |", 100.0 * success, t.healthy_ok, t.healthy_calls);
        println!("| upstream calls per call in the total outage | {per_call:.2} ({outage_upstream} for {} calls) |", t.outage_calls);
        println!("| streams with a duplicated or reordered chunk | {} |", t.duplicated);
        println!("| answers replayed by the idempotency layer | {} |", t.replayed);
        println!("| calls with a hedged attempt | {} |", t.hedged);
        println!("| open files after warm-up / at the end | {fds} / {} |", end.0);
        println!("| live tasks after warm-up / at the end | {tasks} / {} |", end.1);
        println!("| resident memory after warm-up / at the end | {} / {} KiB |", rss, end.2);
        assert!(t.max_overshoot <= Duration::from_millis(50), "overshoot {:?}", t.max_overshoot);
        assert!(success >= 0.999, "success {success}");
        assert!(t.outage_calls > 0, "the outage saw calls");
        assert!(per_call <= 1.2, "{per_call} upstream calls per call in the outage");
        assert_eq!(t.duplicated, 0);
        assert!(t.replayed > 0, "the idempotency layer replayed answers");
        assert!(t.hedged > 0, "the hedge layer hedged slow attempts");
        let within = |before: usize, after: usize| after <= before + before / 10 + 2;
        assert!(within(fds, end.0), "open files {fds} -> {}", end.0);
        assert!(within(tasks, end.1), "live tasks {tasks} -> {}", end.1);
        assert!(end.2 <= rss + rss / 10 + 4096, "resident memory {rss} -> {} KiB", end.2);
    });
}
