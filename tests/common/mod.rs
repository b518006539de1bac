//! Loopback HTTP helpers shared by the root integration tests.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::ServiceExt;
use tower_llm::Failure;

/// Sets its flag when dropped: proves a future was cancelled.
pub(crate) struct DropFlag(pub(crate) Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Serves `svc` on a fresh loopback port, one task per connection.
pub(crate) async fn serve<S>(svc: S) -> SocketAddr
where
    S: tower::Service<
            http::Request<Incoming>,
            Response = http::Response<Full<Bytes>>,
            Error = Failure,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let svc = svc.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let svc = svc.clone();
                    async move {
                        Ok::<_, Infallible>(match svc.oneshot(req).await {
                            Ok(res) => res,
                            Err(e) => {
                                let mut res = http::Response::new(Full::from(e.to_string()));
                                *res.status_mut() = http::StatusCode::GATEWAY_TIMEOUT;
                                res
                            }
                        })
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}
