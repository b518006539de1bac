//! A response cache shared through a real Redis: two replicas (two
//! `RedisCache`s, each with its own connection) on one server. Each test
//! starts (and may kill, freeze and restart) its own `redis-server`; see
//! `tower_llm_test_support::RedisServer` for when a test skips.
//!
//! Real time: Redis's clock and expiry cannot be paused. Ages are
//! checked against the server's own clock (`TIME`) and `at` field, not
//! by sleeping; the one wait is a poll for a 200 ms expiry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tower_llm_cache::{CacheEntry, CacheStore};
use tower_llm_cache_redis::RedisCache;
use tower_llm_core::{ChatChunk, ChatResponse};
use tower_llm_idempotency::{Stored, StreamFrames};
use tower_llm_test_support::{RedisServer, poll, within};

const PREFIX: &str = "test:cache:";
const OP_TIMEOUT: Duration = Duration::from_millis(250);
/// The command timeout plus slack for a machine busy with other builds.
const BOUND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);

macro_rules! redis_or_skip {
    ($name:expr) => {
        match RedisServer::start($name) {
            Some(server) => server,
            None => return,
        }
    };
}

/// One replica's store.
fn replica(url: &str, fallback: bool) -> RedisCache {
    RedisCache::builder(url)
        .expect("url")
        .with_prefix(PREFIX)
        .with_op_timeout(OP_TIMEOUT)
        .with_max_backoff(Duration::from_millis(100))
        .with_local_fallback(fallback)
        .build()
        .expect("store")
}

/// A key as the layer makes them: 64 hex characters.
fn key(n: u8) -> Arc<str> {
    Arc::from(format!("{n:02x}").repeat(32))
}

fn redis_key(key: &str) -> String {
    format!("{PREFIX}{key}")
}

fn response(id: &str) -> Arc<Stored> {
    Arc::new(Stored::Response(ChatResponse {
        id: id.into(),
        model: "m".into(),
        provider: "mock".into(),
        latency: Duration::from_millis(7),
        ..ChatResponse::default()
    }))
}

fn chunk(text: &str) -> ChatChunk {
    ChatChunk {
        text: Some(text.into()),
        ..ChatChunk::default()
    }
}

fn stream() -> Arc<Stored> {
    Arc::new(Stored::Stream {
        provider: Arc::from("mock"),
        model: "m".into(),
        fallback_position: 1,
        chunks: StreamFrames::from(vec![chunk("Hel"), chunk("lo"), chunk(" wor"), chunk("ld")]),
        attempts: vec![],
    })
}

async fn put(store: &RedisCache, key: &Arc<str>, stored: &Arc<Stored>, keep: Duration) {
    store
        .put(key.clone(), stored.clone(), stored.held_bytes(), keep)
        .await
        .expect("kept");
}

async fn hit(store: &RedisCache, key: &Arc<str>) -> CacheEntry {
    store
        .get(key.clone())
        .await
        .expect("answered")
        .expect("a hit")
}

async fn miss(store: &RedisCache, key: &Arc<str>) {
    let got = store.get(key.clone()).await.expect("answered");
    assert!(got.is_none(), "expected a miss, got {got:?}");
}

/// A plain connection of the test's own, to look at (and spoil) keys.
async fn raw(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connects")
}

/// The server's clock in milliseconds.
async fn server_ms(conn: &mut MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs * 1000 + micros / 1000
}

async fn stored_at(conn: &mut MultiplexedConnection, key: &str) -> u64 {
    conn.hget(redis_key(key), "at").await.expect("HGET at")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_put_by_one_replica_is_got_by_the_other_with_the_servers_age() {
    let server =
        redis_or_skip!("an_answer_put_by_one_replica_is_got_by_the_other_with_the_servers_age");
    let (a, b) = (replica(&server.url(), true), replica(&server.url(), true));
    let mut conn = raw(&server).await;
    let k = key(1);
    let answer = response("answer 1");
    let before = server_ms(&mut conn).await;
    put(&a, &k, &answer, MINUTE).await;
    let at = stored_at(&mut conn, &k).await;
    assert!(
        at >= before,
        "stamped with the server's clock: {at} < {before}"
    );

    let t0 = server_ms(&mut conn).await;
    let entry = hit(&b, &k).await;
    let t1 = server_ms(&mut conn).await;
    assert_eq!(entry.stored, answer);
    // The age is the server's clock at the get minus the stored-at field.
    let age = u64::try_from(entry.age.as_millis()).expect("small");
    assert!(
        (t0 - at..=t1 - at).contains(&age),
        "{age} ms not in {}..={}",
        t0 - at,
        t1 - at
    );
    assert!(entry.age < Duration::from_secs(1), "{:?}", entry.age);

    let pttl: i64 = conn.pttl(redis_key(&k)).await.expect("PTTL");
    assert!((59_000..=60_000).contains(&pttl), "PTTL {pttl}");
    assert!(a.is_up() && b.is_up());
    assert!(a.local().is_empty() && b.local().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_age_is_the_servers_clock_minus_the_stored_at_time_and_never_negative() {
    let server =
        redis_or_skip!("the_age_is_the_servers_clock_minus_the_stored_at_time_and_never_negative");
    let (a, b) = (replica(&server.url(), true), replica(&server.url(), true));
    let mut conn = raw(&server).await;
    let k = key(2);
    put(&a, &k, &response("old"), MINUTE).await;
    // As if stored 5 s ago by the server's clock.
    let t0 = server_ms(&mut conn).await;
    let at = t0 - 5000;
    let () = conn
        .hset(redis_key(&k), "at", at.to_string())
        .await
        .expect("HSET");
    let entry = hit(&b, &k).await;
    let t1 = server_ms(&mut conn).await;
    let age = u64::try_from(entry.age.as_millis()).expect("small");
    assert!(
        (5000..=t1 - at).contains(&age),
        "{age} ms, at most {}",
        t1 - at
    );

    // Stored "in the future" (the server's clock went back): age zero.
    let () = conn
        .hset(redis_key(&k), "at", (t1 + 60_000).to_string())
        .await
        .expect("HSET");
    assert_eq!(hit(&a, &k).await.age, Duration::ZERO);
    assert_eq!(hit(&b, &k).await.age, Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_put_by_one_replica_is_got_chunk_for_chunk_by_the_other() {
    let server = redis_or_skip!("a_stream_put_by_one_replica_is_got_chunk_for_chunk_by_the_other");
    let (a, b) = (replica(&server.url(), true), replica(&server.url(), true));
    let k = key(3);
    let answer = stream();
    put(&a, &k, &answer, MINUTE).await;
    let entry = hit(&b, &k).await;
    assert_eq!(entry.stored, answer);
    let Stored::Stream {
        provider,
        model,
        fallback_position,
        chunks,
        attempts,
    } = &*entry.stored
    else {
        panic!("a stream, got {:?}", entry.stored);
    };
    assert_eq!((&**provider, model.as_str()), ("mock", "m"));
    assert_eq!(*fallback_position, 1);
    assert!(attempts.is_empty());
    let texts: Vec<String> = chunks
        .iter()
        .map(|c| c.expect("decodes").text.unwrap_or_default())
        .collect();
    assert_eq!(texts, ["Hel", "lo", " wor", "ld"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_expires_after_its_keep_and_a_keep_under_a_millisecond_removes_it() {
    let server =
        redis_or_skip!("an_entry_expires_after_its_keep_and_a_keep_under_a_millisecond_removes_it");
    let (a, b) = (replica(&server.url(), true), replica(&server.url(), true));
    let mut conn = raw(&server).await;
    let k = key(4);
    put(&a, &k, &response("brief"), Duration::from_millis(200)).await;
    let pttl: i64 = conn.pttl(redis_key(&k)).await.expect("PTTL");
    assert!((1..=200).contains(&pttl), "PTTL {pttl}");
    assert_eq!(hit(&b, &k).await.stored, response("brief"));
    let started = Instant::now();
    let gone = poll(Duration::from_secs(2), || async {
        matches!(b.get(k.clone()).await, Ok(None))
    })
    .await;
    assert!(gone, "expired");
    // Not before its keep (less what the put and first get took).
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
    let exists: bool = conn.exists(redis_key(&k)).await.expect("EXISTS");
    assert!(!exists);

    // A later put replaces; a keep under 1 ms removes the key.
    put(&a, &k, &response("first"), MINUTE).await;
    put(&a, &k, &response("second"), MINUTE).await;
    assert_eq!(hit(&b, &k).await.stored, response("second"));
    put(&a, &k, &response("third"), Duration::from_micros(500)).await;
    miss(&b, &k).await;
    let exists: bool = conn.exists(redis_key(&k)).await.expect("EXISTS");
    assert!(!exists);
    // A keep past Redis's range is cut to a century, not refused.
    put(&a, &k, &response("for ever"), Duration::MAX).await;
    let pttl: i64 = conn.pttl(redis_key(&k)).await.expect("PTTL");
    let century = 100 * 365 * 86_400 * 1000_i64;
    assert!((century - 60_000..=century).contains(&pttl), "PTTL {pttl}");
    assert!(a.is_up() && b.is_up());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_in_redis_is_exactly_the_prefix_and_the_key() {
    let server = redis_or_skip!("the_key_in_redis_is_exactly_the_prefix_and_the_key");
    let mut conn = raw(&server).await;
    let k = key(5);
    // The default prefix.
    let default = RedisCache::open(&server.url()).expect("store");
    put(&default, &k, &response("a"), MINUTE).await;
    let keys: Vec<String> = conn.keys("*").await.expect("KEYS");
    assert_eq!(keys, [format!("tower-llm:cache:{k}")]);
    let fields: Vec<String> = conn
        .hkeys(format!("tower-llm:cache:{k}"))
        .await
        .expect("HKEYS");
    let mut fields = fields;
    fields.sort();
    assert_eq!(fields, ["answer", "at"]);
    // Another prefix: another key, and the stores do not see each other.
    let other = replica(&server.url(), true);
    miss(&other, &k).await;
    put(&other, &k, &response("b"), MINUTE).await;
    let mut keys: Vec<String> = conn.keys("*").await.expect("KEYS");
    keys.sort();
    assert_eq!(
        keys,
        [format!("test:cache:{k}"), format!("tower-llm:cache:{k}")]
    );
    assert_eq!(hit(&default, &k).await.stored, response("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_does_not_decode_reads_as_a_miss_and_a_put_replaces_it() {
    let server =
        redis_or_skip!("a_value_that_does_not_decode_reads_as_a_miss_and_a_put_replaces_it");
    let store = replica(&server.url(), true);
    let mut conn = raw(&server).await;

    // A string set by something else.
    let k = key(6);
    let () = conn.set(redis_key(&k), "garbage").await.expect("SET");
    miss(&store, &k).await;
    // A list.
    let k2 = key(7);
    let () = conn.rpush(redis_key(&k2), "x").await.expect("RPUSH");
    miss(&store, &k2).await;
    // Our shape, corrupted JSON.
    let k3 = key(8);
    let () = conn
        .hset_multiple(
            redis_key(&k3),
            &[("at", "1"), ("answer", "{\"kind\":\"resp")],
        )
        .await
        .expect("HSET");
    miss(&store, &k3).await;
    // Valid JSON of another shape.
    let k4 = key(9);
    let () = conn
        .hset_multiple(redis_key(&k4), &[("at", "1"), ("answer", "[1,2,3]")])
        .await
        .expect("HSET");
    miss(&store, &k4).await;
    // A good answer with an unreadable stored-at time.
    let json = serde_json::to_string(&*response("x")).expect("serializes");
    let k5 = key(10);
    let () = conn
        .hset_multiple(
            redis_key(&k5),
            &[("at", "yesterday"), ("answer", json.as_str())],
        )
        .await
        .expect("HSET");
    miss(&store, &k5).await;
    // A hash without the answer.
    let k6 = key(11);
    let () = conn.hset(redis_key(&k6), "at", "1").await.expect("HSET");
    miss(&store, &k6).await;
    // The same good answer with a readable time is a hit: only the
    // spoiled part made the misses.
    let () = conn.hset(redis_key(&k5), "at", "1").await.expect("HSET");
    assert_eq!(hit(&store, &k5).await.stored, response("x"));

    assert!(store.is_up(), "a bad value is not an outage");
    assert!(store.local().is_empty());
    // A put replaces the string set by something else.
    put(&store, &k, &response("ours"), MINUTE).await;
    assert_eq!(hit(&store, &k).await.stored, response("ours"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_redis_refuses_is_an_error_and_the_store_stays_up() {
    let server = redis_or_skip!("a_write_redis_refuses_is_an_error_and_the_store_stays_up");
    let writer = replica(&server.url(), true);
    let mut conn = raw(&server).await;
    // A user that may read but not write (as on a read-only replica).
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "reader", "on", ">pw", "~*", "+@all", "-@write"])
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let reader_url = server.url().replace("redis://", "redis://reader:pw@");
    let reader = replica(&reader_url, true);
    let k = key(12);
    put(&writer, &k, &response("before"), MINUTE).await;
    assert_eq!(hit(&reader, &k).await.stored, response("before"));
    let refused = reader
        .put(k.clone(), response("refused"), 100, MINUTE)
        .await
        .expect_err("the write is refused");
    assert_eq!(refused.0, "Redis refused the write (ERR)");
    assert!(reader.is_up(), "a refusal is not an outage");
    assert!(reader.local().is_empty(), "not kept in-process either");
    assert_eq!(hit(&reader, &k).await.stored, response("before"));
}

/// Runs `op`, asserting it returned within `bound`; its output.
async fn bounded<T>(bound: Duration, op: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(5), op)
        .await
        .expect("returned within 5 s");
    let took = started.elapsed();
    assert!(took < bound, "took {took:?}");
    (out, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_answers_within_the_timeout_from_the_local_cache_until_it_is_back() {
    let mut server = redis_or_skip!(
        "redis_killed_answers_within_the_timeout_from_the_local_cache_until_it_is_back"
    );
    let (a, b) = (replica(&server.url(), true), replica(&server.url(), true));
    let strict = replica(&server.url(), false);
    let (k1, k2, k3) = (key(21), key(22), key(23));
    put(&a, &k1, &response("shared"), MINUTE).await;
    assert_eq!(hit(&b, &k1).await.stored, response("shared"));
    assert_eq!(hit(&strict, &k1).await.stored, response("shared"));

    server.kill();
    // The local cache has nothing yet: a miss, not an error.
    let (got, _) = bounded(BOUND, a.get(k1.clone())).await;
    assert!(got.expect("the fallback answers").is_none());
    assert!(!a.is_up());
    // A put while down is kept in-process and served by this replica.
    let answer = response("during");
    let (kept, _) = bounded(
        BOUND,
        a.put(k2.clone(), answer.clone(), answer.held_bytes(), MINUTE),
    )
    .await;
    kept.expect("kept in-process");
    let (got, _) = bounded(BOUND, a.get(k2.clone())).await;
    let entry = got.expect("answered").expect("a local hit");
    assert_eq!(entry.stored, answer);
    assert!(entry.age < Duration::from_secs(1));
    assert_eq!(a.local().len(), 1);
    // ...but not by the other replica.
    let (got, _) = bounded(BOUND, b.get(k2.clone())).await;
    assert!(got.expect("the fallback answers").is_none());
    assert!(!b.is_up());
    // Without the fallback: errors, as quickly.
    let (got, _) = bounded(BOUND, strict.get(k1.clone())).await;
    assert!(got.is_err());
    let (kept, _) = bounded(BOUND, strict.put(k2.clone(), answer.clone(), 100, MINUTE)).await;
    assert!(kept.is_err());
    assert!(strict.local().is_empty());

    server.restart();
    within(Duration::from_secs(3), || {
        a.is_up() && b.is_up() && strict.is_up()
    })
    .await
    .expect("every store sees Redis back");
    // Shared again (the restarted server is empty).
    put(&a, &k3, &response("after"), MINUTE).await;
    assert_eq!(hit(&b, &k3).await.stored, response("after"));
    assert_eq!(hit(&strict, &k3).await.stored, response("after"));
    // What was kept in-process during the outage is no longer served.
    miss(&a, &k2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_holds_no_operation_past_the_timeout() {
    let server = redis_or_skip!("a_frozen_redis_holds_no_operation_past_the_timeout");
    let a = replica(&server.url(), true);
    let strict = replica(&server.url(), false);
    let (k1, k2) = (key(31), key(32));
    put(&a, &k1, &response("warm"), MINUTE).await;
    assert_eq!(hit(&strict, &k1).await.stored, response("warm"));

    server.freeze(true);
    // The first command waits for the timeout, no longer.
    let (got, took) = bounded(BOUND, a.get(k1.clone())).await;
    assert!(got.expect("the fallback answers").is_none());
    assert!(
        took >= Duration::from_millis(200),
        "it waited on Redis: {took:?}"
    );
    assert!(!a.is_up());
    // Known down: the next ones do not wait on Redis at all.
    let answer = response("frozen");
    let (kept, _) = bounded(
        Duration::from_millis(200),
        a.put(k2.clone(), answer.clone(), answer.held_bytes(), MINUTE),
    )
    .await;
    kept.expect("kept in-process");
    let (got, _) = bounded(Duration::from_millis(200), a.get(k2.clone())).await;
    assert_eq!(got.expect("answered").expect("a local hit").stored, answer);
    // Without the fallback: an error after the timeout, then at once.
    let (got, took) = bounded(BOUND, strict.put(k2.clone(), answer.clone(), 100, MINUTE)).await;
    assert!(got.is_err());
    assert!(
        took >= Duration::from_millis(200),
        "it waited on Redis: {took:?}"
    );
    let (got, _) = bounded(Duration::from_millis(200), strict.get(k1.clone())).await;
    assert!(got.is_err());

    server.freeze(false);
    within(Duration::from_secs(3), || a.is_up() && strict.is_up())
        .await
        .expect("both stores see Redis back");
    assert_eq!(hit(&a, &k1).await.stored, response("warm"));
    assert_eq!(hit(&strict, &k1).await.stored, response("warm"));
}
