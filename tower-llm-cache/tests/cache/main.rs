//! The cache layer on virtual time: fresh hits and their exact ages, the
//! request's `Cache-Control`, streams, what is never stored, the
//! stale-safe rung, the deadline, tenants and the stores.

mod control;
mod deadline;
mod fresh;
mod never_stored;
mod stale;
mod store;
mod streams;
mod tenants;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tower::{Service, ServiceExt, service_fn};
use tower_llm_cache::{CacheConfig, CacheLayer};
use tower_llm_core::{
    CacheOutcome, CacheStatus, ChatRequest, ChatResponse, Failure, FailureClass, Message, ToolCall,
};
use tower_llm_idempotency::NoTenant;

/// How the test finds a request's inbound headers: typed requests carry
/// none, so the test keeps them in the request's extensions.
type HeaderFn = for<'a> fn(&'a ChatRequest) -> Option<&'a HeaderMap>;

/// The inbound HTTP headers a server kept with a typed request.
#[derive(Debug, Clone)]
struct Inbound(HeaderMap);

fn inbound(req: &ChatRequest) -> Option<&HeaderMap> {
    req.extensions.get::<Inbound>().map(|i| &i.0)
}

/// What the provider does on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// Answers `"answer n"` (id and text) for call `n`.
    Answer,
    /// Answers `"answer n"` with one tool call.
    ToolCall,
    /// The fallback layer's degraded answer.
    Degraded,
    /// Fails with this class.
    Fail(FailureClass),
    /// Never answers.
    Hang,
    /// Fails with this class after this long.
    FailAfter(FailureClass, std::time::Duration),
    /// Records a failed attempt of this class in the call's log (as the
    /// last link's), then answers the fallback layer's degraded answer.
    DegradedAfter(FailureClass),
}

type Script = Arc<dyn Fn(usize) -> Reply + Send + Sync>;

/// A unary provider counting its calls; call `n` does `script(n)`.
#[derive(Clone)]
struct Provider {
    calls: Arc<AtomicUsize>,
    script: Script,
}

impl Provider {
    fn answering() -> Self {
        Provider::scripted(|_| Reply::Answer)
    }

    fn scripted(script: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Self {
        Provider {
            calls: Arc::default(),
            script: Arc::new(script),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl Service<
        ChatRequest,
        Response = ChatResponse,
        Error = Failure,
        Future = impl Send + 'static,
    > + Clone
    + Send
    + 'static {
        let this = self.clone();
        service_fn(move |req: ChatRequest| {
            let n = this.calls.fetch_add(1, Ordering::SeqCst);
            let reply = (this.script)(n);
            if let Reply::DegradedAfter(class) = reply {
                use tower_llm_core::layer::AttemptLogExt;
                let log = tower_llm_core::AttemptLog::of(&req).expect("a call owner's log");
                let link = tower_llm_core::Link::new("p", "m");
                let record = tower_llm_core::AttemptRecord::new(
                    &link,
                    1,
                    tower_llm_core::AttemptOutcome::Failed(class),
                    std::time::Duration::ZERO,
                );
                let _ = log.begin(record);
            }
            async move {
                match reply {
                    Reply::Answer => Ok(answer(n)),
                    Reply::ToolCall => Ok(ChatResponse::builder("m")
                        .id(format!("answer {n}"))
                        .provider("mock")
                        .tool_call(ToolCall {
                            id: "call_1".into(),
                            name: "send_email".into(),
                            arguments: "{}".into(),
                        })
                        .build()),
                    Reply::Degraded => Ok(ChatResponse {
                        id: format!("degraded {n}"),
                        degraded: true,
                        ..ChatResponse::default()
                    }),
                    Reply::Fail(class) => Err(Failure::new(class)),
                    Reply::Hang => std::future::pending().await,
                    Reply::FailAfter(class, after) => {
                        tokio::time::sleep(after).await;
                        Err(Failure::new(class))
                    }
                    Reply::DegradedAfter(_) => Ok(ChatResponse {
                        id: format!("degraded {n}"),
                        degraded: true,
                        ..ChatResponse::default()
                    }),
                }
            }
        })
    }
}

/// The provider's answer to call `n`.
fn answer(n: usize) -> ChatResponse {
    ChatResponse::builder("m")
        .id(format!("answer {n}"))
        .provider("mock")
        .text(format!("answer {n}"))
        .build()
}

/// The same question every time.
fn ask() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("Capital of France?")])
}

/// [`ask`] with these inbound headers.
fn ask_with(headers: &[(&'static str, &'static str)]) -> ChatRequest {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    let mut req = ask();
    req.extensions.insert(Inbound(map));
    req
}

/// A cache layer reading the inbound headers the test keeps.
fn cache(config: CacheConfig) -> CacheLayer<NoTenant, HeaderFn> {
    CacheLayer::new(config)
        .expect("valid config")
        .with_headers(inbound as HeaderFn)
}

/// `ttl_ms` and `stale_ms`, the rest default.
fn config(ttl_ms: u64, stale_ms: u64) -> CacheConfig {
    CacheConfig {
        ttl_ms,
        stale_ms,
        ..CacheConfig::default()
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

async fn advance(by: Duration) {
    tokio::time::advance(by).await;
}

/// Calls `svc` once with `req`.
async fn call<S>(svc: &S, req: ChatRequest) -> Result<ChatResponse, Failure>
where
    S: Service<ChatRequest, Response = ChatResponse, Error = Failure> + Clone,
{
    svc.clone().oneshot(req).await
}

/// The answer's id and what the cache did for it.
fn seen(res: &ChatResponse) -> (&str, Option<CacheOutcome>) {
    (res.id.as_str(), res.cache)
}

fn hit(age: Duration) -> Option<CacheOutcome> {
    Some(CacheOutcome::new(CacheStatus::Hit, age))
}

fn stale(age: Duration) -> Option<CacheOutcome> {
    Some(CacheOutcome::new(CacheStatus::Stale, age))
}

const MISS: Option<CacheOutcome> = Some(CacheOutcome::MISS);
