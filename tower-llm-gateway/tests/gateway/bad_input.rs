//! Client-side bad input through the gateway, as a table: each row a
//! request a careless or hostile client sends over a raw loopback socket,
//! and the status it must get (virtual time). After the table, the
//! gateway still answers a normal call, and no bad row reached the
//! upstream.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_llm_providers::mock::Reply;

use crate::support::*;

async fn connect(h: &Harness) -> TcpStream {
    TcpStream::connect(h.url.trim_start_matches("http://"))
        .await
        .expect("connect")
}

/// Writes `bytes` (and, if `close`, shuts the write side) and reads the
/// first status line's code, or `None` if the connection closed without
/// an answer.
async fn exchange(h: &Harness, bytes: &[u8], close: bool) -> (Option<u16>, String) {
    let mut tcp = connect(h).await;
    tcp.write_all(bytes).await.expect("write");
    if close {
        let _ = tcp.shutdown().await;
    }
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(60), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => {
                got.extend_from_slice(&buf[..n]);
                if complete(&got) {
                    break;
                }
            }
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok());
    (status, text)
}

/// A whole answer (headers and a `content-length` body) has arrived.
fn complete(got: &[u8]) -> bool {
    let text = String::from_utf8_lossy(got);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .and_then(|v| v.trim().parse::<usize>().ok());
    len.is_some_and(|n| body.len() >= n)
}

fn post(body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

#[tokio::test(start_paused = true)]
async fn bad_client_input_gets_the_status_in_the_table() {
    let h = start(
        Reply::openai_text("ok"),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    let deep = format!(
        r#"{{"model":"smart","messages":[{{"role":"user","content":{}1{}}}]}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let huge_array = format!(
        r#"{{"model":"smart","messages":[{}]}}"#,
        vec![r#"{"role":"user","content":"x"}"#; 25_000].join(",")
    );
    let oversized = format!(
        r#"{{"model":"smart","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(2 << 20)
    );
    let rows: Vec<(&str, Vec<u8>, bool, Option<u16>)> = vec![
        ("invalid UTF-8", post(b"{\"model\":\"smart\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"), false, Some(400)),
        ("not JSON", post(b"model=smart"), false, Some(400)),
        ("empty body", post(b""), false, Some(400)),
        ("deep nesting", post(deep.as_bytes()), false, Some(400)),
        ("wrong type for messages", post(br#"{"model":"smart","messages":"hi"}"#), false, Some(400)),
        ("wrong type for a role", post(br#"{"model":"smart","messages":[{"role":7,"content":"hi"}]}"#), false, Some(400)),
        ("missing messages", post(br#"{"model":"smart"}"#), false, Some(400)),
        ("n > 1", post(br#"{"model":"smart","n":2,"messages":[{"role":"user","content":"hi"}]}"#), false, Some(400)),
        ("unknown route", post(br#"{"model":"nope","messages":[{"role":"user","content":"hi"}]}"#), false, Some(404)),
        // Unknown fields with no provider-neutral meaning are ignored.
        ("unknown fields", post(br#"{"model":"smart","frobnicate":true,"messages":[{"role":"user","content":"hi"}]}"#), false, Some(200)),
        ("a huge array within the body limit", post(huge_array.as_bytes()), false, Some(200)),
        ("oversized body", post(oversized.as_bytes()), false, Some(413)),
        (
            "a body shorter than its content-length, then close",
            {
                let mut r = post(br#"{"model":"smart","messages":[]}"#);
                let cut = r.len() - 5;
                r.truncate(cut);
                r
            },
            true,
            Some(400),
        ),
        ("a garbage request line", b"BREW /pot HTCPCP/1.0\r\n\r\n".to_vec(), false, Some(400)),
        ("a head that never ends, then close", b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nx-a: b".to_vec(), true, None),
        ("a wrong method", b"DELETE /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: 0\r\n\r\n".to_vec(), false, Some(405)),
    ];
    let mut report = String::new();
    let mut wrong = Vec::new();
    for (name, bytes, close, expected) in rows {
        let (status, text) = exchange(&h, &bytes, close).await;
        report.push_str(&format!("| {name} | {expected:?} | {status:?} |\n"));
        if status != expected {
            wrong.push(format!(
                "{name}: expected {expected:?}, got {status:?}: {}",
                text.lines().next().unwrap_or_default()
            ));
        }
    }
    println!("| request | expected | got |\n|---|---|---|\n{report}");
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Only the two well-formed rows reached the upstream.
    assert_eq!(h.primary.received().len(), 2);
    assert_eq!(h.chat(HELLO).await.status, 200);
}

#[tokio::test(start_paused = true)]
async fn pipelined_requests_are_answered_in_order() {
    let h = start(
        Reply::openai_text("ok"),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    let mut tcp = connect(&h).await;
    let mut both = post(HELLO.as_bytes());
    both.extend_from_slice(&post(
        br#"{"model":"nope","messages":[{"role":"user","content":"hi"}]}"#,
    ));
    tcp.write_all(&both).await.expect("write");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    while String::from_utf8_lossy(&got).matches("HTTP/1.1 ").count() < 2 {
        let n = tokio::time::timeout(Duration::from_secs(30), tcp.read(&mut buf))
            .await
            .expect("answers in time")
            .expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    let first = text.find("HTTP/1.1 200").expect("the first answer");
    let second = text.find("HTTP/1.1 404").expect("the second answer");
    assert!(first < second, "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_at_any_phase_costs_nothing_after() {
    // Headers half sent, body half sent, waiting for a slow answer: each
    // client goes; the gateway serves the next call normally.
    let h = start(
        Reply::openai_text("slow").after(Duration::from_millis(1_500)),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    let whole = post(HELLO.as_bytes());
    for cut in [10, whole.len() - 10, whole.len()] {
        let mut tcp = connect(&h).await;
        tcp.write_all(&whole[..cut]).await.expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(tcp);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The waiting client's upstream call was made once and then cut.
    assert_eq!(h.primary.received().len(), 1);
    let answer = h.chat(HELLO).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}
