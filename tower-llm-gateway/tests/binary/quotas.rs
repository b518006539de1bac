//! Tenant quotas in two `tower-llm-gateway` processes (the built binary)
//! with one policy file, in front of one loopback upstream whose answers
//! cost a known amount: counted on one real Redis (the pair together
//! never passes the quota), counted in each process (the pair admits up
//! to twice the quota), and with that Redis killed or frozen (each
//! process admits against its local share, no call waits for Redis, and
//! what was spent meanwhile reaches Redis when it is back).
//!
//! Real processes, a real Redis and real time: bounded waits and polls,
//! never a fixed sleep. The figures printed (calls admitted, spend,
//! elapsed, slowest call) come from the debug build.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower_llm_providers::mock::{MockServer, Reply};
use tower_llm_test_support::{RedisServer, poll};

use crate::support::{Binary, Pair, Resp, redis_command, send};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Nano-dollars per dollar.
const NANOS: u64 = 1_000_000_000;
/// The tenant quota: 1 USD per window.
const QUOTA: u64 = NANOS;
/// One call's cost: the upstream reports 20 input tokens at $10/M and
/// 100 output tokens (the route's cap) at $28/M: 200 + 2,800 µ$.
const CALL: u64 = 3_000_000;
/// One call's hold: the input bound of [`HELLO`] (16 tokens of request
/// framing, 8 of message framing, 5 bytes of text) at $10/M and the
/// output cap at $28/M: 290 + 2,800 µ$.
const HOLD: u64 = 3_090_000;
/// The longest window (366 days): no window ends during a test, short of
/// bad luck once a year.
const WINDOW_SECS: u64 = 366 * 86_400;
/// The route's deadline.
const DEADLINE: Duration = Duration::from_secs(2);
/// The quota store's Redis command timeout (`tower-llm-cost-redis`'s
/// default).
const OP_TIMEOUT: Duration = Duration::from_millis(250);

/// Calls in flight at each process in a burst. At 100 (two processes on
/// two cores, the debug build), a reserve's reply can take longer than
/// the store's 250 ms op timeout with Redis healthy (this process's own
/// scheduling, the queue on its one connection): slow is not down, so
/// the store waits for the reply (its reserve timeout, 2 s, at most)
/// while its probe sees Redis answer `PING`, and stays exact.
const IN_FLIGHT: usize = 100;

const HELLO: &str = r#"{"model": "metered", "messages": [{"role": "user", "content": "Hello"}]}"#;

/// Checks every 429 of `b` carries a `Retry-After` (the end of the
/// quota's window).
fn check_retry_after(b: &Burst) {
    assert_eq!(b.refused_without_retry_after, 0, "{b:?}");
}

/// One test at a time in this file: four gateway processes and their
/// calls on two cores would blur the timings asserted.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An OpenAI answer reporting 20 input and 100 output tokens: [`CALL`].
fn metered_reply() -> Reply {
    let body = serde_json::json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": "mock-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 100, "total_tokens": 120}
    });
    Reply::json(200, body.to_string())
}

/// Starts the upstream answering [`metered_reply`] to every call.
async fn metered_upstream() -> MockServer {
    let upstream = MockServer::start(metered_reply()).await.expect("upstream");
    upstream.keep_last_request_only();
    upstream
}

/// Writes the policy of test `name`: a 1 USD quota per tenant, the
/// route `metered` over the upstream (priced, output capped at 100
/// tokens), and `shared` (the `[quotas_shared]` table) if any.
fn policy(name: &str, upstream: &str, shared: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "tower-llm-binary-quotas-{name}-{}.toml",
        std::process::id()
    ));
    let text = format!(
        r#"
        [deadline]
        total_ms = {deadline}
        [retry]
        max_attempts = 1
        [quotas]
        window_secs = {WINDOW_SECS}
        max_cost = 1.0
        {shared}
        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{upstream}/v1"
        api_key_env = "UPSTREAM_KEY"
        [prices.primary]
        gpt-4o-mini = {{ input = 10.0, output = 28.0 }}
        [[routes]]
        model = "metered"
        max_output_tokens = 100
        chain = [{{ provider = "primary", model = "gpt-4o-mini" }}]
        "#,
        deadline = DEADLINE.as_millis(),
    );
    std::fs::write(&path, text).expect("write the policy file");
    path
}

/// `[quotas_shared]` on `redis` with `prefix`, and `local_share` if any.
fn shared_table(redis: &RedisServer, prefix: &str, local_share: Option<f64>) -> String {
    let share = local_share.map_or(String::new(), |s| format!("local_share = {s}"));
    format!(
        "[quotas_shared]\nredis = \"{}\"\nprefix = \"{prefix}\"\n{share}",
        redis.url()
    )
}

/// Dollars (`0.003`) in nano-dollars.
fn nanos(dollars: &str) -> u64 {
    let (whole, frac) = dollars.split_once('.').unwrap_or((dollars, ""));
    assert!(frac.len() <= 9, "{dollars}: more than nine decimals");
    let whole: u64 = whole.parse().expect("whole dollars");
    let frac: u64 = format!("{frac:0<9}").parse().expect("a fraction");
    whole * NANOS + frac
}

fn usd(nanos: u64) -> f64 {
    nanos as f64 / NANOS as f64
}

/// What a burst of calls got from one gateway.
#[derive(Debug, Default)]
struct Burst {
    /// 200s.
    admitted: u64,
    /// 429 `quota_exceeded`s.
    refused: u64,
    /// Of those, the ones without a `Retry-After`.
    refused_without_retry_after: u64,
    /// The sum of the 200s' `x-llm-cost`, in nano-dollars.
    spent: u64,
    /// 200s whose `x-llm-cost` was not [`CALL`].
    off_price: u64,
    /// The slowest call.
    slowest: Duration,
    /// The whole burst.
    elapsed: Duration,
}

/// Sends `calls` chat calls as `tenant` to `gw`, `in_flight` at a time;
/// panics on any answer other than a 200 with `x-llm-cost` or a 429
/// `quota_exceeded`, or on a call unanswered within 10 s.
async fn burst(
    client: &HttpClient,
    gw: &Binary,
    tenant: &'static str,
    calls: usize,
    in_flight: usize,
) -> Burst {
    let url: Arc<str> = format!("{}/v1/chat/completions", gw.url).into();
    let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut tasks = tokio::task::JoinSet::new();
    let start = Instant::now();
    for _ in 0..calls {
        let permit = permits.clone().acquire_owned().await.expect("permits");
        let client = client.clone();
        let url = url.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let req = http::Request::post(&*url)
                .header("content-type", "application/json")
                .header("x-tenant-id", tenant)
                .body(Full::new(Bytes::from_static(HELLO.as_bytes())))
                .expect("request");
            let sent = Instant::now();
            let res = tokio::time::timeout(Duration::from_secs(10), client.request(req))
                .await
                .expect("an answer within 10 s")
                .expect("an answer");
            let status = res.status().as_u16();
            let headers = res.headers().clone();
            let body = res.into_body().collect().await.expect("body").to_bytes();
            let took = sent.elapsed();
            let body = String::from_utf8_lossy(&body).into_owned();
            match status {
                200 => {
                    let cost = headers
                        .get("x-llm-cost")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_else(|| panic!("a 200 without x-llm-cost: {headers:?}"));
                    (Ok(nanos(cost)), took)
                }
                429 => {
                    let json: serde_json::Value = serde_json::from_str(&body).expect("json");
                    assert_eq!(json["error"]["type"], "quota_exceeded", "{body}");
                    assert_eq!(json["error"]["code"], "tenant_quota_exhausted", "{body}");
                    (Err(headers.contains_key("retry-after")), took)
                }
                other => panic!("{other}: {body}"),
            }
        });
    }
    let mut out = Burst::default();
    while let Some(done) = tasks.join_next().await {
        let (cost, took) = done.expect("a call task");
        out.slowest = out.slowest.max(took);
        match cost {
            Ok(cost) => {
                out.admitted += 1;
                out.spent += cost;
                out.off_price += u64::from(cost != CALL);
            }
            Err(retry_after) => {
                out.refused += 1;
                out.refused_without_retry_after += u64::from(!retry_after);
            }
        }
    }
    out.elapsed = start.elapsed();
    out
}

/// What Redis counts for `tenant` under `prefix`, over every window:
/// spent and held, in nano-dollars.
async fn redis_counts(redis: &RedisServer, prefix: &str, tenant: &str) -> (u64, u64) {
    let hex: String = tenant.bytes().map(|b| format!("{b:02x}")).collect();
    let pattern = format!("{prefix}{{t{hex}}}:*:h");
    let keys = match redis_command(&redis.url(), &["KEYS", &pattern]).await {
        Resp::Array(Some(keys)) => keys,
        other => panic!("KEYS: {other:?}"),
    };
    let (mut spent, mut held) = (0, 0);
    for key in keys {
        let key = key.text().expect("a key");
        for (field, sum) in [("sc", &mut spent), ("hc", &mut held)] {
            let reply = redis_command(&redis.url(), &["HGET", &key, field]).await;
            *sum += reply
                .text()
                .map_or(0, |v| v.parse::<u64>().expect("a count"));
        }
    }
    (spent, held)
}

/// Polls (every 10 ms, `limit` at most) until Redis counts `want`
/// (spent, held) for `tenant`; what it counted last, as an error if it
/// never matched.
async fn redis_reaches(
    redis: &RedisServer,
    prefix: &str,
    tenant: &str,
    want: (u64, u64),
    limit: Duration,
) -> Result<(u64, u64), (u64, u64)> {
    let start = Instant::now();
    loop {
        let seen = redis_counts(redis, prefix, tenant).await;
        if seen == want {
            return Ok(seen);
        }
        if start.elapsed() >= limit {
            return Err(seen);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `gw` counts its quotas on Redis (its
/// `ai_router_quota_shared_store_up` gauge reads 1).
async fn quota_shared(client: &HttpClient, gw: &Binary) -> bool {
    let (_, metrics) = send(client, "GET", &format!("{}/metrics", gw.url), "").await;
    metrics
        .lines()
        .any(|l| l.starts_with("ai_router_quota_shared_store_up") && l.ends_with(" 1"))
}

/// Waits (5 s at most) until both gateways count their quotas on Redis.
async fn both_shared(client: &HttpClient, a: &Binary, b: &Binary) {
    for gw in [a, b] {
        let up = poll(Duration::from_secs(5), || quota_shared(client, gw)).await;
        assert!(up, "{} does not count its quotas on Redis", gw.url);
    }
}

/// The pair of processes of `config`, logging to files of their own.
async fn start_pair(name: &str, config: &std::path::Path) -> Pair {
    Pair::start(
        &format!("quotas-{name}"),
        config,
        &[("UPSTREAM_KEY", "sk-test-key")],
        "quota store: Redis unavailable",
    )
    .await
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_redis_never_pass_a_tenant_quota() {
    let _serial = SERIAL.lock().await;
    let Some(redis) = RedisServer::start("two_processes_on_one_redis") else {
        return;
    };
    let upstream = metered_upstream().await;
    let prefix = "quotas-exact:";
    let config = policy(
        "exact",
        &upstream.url(),
        &shared_table(&redis, prefix, None),
    );
    let pair = start_pair("exact", &config).await;
    let (a, b) = (&pair.a, &pair.b);
    let client = client();
    both_shared(&client, a, b).await;

    // 500 calls at each process, IN_FLIGHT at a time at each, one tenant.
    let start = Instant::now();
    let (at_a, at_b) = tokio::join!(
        burst(&client, a, "acme", 500, IN_FLIGHT),
        burst(&client, b, "acme", 500, IN_FLIGHT)
    );
    let elapsed = start.elapsed();
    let admitted = at_a.admitted + at_b.admitted;
    let spent = at_a.spent + at_b.spent;
    // Every settle is queued to a worker: wait until Redis counts what
    // the answers said they cost, and holds nothing. Usage is believed:
    // no estimate error.
    let counted = redis_reaches(&redis, prefix, "acme", (spent, 0), Duration::from_secs(5))
        .await
        .unwrap_or_else(|seen| panic!("Redis counts {seen:?}, the answers ${}", usd(spent)));
    eprintln!(
        "quotas, shared on Redis: {admitted} of 1000 calls admitted (A {}, B {}), \
         x-llm-cost sum ${}, Redis spent ${}, in {elapsed:?} (slowest call A {:?}, B {:?}); \
         {} of {} refusals without Retry-After",
        at_a.admitted,
        at_b.admitted,
        usd(spent),
        usd(counted.0),
        at_a.slowest,
        at_b.slowest,
        at_a.refused_without_retry_after + at_b.refused_without_retry_after,
        at_a.refused + at_b.refused
    );
    assert_eq!(at_a.off_price + at_b.off_price, 0, "{at_a:?} {at_b:?}");
    assert_eq!(admitted + at_a.refused + at_b.refused, 1000);
    check_retry_after(&at_a);
    check_retry_after(&at_b);
    // Redis answered all along: neither store counted in-process.
    assert_eq!(
        pair.outages(),
        [0, 0],
        "a quota store declared Redis down while Redis answered"
    );
    assert!(spent <= QUOTA, "spent ${} of a $1 quota", usd(spent));
    assert!(admitted * CALL <= QUOTA, "{admitted} calls admitted");
    // A refusal means what was spent and held left no room for one more
    // hold: at least (1 USD - one hold) / one hold calls were admitted.
    assert!(
        admitted >= (QUOTA - HOLD).div_ceil(HOLD),
        "only {admitted} calls admitted"
    );
    let _ = std::fs::remove_file(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_counting_locally_admit_up_to_twice_the_quota() {
    let _serial = SERIAL.lock().await;
    let upstream = metered_upstream().await;
    let config = policy("local", &upstream.url(), "");
    let pair = start_pair("local", &config).await;
    let (a, b) = (&pair.a, &pair.b);
    let client = client();

    let start = Instant::now();
    let (at_a, at_b) = tokio::join!(
        burst(&client, a, "acme", 500, IN_FLIGHT),
        burst(&client, b, "acme", 500, IN_FLIGHT)
    );
    let elapsed = start.elapsed();
    let admitted = at_a.admitted + at_b.admitted;
    let spent = at_a.spent + at_b.spent;
    eprintln!(
        "quotas, counted in each process: {admitted} of 1000 calls admitted (A {}, B {}), \
         x-llm-cost sum ${}, in {elapsed:?} (slowest call A {:?}, B {:?})",
        at_a.admitted,
        at_b.admitted,
        usd(spent),
        at_a.slowest,
        at_b.slowest
    );
    assert_eq!(at_a.off_price + at_b.off_price, 0, "{at_a:?} {at_b:?}");
    assert_eq!(admitted + at_a.refused + at_b.refused, 1000);
    check_retry_after(&at_a);
    check_retry_after(&at_b);
    // Each process admits up to the quota on its own: together more than
    // one quota, never more than two.
    for at in [&at_a, &at_b] {
        assert!(at.spent <= QUOTA, "{at:?}");
        assert!(at.admitted >= (QUOTA - HOLD).div_ceil(HOLD), "{at:?}");
    }
    assert!(spent > QUOTA, "spent ${}", usd(spent));
    assert!(spent <= 2 * QUOTA, "spent ${}", usd(spent));
    let _ = std::fs::remove_file(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_each_process_admits_its_share_and_pushes_it_back() {
    let _serial = SERIAL.lock().await;
    let Some(mut redis) = RedisServer::start("with_redis_killed") else {
        return;
    };
    let upstream = metered_upstream().await;
    let prefix = "quotas-killed:";
    let config = policy(
        "killed",
        &upstream.url(),
        &shared_table(&redis, prefix, Some(0.5)),
    );
    let pair = start_pair("killed", &config).await;
    let (a, b) = (&pair.a, &pair.b);
    let client = client();
    both_shared(&client, a, b).await;

    redis.kill();
    // "flood" asks both processes for more than their half each;
    // "partial" spends $0.30 through A only.
    let start = Instant::now();
    let (at_a, at_b, partial) = tokio::join!(
        burst(&client, a, "flood", 250, IN_FLIGHT),
        burst(&client, b, "flood", 250, IN_FLIGHT),
        burst(&client, a, "partial", 100, IN_FLIGHT)
    );
    let elapsed = start.elapsed();
    eprintln!(
        "quotas, Redis killed, local_share 0.5: flood admitted A {} (${}), B {} (${}) of 250 each; \
         partial {} of 100 through A; in {elapsed:?}, slowest call {:?}",
        at_a.admitted,
        usd(at_a.spent),
        at_b.admitted,
        usd(at_b.spent),
        partial.admitted,
        at_a.slowest.max(at_b.slowest).max(partial.slowest)
    );
    for at in [&at_a, &at_b, &partial] {
        assert_eq!(at.off_price, 0, "{at:?}");
        // Nothing waits for the dead Redis.
        assert!(
            at.slowest <= DEADLINE + Duration::from_secs(1),
            "a call took {:?}",
            at.slowest
        );
    }
    // Each process admits against half the quota: at most $0.50, and
    // at least as much as leaves no room for one more hold.
    for at in [&at_a, &at_b] {
        assert!(at.spent <= QUOTA / 2, "{at:?}");
        assert!(at.admitted >= (QUOTA / 2 - HOLD).div_ceil(HOLD), "{at:?}");
    }
    assert_eq!(partial.admitted, 100, "{partial:?}");
    check_retry_after(&at_a);
    check_retry_after(&at_b);
    assert_eq!(pair.outages(), [1, 1]);

    // Redis comes back empty; both processes push what they spent
    // meanwhile, then count on it again.
    redis.restart();
    let back = Instant::now();
    let flood = at_a.spent + at_b.spent;
    for (tenant, spent) in [("flood", flood), ("partial", partial.spent)] {
        redis_reaches(&redis, prefix, tenant, (spent, 0), Duration::from_secs(10))
            .await
            .unwrap_or_else(|seen| {
                panic!("Redis counts {seen:?} for {tenant}, not ${}", usd(spent))
            });
    }
    both_shared(&client, a, b).await;
    eprintln!(
        "quotas, Redis restarted: local spend pushed within {:?}",
        back.elapsed()
    );

    // "partial" through B: counted locally, B would admit its half
    // ($0.50); shared without the push, the whole quota. Shared with
    // A's $0.30 pushed: $0.70 at most.
    let after = burst(&client, b, "partial", 400, IN_FLIGHT).await;
    let want = (partial.spent + after.spent, 0);
    let counted = redis_reaches(&redis, prefix, "partial", want, Duration::from_secs(5))
        .await
        .unwrap_or_else(|seen| panic!("Redis counts {seen:?}, the answers {want:?}"));
    eprintln!(
        "quotas, shared again: partial admitted {} of 400 through B (${}), Redis spent ${} in all",
        after.admitted,
        usd(after.spent),
        usd(counted.0)
    );
    assert_eq!(after.off_price, 0, "{after:?}");
    check_retry_after(&after);
    // Counted on Redis all along since it came back.
    assert_eq!(pair.outages(), [1, 1]);
    assert!(counted.0 <= QUOTA, "spent ${}", usd(counted.0));
    assert!(
        after.admitted >= (QUOTA - partial.spent - HOLD).div_ceil(HOLD),
        "{after:?}"
    );
    let _ = std::fs::remove_file(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_frozen_calls_answer_within_the_op_timeout_from_the_local_share() {
    let _serial = SERIAL.lock().await;
    let Some(redis) = RedisServer::start("with_redis_frozen") else {
        return;
    };
    let upstream = metered_upstream().await;
    let prefix = "quotas-frozen:";
    let config = policy(
        "frozen",
        &upstream.url(),
        &shared_table(&redis, prefix, Some(0.5)),
    );
    let pair = start_pair("frozen", &config).await;
    let (a, b) = (&pair.a, &pair.b);
    let client = client();
    both_shared(&client, a, b).await;
    // One call each, counted on Redis: both are connected to it.
    let (warm_a, warm_b) = tokio::join!(
        burst(&client, a, "warm", 1, 1),
        burst(&client, b, "warm", 1, 1)
    );
    assert_eq!(warm_a.admitted + warm_b.admitted, 2);
    redis_reaches(
        &redis,
        prefix,
        "warm",
        (2 * CALL, 0),
        Duration::from_secs(5),
    )
    .await
    .unwrap_or_else(|seen| panic!("the warm-up calls are not counted on Redis: {seen:?}"));

    redis.freeze(true);
    let start = Instant::now();
    let (at_a, at_b) = tokio::join!(
        burst(&client, a, "frozen", 50, IN_FLIGHT),
        burst(&client, b, "frozen", 50, IN_FLIGHT)
    );
    let elapsed = start.elapsed();
    eprintln!(
        "quotas, Redis frozen: admitted A {}, B {} of 50 each in {elapsed:?}, \
         slowest call A {:?}, B {:?} (op timeout {OP_TIMEOUT:?})",
        at_a.admitted, at_b.admitted, at_a.slowest, at_b.slowest
    );
    redis.freeze(false);
    for at in [&at_a, &at_b] {
        // $0.15 each: within the local share.
        assert_eq!(at.admitted, 50, "{at:?}");
        assert_eq!(at.off_price, 0, "{at:?}");
        assert!(
            at.slowest <= OP_TIMEOUT + Duration::from_millis(750),
            "a call took {:?} with Redis frozen",
            at.slowest
        );
    }
    assert_eq!(pair.outages(), [1, 1]);

    // Thawed: what was spent in-process reaches Redis, and the reserves
    // that timed out leave no hold behind.
    let thawed = Instant::now();
    let want = (at_a.spent + at_b.spent, 0);
    redis_reaches(&redis, prefix, "frozen", want, Duration::from_secs(10))
        .await
        .unwrap_or_else(|seen| panic!("Redis counts {seen:?}, the answers {want:?}"));
    both_shared(&client, a, b).await;
    eprintln!(
        "quotas, Redis thawed: local spend pushed within {:?}",
        thawed.elapsed()
    );
    let _ = std::fs::remove_file(&config);
}
