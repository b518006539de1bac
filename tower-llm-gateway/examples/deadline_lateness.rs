//! How late the gateway's deadline answers come, and what a call in flight
//! costs in memory: CALLS concurrent calls against an upstream that
//! accepts and never answers, each on a connection of its own opened
//! before any call is sent, so the clock measures the gateway and not the
//! accept queue.
//!
//! ```text
//! cargo build --release -p tower-llm-gateway --bins --example deadline_lateness
//! target/release/examples/deadline_lateness [--binary target/release/tower-llm-gateway]
//!     [--calls 1000] [--deadline-ms 2000] [--workers N] [--rounds 1]
//! ```
//!
//! Prints the lateness past the deadline (p50, p99, max), the answers'
//! statuses, and the gateway's resident memory idle and with every call in
//! flight (its difference per call is the figure `[server] max_in_flight`
//! is derived from). Loopback only; bounded in count and time.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncBufReadExt;

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    binary: String,
    calls: usize,
    deadline_ms: u64,
    workers: Option<usize>,
    rounds: usize,
}

fn args() -> Result<Args, Error> {
    let mut args = Args {
        binary: "target/release/tower-llm-gateway".into(),
        calls: 1000,
        deadline_ms: 2000,
        workers: None,
        rounds: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--binary" => args.binary = value()?,
            "--calls" => args.calls = value()?.parse()?,
            "--deadline-ms" => args.deadline_ms = value()?.parse()?,
            "--workers" => args.workers = Some(value()?.parse()?),
            "--rounds" => args.rounds = value()?.parse()?,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    Ok(args)
}

/// The process's resident memory in KiB (`VmRSS`), or 0 off Linux.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Error> {
    let args = args()?;
    // An upstream that accepts, reads, and never answers.
    let upstream_addr = tower_llm_test_support::silent_upstream().await;
    let config =
        std::env::temp_dir().join(format!("deadline-lateness-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            r#"
            [server]
            max_connections = {conns}
            max_in_flight = {conns}
            [deadline]
            total_ms = {deadline}
            [retry]
            max_attempts = 1
            attempt_timeout_ms = {deadline}
            [[providers]]
            name = "silent"
            kind = "openai"
            base_url = "http://{upstream_addr}/v1"
            api_key_env = "UPSTREAM_KEY"
            [[routes]]
            model = "smart"
            chain = [{{ provider = "silent", model = "m" }}]
            "#,
            conns = args.calls * 2,
            deadline = args.deadline_ms,
        ),
    )?;
    let mut cmd = tokio::process::Command::new(&args.binary);
    cmd.arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .env("UPSTREAM_KEY", "sk-lateness")
        .stdout(std::process::Stdio::piped())
        .stderr(match std::env::var_os("LATENESS_GATEWAY_STDERR") {
            Some(path) => std::fs::File::create(path)?.into(),
            None => std::process::Stdio::null(),
        })
        .kill_on_drop(true);
    if let Some(n) = args.workers {
        cmd.args(["--workers", &n.to_string()]);
    }
    let mut child = cmd.spawn()?;
    let pid = child.id().unwrap_or(0);
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let addr = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(at) = line.find("http://") {
                return Some(line[at + 7..].trim().to_owned());
            }
        }
        None
    })
    .await?
    .ok_or("the gateway did not listen")?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    // Every connection first, then every call at once.
    let mut senders = Vec::with_capacity(args.calls);
    for _ in 0..args.calls {
        let stream = tokio::net::TcpStream::connect(&addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        senders.push(sender);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_kib(pid);
    let body =
        Bytes::from_static(br#"{"model":"smart","messages":[{"role":"user","content":"Hello"}]}"#);
    for round in 1..=args.rounds {
        let start = Instant::now();
        let calls: Vec<_> = std::mem::take(&mut senders)
            .into_iter()
            .map(|mut sender| {
                let req = http::Request::post("/v1/chat/completions")
                    .header("host", "gateway")
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()));
                tokio::spawn(async move {
                    let req = req.map_err(|e| e.to_string())?;
                    let sent = Instant::now();
                    let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
                    let took = sent.elapsed();
                    let status = res.status().as_u16();
                    let _ = res.into_body().collect().await;
                    Ok::<_, String>((took, status, sender))
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(args.deadline_ms / 2)).await;
        let busy = rss_kib(pid);
        let mut late = Vec::with_capacity(calls.len());
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        for call in calls {
            match call.await? {
                Ok((took, status, sender)) => {
                    *statuses.entry(status).or_default() += 1;
                    late.push(took.as_secs_f64() * 1000.0 - args.deadline_ms as f64);
                    senders.push(sender);
                }
                Err(e) => eprintln!("a call failed: {e}"),
            }
        }
        let wall = start.elapsed();
        late.sort_by(f64::total_cmp);
        println!(
            "round {round}: {} calls, deadline {} ms, workers {}: lateness p50 {:+.1} ms, p99 {:+.1} ms, max {:+.1} ms (min {:+.1}); statuses {:?}; all answered in {:.0} ms",
            late.len(),
            args.deadline_ms,
            args.workers
                .map_or_else(|| "default".into(), |n| n.to_string()),
            percentile(&late, 0.5),
            percentile(&late, 0.99),
            late.last().copied().unwrap_or(f64::NAN),
            late.first().copied().unwrap_or(f64::NAN),
            statuses,
            wall.as_secs_f64() * 1000.0,
        );
        println!(
            "round {round}: gateway RSS {:.1} MiB with {} idle connections, {:.1} MiB with every call in flight: {:.1} KiB per call",
            idle as f64 / 1024.0,
            args.calls,
            busy as f64 / 1024.0,
            (busy.saturating_sub(idle)) as f64 / args.calls as f64,
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // SIGTERM first (a profiler wrapping the gateway writes its output on
    // a clean exit), then a kill.
    drop(senders);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    if tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
    let _ = std::fs::remove_file(config);
    Ok(())
}
