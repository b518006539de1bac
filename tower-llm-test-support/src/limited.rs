//! [`LimitedUpstream`]: an OpenAI-compatible chat endpoint that enforces
//! real rate limits per API key, the way OpenAI does, and counts what each
//! key was sent.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use tokio::time::Instant;

/// The limits every key of a [`LimitedUpstream`] gets, and what one call
/// costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests a key may make in any `window`.
    pub requests: u32,
    /// Tokens (input and output) a key may use in any `window`.
    pub tokens: u32,
    /// The sliding window the limits count over.
    pub window: Duration,
    /// The input tokens every call reports in `usage` (and costs).
    pub input_tokens: u32,
    /// The output tokens every call reports in `usage` (and costs).
    pub output_tokens: u32,
}

impl Limits {
    /// `requests` and `tokens` in any `window`; every call costs 20 input
    /// and 10 output tokens.
    pub fn new(requests: u32, tokens: u32, window: Duration) -> Self {
        assert!(!window.is_zero(), "a window of zero");
        Limits {
            requests,
            tokens,
            window,
            input_tokens: 20,
            output_tokens: 10,
        }
    }

    /// The tokens one call costs.
    pub fn call_tokens(&self) -> u32 {
        self.input_tokens + self.output_tokens
    }

    /// A limit per `window` as a limit per minute (what OpenAI's
    /// `x-ratelimit-limit-*` headers state), rounded down, at least 1.
    pub fn per_minute(&self, per_window: u32) -> u64 {
        let per_minute = u128::from(per_window) * 60_000_000_000 / self.window.as_nanos().max(1);
        u64::try_from(per_minute).unwrap_or(u64::MAX).max(1)
    }
}

/// What one key was sent and answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyStats {
    /// Calls answered 200.
    pub answered: u64,
    /// Calls answered 429 (over a limit).
    pub rejected: u64,
    /// The most requests that arrived (answered or not) within any one
    /// window: over [`Limits::requests`], the key was sent more than it
    /// allows.
    pub max_offered_in_window: u32,
    /// The most requests answered within any one window (never over
    /// [`Limits::requests`]: the limit is enforced).
    pub max_answered_in_window: u32,
}

/// An OpenAI-compatible `POST /v1/chat/completions` on a loopback port
/// that enforces [`Limits`] per API key (the `authorization: Bearer`
/// header; none: the empty key), over a sliding window: a key may make
/// at most `requests` calls and use at most `tokens` tokens in any
/// `window`. It stops when dropped.
///
/// A call within the limits gets a chat completion with `usage`
/// (`input_tokens` + `output_tokens`, fixed); a call over a limit gets a
/// 429 `rate_limit_exceeded` with `retry-after` (whole seconds, rounded
/// up) and `retry-after-ms`: when the first slot frees. Every answer
/// carries OpenAI's headers:
///
/// - `x-ratelimit-limit-requests`, `x-ratelimit-limit-tokens`: the limits
///   **per minute** (OpenAI states RPM and TPM; a limit per 2 s window of
///   5 reads `150`), so a pacer that reads them per minute paces right.
/// - `x-ratelimit-remaining-requests`, `x-ratelimit-remaining-tokens`:
///   what is left in the window now (after this call).
/// - `x-ratelimit-reset-requests`, `x-ratelimit-reset-tokens`: the time
///   until the window is back to its initial state (the newest counted
///   call leaves it), as Go durations: `1s`, `120ms`, `1.5s`, `6m0s`.
///
/// The clock is tokio's ([`tokio::time::Instant`]), read on the tasks of
/// the runtime that started it: real time, or the test's paused clock
/// under `start_paused` (the same clock as a gateway's pacer in that
/// runtime). Note that loopback I/O does not hold a paused clock back
/// (it jumps to the next timer while a socket is waited on), so
/// end-to-end tests through a real HTTP client use real time.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_test_support::limited::{Limits, LimitedUpstream};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let upstream = LimitedUpstream::start(Limits::new(5, 1_000, Duration::from_secs(2))).await;
/// assert!(upstream.url().starts_with("http://127.0.0.1:"));
/// assert_eq!(upstream.stats("sk-a"), Default::default());
/// # }
/// ```
#[derive(Debug)]
pub struct LimitedUpstream {
    addr: SocketAddr,
    limits: Limits,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Default)]
struct State {
    /// By the key's raw bytes (a key is opaque, never decoded).
    keys: HashMap<Vec<u8>, Key>,
}

#[derive(Debug, Default)]
struct Key {
    /// When each answered call was answered, within the window.
    answered: VecDeque<Instant>,
    /// When each call arrived, within the window.
    offered: VecDeque<Instant>,
    stats: KeyStats,
}

impl Key {
    fn forget_before(&mut self, since: Option<Instant>) {
        if let Some(since) = since {
            while self.answered.front().is_some_and(|t| *t <= since) {
                self.answered.pop_front();
            }
            while self.offered.front().is_some_and(|t| *t <= since) {
                self.offered.pop_front();
            }
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LimitedUpstream {
    /// Starts one on a fresh loopback port, on a task of the current
    /// runtime.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound, or outside a tokio runtime.
    pub async fn start(limits: Limits) -> LimitedUpstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("its address");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let state = shared.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(&state, limits, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        LimitedUpstream {
            addr,
            limits,
            state,
            task,
        }
    }

    /// `http://127.0.0.1:PORT` (an OpenAI provider's `base_url` is this
    /// and `/v1`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The limits every key gets.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// What `key` was sent so far (zeros for a key never seen).
    pub fn stats(&self, key: &str) -> KeyStats {
        lock(&self.state)
            .keys
            .get(key.as_bytes())
            .map(|k| k.stats)
            .unwrap_or_default()
    }

    /// Every key seen, with its stats, by key (shown lossily as text).
    pub fn all_stats(&self) -> Vec<(String, KeyStats)> {
        let mut all: Vec<_> = lock(&self.state)
            .keys
            .iter()
            .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.stats))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Every key's stats added up (the maxima: the largest of any key).
    pub fn total(&self) -> KeyStats {
        self.all_stats()
            .into_iter()
            .fold(KeyStats::default(), |t, (_, s)| KeyStats {
                answered: t.answered + s.answered,
                rejected: t.rejected + s.rejected,
                max_offered_in_window: t.max_offered_in_window.max(s.max_offered_in_window),
                max_answered_in_window: t.max_answered_in_window.max(s.max_answered_in_window),
            })
    }
}

impl Drop for LimitedUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a key's window says now: the request and token headers' values.
struct Window {
    remaining_requests: u32,
    remaining_tokens: u32,
    /// Until the window is back to its initial state.
    reset: Duration,
}

async fn handle(
    state: &Mutex<State>,
    limits: Limits,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    // Read the whole request (its content is not looked at).
    let _ = body.collect().await;
    if parts.method != http::Method::POST || !parts.uri.path().ends_with("/chat/completions") {
        return error(404, "not_found", "only POST /v1/chat/completions", &[]);
    }
    let key = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default()
        .to_vec();
    let cost = limits.call_tokens();
    let now = Instant::now();
    let (admitted, window, retry) = {
        let mut state = lock(state);
        let k = state.keys.entry(key).or_default();
        k.forget_before(now.checked_sub(limits.window));
        k.offered.push_back(now);
        let offered = u32::try_from(k.offered.len()).unwrap_or(u32::MAX);
        k.stats.max_offered_in_window = k.stats.max_offered_in_window.max(offered);
        let used_requests = u32::try_from(k.answered.len()).unwrap_or(u32::MAX);
        let used_tokens = used_requests.saturating_mul(cost);
        let admitted =
            used_requests < limits.requests && used_tokens.saturating_add(cost) <= limits.tokens;
        // When the first answered call leaves the window: a slot frees.
        let retry = k.answered.front().map_or(Duration::ZERO, |t| {
            (*t + limits.window).saturating_duration_since(now)
        });
        if admitted {
            k.answered.push_back(now);
            k.stats.answered += 1;
            let answered = u32::try_from(k.answered.len()).unwrap_or(u32::MAX);
            k.stats.max_answered_in_window = k.stats.max_answered_in_window.max(answered);
        } else {
            k.stats.rejected += 1;
        }
        let used = u32::try_from(k.answered.len()).unwrap_or(u32::MAX);
        let window = Window {
            remaining_requests: limits.requests.saturating_sub(used),
            remaining_tokens: limits.tokens.saturating_sub(used.saturating_mul(cost)),
            reset: k.answered.back().map_or(Duration::ZERO, |t| {
                (*t + limits.window).saturating_duration_since(now)
            }),
        };
        (admitted, window, retry)
    };
    let mut headers: Vec<(&str, String)> = vec![
        (
            "x-ratelimit-limit-requests",
            limits.per_minute(limits.requests).to_string(),
        ),
        (
            "x-ratelimit-remaining-requests",
            window.remaining_requests.to_string(),
        ),
        ("x-ratelimit-reset-requests", go_duration(window.reset)),
        (
            "x-ratelimit-limit-tokens",
            limits.per_minute(limits.tokens).to_string(),
        ),
        (
            "x-ratelimit-remaining-tokens",
            window.remaining_tokens.to_string(),
        ),
        ("x-ratelimit-reset-tokens", go_duration(window.reset)),
    ];
    if !admitted {
        let ms = retry.as_millis().max(1);
        headers.push(("retry-after", ms.div_ceil(1000).to_string()));
        headers.push(("retry-after-ms", ms.to_string()));
        return error(
            429,
            "rate_limit_exceeded",
            "Rate limit reached for requests or tokens; try again later",
            &headers,
        );
    }
    let body = format!(
        r#"{{"id":"chatcmpl-limited","object":"chat.completion","created":0,"model":"limited-model","choices":[{{"index":0,"message":{{"role":"assistant","content":"ok"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{}}}}}"#,
        limits.input_tokens, limits.output_tokens, cost
    );
    respond(200, body, &headers)
}

fn error(
    status: u16,
    code: &str,
    message: &str,
    headers: &[(&str, String)],
) -> http::Response<Full<Bytes>> {
    let body = format!(
        r#"{{"error":{{"message":"{message}","type":"requests","param":null,"code":"{code}"}}}}"#
    );
    respond(status, body, headers)
}

fn respond(status: u16, body: String, headers: &[(&str, String)]) -> http::Response<Full<Bytes>> {
    let mut res = http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        res = res.header(*name, value.as_str());
    }
    res.body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| http::Response::new(Full::new(Bytes::new())))
}

/// A duration as OpenAI writes its resets (Go's `time.Duration` style):
/// `0s`, `120ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let (seconds, millis) = (rest / 1000, rest % 1000);
    let mut out = String::new();
    if hours > 0 {
        let _ = write!(out, "{hours}h");
    }
    if hours > 0 || minutes > 0 {
        let _ = write!(out, "{minutes}m");
    }
    let _ = write!(out, "{seconds}");
    if millis > 0 {
        let frac = format!("{millis:03}");
        let _ = write!(out, ".{}", frac.trim_end_matches('0'));
    }
    out.push('s');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let d = |ms| go_duration(Duration::from_millis(ms));
        assert_eq!(d(0), "0s");
        assert_eq!(d(120), "120ms");
        assert_eq!(d(1000), "1s");
        assert_eq!(d(1500), "1.5s");
        assert_eq!(d(9816), "9.816s");
        assert_eq!(d(360_000), "6m0s");
        assert_eq!(d(90_050), "1m30.05s");
        assert_eq!(d(3_723_000), "1h2m3s");
    }

    #[test]
    fn per_minute() {
        let l = Limits::new(5, 150, Duration::from_secs(2));
        assert_eq!(l.per_minute(5), 150);
        assert_eq!(l.per_minute(150), 4500);
        assert_eq!(Limits::new(7, 1, Duration::from_secs(60)).per_minute(7), 7);
    }
}
