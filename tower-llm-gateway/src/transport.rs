//! The gateway's HTTP transport to the providers.

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::ResponseFuture;
use tower_llm::providers::RequestBody;
use tower_llm::providers::https::{HttpsClient, client_with_connect_timeout};

/// How the gateway reaches the providers: pooled HTTP/1.1 clients
/// (HTTPS with rustls, and plain HTTP), a [`tower::Service`] over
/// `http::Request<RequestBody>`.
///
/// [`Transport::per_thread`] (what the binary uses) keeps one client, with
/// its own connection pool, per thread that makes calls: a call served on a
/// thread reuses connections that thread opened, so with one
/// single-threaded runtime per core a call never wakes another thread.
/// [`Transport::shared`] (or `From<HttpsClient>`) uses one client, and one
/// pool, from every thread.
///
/// Cloning is cheap and keeps the same clients.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use tower_llm_gateway::Transport;
///
/// let per_thread = Transport::per_thread(Duration::from_secs(5));
/// let shared = Transport::shared(tower_llm::providers::https::client_with_connect_timeout(
///     Duration::from_secs(5),
/// ));
/// # let _ = (per_thread, shared);
/// # }
/// ```
#[derive(Clone)]
pub struct Transport {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Shared(Arc<HttpsClient>),
    PerThread(Arc<PerThread>),
}

/// What each thread's client is built with; threads find their client by
/// this allocation's address (a thread's entry for a transport that is gone
/// is dropped at that thread's next lookup).
struct PerThread {
    connect_timeout: Duration,
}

thread_local! {
    /// This thread's clients, one per live per-thread transport.
    static CLIENTS: RefCell<Vec<(Weak<PerThread>, HttpsClient)>> = const { RefCell::new(Vec::new()) };
}

impl Transport {
    /// One pooled client per thread that makes calls, each with
    /// `connect_timeout`. A client is built on a thread's first call (within
    /// a tokio runtime with the time driver, as every call is).
    pub fn per_thread(connect_timeout: Duration) -> Self {
        Transport {
            kind: Kind::PerThread(Arc::new(PerThread { connect_timeout })),
        }
    }

    /// One client (one pool) for every thread.
    pub fn shared(client: HttpsClient) -> Self {
        Transport {
            kind: Kind::Shared(Arc::new(client)),
        }
    }

    /// The connect timeout of this transport's per-thread clients (`None`
    /// for a shared client, whose setting is its own).
    pub fn connect_timeout(&self) -> Option<Duration> {
        match &self.kind {
            Kind::Shared(_) => None,
            Kind::PerThread(p) => Some(p.connect_timeout),
        }
    }
}

impl From<HttpsClient> for Transport {
    fn from(client: HttpsClient) -> Self {
        Transport::shared(client)
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Shared(_) => f.write_str("Transport::Shared"),
            Kind::PerThread(p) => f
                .debug_struct("Transport::PerThread")
                .field("connect_timeout", &p.connect_timeout)
                .finish(),
        }
    }
}

impl PerThread {
    fn request(self: &Arc<Self>, req: http::Request<RequestBody>) -> ResponseFuture {
        CLIENTS.with(|clients| {
            let mut clients = clients.borrow_mut();
            let me = Arc::as_ptr(self);
            if let Some((_, client)) = clients.iter().find(|(w, _)| w.as_ptr() == me) {
                return client.request(req);
            }
            // A new transport for this thread: forget the clients of the
            // ones that are gone (their pools close).
            clients.retain(|(w, _)| w.strong_count() > 0);
            let client = client_with_connect_timeout(self.connect_timeout);
            let future = client.request(req);
            clients.push((Arc::downgrade(self), client));
            future
        })
    }
}

impl tower::Service<http::Request<RequestBody>> for Transport {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper-util's client is always ready: it queues on its pool.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<RequestBody>) -> Self::Future {
        match &self.kind {
            Kind::Shared(client) => client.request(req),
            Kind::PerThread(p) => p.request(req),
        }
    }
}
