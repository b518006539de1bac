//! The default transport: a pooled hyper-util client over rustls
//! (feature `https`, on by default).

use std::sync::OnceLock;
use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::transport::RequestBody;

/// The default transport type: a pooled HTTP/1.1 client speaking HTTPS
/// (rustls with the `ring` provider and the webpki root certificates) and
/// plain HTTP (for local OpenAI-compatible servers).
pub type HttpsClient = Client<HttpsConnector<HttpConnector>, RequestBody>;

/// The connect timeout of [`shared_client`] (5 s).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A new client with its own connection pool and `connect_timeout`.
///
/// Every provider that does not need its own connect timeout should share
/// [`shared_client`] instead, to share its pool. The client never retries
/// a request, not even one cancelled on a stale pooled connection
/// (`retry_canceled_requests(false)`): the retry layer is the one retry
/// owner. Must be called within a tokio runtime with the time driver (the
/// pool's idle timer).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use tower_llm_providers::https::client_with_connect_timeout;
/// use tower_llm_providers::{ApiKey, OpenAi, OpenAiConfig};
///
/// let client = client_with_connect_timeout(Duration::from_secs(2));
/// let openai = OpenAi::new(client, OpenAiConfig::new(ApiKey::new("sk-...")));
/// # let _ = openai;
/// # }
/// ```
pub fn client_with_connect_timeout(connect_timeout: Duration) -> HttpsClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let https = HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .retry_canceled_requests(false)
        .build(https)
}

/// The process-wide pooled client (connect timeout
/// [`DEFAULT_CONNECT_TIMEOUT`]), built once on first use. Cloning it is
/// cheap and shares the pool.
pub fn shared_client() -> HttpsClient {
    static CLIENT: OnceLock<HttpsClient> = OnceLock::new();
    CLIENT
        .get_or_init(|| client_with_connect_timeout(DEFAULT_CONNECT_TIMEOUT))
        .clone()
}
