//! The gateway's HTTP server: hyper's HTTP/1 connection builder with the
//! limits of the policy's `[server]` section, in place of `axum::serve`
//! (which has no timer, so hyper's timeouts are off and a slow or idle
//! client holds its connection forever).
//!
//! Per connection:
//! - **head**: a new connection's first request head, and on a kept-alive
//!   connection each later head from its first byte, must arrive within
//!   `header_read_timeout_ms` (slowloris);
//! - **idle**: after an answer has been sent, with no request in progress
//!   and no byte received or sent, the connection is closed after
//!   `idle_timeout_ms`;
//! - **send**: while the server has bytes to write and the client reads
//!   none, the connection is closed after `send_timeout_ms`;
//! - **closed by the call**: a streamed answer whose call passed its
//!   deadline closes its connection (see [`Connection::close`]).
//!
//! At most `max_connections` are open; further clients wait in the listen
//! queue. On shutdown the listener closes, every connection finishes the
//! call it is serving (keep-alive off), and connections still open after
//! the grace period are dropped.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::config::ServerPolicy;
use axum::Router;
use axum::body::Body;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

/// What a connection is doing, for its timers.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// No request in progress and no byte received or sent since this
    /// instant.
    Idle(Instant),
    /// A request's head is arriving (its first byte came at this instant).
    Head(Instant),
    /// Requests in progress.
    Busy,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    /// Requests whose answer has not been sent whole.
    requests: usize,
    /// Since when a write has been waiting on a client that reads nothing.
    write_blocked: Option<Instant>,
    /// When the connection's timer looks at the state next.
    armed: Option<Instant>,
}

/// One accepted connection, as its requests see it (in their extensions).
#[derive(Debug, Clone)]
pub(crate) struct Connection(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    limits: ServerPolicy,
    state: Mutex<State>,
    closed: AtomicBool,
    changed: Notify,
}

impl Connection {
    fn new(limits: ServerPolicy) -> Self {
        Connection(Arc::new(Shared {
            limits,
            // A new connection owes its first head at once.
            state: Mutex::new(State {
                phase: Phase::Head(Instant::now()),
                requests: 0,
                write_blocked: None,
                armed: None,
            }),
            closed: AtomicBool::new(false),
            changed: Notify::new(),
        }))
    }

    /// Closes the connection now, whatever it is doing (its socket is
    /// dropped; a client reading nothing is not waited for).
    pub(crate) fn close(&self) {
        self.0.closed.store(true, Ordering::SeqCst);
        self.0.changed.notify_one();
    }

    /// Changes the state; wakes the connection's timer only when the change
    /// brings a deadline before the check it armed (a connection's every
    /// request would otherwise poll its whole task once more).
    fn update(&self, f: impl FnOnce(&mut State)) {
        let mut s = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut s);
        let notify = match (expires(&s, &self.0.limits), s.armed) {
            (Some(deadline), Some(armed)) => deadline < armed,
            (Some(_), None) => true,
            (None, _) => false,
        };
        drop(s);
        if notify {
            self.0.changed.notify_one();
        }
    }

    fn request_started(&self) {
        self.update(|s| {
            s.requests += 1;
            s.phase = Phase::Busy;
        });
    }

    fn request_ended(&self) {
        self.update(|s| {
            s.requests = s.requests.saturating_sub(1);
            if s.requests == 0 {
                s.phase = Phase::Idle(Instant::now());
            }
        });
    }

    fn read_bytes(&self) {
        self.update(|s| {
            if let Phase::Idle(_) = s.phase {
                s.phase = Phase::Head(Instant::now());
            }
        });
    }

    /// A write was tried: `Pending` starts the send timer; bytes written
    /// stop it, and keep an idle connection that is still sending the tail
    /// of its last answer from counting as idle.
    fn wrote(&self, polled: &Poll<io::Result<usize>>) {
        self.update(|s| match polled {
            Poll::Pending if s.write_blocked.is_none() => {
                s.write_blocked = Some(Instant::now());
            }
            Poll::Ready(Ok(n)) if *n > 0 => {
                if let Phase::Idle(since) = &mut s.phase {
                    *since = Instant::now();
                }
                s.write_blocked = None;
            }
            _ => {}
        });
    }

    /// `true` while bytes of an answer wait on a client that reads nothing.
    pub(crate) fn write_pending(&self) -> bool {
        self.0
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write_blocked
            .is_some()
    }

    /// When the connection must be closed unless something happens first.
    fn expires(&self) -> Option<Instant> {
        let s = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        expires(&s, &self.0.limits)
    }

    /// When the connection's timer looks at the state next (and arms it
    /// there): never later than [`expires`], and early enough that only a
    /// change [`Connection::update`] wakes it for can bring a deadline
    /// before it:
    /// - busy: after the shorter of the idle and header timeouts;
    /// - idle since `t`: at its deadline, or after one header timeout if
    ///   that is sooner (a head may start at any time);
    /// - reading a head since `t`: at its deadline;
    /// - a write waiting on the client adds its send deadline (and an idle
    ///   connection still sending has no idle deadline).
    ///
    /// Never sooner than a millisecond from now, so the timer's loop
    /// cannot spin.
    fn next_check(&self) -> Instant {
        let now = Instant::now();
        let limits = &self.0.limits;
        let head = limits.header_read_timeout();
        let mut s = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        let check = match (s.phase, s.write_blocked) {
            (Phase::Busy, None) => now + limits.idle_timeout().min(head),
            (Phase::Busy | Phase::Idle(_), Some(since)) => {
                (now + head).min(since + limits.send_timeout())
            }
            (Phase::Idle(since), None) => (since + limits.idle_timeout()).min(now + head),
            (Phase::Head(since), blocked) => {
                let deadline = since + head;
                blocked.map_or(deadline, |b| deadline.min(b + limits.send_timeout()))
            }
        };
        let check = check.max(now + Duration::from_millis(1));
        s.armed = Some(check);
        check
    }
}

/// When a connection in state `s` must be closed unless something happens
/// first.
fn expires(s: &State, limits: &ServerPolicy) -> Option<Instant> {
    let phase = match s.phase {
        // Bytes of the last answer still waiting on the client: that is
        // sending (the send timer's), not idling.
        Phase::Idle(_) if s.write_blocked.is_some() => None,
        Phase::Idle(since) => Some(since + limits.idle_timeout()),
        Phase::Head(since) => Some(since + limits.header_read_timeout()),
        Phase::Busy => None,
    };
    let send = s.write_blocked.map(|since| since + limits.send_timeout());
    match (phase, send) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The socket, watched: reads move an idle connection to reading a head,
/// writes that wait on the client start the send timer.
struct Watched {
    io: TcpStream,
    conn: Connection,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.read_bytes();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.conn.wrote(&polled);
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.conn.wrote(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// An answer's body that tells its connection when it has been sent whole
/// (or dropped).
struct Tracked {
    body: Body,
    conn: Option<Connection>,
}

impl Tracked {
    fn end(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.request_ended();
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.end();
    }
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.end();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The connection slots of `[server] max_connections`: one per open
/// connection, shared by every listener served with them
/// ([`serve_with_slots`]), so several listeners (one per worker thread)
/// still hold at most that many connections between them. A listener
/// waiting for its next connection holds one slot.
#[derive(Debug, Clone)]
pub struct ConnectionSlots {
    slots: Arc<Semaphore>,
    max: usize,
}

impl ConnectionSlots {
    /// Slots for at most `max_connections` open connections (at most
    /// [`Semaphore::MAX_PERMITS`]; the policy file allows far fewer).
    pub fn new(max_connections: usize) -> Self {
        let max = max_connections.min(Semaphore::MAX_PERMITS);
        ConnectionSlots {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

/// Serves `router` on `listener` with `limits` until `shutdown` resolves
/// (to the grace period); then stops accepting, lets each connection
/// finish the call it serves for up to that grace, drops the connections
/// still open, and returns. Accept errors (too many open files, a reset
/// before accept) are retried after a short pause, as `axum::serve` does.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerPolicy,
    shutdown: impl Future<Output = Duration> + Send,
) {
    let slots = ConnectionSlots::new(limits.max_connections);
    serve_with_slots(listener, router, limits, slots, shutdown).await;
}

/// [`serve`], with connection slots shared with other listeners: the
/// binary serves one listener per worker thread (each on a runtime of its
/// own) with one [`ConnectionSlots`]. On shutdown it returns once every
/// connection holding one of `slots` is gone (or the grace has run out).
pub async fn serve_with_slots(
    listener: TcpListener,
    router: Router,
    limits: ServerPolicy,
    slots: ConnectionSlots,
    shutdown: impl Future<Output = Duration> + Send,
) {
    let ConnectionSlots { slots, max } = slots;
    let (stop, stopped) = tokio::sync::watch::channel(Duration::ZERO);
    let mut shutdown = std::pin::pin!(shutdown);
    let grace = loop {
        let slot = tokio::select! {
            grace = &mut shutdown => break grace,
            slot = slots.clone().acquire_owned() => slot,
        };
        let Ok(slot) = slot else {
            break Duration::ZERO;
        };
        let accepted = tokio::select! {
            grace = &mut shutdown => break grace,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::debug!(target: "gateway", error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            connection(tcp, router, limits, &mut stopped).await;
            drop(slot);
        });
    };
    drop(listener);
    let _ = stop.send(grace);
    // Every connection holds a slot until it is gone.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(grace + Duration::from_secs(1), slots.acquire_many(all)).await;
}

/// Serves one connection until it ends, a limit closes it, or the
/// shutdown's grace period runs out.
async fn connection(
    tcp: TcpStream,
    router: Router,
    limits: ServerPolicy,
    stopped: &mut tokio::sync::watch::Receiver<Duration>,
) {
    let conn = Connection::new(limits);
    let io = TokioIo::new(Watched {
        io: tcp,
        conn: conn.clone(),
    });
    let service = {
        let conn = conn.clone();
        hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            conn.request_started();
            req.extensions_mut().insert(conn.clone());
            let conn = conn.clone();
            let call = router.clone().oneshot(req.map(Body::new));
            async move {
                let res = match call.await {
                    Ok(res) => res,
                    Err(never) => match never {},
                };
                Ok::<_, std::convert::Infallible>(res.map(|body| Tracked {
                    body,
                    conn: Some(conn),
                }))
            }
        })
    };
    let served = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    let mut served = std::pin::pin!(served);
    let mut stop_by: Option<Instant> = None;
    loop {
        if conn.0.closed.load(Ordering::SeqCst) {
            return;
        }
        let changed = conn.0.changed.notified();
        let check = match stop_by {
            Some(stop) => conn.next_check().min(stop),
            None => conn.next_check(),
        };
        tokio::select! {
            _ = served.as_mut() => return,
            _ = changed => {}
            _ = tokio::time::sleep_until(check) => {
                let now = Instant::now();
                if stop_by.is_some_and(|t| t <= now)
                    || conn.expires().is_some_and(|t| t <= now)
                {
                    return;
                }
            }
            _ = stopped.changed(), if stop_by.is_none() => {
                served.as_mut().graceful_shutdown();
                stop_by = Some(Instant::now() + *stopped.borrow());
            }
        }
    }
}
