//! Playing one reply: the response and its body.

use std::collections::VecDeque;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tower_llm_core::BoxError;

use super::reply::{Recorded, Reply, Step};

/// The response body of the doubles.
#[derive(Debug)]
pub struct MockBody {
    steps: VecDeque<Step>,
    repeat: Option<(Bytes, usize)>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Counts a drop before the end (streams only).
    aborted: Option<Arc<AtomicUsize>>,
    ended: bool,
}

impl MockBody {
    pub(super) fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        MockBody {
            steps: steps.into_iter().collect(),
            repeat: None,
            sleep: None,
            aborted: None,
            ended: false,
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.steps.pop_front() {
                Some(Step::Send(chunk)) => return Poll::Ready(Some(Ok(Frame::data(chunk)))),
                Some(Step::Pause(d)) => self.sleep = Some(Box::pin(tokio::time::sleep(d))),
                Some(Step::Stall) => {
                    self.steps.push_front(Step::Stall);
                    return Poll::Pending;
                }
                Some(Step::Break) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err("the connection broke off mid-body".into())));
                }
                None => break,
            }
        }
        if let Some((chunk, left)) = self.repeat.as_mut() {
            if *left > 0 {
                let n = (*left).min(chunk.len());
                *left -= n;
                return Poll::Ready(Some(Ok(Frame::data(chunk.slice(..n)))));
            }
        }
        self.ended = true;
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        // Only once polled to its end, so that a complete stream is never
        // counted as aborted.
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for MockBody {
    fn drop(&mut self) {
        if let (false, Some(aborted)) = (self.ended, &self.aborted) {
            aborted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// `reply` with any [`Reply::With`] (also under a delay) built for `req`.
pub(super) fn resolve(reply: Reply, req: &Recorded) -> Reply {
    match reply {
        Reply::With(build) => resolve(build(req), req),
        Reply::Delayed(d, inner) => Reply::Delayed(d, Box::new(resolve(*inner, req))),
        other => other,
    }
}

/// Builds the response for `reply` (after any delay), or `None` for a reset
/// or a hang (which never returns).
pub(super) async fn respond(
    reply: Reply,
    aborted: Arc<AtomicUsize>,
) -> Option<http::Response<MockBody>> {
    let mut reply = reply;
    loop {
        match reply {
            Reply::Delayed(d, inner) => {
                tokio::time::sleep(d).await;
                reply = *inner;
            }
            Reply::Hang => std::future::pending::<()>().await,
            // Resolved against the request before `respond`.
            Reply::Reset | Reply::With(_) => return None,
            Reply::Answer {
                status,
                headers,
                body,
            } => {
                let mut res = http::Response::new(MockBody::new([Step::Send(body)]));
                *res.status_mut() =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                for (k, v) in headers {
                    if let (Ok(k), Ok(v)) = (
                        HeaderName::from_bytes(k.as_bytes()),
                        HeaderValue::from_str(&v),
                    ) {
                        res.headers_mut().append(k, v);
                    }
                }
                return Some(res);
            }
            Reply::Truncated { sent } => {
                return Some(http::Response::new(MockBody::new([
                    Step::Send(sent),
                    Step::Break,
                ])));
            }
            Reply::Oversized { len } => {
                let mut body = MockBody::new([]);
                body.repeat = Some((Bytes::from(vec![b' '; 64 * 1024]), len));
                return Some(http::Response::new(body));
            }
            Reply::Sse(events) => {
                reply = Reply::sse_steps(
                    events
                        .into_iter()
                        .map(|e| Step::Send(Bytes::from(e)))
                        .collect(),
                );
            }
            Reply::Stream {
                content_type,
                steps,
            } => {
                let mut body = MockBody::new(steps);
                body.aborted = Some(aborted);
                let mut res = http::Response::new(body);
                if let Ok(v) = HeaderValue::from_str(&content_type) {
                    res.headers_mut().insert("content-type", v);
                }
                return Some(res);
            }
        }
    }
}
