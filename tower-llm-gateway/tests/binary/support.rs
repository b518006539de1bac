//! The built `tower-llm-gateway` binary in a test: started on a free port
//! with a policy file, and plain HTTP to it.

#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::io::AsyncBufReadExt;

/// Writes the policy file of test `name` (under the temp dir, unique to
/// this process): `tables` first (`[deadline]`, `[retry]`, ...), then one
/// OpenAI provider `primary` at `upstream` (its key from `UPSTREAM_KEY`)
/// and one route `route` over it.
pub(crate) fn one_link_policy(
    name: &str,
    upstream: &str,
    route: &str,
    tables: &str,
) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "tower-llm-binary-{name}-{}.toml",
        std::process::id()
    ));
    let text = format!(
        r#"
        {tables}
        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{upstream}/v1"
        api_key_env = "UPSTREAM_KEY"
        [[routes]]
        model = "{route}"
        chain = [{{ provider = "primary", model = "gpt-4o-mini" }}]
        "#
    );
    std::fs::write(&path, text).expect("write the policy file");
    path
}

/// A running gateway binary; killed when dropped.
pub(crate) struct Binary {
    pub(crate) url: String,
    pub(crate) child: tokio::process::Child,
}

/// Starts the binary with `--config config --listen 127.0.0.1:0` and
/// `args`, `UPSTREAM_KEY` set, and waits (10 s at most) for the address it
/// prints.
pub(crate) async fn spawn(config: &std::path::Path, args: &[&str]) -> Binary {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-llm-gateway"));
    command
        .arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("UPSTREAM_KEY", "sk-test-key");
    start(command).await
}

/// Starts `command` (the binary with its arguments and environment) and
/// waits (10 s at most) for the address it prints.
pub(crate) async fn start(command: tokio::process::Command) -> Binary {
    start_logging(command, Stdio::null()).await
}

/// As [`start`], with the binary's stderr (its log) sent to `stderr`.
pub(crate) async fn start_logging(
    mut command: tokio::process::Command,
    stderr: impl Into<Stdio>,
) -> Binary {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("the gateway binary starts");
    let stdout = child.stdout.take().expect("its stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    // "tower-llm gateway listening on http://127.0.0.1:PORT"
    let url = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(at) = line.find("http://") {
                return line[at..].trim().to_owned();
            }
        }
        panic!("the gateway ended without listening");
    })
    .await
    .expect("the gateway listens within 10 s");
    // Keep reading its stdout so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Binary { url, child }
}

/// Sends `body` as JSON with `method` to `url` (10 s at most); the status
/// and the body.
pub(crate) async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    method: &str,
    url: &str,
    body: &'static str,
) -> (u16, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("request");
    let res = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("an answer within 10 s")
        .expect("an answer");
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A Redis reply, as the tests read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resp {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`.
    Error(String),
    /// `:42`.
    Int(i64),
    /// A bulk string (`None`: nil).
    Bulk(Option<Vec<u8>>),
    /// An array (`None`: nil).
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// A bulk string's or a simple string's text.
    pub(crate) fn text(&self) -> Option<String> {
        match self {
            Resp::Simple(s) => Some(s.clone()),
            Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }
}

/// One reply parsed from the front of `buf`, and its length; `None`
/// while `buf` holds less than a whole reply.
fn parse_resp(buf: &[u8]) -> Option<(Resp, usize)> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[1..end]).expect("a RESP line is text");
    let after = end + 2;
    match buf.first()? {
        b'+' => Some((Resp::Simple(line.to_owned()), after)),
        b'-' => Some((Resp::Error(line.to_owned()), after)),
        b':' => Some((Resp::Int(line.parse().expect("an integer")), after)),
        b'$' => {
            let Ok(len) = usize::try_from(line.parse::<i64>().expect("a length")) else {
                return Some((Resp::Bulk(None), after));
            };
            let data = buf.get(after..after + len)?;
            buf.get(after + len..after + len + 2)?;
            Some((Resp::Bulk(Some(data.to_vec())), after + len + 2))
        }
        b'*' => {
            let Ok(n) = usize::try_from(line.parse::<i64>().expect("a count")) else {
                return Some((Resp::Array(None), after));
            };
            let mut items = Vec::with_capacity(n);
            let mut at = after;
            for _ in 0..n {
                let (item, used) = parse_resp(&buf[at..])?;
                items.push(item);
                at += used;
            }
            Some((Resp::Array(Some(items)), at))
        }
        other => panic!("not a RESP reply: {:?}", char::from(*other)),
    }
}

/// Runs one command on the Redis at `url` (`redis://HOST:PORT`, no
/// password) over a connection of its own (2 s at most); its reply.
pub(crate) async fn redis_command(url: &str, args: &[&str]) -> Resp {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let addr = url.trim_start_matches("redis://").trim_end_matches('/');
    let mut wire = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        wire.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        wire.extend_from_slice(arg.as_bytes());
        wire.extend_from_slice(b"\r\n");
    }
    tokio::time::timeout(Duration::from_secs(2), async {
        let mut conn = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connect to Redis");
        conn.write_all(&wire).await.expect("send to Redis");
        let mut buf = Vec::new();
        loop {
            if let Some((reply, _)) = parse_resp(&buf) {
                return reply;
            }
            let mut chunk = [0_u8; 4096];
            let n = conn.read(&mut chunk).await.expect("read from Redis");
            assert!(n > 0, "Redis closed the connection mid-reply");
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("Redis answers within 2 s")
}

/// The binary on `config`, its stderr (its log) written to `log`, with
/// each of `env` (a variable and its value) set: the API keys of the
/// policy's providers (`api_key_env`).
pub(crate) async fn spawn_logged_with_env(
    config: &std::path::Path,
    env: &[(&str, &str)],
    log: &std::path::Path,
) -> Binary {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-llm-gateway"));
    command
        .arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .envs(env.iter().copied());
    let file = std::fs::File::create(log).expect("create the log file");
    start_logging(command, file).await
}

/// Two gateway processes of one policy file, each logging to a file of
/// its own (removed when dropped).
pub(crate) struct Pair {
    pub(crate) a: Binary,
    pub(crate) b: Binary,
    logs: [std::path::PathBuf; 2],
    /// The line a process logs once when its shared store goes down.
    outage: &'static str,
}

impl Pair {
    /// The pair of `config`, with `env` set (the providers' API keys);
    /// `outage` is the line each logs when its shared store goes down.
    pub(crate) async fn start(
        name: &str,
        config: &std::path::Path,
        env: &[(&str, &str)],
        outage: &'static str,
    ) -> Pair {
        let logs = ["a", "b"].map(|p| {
            std::env::temp_dir().join(format!(
                "tower-llm-binary-{name}-{p}-{}.log",
                std::process::id()
            ))
        });
        let a = spawn_logged_with_env(config, env, &logs[0]).await;
        let b = spawn_logged_with_env(config, env, &logs[1]).await;
        Pair { a, b, logs, outage }
    }

    /// How often each process logged that its shared store went down
    /// (once per outage).
    pub(crate) fn outages(&self) -> [usize; 2] {
        self.logs.clone().map(|log| {
            std::fs::read_to_string(&log)
                .expect("the log")
                .lines()
                .filter(|l| l.contains(self.outage))
                .count()
        })
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for log in &self.logs {
            let _ = std::fs::remove_file(log);
        }
    }
}
