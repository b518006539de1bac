//! Many long streams at once through one gateway process: memory per open
//! stream, CPU per relayed chunk, and whether every stream ends whole.
//!
//! ```text
//! cargo build --release -p tower-llm-gateway
//! cargo build --release --example capacity
//! target/release/examples/capacity --streams 10000 --chunks 60
//! ```
//!
//! Flags: `--streams N` (10,000), `--chunks N` (60), `--every-ms MS`
//! (1,000), `--rate N` streams opened per second (1,000), `--binary PATH`,
//! `--deadline-ms MS` (`[deadline] total_ms` and `[retry]
//! attempt_timeout_ms`; default the stream's length plus 2 minutes, 0 for
//! the gateway's defaults).
//!
//! Three processes on loopback: a slow OpenAI-format upstream (this
//! program, `upstream` mode: the mock provider of `examples/mock_upstream.rs`
//! answering every call with a role chunk, then one content chunk per
//! second for `--chunks` seconds, a stop chunk, a usage chunk and
//! `[DONE]`), the release gateway binary with one route over it, and this
//! program as the client: one HTTP/1.1 connection per stream (hyper), the
//! streams opened at `--rate` per second in three stages (a tenth, half,
//! all of `--streams`).
//!
//! Reports the gateway's resident memory (`VmRSS`) idle and at each stage
//! (once every stream of the stage has its first event, and 3 s later),
//! its CPU (`utime + stime` from `/proc/PID/stat`) over the steady window
//! (every stream open, until the first one ends) divided by the content
//! chunks relayed in it, the client's and the upstream's CPU over the same
//! window (the load generator must not be the bottleneck), and every
//! stream's outcome: whole (all chunks and `[DONE]`), short, or an error.
//!
//! Each open stream holds two sockets in the gateway, so the gateway needs
//! `2 × streams` file descriptors and more; this program raises its own
//! `ulimit -n` (and so its children's) to `2 × streams + 1024`, or to the
//! hard limit when that is lower, by re-running itself under
//! `sh -c 'ulimit -n …'`, and refuses to start below `2 × streams + 100`.
//! Loopback only; bounded in count and time.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tower_llm_providers::mock::{MockServer, Recorded, Reply, Step, openai_stream_steps};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The upstream's answer to every call, built once.
static LONG_STREAM: OnceLock<Reply> = OnceLock::new();

fn long_stream(_: &Recorded) -> Reply {
    LONG_STREAM.get().cloned().unwrap_or(Reply::Hang)
}

/// An OpenAI stream of `chunks` content chunks, each after `every`.
fn paced_steps(chunks: usize, every: Duration) -> Vec<Step> {
    let pieces = vec!["tok "; chunks];
    let mut out = Vec::new();
    // [role, piece × chunks, stop, usage, [DONE]]
    for (i, step) in openai_stream_steps(&pieces, true).into_iter().enumerate() {
        if (1..=chunks).contains(&i) {
            out.push(Step::Pause(every));
        }
        out.push(step);
    }
    out
}

#[derive(Debug)]
struct Args {
    streams: usize,
    chunks: usize,
    every_ms: u64,
    rate: usize,
    binary: String,
    /// `[deadline] total_ms` and `[retry] attempt_timeout_ms`; 0 leaves
    /// the gateway's defaults (30 s each).
    deadline_ms: Option<u64>,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, BoxError> {
    let mut a = Args {
        streams: 10_000,
        chunks: 60,
        every_ms: 1_000,
        rate: 1_000,
        binary: "target/release/tower-llm-gateway".into(),
        deadline_ms: None,
    };
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--streams" => a.streams = value.parse()?,
            "--chunks" => a.chunks = value.parse()?,
            "--every-ms" => a.every_ms = value.parse()?,
            "--rate" => a.rate = value.parse()?,
            "--binary" => a.binary = value,
            "--deadline-ms" => a.deadline_ms = Some(value.parse()?),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    Ok(a)
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The soft `Max open files` of this process.
fn nofile() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// `utime + stime` of `pid` in seconds.
fn cpu_seconds(pid: u32, ticks: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let f: Vec<&str> = after.split_whitespace().collect();
    // After "pid (comm) ": state is field 3, utime 14 and stime 15.
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / ticks
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Counters shared by every stream.
#[derive(Debug, Default)]
struct Stats {
    /// Streams that have had their first event.
    open: AtomicUsize,
    /// Streams that ended, whichever way.
    ended: AtomicUsize,
    /// Content chunks received, over all streams.
    chunks: AtomicU64,
    /// The longest gap between two content chunks of one stream, in µs.
    max_gap_us: AtomicU64,
    /// Gaps longer than 1.5 × the upstream's pace.
    late: AtomicU64,
    outcomes: Mutex<BTreeMap<String, usize>>,
}

/// One streamed call; returns its outcome ("whole", "short …", "status …",
/// "error …").
async fn one_stream(
    gw: SocketAddr,
    body: Bytes,
    chunks: usize,
    every: Duration,
    st: &Stats,
) -> String {
    let mut content = 0usize;
    let mut done = false;
    let mut opened = false;
    let result: Result<Option<u16>, BoxError> = async {
        let tcp = tokio::net::TcpStream::connect(gw).await?;
        tcp.set_nodelay(true)?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let req = http::Request::post("/v1/chat/completions")
            .header("host", "gateway")
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        let resp = send.send_request(req).await?;
        if resp.status() != http::StatusCode::OK {
            return Ok(Some(resp.status().as_u16()));
        }
        let mut body = resp.into_body();
        let mut buf: Vec<u8> = Vec::new();
        let mut last: Option<Instant> = None;
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = buf.drain(..end + 2).collect();
                for line in event.split(|b| *b == b'\n') {
                    let Some(payload) = line.strip_prefix(b"data: ".as_slice()) else {
                        continue;
                    };
                    if !opened {
                        opened = true;
                        st.open.fetch_add(1, Ordering::Relaxed);
                    }
                    if payload == b"[DONE]" {
                        done = true;
                        continue;
                    }
                    let v: serde_json::Value = serde_json::from_slice(payload)?;
                    let has_text = v["choices"][0]["delta"]["content"]
                        .as_str()
                        .is_some_and(|s| !s.is_empty());
                    if has_text {
                        content += 1;
                        st.chunks.fetch_add(1, Ordering::Relaxed);
                        let now = Instant::now();
                        if let Some(prev) = last {
                            let gap = now - prev;
                            st.max_gap_us
                                .fetch_max(gap.as_micros() as u64, Ordering::Relaxed);
                            if gap > every * 3 / 2 {
                                st.late.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        last = Some(now);
                    }
                }
            }
        }
        Ok(None)
    }
    .await;
    st.ended.fetch_add(1, Ordering::Relaxed);
    match result {
        Ok(Some(status)) => format!("status {status}"),
        Ok(None) if content == chunks && done => "whole".into(),
        Ok(None) => format!("short ({content} chunks, [DONE] {done})"),
        Err(e) => format!("error {e} (after {content} chunks)"),
    }
}

fn policy(up: u16, deadline_ms: u64) -> String {
    let timeouts = if deadline_ms == 0 {
        String::new()
    } else {
        format!("[deadline]\ntotal_ms = {deadline_ms}\n")
    };
    let attempt = if deadline_ms == 0 {
        String::new()
    } else {
        format!("attempt_timeout_ms = {deadline_ms}\n")
    };
    format!(
        r#"
{timeouts}[retry]
max_attempts = 1
{attempt}[server]
max_connections = 20000
max_in_flight = 20000
[[providers]]
name = "slow"
kind = "openai"
base_url = "http://127.0.0.1:{up}/v1"
api_key_env = "CAPACITY_KEY"
[[routes]]
model = "smart"
chain = [{{ provider = "slow", model = "m" }}]
"#
    )
}

/// Kills the children when the run ends, however it ends.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_port(port: u16) -> Result<(), BoxError> {
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("nothing listens on {port}").into())
}

async fn upstream(addr: &str, chunks: usize, every_ms: u64) -> Result<(), BoxError> {
    let _ = LONG_STREAM.set(Reply::sse_steps(paced_steps(
        chunks,
        Duration::from_millis(every_ms),
    )));
    let l = TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    let server = MockServer::start_on(l, Reply::With(long_stream)).await?;
    server.keep_last_request_only();
    println!("ready");
    tokio::signal::ctrl_c().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("upstream") {
        let (addr, chunks, every) = (&argv[2], argv[3].parse()?, argv[4].parse()?);
        return upstream(addr, chunks, every).await;
    }
    let args = parse_args(argv.iter().skip(1).cloned())?;
    // The gateway holds two sockets per stream, and a few more of its own.
    let (wanted, needed) = (2 * args.streams + 1024, 2 * args.streams + 100);
    if nofile() < wanted && std::env::var_os("CAPACITY_REEXEC").is_none() {
        // As high as allowed: `wanted`, else the hard limit.
        let err = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {wanted} 2>/dev/null || ulimit -n $(ulimit -Hn); exec \"$0\" \"$@\""
            ))
            .args(&argv)
            .env("CAPACITY_REEXEC", "1")
            .exec();
        return Err(format!("re-running under ulimit -n {wanted}: {err}").into());
    }
    if nofile() < needed {
        return Err(format!(
            "ulimit -n is {} (its hard limit cannot be raised here): at most {} streams, {needed} descriptors needed",
            nofile(),
            nofile().saturating_sub(100) / 2
        )
        .into());
    }
    let ticks: f64 = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0);
    let every = Duration::from_millis(args.every_ms);
    let (up_port, gw_port) = (free_port()?, free_port()?);

    let mut children = Children(Vec::new());
    let mut up = Command::new(std::env::current_exe()?)
        .args([
            "upstream",
            &format!("127.0.0.1:{up_port}"),
            &args.chunks.to_string(),
        ])
        .arg(args.every_ms.to_string())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut ready = String::new();
    std::io::BufReader::new(up.stdout.take().ok_or("no stdout")?).read_line(&mut ready)?;
    let up_pid = up.id();
    children.0.push(up);

    // Long enough for the whole stream unless told otherwise.
    let deadline_ms = args
        .deadline_ms
        .unwrap_or(args.every_ms * args.chunks as u64 + 120_000);
    let path = std::env::temp_dir().join(format!("capacity-{}.toml", std::process::id()));
    std::fs::write(&path, policy(up_port, deadline_ms))?;
    let gw = Command::new(&args.binary)
        .args(["--config", path.to_str().ok_or("path")?, "--listen"])
        .arg(format!("127.0.0.1:{gw_port}"))
        .env("CAPACITY_KEY", "sk-capacity")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let gw_pid = gw.id();
    children.0.push(gw);
    wait_port(gw_port)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss_kib(gw_pid);
    println!(
        "streams {}, {} chunks each, one per {} ms; ulimit -n {}; gateway pid {gw_pid}",
        args.streams,
        args.chunks,
        args.every_ms,
        nofile()
    );
    println!(
        "gateway RSS idle: {:.1} MiB, {} fds",
        idle as f64 / 1024.0,
        open_fds(gw_pid)
    );

    let st = Arc::new(Stats::default());
    let gw_addr: SocketAddr = ([127, 0, 0, 1], gw_port).into();
    let body = Bytes::from_static(
        br#"{"model": "smart", "stream": true, "messages": [{"role": "user", "content": "Hello"}]}"#,
    );
    let started = Instant::now();
    let gw_cpu0 = cpu_seconds(gw_pid, ticks);
    let mut tasks = Vec::with_capacity(args.streams);
    let mut stages: Vec<usize> = vec![args.streams / 10, args.streams / 2, args.streams];
    stages.retain(|s| *s > 0);
    stages.dedup();
    let batch = (args.rate / 100).max(1);
    for &target in &stages {
        while tasks.len() < target {
            for _ in 0..batch.min(target - tasks.len()) {
                let (st, body) = (st.clone(), body.clone());
                let chunks = args.chunks;
                tasks.push(tokio::spawn(async move {
                    let outcome = one_stream(gw_addr, body, chunks, every, &st).await;
                    *st.outcomes
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(outcome)
                        .or_default() += 1;
                }));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let wait_from = Instant::now();
        while st.open.load(Ordering::Relaxed) + st.ended.load(Ordering::Relaxed) < target
            && wait_from.elapsed() < Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let at_open = rss_kib(gw_pid);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rss = rss_kib(gw_pid);
        let open = st.open.load(Ordering::Relaxed)
            - st.ended
                .load(Ordering::Relaxed)
                .min(st.open.load(Ordering::Relaxed));
        println!(
            "t={:>5.1}s {target:>6} streams started, {open} open: gateway RSS {:.1} MiB ({:.1} at open), {:.1} KiB per open stream over idle; {} fds",
            started.elapsed().as_secs_f64(),
            rss as f64 / 1024.0,
            at_open as f64 / 1024.0,
            (rss.saturating_sub(idle)) as f64 / open.max(1) as f64,
            open_fds(gw_pid),
        );
    }

    // The steady window: every stream open, until the first one ends.
    let (gw0, cl0, up0) = (
        cpu_seconds(gw_pid, ticks),
        cpu_seconds(std::process::id(), ticks),
        cpu_seconds(up_pid, ticks),
    );
    let chunks0 = st.chunks.load(Ordering::Relaxed);
    let window = Instant::now();
    let mut peak = 0;
    while st.ended.load(Ordering::Relaxed) == 0 && window.elapsed() < Duration::from_secs(3_600) {
        peak = peak.max(rss_kib(gw_pid));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let secs = window.elapsed().as_secs_f64();
    let (gw1, cl1, up1) = (
        cpu_seconds(gw_pid, ticks),
        cpu_seconds(std::process::id(), ticks),
        cpu_seconds(up_pid, ticks),
    );
    let relayed = st.chunks.load(Ordering::Relaxed) - chunks0;
    println!(
        "steady window {secs:.1} s: {relayed} chunks relayed ({:.0}/s); gateway CPU {:.2} s ({:.0} % of a core), {:.1} µs per chunk; client {:.0} %, upstream {:.0} % of a core; gateway RSS peak {:.1} MiB",
        relayed as f64 / secs,
        gw1 - gw0,
        100.0 * (gw1 - gw0) / secs,
        1e6 * (gw1 - gw0) / relayed.max(1) as f64,
        100.0 * (cl1 - cl0) / secs,
        100.0 * (up1 - up0) / secs,
        peak as f64 / 1024.0,
    );

    let limit = Duration::from_millis(args.every_ms * args.chunks as u64 + 120_000);
    for t in tasks {
        let _ = tokio::time::timeout(limit, t).await;
    }
    let total_chunks = st.chunks.load(Ordering::Relaxed);
    let gw_cpu = cpu_seconds(gw_pid, ticks) - gw_cpu0;
    println!(
        "whole run {:.1} s: {total_chunks} chunks; gateway CPU {gw_cpu:.1} s, {:.1} µs per chunk (connects and ends included); longest gap between two chunks of a stream {:.0} ms, {} gaps over {:.0} ms",
        started.elapsed().as_secs_f64(),
        1e6 * gw_cpu / total_chunks.max(1) as f64,
        st.max_gap_us.load(Ordering::Relaxed) as f64 / 1000.0,
        st.late.load(Ordering::Relaxed),
        every.as_secs_f64() * 1500.0,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "gateway RSS after: {:.1} MiB, {} fds",
        rss_kib(gw_pid) as f64 / 1024.0,
        open_fds(gw_pid)
    );
    let outcomes = st
        .outcomes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let whole = outcomes.get("whole").copied().unwrap_or(0);
    println!("outcomes: {outcomes:?}");
    println!("errors or short streams: {}", args.streams - whole);
    let _ = std::fs::remove_file(&path);
    drop(children);
    Ok(())
}
