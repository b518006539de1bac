//! [`ContinuationLayer`]: a link's way of asking its model to continue.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_llm_core::{
    BoxError, ChatRequest, Continuation, Failure, FailureClass, Link, Message, Role,
};
use tower_service::Service;

/// The user message that follows the partial answer on a link without
/// prefill: the model is asked to go on from the exact character where
/// its answer stopped, without repeating, restarting or commenting.
/// (Whatever it still repeats of the answer's tail is trimmed by
/// [`ResumeLayer`](crate::ResumeLayer).)
pub const CONTINUE_INSTRUCTION: &str = "Your previous answer was cut off by a network error \
before it was complete. Continue it from exactly where it stopped, even in the middle of a \
word or a sentence: reply with only the rest of the answer, starting with the next \
character. Do not repeat any of it, do not start over, and do not mention the interruption.";

/// Whether a link's model accepts an *assistant prefill* (a conversation
/// that ends with a partial assistant message, which the model then
/// continues): Anthropic's Claude models before 4.6 and Claude on
/// Bedrock do; OpenAI's Chat Completions and newer Claude models do not.
///
/// Shared and cheap to clone: configured `true` or `false` per link, and
/// *learned* from a refusal: when a prefilled continuation fails with a
/// [`BadRequest`](FailureClass::BadRequest), the link is marked as
/// refusing prefill for every later call of every clone (atomically), and
/// that continuation is sent again at once without prefill.
///
/// ```
/// use tower_llm_resume::Prefill;
///
/// let claude = Prefill::new(true);
/// let same = claude.clone();
/// assert!(same.is_supported());
/// claude.mark_refused(); // what the layer does on a refusal
/// assert!(!same.is_supported() && same.was_refused());
/// assert!(!Prefill::new(false).was_refused());
/// ```
#[derive(Clone)]
pub struct Prefill {
    state: Arc<AtomicU8>,
}

const NO: u8 = 0;
const YES: u8 = 1;
const REFUSED: u8 = 2;

impl Prefill {
    /// A link whose model does (`true`) or does not accept a prefill.
    pub fn new(supported: bool) -> Self {
        Prefill {
            state: Arc::new(AtomicU8::new(if supported { YES } else { NO })),
        }
    }

    /// `true` while continuations on this link are prefilled.
    pub fn is_supported(&self) -> bool {
        self.state.load(Ordering::Acquire) == YES
    }

    /// `true` once the link refused a prefill (configured to accept it,
    /// learned otherwise).
    pub fn was_refused(&self) -> bool {
        self.state.load(Ordering::Acquire) == REFUSED
    }

    /// Marks the link as refusing prefill, for every later call.
    pub fn mark_refused(&self) {
        // Only a link configured to prefill can learn a refusal.
        let _ = self
            .state
            .compare_exchange(YES, REFUSED, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl fmt::Debug for Prefill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state.load(Ordering::Acquire) {
            YES => "supported",
            REFUSED => "refused",
            _ => "unsupported",
        };
        f.debug_tuple("Prefill").field(&state).finish()
    }
}

/// Turns a continuation request (one carrying a
/// [`Continuation`]) into messages this link's model understands; any
/// other request passes as it is. One per link: inside the fallback layer
/// (so each link asks its own way), outside the link's retry layer.
///
/// With [`Prefill`] supported, the partial answer is appended as the last,
/// assistant message, which the model continues. Without, the partial
/// answer is appended as an assistant message followed by a user message,
/// [`CONTINUE_INSTRUCTION`]. Either way trailing whitespace is left out of
/// the partial answer (Anthropic refuses a prefill that ends with it; the
/// model writes it again and the repeat is trimmed), and a request that
/// already ended with the caller's own assistant prefill gets the partial
/// answer appended to it. The marker is taken out of the request that is
/// sent.
///
/// A prefilled continuation refused as a bad request teaches the link
/// (see [`Prefill`]) and is sent again at once without prefill: one more
/// call, no backoff. If that fails too, its failure says so in its
/// message. The partial answer's text is never logged or put in a
/// failure.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_llm_core::{ChatRequest, Continuation, Failure, Message, Role};
/// use tower_llm_resume::{ContinuationLayer, Prefill};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let record = seen.clone();
/// let link = ServiceBuilder::new()
///     .layer(ContinuationLayer::new(Prefill::new(true)))
///     .service(service_fn(move |req: ChatRequest| {
///         record.lock().unwrap().push(req.messages.clone());
///         async { Ok::<_, Failure>(()) }
///     }));
/// let mut req = ChatRequest::new("claude", vec![Message::user("Count to five.")]);
/// Continuation::new("One, two, ").store(&mut req);
/// link.oneshot(req).await.unwrap();
/// let sent = seen.lock().unwrap()[0].clone();
/// assert_eq!(sent.len(), 2);
/// assert_eq!((sent[1].role, sent[1].joined_text()), (Role::Assistant, "One, two,".to_owned()));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ContinuationLayer {
    prefill: Prefill,
}

impl ContinuationLayer {
    /// A layer for a link whose prefill capability is `prefill` (shared
    /// with every clone, and with other layers given a clone of it).
    pub fn new(prefill: Prefill) -> Self {
        ContinuationLayer { prefill }
    }

    /// The link's prefill capability.
    pub fn prefill(&self) -> &Prefill {
        &self.prefill
    }
}

impl<S> Layer<S> for ContinuationLayer {
    type Service = Continue<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Continue {
            inner,
            prefill: self.prefill.clone(),
        }
    }
}

/// The service built by [`ContinuationLayer`].
#[derive(Debug, Clone)]
pub struct Continue<S> {
    inner: S,
    prefill: Prefill,
}

impl<S> Continue<S> {
    /// `inner`, its continuation requests asked the way `prefill` says.
    pub fn new(inner: S, prefill: Prefill) -> Self {
        Continue { inner, prefill }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<ChatRequest> for Continue<S>
where
    S: Service<ChatRequest> + Clone,
    S::Error: Into<BoxError> + 'static,
{
    type Response = S::Response;
    type Error = Failure;
    type Future = ContinueFuture<S::Future, S>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Failure::from_inner)
    }

    fn call(&mut self, mut req: ChatRequest) -> Self::Future {
        let Some(continuation) = Continuation::take(&mut req) else {
            return ContinueFuture::plain(self.inner.call(req));
        };
        // A partial answer of nothing but whitespace is not asked for at
        // all (see `ask`): no prefill to refuse.
        if !self.prefill.is_supported() || continuation.partial().trim_end().is_empty() {
            ask(&mut req, continuation.partial(), false);
            return ContinueFuture::plain(self.inner.call(req));
        }
        // What to send if the prefill is refused: the same request, asked
        // without it, by a clone made ready when needed.
        let mut plain = req.clone();
        ask(&mut plain, continuation.partial(), false);
        ask(&mut req, continuation.partial(), true);
        let again = Again {
            service: self.inner.clone(),
            request: Some(plain),
            prefill: self.prefill.clone(),
        };
        ContinueFuture {
            fut: Some(self.inner.call(req)),
            again: Some(again),
            refused: false,
        }
    }
}

/// Appends the partial answer to `req`'s messages: as the last, assistant
/// message (`prefill`), or followed by [`CONTINUE_INSTRUCTION`].
fn ask(req: &mut ChatRequest, partial: &str, prefill: bool) {
    let partial = partial.trim_end();
    if partial.is_empty() {
        // Nothing but whitespace was sent: the request as it is (the
        // model starts over, and the repeat is trimmed).
        return;
    }
    let messages = Arc::make_mut(&mut req.messages);
    match messages.last_mut() {
        // The caller's own prefill: the answer continues it.
        Some(last) if last.role == Role::Assistant && last.tool_calls.is_empty() => {
            let mut text = last.joined_text();
            text.push_str(partial);
            *last = Message::assistant(text);
        }
        _ => messages.push(Message::assistant(partial)),
    }
    if !prefill {
        messages.push(Message::user(CONTINUE_INSTRUCTION));
    }
}

/// A prefilled continuation's second chance, without prefill.
struct Again<S> {
    service: S,
    request: Option<ChatRequest>,
    prefill: Prefill,
}

pin_project! {
    /// Response future of [`Continue`]: the inner call's, and, when a
    /// prefilled continuation is refused as a bad request, the call sent
    /// again without prefill.
    pub struct ContinueFuture<F, S> {
        #[pin]
        fut: Option<F>,
        again: Option<Again<S>>,
        refused: bool,
    }
}

impl<F, S> ContinueFuture<F, S> {
    fn plain(fut: F) -> Self {
        ContinueFuture {
            fut: Some(fut),
            again: None,
            refused: false,
        }
    }
}

impl<F, S> fmt::Debug for ContinueFuture<F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContinueFuture")
            .field("prefilled", &self.again.is_some())
            .field("refused", &self.refused)
            .finish_non_exhaustive()
    }
}

impl<F, S, Res, E> Future for ContinueFuture<F, S>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError> + 'static,
    S: Service<ChatRequest, Future = F, Response = Res, Error = E>,
{
    type Output = Result<Res, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            if let Some(fut) = this.fut.as_mut().as_pin_mut() {
                let result = ready!(fut.poll(cx)).map_err(Failure::from_inner);
                this.fut.set(None);
                return match result {
                    Err(failure)
                        if failure.class() == FailureClass::BadRequest && this.again.is_some() =>
                    {
                        if let Some(again) = this.again.as_ref() {
                            again.prefill.mark_refused();
                            let link = again.request.as_ref().and_then(|r| Link::of(r));
                            tracing::warn!(
                                provider = link.map_or("", Link::provider),
                                model = link.map_or("", Link::model),
                                "the link refused an assistant prefill: its continuations are asked without prefill from now on"
                            );
                        }
                        *this.refused = true;
                        continue;
                    }
                    Err(failure) if *this.refused => Poll::Ready(Err(after_refusal(failure))),
                    result => {
                        *this.again = None;
                        Poll::Ready(result)
                    }
                };
            }
            let Some(again) = this.again.as_mut() else {
                return Poll::Ready(Err(Failure::new(FailureClass::Cancelled)
                    .with_message("continuation future polled after completion")));
            };
            if let Err(e) = ready!(again.service.poll_ready(cx)) {
                *this.again = None;
                return Poll::Ready(Err(after_refusal(Failure::from_inner(e))));
            }
            let Some(request) = again.request.take() else {
                *this.again = None;
                continue;
            };
            let fut = again.service.call(request);
            *this.again = None;
            this.fut.set(Some(fut));
        }
    }
}

/// `failure`, its message saying that it followed a refused prefill.
fn after_refusal(failure: Failure) -> Failure {
    let message = match failure.message() {
        Some(m) => format!(
            "{m} (continuation sent without prefill after the link refused an assistant prefill)"
        ),
        None => "continuation sent without prefill after the link refused an assistant prefill"
            .to_owned(),
    };
    failure.with_message(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;
    use tower_llm_core::ToolCall;

    fn texts(req: &ChatRequest) -> Vec<(Role, String)> {
        req.messages
            .iter()
            .map(|m| (m.role, m.joined_text()))
            .collect()
    }

    #[test]
    fn the_partial_answer_is_appended_the_links_way() {
        let base = ChatRequest::new("m", vec![Message::user("Q")]);
        let mut prefilled = base.clone();
        ask(&mut prefilled, "Half an ans \n", true);
        assert_eq!(
            texts(&prefilled),
            [
                (Role::User, "Q".to_owned()),
                (Role::Assistant, "Half an ans".to_owned())
            ]
        );
        let mut told = base.clone();
        ask(&mut told, "Half an ans", false);
        assert_eq!(
            texts(&told)[1..],
            [
                (Role::Assistant, "Half an ans".to_owned()),
                (Role::User, CONTINUE_INSTRUCTION.to_owned())
            ]
        );
        assert_eq!(base.messages.len(), 1, "the original is not changed");
        // Nothing but whitespace: the request as it is.
        let mut blank = base.clone();
        ask(&mut blank, " \n", true);
        assert_eq!(texts(&blank), texts(&base));
    }

    #[test]
    fn the_callers_own_prefill_is_continued_and_a_tool_call_turn_is_not() {
        let mut req = ChatRequest::new(
            "m",
            vec![Message::user("JSON please"), Message::assistant("{")],
        );
        ask(&mut req, "\"a\": 1", true);
        assert_eq!(texts(&req)[1], (Role::Assistant, "{\"a\": 1".to_owned()));
        assert_eq!(req.messages.len(), 2);
        let mut called = Message::assistant("");
        called.tool_calls.push(ToolCall {
            id: "c".into(),
            name: "f".into(),
            arguments: "{}".into(),
        });
        let mut req = ChatRequest::new("m", vec![Message::user("Q"), called]);
        ask(&mut req, "After the tool", true);
        assert_eq!(req.messages.len(), 3);
        assert!(req.messages[1].joined_text().is_empty());
    }

    #[tokio::test]
    async fn a_bad_request_to_an_unprefilled_continuation_teaches_nothing() {
        let prefill = Prefill::new(true);
        let refuse = tower::service_fn(|_req: ChatRequest| async {
            Err::<(), _>(Failure::new(FailureClass::BadRequest))
        });
        let svc = ContinuationLayer::new(prefill.clone()).layer(refuse);
        // A partial answer of whitespace only is sent without prefill.
        let mut req = ChatRequest::new("m", vec![Message::user("Q")]);
        Continuation::new("  ").store(&mut req);
        let err = svc.clone().oneshot(req).await.expect_err("refused");
        assert!(err.is_bad_request());
        assert!(prefill.is_supported() && !prefill.was_refused());
        // An ordinary request is not a continuation.
        let err = svc
            .oneshot(ChatRequest::new("m", vec![Message::user("Q")]))
            .await
            .expect_err("refused");
        assert_eq!(err.message(), None);
        assert!(prefill.is_supported());
    }
}
