//! A `[[pools]]` of three API keys in two `tower-llm-gateway` processes
//! (the built binary) with one policy file, in front of one upstream
//! that really enforces rate limits per key (`LimitedUpstream`: 5
//! requests per 2 s window each, stated as 150 a minute in its
//! `x-ratelimit-*` headers), each provider's `rpm` set to its key's 150:
//! paced on one real Redis (`[pools_shared]`, the fleet's buckets),
//! paced in each process alone (the pair may send a key up to twice its
//! limit), and with that Redis killed mid-run (each process paces at its
//! `local_share` of every limit).
//!
//! Real processes, a real Redis and real time: a steady load, bounded
//! waits and polls. The figures printed (calls, client errors, upstream
//! calls per client call, 429s, the most sent to one key in a window)
//! come from the debug build.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower_llm_test_support::{KeyStats, LimitedUpstream, Limits, RedisServer, poll};

use crate::support::{Binary, Pair, Resp, redis_command, send};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The brief's keys: 5 requests in any 2 s (150 a minute), tokens to
/// spare; each provider's `rpm` is its key's 150.
const REQUESTS: u32 = 5;
const TOKENS: u32 = 100_000;
const WINDOW: Duration = Duration::from_secs(2);
/// The budget runs: each provider's `rpm` is 12 (its bucket: 12
/// requests, refilled at one per 5 s), far under what its key takes
/// (1,000 a minute: the upstream never refuses), so the fleet's bucket
/// is the only limit and what each key answered is what the fleet sent.
const BUDGET_RPM: u32 = 12;
/// The providers, one key each: `k1` calls with `$K1` (`sk-k1`), ...
const KEYS: [&str; 3] = ["k1", "k2", "k3"];
/// The route's deadline.
const DEADLINE: Duration = Duration::from_secs(5);
/// The load: 6 calls a second in all (for the window runs, 4 of the 5
/// each key takes in a window), every other one to each process, for
/// 12 s.
const RATE: u32 = 6;
const LOAD_FOR: Duration = Duration::from_secs(12);

const HELLO: &str = r#"{"model": "smart", "messages": [{"role": "user", "content": "Hello"}]}"#;

/// One test at a time in this file: the timings are real, on two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The brief's keys' limits.
fn window_limits() -> Limits {
    Limits::new(REQUESTS, TOKENS, WINDOW)
}

/// The budget runs' keys: 1,000 requests a minute each.
fn roomy_limits() -> Limits {
    Limits::new(1_000, 1_000_000, Duration::from_secs(60))
}

/// The most a bucket of `rpm` (full at the start, as the fleet's is)
/// gives over `elapsed`: `rpm` and what refills.
fn bucket_bound(rpm: u32, elapsed: Duration) -> u64 {
    u64::from(rpm) + (f64::from(rpm) * elapsed.as_secs_f64() / 60.0).ceil() as u64
}

/// Writes the policy of test `name`: three OpenAI providers on
/// `upstream` with `rpm` each, one pool over them (a call waits 1 s at
/// most for room), the route `smart` over the pool (one attempt: every
/// upstream call is counted), and `shared` (the `[pools_shared]` table)
/// if any.
fn policy(
    name: &str,
    upstream: &LimitedUpstream,
    limits: &str,
    shared: &str,
) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "tower-llm-binary-pools-{name}-{}.toml",
        std::process::id()
    ));
    let mut text = format!(
        r#"
        [deadline]
        total_ms = {}
        [retry]
        max_attempts = 1
        {shared}
        "#,
        DEADLINE.as_millis()
    );
    for key in KEYS {
        text.push_str(&format!(
            r#"
        [[providers]]
        name = "{key}"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "{}"
        {limits}
        "#,
            upstream.url(),
            key.to_uppercase()
        ));
    }
    text.push_str(
        r#"
        [[pools]]
        name = "keys"
        max_wait_ms = 1000
        deployments = [{ provider = "k1" }, { provider = "k2" }, { provider = "k3" }]
        [[routes]]
        model = "smart"
        chain = [{ provider = "keys", model = "m" }]
        "#,
    );
    std::fs::write(&path, text).expect("write the policy file");
    path
}

/// `[pools_shared]` on `redis` with `prefix` and `local_share`.
fn shared_table(redis: &RedisServer, prefix: &str, local_share: f64) -> String {
    format!(
        "[pools_shared]\nredis = \"{}\"\nprefix = \"{prefix}\"\nlocal_share = {local_share}",
        redis.url()
    )
}

/// The pair of processes of `config`, logging to files of their own.
async fn start_pair(name: &str, config: &std::path::Path) -> Pair {
    Pair::start(
        &format!("pools-{name}"),
        config,
        &[("K1", "sk-k1"), ("K2", "sk-k2"), ("K3", "sk-k3")],
        "pool pacing store: Redis unavailable",
    )
    .await
}

/// Whether `gw`'s `ai_router_pool_shared_store_up` reads `want`.
async fn store_up(client: &HttpClient, gw: &Binary, want: u8) -> bool {
    let (_, metrics) = send(client, "GET", &format!("{}/metrics", gw.url), "").await;
    metrics.lines().any(|l| {
        l.starts_with("ai_router_pool_shared_store_up") && l.ends_with(&format!(" {want}"))
    })
}

/// Waits (5 s at most) until both processes' gauge reads `want`.
async fn both_read(client: &HttpClient, pair: &Pair, want: u8) {
    for gw in [&pair.a, &pair.b] {
        let read = poll(Duration::from_secs(5), || store_up(client, gw, want)).await;
        assert!(
            read,
            "{}: ai_router_pool_shared_store_up is not {want}",
            gw.url
        );
    }
}

/// One client call: which process (0: A, 1: B), when it was sent
/// (since the run's start), its status.
#[derive(Debug, Clone, Copy)]
struct Call {
    process: usize,
    sent: Duration,
    status: u16,
}

/// What a load run saw.
#[derive(Debug)]
struct Run {
    calls: Vec<Call>,
    /// Client-visible failures (a status other than 200).
    errors: usize,
    first_error: Option<String>,
    /// Calls the upstream received (answered and 429).
    upstream: u64,
    /// Of those, the 429s.
    rejected: u64,
    slowest: Duration,
    /// From the first call sent to the last answer.
    elapsed: Duration,
    keys: Vec<(String, KeyStats)>,
}

impl Run {
    #[allow(clippy::cast_precision_loss)]
    fn upstream_per_call(&self) -> f64 {
        self.upstream as f64 / self.calls.len() as f64
    }

    /// The most requests any key was sent within one window.
    fn max_offered(&self) -> u32 {
        self.keys
            .iter()
            .map(|(_, s)| s.max_offered_in_window)
            .max()
            .unwrap_or(0)
    }

    /// The most calls any key answered.
    fn max_answered(&self) -> u64 {
        self.keys.iter().map(|(_, s)| s.answered).max().unwrap_or(0)
    }

    /// The fewest calls any key answered (0 for a key never sent one).
    fn min_answered(&self) -> u64 {
        if self.keys.len() < KEYS.len() {
            return 0;
        }
        self.keys.iter().map(|(_, s)| s.answered).min().unwrap_or(0)
    }

    fn answered(&self) -> u64 {
        self.keys.iter().map(|(_, s)| s.answered).sum()
    }

    fn print(&self, name: &str, window: Duration, limit: u32) {
        eprintln!(
            "{name}: {} calls in {:?}, {} client errors, {} upstream calls ({:.3} per call), \
             {} 429s, max sent to one key in a {window:?} window: {} (limit {limit}), \
             slowest call {:?}",
            self.calls.len(),
            self.elapsed,
            self.errors,
            self.upstream,
            self.upstream_per_call(),
            self.rejected,
            self.max_offered(),
            self.slowest
        );
        for (key, s) in &self.keys {
            eprintln!(
                "  {key}: {} answered, {} 429s, max sent in a window {}",
                s.answered, s.rejected, s.max_offered_in_window
            );
        }
        if let Some(error) = &self.first_error {
            eprintln!("  first client error: {error}");
        }
    }
}

/// [`RATE`] calls a second for [`LOAD_FOR`], every other one to each
/// process, each on a task of its own (an answer within the deadline and
/// 500 ms more, or the test fails); every answer awaited.
async fn load(client: &HttpClient, pair: &Pair, upstream: &LimitedUpstream, rate: u32) -> Run {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let n = usize::try_from(LOAD_FOR.as_millis() * u128::from(rate) / 1000).expect("a count");
    let urls = [&pair.a, &pair.b].map(|gw| format!("{}/v1/chat/completions", gw.url));
    let start = Instant::now();
    let mut calls = Vec::with_capacity(n);
    for i in 0..n {
        tick.tick().await;
        let client = client.clone();
        let req = http::Request::post(&urls[i % 2])
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(HELLO.as_bytes())))
            .expect("request");
        calls.push(tokio::spawn(async move {
            let sent = Instant::now();
            let limit = DEADLINE + Duration::from_millis(500);
            let res = tokio::time::timeout(limit, client.request(req))
                .await
                .expect("an answer within the deadline")
                .expect("an answer");
            let status = res.status().as_u16();
            let body = res.into_body().collect().await.expect("body").to_bytes();
            let call = Call {
                process: i % 2,
                sent: sent - start,
                status,
            };
            (
                call,
                String::from_utf8_lossy(&body).into_owned(),
                sent.elapsed(),
            )
        }));
    }
    let mut run = Run {
        calls: Vec::with_capacity(n),
        errors: 0,
        first_error: None,
        upstream: 0,
        rejected: 0,
        slowest: Duration::ZERO,
        elapsed: Duration::ZERO,
        keys: Vec::new(),
    };
    for call in calls {
        let (call, body, took) = call.await.expect("the call's task");
        run.slowest = run.slowest.max(took);
        if call.status != 200 {
            run.first_error
                .get_or_insert_with(|| format!("{} {body}", call.status));
            run.errors += 1;
        }
        run.calls.push(call);
    }
    run.elapsed = start.elapsed();
    let total = upstream.total();
    run.upstream = total.answered + total.rejected;
    run.rejected = total.rejected;
    run.keys = upstream.all_stats();
    run
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Asserts the buckets of every deployment are on Redis under `prefix`.
async fn buckets_on_redis(redis: &RedisServer, prefix: &str) {
    let Resp::Array(Some(keys)) =
        redis_command(&redis.url(), &["KEYS", &format!("{prefix}*")]).await
    else {
        panic!("KEYS");
    };
    let mut keys: Vec<_> = keys.iter().filter_map(Resp::text).collect();
    keys.sort();
    assert_eq!(
        keys,
        KEYS.map(|k| format!("{prefix}{k}")),
        "the buckets on Redis"
    );
}

/// A run of the pair on `upstream` with `rpm` per provider, paced on
/// `redis` (local share 0.5) if any, else each process alone.
async fn run_pair(
    name: &str,
    upstream: &LimitedUpstream,
    limits: &str,
    rate: u32,
    redis: Option<&RedisServer>,
) -> Run {
    let prefix = format!("pools-{name}:");
    let shared = redis.map_or(String::new(), |r| shared_table(r, &prefix, 0.5));
    let config = policy(name, upstream, limits, &shared);
    let pair = start_pair(name, &config).await;
    let client = client();
    if redis.is_some() {
        both_read(&client, &pair, 1).await;
    }
    let run = load(&client, &pair, upstream, rate).await;
    if let Some(redis) = redis {
        buckets_on_redis(redis, &prefix).await;
        assert_eq!(pair.outages(), [0, 0], "a store declared Redis down");
    }
    let _ = std::fs::remove_file(&config);
    run
}

/// The fleet-exact run: each key allows 5 requests in any 2 s (stated
/// as 150 a minute); each provider is paced at 90 a minute with a burst
/// of 1 s (`burst_ms`: at most 1.5 + 3 = 4.5 requests in any 2 s), and 4
/// calls a second go over the pair, paced on one Redis: no 429, no key
/// over its limit. Then the same pair, each process pacing alone, for
/// contrast (printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_paced_on_one_redis_keep_every_key_under_its_window_limit() {
    let _serial = SERIAL.lock().await;
    let Some(redis) = RedisServer::start("pools_window") else {
        return;
    };
    let limits = "rpm = 90\n        burst_ms = 1000";
    let upstream = LimitedUpstream::start(window_limits()).await;
    let run = run_pair("window", &upstream, limits, 4, Some(&redis)).await;
    run.print(
        "pools, 5 per 2 s keys, paced on one Redis",
        WINDOW,
        REQUESTS,
    );
    assert_eq!(run.errors, 0, "{run:?}");
    assert!(run.upstream_per_call() <= 1.02, "{run:?}");
    assert!(
        run.max_offered() <= REQUESTS,
        "a key over its limit: {run:?}"
    );
    let upstream = LimitedUpstream::start(window_limits()).await;
    let alone = run_pair("window-alone", &upstream, limits, 4, None).await;
    alone.print(
        "pools, 5 per 2 s keys, each process alone",
        WINDOW,
        REQUESTS,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_redis_send_each_key_its_rpm_and_no_more_alone_twice() {
    let _serial = SERIAL.lock().await;
    let Some(redis) = RedisServer::start("pools_budget") else {
        return;
    };
    let window = roomy_limits().window;
    let upstream = LimitedUpstream::start(roomy_limits()).await;
    let limits = format!("rpm = {BUDGET_RPM}");
    let shared = run_pair("budget-shared", &upstream, &limits, RATE, Some(&redis)).await;
    shared.print("pools, rpm 12, paced on one Redis", window, BUDGET_RPM);
    let upstream = LimitedUpstream::start(roomy_limits()).await;
    let alone = run_pair("budget-alone", &upstream, &limits, RATE, None).await;
    alone.print("pools, rpm 12, each process alone", window, BUDGET_RPM);
    eprintln!(
        "pools, rpm 12: answered paced on Redis {} (client errors {}), each process alone {} \
         (client errors {})",
        shared.answered(),
        shared.errors,
        alone.answered(),
        alone.errors
    );
    // The fleet sent each key what one bucket of its rpm gives, no more,
    // and used it (not a replica's share of it); every call it could not
    // take was refused, none sent twice.
    let bound = bucket_bound(BUDGET_RPM, shared.elapsed);
    assert!(shared.max_answered() <= bound, "over {bound}: {shared:?}");
    assert!(
        shared.min_answered() >= u64::from(BUDGET_RPM),
        "a key short of its rpm: {shared:?}"
    );
    assert_eq!(shared.rejected, 0, "{shared:?}");
    assert_eq!(
        shared.answered() + shared.errors as u64,
        shared.calls.len() as u64,
        "{shared:?}"
    );
    // Each process alone spends each key's whole rpm: together more than
    // the fleet's bucket gives.
    assert!(
        alone.answered() > 3 * bucket_bound(BUDGET_RPM, alone.elapsed),
        "{alone:?}"
    );
    assert!(
        alone.max_answered() <= 2 * bucket_bound(BUDGET_RPM, alone.elapsed),
        "{alone:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_mid_run_each_process_paces_at_its_share() {
    let _serial = SERIAL.lock().await;
    let Some(mut redis) = RedisServer::start("pools_redis_killed") else {
        return;
    };
    let window = roomy_limits().window;
    let upstream = LimitedUpstream::start(roomy_limits()).await;
    let config = policy(
        "killed",
        &upstream,
        &format!("rpm = {BUDGET_RPM}"),
        &shared_table(&redis, "pools-killed:", 0.5),
    );
    let pair = start_pair("killed", &config).await;
    let client = client();
    both_read(&client, &pair, 1).await;

    let killed_at = LOAD_FOR / 4;
    let (run, ()) = tokio::join!(load(&client, &pair, &upstream, RATE), async {
        tokio::time::sleep(killed_at).await;
        redis.kill();
        both_read(&client, &pair, 0).await;
    });
    run.print(
        &format!("pools, rpm 12, Redis killed {killed_at:?} into the run, local_share 0.5"),
        window,
        BUDGET_RPM,
    );
    // Calls sent once Redis was dead (and the op timeout past), by
    // process: what each answered.
    let after = killed_at + Duration::from_millis(250);
    let served_after = [0, 1].map(|p| {
        run.calls
            .iter()
            .filter(|c| c.process == p && c.sent >= after && c.status == 200)
            .count() as u64
    });
    eprintln!(
        "  served after the kill: A {}, B {}",
        served_after[0], served_after[1]
    );
    assert_eq!(pair.outages(), [1, 1]);
    assert!(
        run.slowest <= DEADLINE,
        "a call took {:?} (deadline {DEADLINE:?})",
        run.slowest
    );
    assert_eq!(run.rejected, 0, "{run:?}");
    // Calls kept being served, each process from its half of every key's
    // rpm (a bucket of 6 per key, full when Redis went, refilled at 6 a
    // minute): three keys' worth at most.
    let share = bucket_bound(BUDGET_RPM / 2, run.elapsed);
    for served in served_after {
        assert!(served > 0, "nothing served after the kill: {run:?}");
        assert!(served <= 3 * share, "over its share {}: {run:?}", 3 * share);
    }
    // A key got what the fleet's bucket gave before the kill and each
    // process's half after: never more than two halves and the whole.
    assert!(
        run.max_answered() <= 2 * bucket_bound(BUDGET_RPM, run.elapsed),
        "{run:?}"
    );
    let _ = std::fs::remove_file(&config);
}
