//! `LimitedUpstream`: limits per key over a sliding window, 429s with
//! OpenAI's headers, the counts; under real and paused time.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tower_llm_test_support::{LimitedUpstream, Limits};

struct Answer {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
}

/// One `POST /v1/chat/completions` with `key`, on its own connection.
async fn call(upstream: &LimitedUpstream, key: &str) -> Answer {
    let addr = upstream.url().trim_start_matches("http://").to_owned();
    let mut sock = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).await.expect("write");
    let mut raw = String::new();
    sock.read_to_string(&mut raw).await.expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

#[tokio::test]
async fn each_key_gets_its_own_requests_per_window_then_429s_with_openai_headers() {
    let up = LimitedUpstream::start(Limits::new(3, 10_000, Duration::from_secs(2))).await;
    for left in [2, 1, 0] {
        let a = call(&up, "sk-a").await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(a.body.contains(r#""total_tokens":30"#), "{}", a.body);
        assert_eq!(
            a.header("x-ratelimit-limit-requests"),
            "90",
            "3 per 2 s = 90 a minute"
        );
        assert_eq!(a.header("x-ratelimit-remaining-requests"), left.to_string());
        assert_eq!(a.header("x-ratelimit-limit-tokens"), "300000");
        assert_eq!(
            a.header("x-ratelimit-remaining-tokens"),
            (10_000 - 30 * (3 - left)).to_string()
        );
        let reset = a.header("x-ratelimit-reset-requests");
        assert!(reset.ends_with('s') && !reset.starts_with('0'), "{reset}");
    }
    let over = call(&up, "sk-a").await;
    assert_eq!(over.status, 429, "{}", over.body);
    assert!(over.body.contains("rate_limit_exceeded"));
    assert_eq!(over.header("retry-after"), "2");
    let ms: u64 = over.header("retry-after-ms").parse().expect("ms");
    assert!((1..=2000).contains(&ms), "{ms}");
    assert_eq!(over.header("x-ratelimit-remaining-requests"), "0");
    // Another key is not limited by the first.
    assert_eq!(call(&up, "sk-b").await.status, 200);

    let a = up.stats("sk-a");
    assert_eq!((a.answered, a.rejected), (3, 1));
    assert_eq!(a.max_offered_in_window, 4, "4 sent in one window");
    assert_eq!(a.max_answered_in_window, 3);
    assert_eq!(up.stats("sk-b").answered, 1);
    assert_eq!(up.total().answered, 4);
    assert_eq!(up.all_stats().len(), 2);
}

#[tokio::test]
async fn a_token_limit_binds_on_its_own() {
    // 30 tokens a call, 70 a window: the third call is over.
    let up = LimitedUpstream::start(Limits::new(100, 70, Duration::from_secs(5))).await;
    assert_eq!(call(&up, "k").await.status, 200);
    let second = call(&up, "k").await;
    assert_eq!(second.status, 200);
    assert_eq!(second.header("x-ratelimit-remaining-tokens"), "10");
    assert_eq!(second.header("x-ratelimit-remaining-requests"), "98");
    assert_eq!(call(&up, "k").await.status, 429);
}

#[tokio::test]
async fn the_window_slides_in_real_time() {
    let up = LimitedUpstream::start(Limits::new(2, 10_000, Duration::from_millis(300))).await;
    assert_eq!(call(&up, "k").await.status, 200);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(call(&up, "k").await.status, 200);
    assert_eq!(call(&up, "k").await.status, 429);
    // The first call has left the window, the second not yet.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(call(&up, "k").await.status, 200);
    assert_eq!(call(&up, "k").await.status, 429);
    let s = up.stats("k");
    assert_eq!(
        (s.answered, s.rejected, s.max_answered_in_window),
        (3, 2, 2)
    );
}

#[tokio::test(start_paused = true)]
async fn the_window_follows_a_paused_clock() {
    // A minute's window costs no real time.
    let up = LimitedUpstream::start(Limits::new(2, 10_000, Duration::from_secs(60))).await;
    assert_eq!(call(&up, "k").await.status, 200);
    assert_eq!(call(&up, "k").await.status, 200);
    let over = call(&up, "k").await;
    assert_eq!(over.status, 429);
    assert_eq!(over.header("retry-after"), "60");
    assert_eq!(over.header("x-ratelimit-reset-requests"), "1m0s");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(call(&up, "k").await.status, 200);
}
