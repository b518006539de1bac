//! The floor a gateway on this stack can reach: a bare hyper reverse proxy.
//! It accepts, reads the body, forwards it to the upstream with hyper-util's
//! pooled client, and streams the answer back; no parsing, no policy.
//! `scripts/e2e.py` runs it side by side with the gateway and prints the
//! gateway's figures as ratios to it.
//!
//! ```text
//! cargo run --release --example bare_proxy -- 127.0.0.1:8081 http://127.0.0.1:9001
//! ```

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

type Upstream = Client<HttpConnector, Full<Bytes>>;

async fn forward(
    client: Upstream,
    base: String,
    req: http::Request<Incoming>,
) -> Result<http::Response<Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = http::Request::builder()
        .method(parts.method)
        .uri(format!("{base}{path}"));
    for (name, value) in &parts.headers {
        if name != http::header::HOST {
            out = out.header(name, value);
        }
    }
    Ok(client.request(out.body(Full::new(body))?).await?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(base)) = (args.next(), args.next()) else {
        eprintln!("usage: bare_proxy LISTEN_ADDR UPSTREAM_BASE_URL");
        std::process::exit(2);
    };
    let addr: SocketAddr = listen.parse()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Upstream = Client::builder(TokioExecutor::new()).build(connector);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| forward(client.clone(), base.clone(), req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
