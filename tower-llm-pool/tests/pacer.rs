//! The pacer: buckets (exact, in paused time), what rate-limit headers
//! teach it, lying headers bounded, and the observing transport layer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::{Instant, advance};
use tower::{Layer, ServiceExt, service_fn};
use tower_llm_pool::{
    HeaderIssue, LimitHeaders, MAX_HEADER_WAIT, ObserveRateLimits, ObserveRateLimitsLayer,
    PaceLimits, Pacer, RateLimitHeaders,
};

const OPENAI_429: &str =
    include_str!("../../tower-llm-providers/tests/fixtures/openai_error_rate_limit.headers");
const ANTHROPIC_429: &str =
    include_str!("../../tower-llm-providers/tests/fixtures/anthropic_error_rate_limit_429.headers");

/// A `.headers` fixture: one `Name: value` a line.
fn fixture(text: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (name, value) = line.split_once(':').expect("Name: value");
        headers.append(
            HeaderName::from_bytes(name.trim().as_bytes()).expect("name"),
            HeaderValue::from_str(value.trim()).expect("value"),
        );
    }
    headers
}

fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_bytes(value).expect("value"),
        );
    }
    headers
}

fn limits(rpm: Option<u32>, tpm: Option<u32>) -> PaceLimits {
    PaceLimits {
        rpm,
        tpm,
        burst_ms: None,
    }
}

/// The Anthropic fixture's `date`: Wed, 25 Feb 2026 20:02:32 GMT.
fn anthropic_date() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_772_049_752)
}

// ---- buckets ----

#[tokio::test(start_paused = true)]
async fn rpm_60_is_one_request_a_second() {
    let pacer = Pacer::new(limits(Some(60), None));
    let start = Instant::now();
    for _ in 0..60 {
        let _ = pacer.try_take(0).unwrap();
    }
    assert_eq!(
        pacer.try_take(0).unwrap_err(),
        start + Duration::from_secs(1)
    );
    advance(Duration::from_millis(999)).await;
    assert_eq!(
        pacer.try_take(0).unwrap_err(),
        start + Duration::from_secs(1)
    );
    advance(Duration::from_millis(1)).await;
    let _ = pacer.try_take(0).unwrap();
    assert_eq!(
        pacer.try_take(0).unwrap_err(),
        start + Duration::from_secs(2)
    );
    // Four seconds idle: four requests, not five.
    advance(Duration::from_secs(4)).await;
    for _ in 0..4 {
        let _ = pacer.try_take(0).unwrap();
    }
    assert_eq!(
        pacer.try_take(0).unwrap_err(),
        start + Duration::from_secs(6)
    );
    // A full minute idle refills to the capacity, not past it.
    advance(Duration::from_secs(600)).await;
    assert_eq!(pacer.snapshot().requests, Some(60));
}

#[tokio::test(start_paused = true)]
async fn token_bucket_waits_exactly_and_settle_gives_back() {
    // 6000 a minute: 100 tokens a second.
    let pacer = Pacer::new(limits(None, Some(6_000)));
    let start = Instant::now();
    let big = pacer.try_take(5_000).unwrap();
    assert_eq!(big.tokens(), 5_000);
    assert_eq!(pacer.snapshot().tokens, Some(1_000));
    // 2000 needs 1000 more: 10 s.
    assert_eq!(
        pacer.try_take(2_000).unwrap_err(),
        start + Duration::from_secs(10)
    );
    // The answer used 1000 of 5000: 4000 back.
    big.settle(1_000);
    assert_eq!(pacer.snapshot().tokens, Some(5_000));
    let small = pacer.try_take(2_000).unwrap();
    // Used more than taken: the rest comes out of the bucket, down to
    // empty (no debt below it).
    small.settle(9_999);
    assert_eq!(pacer.snapshot().tokens, Some(0));
    advance(Duration::from_secs(30)).await;
    assert_eq!(pacer.snapshot().tokens, Some(3_000));
    // A ticket settled at 0 gives back all it took, never past capacity.
    let t = pacer.try_take(3_000).unwrap();
    advance(Duration::from_secs(45)).await;
    assert_eq!(pacer.snapshot().tokens, Some(4_500));
    t.settle(0);
    assert_eq!(pacer.snapshot().tokens, Some(6_000));
    // Dropping a ticket keeps what was taken.
    drop(pacer.try_take(1_000).unwrap());
    assert_eq!(pacer.snapshot().tokens, Some(5_000));
}

#[tokio::test(start_paused = true)]
async fn both_buckets_or_neither() {
    let pacer = Pacer::new(limits(Some(60), Some(600)));
    let start = Instant::now();
    let _ = pacer.try_take(600).unwrap();
    // Tokens short (10 a second): nothing taken, not even the request.
    assert_eq!(
        pacer.try_take(50).unwrap_err(),
        start + Duration::from_secs(5)
    );
    assert_eq!(pacer.snapshot().requests, Some(59));
    // Requests short: the later of the two.
    let pacer = Pacer::new(limits(Some(1), Some(600)));
    let _ = pacer.try_take(0).unwrap();
    assert_eq!(
        pacer.try_take(10).unwrap_err(),
        start + Duration::from_secs(60)
    );
    assert_eq!(pacer.snapshot().tokens, Some(600));
}

#[tokio::test(start_paused = true)]
async fn a_request_larger_than_the_bucket_goes_when_it_is_full() {
    let pacer = Pacer::new(limits(None, Some(1_000)));
    let start = Instant::now();
    let t = pacer.try_take(5_000).unwrap();
    assert_eq!(pacer.snapshot().tokens, Some(0));
    // One token: 60 ms. Another oversized request: a full bucket, 60 s.
    assert_eq!(
        pacer.try_take(1).unwrap_err(),
        start + Duration::from_millis(60)
    );
    assert_eq!(
        pacer.try_take(5_000).unwrap_err(),
        start + Duration::from_secs(60)
    );
    // It took the whole bucket (1000): using 400 gives 600 back.
    t.settle(400);
    assert_eq!(pacer.snapshot().tokens, Some(600));
    advance(Duration::from_secs(60)).await;
    let _ = pacer.try_take(5_000).unwrap();
}

#[tokio::test(start_paused = true)]
async fn unpaced_limits_always_have_room() {
    let pacer = Pacer::new(PaceLimits::default());
    for _ in 0..10_000 {
        pacer.try_take(u64::MAX).unwrap().settle(0);
    }
    let s = pacer.snapshot();
    assert_eq!(
        (s.limits, s.requests, s.tokens, s.held_until),
        (PaceLimits::default(), None, None, None)
    );
}

#[tokio::test(start_paused = true)]
async fn a_zero_limit_is_one() {
    let pacer = Pacer::new(limits(Some(0), None));
    let start = Instant::now();
    let _ = pacer.try_take(0).unwrap();
    assert_eq!(
        pacer.try_take(0).unwrap_err(),
        start + Duration::from_secs(60)
    );
}

#[test]
fn pace_limits_serde() {
    let l: PaceLimits = serde_json::from_str(r#"{"rpm": 500, "tpm": 30000}"#).unwrap();
    assert_eq!(l, limits(Some(500), Some(30_000)));
    assert_eq!(
        serde_json::to_string(&limits(Some(5), None)).unwrap(),
        r#"{"rpm":5}"#
    );
    assert!(serde_json::from_str::<PaceLimits>(r#"{"rps": 5}"#).is_err());
}

// ---- headers ----

#[test]
fn openai_fixture_headers_parse_exactly() {
    let seen =
        RateLimitHeaders::parse_at(&fixture(OPENAI_429), || panic!("no timestamp to measure"));
    assert_eq!(
        seen.requests,
        LimitHeaders {
            limit: Some(500),
            remaining: Some(499),
            reset: Some(Duration::from_millis(120)),
        }
    );
    assert_eq!(
        seen.tokens,
        LimitHeaders {
            limit: Some(10_000),
            remaining: Some(1_446),
            reset: Some(Duration::from_millis(9_816)),
        }
    );
    assert!(seen.issues.is_empty());
}

#[test]
fn anthropic_fixture_headers_parse_exactly() {
    let seen = RateLimitHeaders::parse_at(&fixture(ANTHROPIC_429), anthropic_date);
    assert_eq!(
        seen.requests,
        LimitHeaders {
            limit: Some(50),
            remaining: Some(49),
            reset: Some(Duration::ZERO),
        }
    );
    // `-tokens-*` wins over input and output.
    assert_eq!(
        seen.tokens,
        LimitHeaders {
            limit: Some(38_000),
            remaining: Some(8_000),
            reset: Some(Duration::from_secs(12)),
        }
    );
    assert!(seen.issues.is_empty());
    // A reset in the past is now.
    let later = RateLimitHeaders::parse_at(&fixture(ANTHROPIC_429), || {
        anthropic_date() + Duration::from_secs(3600)
    });
    assert_eq!(later.tokens.reset, Some(Duration::ZERO));
}

#[test]
fn anthropic_input_and_output_add_up_without_tokens_headers() {
    let mut h = fixture(ANTHROPIC_429);
    for name in ["limit", "remaining", "reset"] {
        h.remove(format!("anthropic-ratelimit-tokens-{name}"));
    }
    // The fixture's input side is exhausted: nothing left until its reset.
    let seen = RateLimitHeaders::parse_at(&h, anthropic_date);
    assert_eq!(
        seen.tokens,
        LimitHeaders {
            limit: Some(38_000),
            remaining: Some(0),
            reset: Some(Duration::from_secs(12)),
        }
    );
    // Both sides with room: added up, the later reset.
    h.insert(
        "anthropic-ratelimit-input-tokens-remaining",
        HeaderValue::from_static("1000"),
    );
    let seen = RateLimitHeaders::parse_at(&h, anthropic_date);
    assert_eq!(
        seen.tokens,
        LimitHeaders {
            limit: Some(38_000),
            remaining: Some(9_000),
            reset: Some(Duration::from_secs(12)),
        }
    );
}

#[test]
fn openai_reset_durations() {
    let reset = |v: &str| {
        let seen =
            RateLimitHeaders::parse(&headers(&[("x-ratelimit-reset-requests", v.as_bytes())]));
        (
            seen.requests.reset,
            seen.issues.contains(HeaderIssue::ResetTooFar),
        )
    };
    assert_eq!(reset("120ms"), (Some(Duration::from_millis(120)), false));
    assert_eq!(reset("9.816s"), (Some(Duration::from_millis(9_816)), false));
    assert_eq!(reset("1m0s"), (Some(Duration::from_secs(60)), false));
    // Past the cap: cut to it.
    assert_eq!(reset("1m30s"), (Some(MAX_HEADER_WAIT), true));
    assert_eq!(reset("6m0s"), (Some(MAX_HEADER_WAIT), true));
}

#[tokio::test(start_paused = true)]
async fn observed_limits_follow_the_provider_bounded_by_configuration() {
    // Nothing configured: the provider's limits, and its remaining.
    let pacer = Pacer::new(PaceLimits::default());
    pacer.observe(&fixture(OPENAI_429));
    let s = pacer.snapshot();
    assert_eq!(s.limits, limits(Some(500), Some(10_000)));
    assert_eq!((s.requests, s.tokens), (Some(499), Some(1_446)));
    // 2000 tokens: 554 short, at 10000 a minute: 3.324 s.
    let now = Instant::now();
    assert_eq!(
        pacer.try_take(2_000).unwrap_err(),
        now + Duration::from_millis(3_324)
    );

    // Configured lower than the provider: the configured limit stays.
    let pacer = Pacer::new(limits(Some(100), Some(5_000)));
    pacer.observe(&fixture(OPENAI_429));
    let s = pacer.snapshot();
    assert_eq!(s.limits, limits(Some(100), Some(5_000)));
    assert_eq!((s.requests, s.tokens), (Some(100), Some(1_446)));

    // Configured higher: the provider's lower limit is followed.
    let pacer = Pacer::new(limits(Some(1_000), Some(50_000)));
    pacer.observe(&fixture(OPENAI_429));
    assert_eq!(pacer.snapshot().limits, limits(Some(500), Some(10_000)));
    // A later header raises the limit again, up to the configured one.
    pacer.observe(&headers(&[("x-ratelimit-limit-requests", b"2000")]));
    assert_eq!(pacer.snapshot().limits, limits(Some(1_000), Some(10_000)));
}

#[tokio::test(start_paused = true)]
async fn a_header_never_raises_what_the_bucket_holds() {
    let pacer = Pacer::new(limits(Some(10), Some(1_000)));
    for _ in 0..5 {
        let _ = pacer.try_take(100).unwrap();
    }
    pacer.observe(&headers(&[
        ("x-ratelimit-remaining-requests", b"10"),
        ("x-ratelimit-remaining-tokens", b"1000"),
    ]));
    let s = pacer.snapshot();
    assert_eq!((s.requests, s.tokens), (Some(5), Some(500)));
}

#[tokio::test(start_paused = true)]
async fn anthropic_fixture_observed() {
    let pacer = Pacer::new(PaceLimits::default());
    pacer.apply(&RateLimitHeaders::parse_at(
        &fixture(ANTHROPIC_429),
        anthropic_date,
    ));
    let s = pacer.snapshot();
    assert_eq!(s.limits, limits(Some(50), Some(38_000)));
    assert_eq!((s.requests, s.tokens), (Some(49), Some(8_000)));
    assert_eq!(s.held_until, None);
}

#[tokio::test(start_paused = true)]
async fn nothing_remaining_waits_for_the_reset() {
    let pacer = Pacer::new(limits(Some(600), None));
    let start = Instant::now();
    pacer.observe(&headers(&[
        ("x-ratelimit-remaining-requests", b"0"),
        ("x-ratelimit-reset-requests", b"2.5s"),
    ]));
    assert_eq!(
        pacer.try_take(0).unwrap_err(),
        start + Duration::from_millis(2_500)
    );
    assert_eq!(
        pacer.snapshot().held_until,
        Some(start + Duration::from_millis(2_500))
    );
    advance(Duration::from_millis(2_500)).await;
    // By then 25 requests have refilled (10 a second).
    assert_eq!(pacer.snapshot().requests, Some(25));
    let _ = pacer.try_take(0).unwrap();
}

// ---- lying headers ----

/// Counts `warn` events (on the thread it is the default of).
struct WarnCounter(Arc<AtomicUsize>);

impl tracing::Subscriber for WarnCounter {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn count_warnings() -> (Arc<AtomicUsize>, tracing::subscriber::DefaultGuard) {
    let count = Arc::new(AtomicUsize::new(0));
    let guard = tracing::subscriber::set_default(WarnCounter(count.clone()));
    (count, guard)
}

#[tokio::test(start_paused = true)]
async fn lying_headers_are_ignored_each_kind_logged_once() {
    let (warnings, _guard) = count_warnings();
    let configured = limits(Some(100), Some(10_000));
    let cases: [(HeaderIssue, &str, &[u8]); 9] = [
        (
            HeaderIssue::NonAscii,
            "x-ratelimit-limit-requests",
            b"5\xff",
        ),
        (
            HeaderIssue::NonAscii,
            "anthropic-ratelimit-tokens-remaining",
            "1\u{b5}".as_bytes(),
        ),
        (
            HeaderIssue::Malformed,
            "x-ratelimit-remaining-tokens",
            b"lots",
        ),
        (
            HeaderIssue::Malformed,
            "anthropic-ratelimit-requests-reset",
            b"tomorrow",
        ),
        (
            HeaderIssue::Negative,
            "x-ratelimit-remaining-requests",
            b"-5",
        ),
        (HeaderIssue::Negative, "x-ratelimit-reset-tokens", b"-1s"),
        (
            HeaderIssue::Absurd,
            "x-ratelimit-limit-tokens",
            b"10000000000",
        ),
        (HeaderIssue::Absurd, "x-ratelimit-limit-requests", b"0"),
        (
            HeaderIssue::Absurd,
            "anthropic-ratelimit-requests-remaining",
            b"99999999999999999999999999",
        ),
    ];
    let pacer = Pacer::new(configured);
    for (kind, name, value) in cases {
        let h = headers(&[(name, value)]);
        let seen = RateLimitHeaders::parse(&h);
        assert!(seen.is_empty(), "{name}: {seen:?}");
        assert_eq!(seen.issues.iter().collect::<Vec<_>>(), vec![kind], "{name}");
        assert_eq!(seen.issue_header(kind), Some(name));
        // Observed three times: ignored, nothing changes.
        for _ in 0..3 {
            pacer.observe(&h);
        }
        let s = pacer.snapshot();
        assert_eq!(s.limits, configured, "{name}");
        assert_eq!(
            (s.requests, s.tokens, s.held_until),
            (Some(100), Some(10_000), None)
        );
    }
    // Four kinds, each logged once.
    assert_eq!(warnings.load(Ordering::SeqCst), 4);
    let seen: Vec<_> = pacer.issues_seen().iter().collect();
    assert_eq!(
        seen,
        [
            HeaderIssue::NonAscii,
            HeaderIssue::Malformed,
            HeaderIssue::Negative,
            HeaderIssue::Absurd
        ]
    );
    // Another pacer logs its own.
    let other = Pacer::new(configured);
    other.observe(&headers(&[("x-ratelimit-remaining-requests", b"-5")]));
    assert_eq!(warnings.load(Ordering::SeqCst), 5);
}

#[tokio::test(start_paused = true)]
async fn a_far_reset_is_cut_to_the_cap_and_logged_once() {
    let (warnings, _guard) = count_warnings();
    let pacer = Pacer::new(limits(Some(100), None));
    let start = Instant::now();
    let far = headers(&[
        ("x-ratelimit-remaining-requests", b"0"),
        ("x-ratelimit-reset-requests", b"100000h"),
    ]);
    for _ in 0..3 {
        pacer.observe(&far);
    }
    assert_eq!(pacer.try_take(0).unwrap_err(), start + MAX_HEADER_WAIT);
    // An Anthropic timestamp years away: the same cap.
    let pacer = Pacer::new(limits(None, Some(1_000)));
    pacer.observe(&headers(&[
        ("anthropic-ratelimit-tokens-remaining", b"0"),
        ("anthropic-ratelimit-tokens-reset", b"9999-12-31T23:59:59Z"),
    ]));
    assert_eq!(pacer.try_take(0).unwrap_err(), start + MAX_HEADER_WAIT);
    assert!(pacer.issues_seen().contains(HeaderIssue::ResetTooFar));
    assert_eq!(warnings.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_429_hold_off_is_capped() {
    let (warnings, _guard) = count_warnings();
    let pacer = Pacer::new(limits(Some(100), None));
    let start = Instant::now();
    pacer.hold_off(Duration::from_secs(10));
    assert_eq!(
        pacer.try_take(0).unwrap_err(),
        start + Duration::from_secs(10)
    );
    // A shorter one does not shorten it.
    pacer.hold_off(Duration::from_secs(1));
    assert_eq!(
        pacer.try_take(0).unwrap_err(),
        start + Duration::from_secs(10)
    );
    assert_eq!(warnings.load(Ordering::SeqCst), 0);
    for _ in 0..3 {
        pacer.hold_off(Duration::from_secs(3600));
        pacer.hold_off(Duration::MAX);
    }
    assert_eq!(pacer.try_take(0).unwrap_err(), start + MAX_HEADER_WAIT);
    assert_eq!(warnings.load(Ordering::SeqCst), 1);
    assert_eq!(
        pacer.issues_seen().iter().collect::<Vec<_>>(),
        [HeaderIssue::HoldOffTooLong]
    );
    advance(MAX_HEADER_WAIT).await;
    let _ = pacer.try_take(0).unwrap();
}

#[tokio::test(start_paused = true)]
async fn no_header_waits_past_the_cap_nor_grants_past_the_configuration() {
    let configured = limits(Some(100), Some(10_000));
    let lies: [&[(&str, &[u8])]; 6] = [
        &[
            ("x-ratelimit-limit-requests", b"1"),
            ("x-ratelimit-remaining-requests", b"0"),
            ("x-ratelimit-reset-requests", b"999h"),
        ],
        &[
            ("x-ratelimit-limit-tokens", b"1"),
            ("x-ratelimit-remaining-tokens", b"0"),
            ("x-ratelimit-reset-tokens", b"59.999999999s"),
        ],
        &[
            ("x-ratelimit-limit-requests", b"1000000000"),
            ("x-ratelimit-remaining-requests", b"1000000000"),
        ],
        &[
            ("x-ratelimit-limit-tokens", b"1000000000"),
            ("x-ratelimit-remaining-tokens", b"1000000000"),
        ],
        &[
            ("anthropic-ratelimit-requests-limit", b"1"),
            ("anthropic-ratelimit-requests-remaining", b"0"),
            (
                "anthropic-ratelimit-requests-reset",
                b"2999-01-01T00:00:00+23:59",
            ),
        ],
        &[
            ("anthropic-ratelimit-input-tokens-limit", b"1000000000"),
            ("anthropic-ratelimit-output-tokens-limit", b"1000000000"),
        ],
    ];
    for lie in lies {
        let pacer = Pacer::new(configured);
        for _ in 0..3 {
            pacer.observe(&headers(lie));
        }
        pacer.hold_off(Duration::MAX);
        let now = Instant::now();
        let s = pacer.snapshot();
        assert!(
            s.limits.rpm <= configured.rpm && s.limits.tpm <= configured.tpm,
            "{s:?}"
        );
        assert!(s.requests <= Some(100) && s.tokens <= Some(10_000), "{s:?}");
        for tokens in [0, 1, 10_000, u64::MAX] {
            let at = pacer.try_take(tokens).unwrap_err();
            assert!(at > now && at <= now + MAX_HEADER_WAIT, "{lie:?}");
        }
        // Once the cap has passed, a request of any size goes.
        advance(MAX_HEADER_WAIT).await;
        let _ = pacer.try_take(u64::MAX).unwrap();
        // And no more than the configured limits in a minute.
        let mut granted = 0;
        while pacer.try_take(0).is_ok() {
            granted += 1;
        }
        assert!(granted < 100, "{lie:?}: {granted}");
    }
}

// ---- the observing transport ----

#[tokio::test(start_paused = true)]
async fn observe_layer_updates_the_pacer_and_passes_answers_on() {
    let pacer = Arc::new(Pacer::new(PaceLimits::default()));
    let transport = service_fn(|req: http::Request<&'static str>| async move {
        let (fixture_text, status) = match req.uri().path() {
            "/openai" => (OPENAI_429, 429),
            "/anthropic" => (ANTHROPIC_429, 200),
            _ => ("", 200),
        };
        let mut res = http::Response::new("body");
        *res.status_mut() = http::StatusCode::from_u16(status).unwrap();
        *res.headers_mut() = fixture(fixture_text);
        Ok::<_, std::convert::Infallible>(res)
    });
    let service = ObserveRateLimitsLayer::new(pacer.clone()).layer(transport);
    let get = |path: &'static str| http::Request::builder().uri(path).body("").unwrap();

    // No rate-limit header: nothing changes.
    let res = service.clone().oneshot(get("/plain")).await.unwrap();
    assert_eq!((res.status(), *res.body()), (http::StatusCode::OK, "body"));
    assert_eq!(pacer.snapshot().limits, PaceLimits::default());

    // OpenAI's 429: its limits, and its Retry-After (10 s) held off.
    let start = Instant::now();
    let res = service.clone().oneshot(get("/openai")).await.unwrap();
    assert_eq!(res.status(), http::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers(), &fixture(OPENAI_429));
    assert_eq!(*res.body(), "body");
    let s = pacer.snapshot();
    assert_eq!(s.limits, limits(Some(500), Some(10_000)));
    assert_eq!((s.requests, s.tokens), (Some(499), Some(1_446)));
    assert_eq!(s.held_until, Some(start + Duration::from_secs(10)));
    assert_eq!(
        pacer.try_take(0).unwrap_err(),
        start + Duration::from_secs(10)
    );

    // Anthropic's headers on a 200: its limits, no hold-off from its
    // Retry-After (not a 429).
    let pacer = Arc::new(Pacer::new(PaceLimits::default()));
    let service = ObserveRateLimits::new(service.into_inner(), pacer.clone());
    let _ = service.oneshot(get("/anthropic")).await.unwrap();
    let s = pacer.snapshot();
    assert_eq!(s.limits, limits(Some(50), Some(38_000)));
    assert_eq!(
        (s.requests, s.tokens, s.held_until),
        (Some(49), Some(8_000), None)
    );
    let _ = pacer.try_take(8_000).unwrap();
}

#[tokio::test(start_paused = true)]
async fn observe_layer_passes_errors_through() {
    let pacer = Arc::new(Pacer::new(limits(Some(5), None)));
    let transport = service_fn(|_: http::Request<()>| async {
        Err::<http::Response<()>, _>("connection reset")
    });
    let service = ObserveRateLimitsLayer::new(pacer.clone()).layer(transport);
    let err = service.oneshot(http::Request::new(())).await.unwrap_err();
    assert_eq!(err, "connection reset");
    assert_eq!(pacer.snapshot().requests, Some(5));
}
