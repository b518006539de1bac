//! Loopback mock providers for load tests (used by `scripts/e2e.py`).
//!
//! ```text
//! cargo run --release --example mock_upstream -- healthy 127.0.0.1:9101
//! cargo run --release --example mock_upstream -- rate-limited 127.0.0.1:9101 127.0.0.1:9102
//! ```
//!
//! `healthy`: one OpenAI-format provider answering at once (a call with
//! `"stream": true` gets a stream of 50 one-word chunks). `rate-limited`:
//! a primary answering 429 with `Retry-After: 1` to 30 % of calls and
//! healthy otherwise, and a healthy Anthropic-format fallback. Runs until
//! killed; prints `ready` when listening.

use std::sync::atomic::{AtomicUsize, Ordering};

use tower_llm_providers::mock::{MockServer, Recorded, Reply};

/// The pieces of a streamed answer.
const PIECES: [&str; 50] = ["tok "; 50];

fn healthy(req: &Recorded) -> Reply {
    let wants_stream = serde_json::from_slice::<serde_json::Value>(&req.body)
        .is_ok_and(|v| v["stream"] == serde_json::Value::Bool(true));
    if wants_stream {
        Reply::openai_stream(&PIECES)
    } else {
        Reply::openai_text("hello")
    }
}

fn rate_limited(_req: &Recorded) -> Reply {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    if CALLS.fetch_add(1, Ordering::Relaxed) % 10 < 3 {
        Reply::openai_error(429, "rate_limit_exceeded", "slow down").with_header("retry-after", "1")
    } else {
        Reply::openai_text("primary")
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bind = |addr: &str| -> Result<std::net::TcpListener, std::io::Error> {
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        Ok(l)
    };
    let mut servers = Vec::new();
    match args.first().map(String::as_str) {
        Some("healthy") => {
            let addr = args.get(1).ok_or("healthy ADDR")?;
            servers.push(MockServer::start_on(bind(addr)?, Reply::With(healthy)).await?);
        }
        Some("rate-limited") => {
            let (a, b) = (
                args.get(1).ok_or("ADDR ADDR")?,
                args.get(2).ok_or("ADDR ADDR")?,
            );
            servers.push(MockServer::start_on(bind(a)?, Reply::With(rate_limited)).await?);
            servers.push(MockServer::start_on(bind(b)?, Reply::anthropic_text("fallback")).await?);
        }
        _ => return Err("usage: mock_upstream healthy ADDR | rate-limited ADDR ADDR".into()),
    }
    for s in &servers {
        s.keep_last_request_only();
    }
    println!("ready");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
