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
pub(crate) async fn start(mut command: tokio::process::Command) -> Binary {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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
