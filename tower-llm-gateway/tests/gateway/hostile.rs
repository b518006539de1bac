//! The gateway against hostile or careless clients, upstreams and
//! operators, over real loopback HTTP (virtual time): slow heads, idle and
//! excess connections, slow bodies, clients that never read, lying
//! upstreams, truncated policy files during a reload.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower_llm_providers::mock::{Reply, Step};

use crate::support::*;

/// A raw request for `body` on `/v1/chat/completions`.
fn raw_chat(body: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

async fn connect(h: &Harness) -> TcpStream {
    TcpStream::connect(h.url.trim_start_matches("http://"))
        .await
        .expect("connect")
}

/// Reads until the server closes the connection (EOF or reset) and
/// returns what came, or `None` if it is still open after `limit`.
async fn read_to_close(tcp: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0_u8; 64 * 1024];
    let until = Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(until, tcp.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads what is queued up to the connection's close, which has already
/// begun: the virtual clock is held still (a blocking task inhibits its
/// auto-advance) while the kernel delivers the rest in real time, so a
/// slow machine cannot make a virtual limit pass first; 10 s of real time
/// at most. `None` if the connection is still open then.
async fn drain_to_close(tcp: &mut TcpStream) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0_u8; 64 * 1024];
    // Ends at 10 s, or as soon as this function returns (`_stop` dropped).
    let (_stop, stopped) = std::sync::mpsc::channel::<()>();
    let mut watchdog = tokio::task::spawn_blocking(move || {
        let _ = stopped.recv_timeout(std::time::Duration::from_secs(10));
    });
    loop {
        tokio::select! {
            read = tcp.read(&mut buf) => match read {
                Ok(0) | Err(_) => return Some(got),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            },
            _ = &mut watchdog => return None,
        }
    }
}

/// Reads until `needle` has arrived.
async fn read_until(tcp: &mut TcpStream, needle: &str) -> String {
    let mut got = Vec::new();
    let mut buf = [0_u8; 4096];
    while !String::from_utf8_lossy(&got).contains(needle) {
        let n = tokio::time::timeout(Duration::from_secs(30), tcp.read(&mut buf))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(
            n > 0,
            "closed before {needle:?}: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// A client socket with a tiny receive window that will never read.
async fn non_reader(h: &Harness) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let addr = h
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    socket.connect(addr).await.expect("connect")
}

#[tokio::test(start_paused = true)]
async fn a_slowloris_head_is_cut_at_the_header_timeout_while_normal_calls_go_on() {
    let h = start(Reply::openai_text("hi"), Reply::anthropic_text("b"), "").await;
    let mut slow = connect(&h).await;
    let started = Instant::now();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n")
        .await
        .expect("write");
    // One more header byte every second: trickling does not extend it.
    let (mut reader, mut writer) = slow.into_split();
    tokio::spawn(async move {
        for _ in 0..60 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if writer.write_all(b"x").await.is_err() {
                return;
            }
        }
    });
    // A normal call meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let mut buf = [0_u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(30), reader.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "still open: {closed:?}"
    );
    let after = started.elapsed();
    assert!(
        after >= Duration::from_secs(10) && after < Duration::from_millis(10_100),
        "closed after {after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let h = start(
        Reply::openai_text("hi"),
        Reply::anthropic_text("b"),
        "[server]\nidle_timeout_ms = 5000",
    )
    .await;
    // A new connection that never sends a byte owes its first head within
    // the header timeout (10 s), not the idle one.
    let mut silent = connect(&h).await;
    let started = Instant::now();
    assert!(
        read_to_close(&mut silent, Duration::from_secs(60))
            .await
            .is_some()
    );
    let after = started.elapsed();
    assert!(
        after >= Duration::from_secs(10) && after < Duration::from_millis(10_100),
        "{after:?}"
    );
    // Kept alive after an answer: closed 5 s after it.
    let mut kept = connect(&h).await;
    kept.write_all(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .expect("write");
    read_until(&mut kept, "\"ok\"}").await;
    let answered = Instant::now();
    assert!(
        read_to_close(&mut kept, Duration::from_secs(60))
            .await
            .is_some()
    );
    let after = answered.elapsed();
    assert!(
        after >= Duration::from_secs(5) && after < Duration::from_millis(5_100),
        "{after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_of_a_large_answer_is_not_taken_for_idle() {
    let size = 4 * 1024 * 1024;
    let h = start(
        Reply::openai_text(&"y".repeat(size)),
        Reply::anthropic_text("b"),
        "[server]\nidle_timeout_ms = 2000",
    )
    .await;
    let mut tcp = non_reader(&h).await;
    tcp.write_all(raw_chat(HELLO).as_bytes())
        .await
        .expect("write");
    // A steady reader through a small window (a few KiB every 10 ms):
    // seconds for the whole answer, well past the idle timeout.
    let mut got = 0_usize;
    let mut buf = vec![0_u8; 64 * 1024];
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        match tcp.read(&mut buf).await {
            Ok(0) => break,
            Err(e) => panic!("{e} after {got} bytes at {:?}", started.elapsed()),
            Ok(n) => got += n,
        }
    }
    assert!(
        got > size,
        "cut after {got} bytes at {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() > Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let h = start(
        Reply::openai_text("hi"),
        Reply::anthropic_text("b"),
        "[server]\nmax_connections = 2",
    )
    .await;
    let first = connect(&h).await;
    let _second = connect(&h).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The third is queued: no answer while both are open.
    let waiting = tokio::time::timeout(Duration::from_secs(5), h.chat(HELLO)).await;
    assert!(waiting.is_err(), "a third connection was served");
    drop(first);
    let a = tokio::time::timeout(Duration::from_secs(5), h.chat(HELLO))
        .await
        .expect("served once a connection closed");
    assert_eq!(a.status, 200);
}

#[tokio::test(start_paused = true)]
async fn a_slow_body_gets_408_at_the_body_timeout() {
    let h = start(
        Reply::openai_text("hi"),
        Reply::anthropic_text("b"),
        "[server]\nbody_read_timeout_ms = 3000",
    )
    .await;
    let mut tcp = connect(&h).await;
    let started = Instant::now();
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\"",
    )
    .await
    .expect("write");
    let answer = read_until(&mut tcp, "request_timeout").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert!(h.primary.received().is_empty());
}

/// An upstream stream far larger than every buffer between it and a
/// client that never reads.
fn endless_stream() -> Reply {
    let piece = Step::openai_text(&"x".repeat(64 * 1024));
    let mut steps = vec![Step::openai_text("first")];
    for _ in 0..1000 {
        steps.push(piece.clone());
        steps.push(Step::Pause(Duration::from_millis(1)));
    }
    Reply::Stream {
        content_type: "text/event-stream".into(),
        steps,
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_nobody_reads_is_cut_at_the_deadline_upstream_and_downstream() {
    let h = start(endless_stream(), Reply::anthropic_text("b"), "").await;
    let mut tcp = non_reader(&h).await;
    let started = Instant::now();
    tcp.write_all(raw_chat(HELLO_STREAM).as_bytes())
        .await
        .expect("write");
    // The harness's deadline is 2 s.
    tokio::time::sleep(Duration::from_millis(1900)).await;
    assert_eq!(h.primary.aborted_streams(), 0, "cut before the deadline");
    tokio::time::sleep_until(started + Duration::from_millis(2000 + 150)).await;
    assert_eq!(
        h.primary.aborted_streams(),
        1,
        "the upstream stream outlived the deadline"
    );
    // The client's connection was closed too: what it holds ends.
    let got = drain_to_close(&mut tcp)
        .await
        .expect("the client's connection was closed");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
}

/// A guard for the pump: a client reading a stream that outlives the
/// deadline gets the deadline's event (the stream's own deadline check did
/// this before the pump; both must agree).
#[tokio::test(start_paused = true)]
async fn a_stream_read_to_the_deadline_ends_with_the_deadline_event() {
    let mut steps = vec![Step::openai_text("first")];
    for _ in 0..100 {
        steps.push(Step::Pause(Duration::from_millis(100)));
        steps.push(Step::openai_text("more"));
    }
    let h = start(
        Reply::Stream {
            content_type: "text/event-stream".into(),
            steps,
        },
        Reply::anthropic_text("b"),
        "",
    )
    .await;
    let a = h.chat(HELLO_STREAM).await;
    assert_eq!(a.status, 200);
    assert!(a.body.contains("deadline_exceeded"), "{}", a.body);
    assert!(!a.body.contains("[DONE]"));
    assert_eq!(h.primary.aborted_streams(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_mid_stream_stops_a_silent_upstream_at_once() {
    let h = start(
        Reply::Stream {
            content_type: "text/event-stream".into(),
            steps: vec![
                Step::openai_text("first"),
                Step::Pause(Duration::from_secs(60)),
                Step::openai_text("late"),
            ],
        },
        Reply::anthropic_text("b"),
        "",
    )
    .await;
    // A long call: neither the deadline nor the stream's idle timeout
    // ends it before the client goes.
    let mut p = h.gateway.policy();
    p.deadline.total_ms = Some(120_000);
    p.stream.idle = Duration::from_secs(120);
    h.gateway.reload(p).expect("valid");
    let mut tcp = connect(&h).await;
    tcp.write_all(raw_chat(HELLO_STREAM).as_bytes())
        .await
        .expect("write");
    read_until(&mut tcp, "first").await;
    let gone = Instant::now();
    drop(tcp);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        h.primary.aborted_streams(),
        1,
        "the upstream kept generating for a client that left"
    );
    assert!(gone.elapsed() < Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_client_that_reads_nothing_of_a_large_answer_is_dropped_at_the_send_timeout() {
    let h = start(
        Reply::openai_text(&"y".repeat(12 * 1024 * 1024)),
        Reply::anthropic_text("b"),
        "[server]\nsend_timeout_ms = 3000",
    )
    .await;
    let mut tcp = non_reader(&h).await;
    tcp.write_all(raw_chat(HELLO).as_bytes())
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let got = drain_to_close(&mut tcp).await.expect("closed");
    assert!(
        got.len() < 12 * 1024 * 1024,
        "the whole answer was kept for a client that reads nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn slow_bodies_hold_only_the_bytes_they_sent_not_call_slots() {
    let h = start(
        Reply::openai_text("hi"),
        Reply::anthropic_text("b"),
        "[server]\nmax_in_flight = 2\nmax_body_bytes_in_flight = 1000",
    )
    .await;
    // Three clients trickle bodies: none takes a call slot.
    let mut slow = Vec::new();
    for _ in 0..3 {
        let mut tcp = connect(&h).await;
        tcp.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: 900\r\n\r\n{\"model\"",
        )
        .await
        .expect("write");
        slow.push(tcp);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    // A body that would take the byte budget past its limit: 503.
    let mut big = connect(&h).await;
    let body = format!(
        r#"{{"model": "smart", "messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "z".repeat(1000)
    );
    big.write_all(raw_chat(&body).as_bytes())
        .await
        .expect("write");
    let answer = read_until(&mut big, "overloaded").await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
}

#[tokio::test(start_paused = true)]
async fn calls_beyond_max_in_flight_get_503_and_are_not_forwarded() {
    let h = Arc::new(start(Reply::Hang, Reply::Hang, "[server]\nmax_in_flight = 2").await);
    let hanging: Vec<_> = (0..2)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move { h.chat(HELLO).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.primary.received().len(), 2);
    let shed = h.chat(HELLO).await;
    assert_eq!(shed.status, 503, "{}", shed.body);
    assert_eq!(shed.header("retry-after"), "1");
    assert_eq!(shed.json()["error"]["code"], "overloaded");
    assert_eq!(h.primary.received().len(), 2);
    for call in hanging {
        assert_eq!(call.await.expect("task").status, 504);
    }
    // Slots come back when calls end.
    h.primary.push(Reply::openai_text("again"));
    assert_eq!(h.chat(HELLO).await.status, 200);
}

#[tokio::test(start_paused = true)]
async fn response_headers_name_the_configured_model_not_the_upstreams() {
    let body = serde_json::json!({
        "id": "x", "object": "chat.completion", "created": 0,
        "model": "modèle-ü\r\nx-evil: 1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
            "finish_reason": "stop"}],
    });
    let h = start(
        Reply::json(200, body.to_string()),
        Reply::anthropic_text("b"),
        "",
    )
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-model-used"), "gpt-4o-mini");
    // The upstream's own name stays in the body, JSON-encoded.
    assert_eq!(a.json()["model"], "modèle-ü\r\nx-evil: 1");
    let chunk = serde_json::json!({
        "id": "x", "object": "chat.completion.chunk", "created": 0, "model": "modèle-ü",
        "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": null}]
    });
    h.primary.push(Reply::Stream {
        content_type: "text/event-stream".into(),
        steps: vec![
            Step::sse(None, &chunk.to_string()),
            Step::sse(None, "[DONE]"),
        ],
    });
    let s = h.chat(HELLO_STREAM).await;
    assert_eq!(s.status, 200, "{}", s.body);
    assert_eq!(s.header("x-llm-model-used"), "gpt-4o-mini");
}

/// Writes `text` to `path` with a modification time of its own (`n`), so
/// the watcher sees every write however fast the test runs.
fn write_file(path: &std::path::Path, text: &str, n: u64) {
    std::fs::write(path, text).expect("write");
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| {
            f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + n))
        })
        .expect("set mtime");
}

/// A gateway watching its policy file (the full chain written), the file,
/// its full text and a backup-only variant of it.
struct Watching {
    h: Arc<Harness>,
    path: std::path::PathBuf,
    full: String,
    backup_only: String,
}

async fn watching(name: &str) -> Watching {
    let h = Arc::new(
        start(
            Reply::openai_text("primary"),
            Reply::anthropic_text("backup"),
            "",
        )
        .await,
    );
    let path = std::env::temp_dir().join(format!(
        "tower-llm-hostile-{name}-{}.toml",
        std::process::id()
    ));
    let full = policy_text(&h.primary, &h.backup, "", FULL_CHAIN);
    let backup_only = policy_text(
        &h.primary,
        &h.backup,
        "",
        r#"[{ provider = "backup", model = "claude-x" }]"#,
    );
    write_file(&path, &full, 0);
    tokio::spawn(tower_llm_gateway::reload_on_change(
        h.gateway.clone(),
        path.clone(),
    ));
    Watching {
        h,
        path,
        full,
        backup_only,
    }
}

/// `clients` clients each calling every 20 ms for `secs`: per call, its
/// status and the provider that served it.
fn load(
    h: &Arc<Harness>,
    clients: usize,
    secs: u64,
) -> Vec<tokio::task::JoinHandle<Vec<(u16, String)>>> {
    (0..clients)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move {
                let mut calls = Vec::new();
                let until = Instant::now() + Duration::from_secs(secs);
                while Instant::now() < until {
                    let a = h.chat(HELLO).await;
                    calls.push((a.status, a.header("x-llm-provider").to_owned()));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                calls
            })
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_truncated_policy_file_during_a_reload_under_load_drops_no_call() {
    let Watching {
        h,
        path,
        full,
        backup_only,
    } = watching("reload").await;
    // Load: four clients, a call every 20 ms each, for 12 s.
    let load = load(&h, 4, 12);
    // A writer that truncates, pauses, then rewrites; twice. Then a file
    // with no routes at all, left in place.
    let mut n = 0;
    for (text, links) in [(&backup_only, 1), (&full, 2)] {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        n += 1;
        write_file(&path, "", n);
        tokio::time::sleep(Duration::from_millis(800)).await;
        n += 1;
        write_file(&path, text, n);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(h.gateway.policy().routes[0].chain.len(), links);
    }
    write_file(&path, "[deadline]\ntotal_ms = 1000\n", n + 1);
    let mut calls = 0;
    for task in load {
        let statuses: Vec<u16> = task.await.expect("task").into_iter().map(|c| c.0).collect();
        calls += statuses.len();
        let failed: Vec<_> = statuses.iter().filter(|s| **s != 200).collect();
        assert!(
            failed.is_empty(),
            "{} of {} calls failed during a reload: {:?}",
            failed.len(),
            statuses.len(),
            &failed[..failed.len().min(5)]
        );
    }
    assert!(calls > 400, "{calls}");
    // The policy without routes was refused: the running one stays.
    assert_eq!(h.gateway.policy().routes[0].chain.len(), 2);
    assert_eq!(h.chat(HELLO).await.status, 200);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_accepting_and_lets_the_call_in_flight_finish() {
    let mut h = start(
        Reply::openai_text("finished").after(Duration::from_millis(1000)),
        Reply::anthropic_text("b"),
        "",
    )
    .await;
    let mut tcp = connect(&h).await;
    tcp.write_all(raw_chat(HELLO).as_bytes())
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = h.stop.take().expect("stop").send(());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        TcpStream::connect(h.url.trim_start_matches("http://"))
            .await
            .is_err(),
        "a new connection was accepted after shutdown"
    );
    let answer = read_until(&mut tcp, "finished").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The answer was the connection's last.
    assert!(drain_to_close(&mut tcp).await.is_some());
    h.served
        .take()
        .expect("task")
        .await
        .expect("the server stopped");
}

#[tokio::test(start_paused = true)]
async fn a_file_still_being_written_is_read_only_once_it_settles() {
    // A valid file a writer passes through on its way to `full` (the
    // backup-only one: it must never be served).
    let Watching {
        h,
        path,
        full,
        backup_only: midway,
    } = watching("settle").await;
    let mut load = load(&h, 1, 5);
    // The watcher looks every second (at 0, 1, 2 ... s): the midway file
    // is on disk when it looks at 2 s, and replaced 100 ms later.
    tokio::time::sleep(Duration::from_millis(1900)).await;
    write_file(&path, &midway, 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    write_file(
        &path,
        &full.replace("total_ms = 2000", "total_ms = 2500"),
        2,
    );
    let served: Vec<String> = load
        .pop()
        .expect("one client")
        .await
        .expect("task")
        .into_iter()
        .map(|c| c.1)
        .collect();
    assert!(served.len() > 100, "{}", served.len());
    assert!(
        served.iter().all(|p| p == "primary"),
        "a half-written policy was served"
    );
    assert_eq!(h.gateway.policy().deadline.total_ms(), 2_500);
    let _ = std::fs::remove_file(&path);
}
