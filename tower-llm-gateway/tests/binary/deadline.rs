//! The built binary answers 1,000 calls against an upstream that never
//! answers at their deadline, even when nobody reads its stderr: failed
//! calls are counted by the metrics, not logged one by one, and log lines
//! are written off the workers (a reader that lags loses lines, never
//! calls). Real processes and real time: bounded waits, never a sleep.
//!
//! The figures printed (lateness past the deadline, from the debug build)
//! are not asserted tightly; `examples/deadline_lateness.rs` measures the
//! release build (`docs/gateway.md`, "Server limits").

use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncBufReadExt;

use crate::support::one_link_policy;

const CALLS: usize = 1000;
const DEADLINE: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_hanging_calls_end_at_their_deadline_with_stderr_unread() {
    let upstream = tower_llm_test_support::silent_upstream().await;
    let deadline = DEADLINE.as_millis();
    let tables = format!(
        "[deadline]\ntotal_ms = {deadline}\n[retry]\nmax_attempts = 1\nattempt_timeout_ms = {deadline}"
    );
    let config = one_link_policy("deadline", &format!("http://{upstream}"), "smart", &tables);
    // Its stderr is a pipe nobody reads: once 64 KiB are waiting, a
    // write to it blocks.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-llm-gateway"))
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .env("UPSTREAM_KEY", "sk-test-key")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the gateway binary starts");
    let _unread_stderr = child.stderr.take().expect("its stderr");
    let stdout = child.stdout.take().expect("its stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let addr = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(at) = line.find("http://") {
                return line[at + 7..].trim().to_owned();
            }
        }
        panic!("the gateway ended without listening");
    })
    .await
    .expect("the gateway listens within 10 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    // Every connection first (the default max_in_flight admits them all),
    // then every call at once.
    let mut senders = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let stream = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        senders.push(sender);
    }
    let body =
        Bytes::from_static(br#"{"model":"smart","messages":[{"role":"user","content":"Hello"}]}"#);
    let calls: Vec<_> = senders
        .into_iter()
        .map(|mut sender| {
            let req = http::Request::post("/v1/chat/completions")
                .header("host", "gateway")
                .header("content-type", "application/json")
                .body(Full::new(body.clone()))
                .expect("request");
            tokio::spawn(async move {
                let sent = Instant::now();
                let res = sender.send_request(req).await.expect("an answer");
                let took = sent.elapsed();
                let status = res.status().as_u16();
                let _ = res.into_body().collect().await;
                (took, status)
            })
        })
        .collect();
    let mut late = Vec::with_capacity(CALLS);
    for call in calls {
        let (took, status) = tokio::time::timeout(DEADLINE * 10, call)
            .await
            .expect("every call is answered (a worker blocked on stderr would hold it)")
            .expect("a call");
        assert_eq!(status, 504, "deadline exceeded");
        assert!(took >= DEADLINE, "{took:?}: answered before the deadline");
        late.push(took - DEADLINE);
    }
    late.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    eprintln!(
        "{CALLS} hanging calls, deadline {} ms (debug build): lateness p50 +{:.1} ms, p99 +{:.1} ms, max +{:.1} ms",
        DEADLINE.as_millis(),
        ms(late[CALLS / 2]),
        ms(late[CALLS * 99 / 100]),
        ms(late[CALLS - 1]),
    );
    // A debug build on a shared machine: only a bound that a blocked
    // worker (seconds) or a lost call cannot meet.
    assert!(late[CALLS - 1] < Duration::from_millis(1_500), "{late:?}");
    let _ = std::fs::remove_file(config);
}
