//! Server-sent events: a committed stream pumped to the client through a
//! small buffer, cut at the call's deadline.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use tokio::time::Instant;
use tower_llm::{ChatStream, Failure};

use crate::Gateway;
use crate::routes::RouteInfo;
use crate::server::Connection;

use super::answer::{Held, insert_answer_flags, insert_attempts, insert_cache};
use super::inbound::{Frames, Inbound};

/// Stream ids: unique per process.
static STREAMS: AtomicU64 = AtomicU64::new(0);

/// Frames a committed stream holds between the upstream and the client.
const SSE_BUFFER: usize = 16;

/// How long a client has to take the deadline's error event before its
/// connection is closed.
const CLOSE_GRACE: Duration = Duration::from_millis(100);

/// A committed stream as server-sent events in the client's format: for
/// OpenAI one `data:` per chunk, `data: [DONE]` at a clean end, or one
/// `data: {"error": ...}` event for a failure after the commit point (and
/// no `[DONE]`); for Anthropic its `message_start` ... `message_stop`
/// events, or one `error` event.
///
/// A task moves the frames from the upstream to the client through a
/// small buffer, so the call's deadline ends the upstream side by itself,
/// whether or not the client reads: at the deadline the upstream stream is
/// dropped (its connection closed, its generation stopped), the client is
/// sent the deadline's error event, and a client that has not taken it
/// within [`CLOSE_GRACE`] has its connection closed.
#[allow(clippy::too_many_arguments)]
pub(super) fn sse(
    gw: Arc<Gateway>,
    stream: ChatStream,
    inbound: Inbound,
    include_usage: bool,
    deadline: Instant,
    conn: Option<Connection>,
    held: Held,
    route: &RouteInfo,
) -> Response {
    let position = stream.fallback_position();
    let mut res = Response::new(Body::empty());
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if stream.is_degraded() {
        insert_attempts(headers, stream.attempts(), None, None);
        headers.insert("x-llm-degraded", HeaderValue::from_static("true"));
    } else {
        insert_attempts(headers, stream.attempts(), Some(position), Some(route));
    }
    insert_answer_flags(headers, stream.attempts(), stream.is_idempotent_replay());
    insert_cache(headers, stream.cache_outcome());
    let id = inbound.stream_id(STREAMS.fetch_add(1, Ordering::Relaxed));
    // The records of each continuation (a route's `resume`) reach the
    // status page once the stream is over: they come after the headers.
    let continued = stream.continuations();
    let frames = inbound.frames(stream, include_usage, id);
    let (tx, rx) = tokio::sync::mpsc::channel(SSE_BUFFER);
    let (taken, gone) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        pump(frames, inbound, tx, deadline, conn, gone, held).await;
        for piece in continued.pieces() {
            gw.status.observe(piece.attempts(), true);
        }
    });
    *res.body_mut() = Body::from_stream(Delivered { rx, _taken: taken });
    res
}

/// Moves `frames` to the client until they end, the client goes, or the
/// deadline passes (see [`sse`]).
async fn pump(
    mut frames: Frames,
    inbound: Inbound,
    tx: tokio::sync::mpsc::Sender<Bytes>,
    deadline: Instant,
    conn: Option<Connection>,
    mut gone: tokio::sync::oneshot::Receiver<()>,
    _held: Held,
) {
    let forward = async {
        loop {
            let next = std::future::poll_fn(|cx| {
                futures_core::Stream::poll_next(std::pin::Pin::new(&mut frames), cx)
            });
            // A client that goes stops the upstream at once, even while the
            // upstream is silent.
            let frame = tokio::select! {
                biased;
                _ = tx.closed() => return,
                frame = next => frame,
            };
            let Some(frame) = frame else {
                return;
            };
            if tx.send(frame).await.is_err() {
                return; // the client is gone
            }
        }
    };
    if tokio::time::timeout_at(deadline, forward).await.is_ok() {
        return;
    }
    // The deadline: the upstream side ends now, read or not.
    drop(frames);
    let failure = Failure::deadline_exceeded().with_message("the call's deadline passed");
    let taken = tokio::time::timeout(CLOSE_GRACE, async {
        // Room for the last event comes only if the client reads.
        let _ = tx.send(inbound.error_event(&failure)).await;
        drop(tx);
        let _ = (&mut gone).await;
    })
    .await
    .is_ok();
    if let Some(conn) = conn {
        if !taken || conn.write_pending() {
            tracing::debug!(target: "gateway", "closing a connection that stopped reading its stream");
            conn.close();
        }
    }
}

/// The client's side of a streamed answer: frames from [`pump`]; dropping
/// it (the answer was sent whole, or the client went) tells the pump.
struct Delivered {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    _taken: tokio::sync::oneshot::Sender<()>,
}

impl futures_core::Stream for Delivered {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|frame| frame.map(Ok))
    }
}
