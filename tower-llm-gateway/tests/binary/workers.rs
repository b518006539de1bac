//! The built binary with several worker threads (one runtime and one
//! listener each on a shared port): every worker serves, the gateway's
//! state (circuits) is one across them, `--workers` is checked, and
//! SIGTERM lets a call in flight on any worker finish before the process
//! exits 0. Real processes and real time: bounded waits, never a sleep.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower_llm_providers::mock::{MockServer, Reply};

use crate::support::{one_link_policy, send, spawn};

const HELLO: &str = r#"{"model": "smart", "messages": [{"role": "user", "content": "Hello"}]}"#;

/// Writes the policy file of test `name`.
fn config(name: &str, upstream: &MockServer, failures: u32) -> std::path::PathBuf {
    let tables = format!(
        "[deadline]\ntotal_ms = 5000\n[retry]\nmax_attempts = 1\nattempt_timeout_ms = 5000\n\
         [breaker]\nconsecutive_failures = {failures}\ncooldown_ms = 60000"
    );
    one_link_policy(
        &format!("workers-{name}"),
        &upstream.url(),
        "smart",
        &tables,
    )
}

/// A client whose every request opens a connection of its own (no pool),
/// so the kernel spreads them across the workers' listeners.
fn fresh_connections() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_serves_and_the_circuits_are_one() {
    let upstream = MockServer::start(Reply::openai_text("hi"))
        .await
        .expect("upstream");
    let file = config("serve", &upstream, 20);
    let gw = spawn(&file, &["--workers", "3"]).await;
    let client = fresh_connections();
    let chat = format!("{}/v1/chat/completions", gw.url);
    for _ in 0..30 {
        assert_eq!(send(&client, "POST", &chat, HELLO).await.0, 200);
    }
    // Each worker has a pool of its own: more than one worker served.
    assert!(
        upstream.connections() > 1,
        "upstream connections: {}",
        upstream.connections()
    );

    // 20 failures in a row, over connections spread across the workers,
    // open the one circuit: its count is the gateway's, not a worker's.
    for _ in 0..20 {
        upstream.push(Reply::openai_error(503, "server_error", "down"));
    }
    for _ in 0..20 {
        assert_eq!(send(&client, "POST", &chat, HELLO).await.0, 503);
    }
    let received = upstream.received().len();
    let (status, body) = send(&client, "POST", &chat, HELLO).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        upstream.received().len(),
        received,
        "an open circuit calls nobody"
    );
    for _ in 0..6 {
        let (status, body) = send(&client, "GET", &format!("{}/health/circuits", gw.url), "").await;
        assert_eq!(status, 200);
        assert!(body.contains(r#""state":"open""#), "{body}");
    }
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_calls_in_flight_on_every_worker_finish() {
    let upstream = MockServer::start(Reply::openai_text("hi").after(Duration::from_millis(800)))
        .await
        .expect("upstream");
    let file = config("sigterm", &upstream, 5);
    let mut gw = spawn(&file, &["--workers", "2"]).await;
    let client = fresh_connections();
    let chat = format!("{}/v1/chat/completions", gw.url);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (client, chat) = (client.clone(), chat.clone());
            tokio::spawn(async move { send(&client, "POST", &chat, HELLO).await.0 })
        })
        .collect();
    let started = tower_llm_test_support::poll(Duration::from_secs(5), || async {
        upstream.received().len() == 8
    })
    .await;
    assert!(started, "8 calls reached the upstream");
    let pid = gw.child.id().expect("running");
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    for call in calls {
        assert_eq!(call.await.expect("the call's task"), 200);
    }
    let exit = tokio::time::timeout(Duration::from_secs(10), gw.child.wait())
        .await
        .expect("the gateway exits once its calls are answered")
        .expect("its status");
    assert!(exit.success(), "{exit:?}");
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn workers_must_be_a_number_above_zero() {
    for bad in ["0", "many", "-1"] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-llm-gateway"))
            .args(["--workers", bad])
            .output()
            .await
            .expect("the binary runs");
        // A usage error: clap's exit code 2 (1 is a failure to start).
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("invalid value '{bad}' for '--workers <N>'"))
                && err.contains("expected a number above 0"),
            "{bad}: {err}"
        );
    }
}
