//! The built binary's command line: `--help` and `--version` (stdout,
//! exit 0), the environment variables each flag falls back to, and usage
//! errors (stderr, exit 2). Real processes: bounded waits, never a sleep.

use std::process::Output;
use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_llm_providers::mock::{MockServer, Reply};

use crate::support::{one_link_policy, send, start};

const BIN: &str = env!("CARGO_BIN_EXE_tower-llm-gateway");

/// The variables the binary reads, removed so the tests' own environment
/// cannot change what they see.
const VARS: [&str; 4] = [
    "TOWER_LLM_GATEWAY_CONFIG",
    "TOWER_LLM_GATEWAY_LISTEN",
    "TOWER_LLM_GATEWAY_WORKERS",
    "TOWER_LLM_GATEWAY_ADMIN_TOKEN",
];

/// The binary with `args` and none of [`VARS`] set.
fn command(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(BIN);
    command.args(args).kill_on_drop(true);
    for var in VARS {
        command.env_remove(var);
    }
    command
}

/// Runs `command` to its end (10 s at most).
async fn finish(mut command: tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(10), command.output())
        .await
        .expect("the binary exits within 10 s")
        .expect("the binary runs")
}

/// A policy file (test `name`) with the one route `from-env-file` to
/// `upstream`.
fn config(name: &str, upstream: &MockServer) -> std::path::PathBuf {
    one_link_policy(&format!("cli-{name}"), &upstream.url(), "from-env-file", "")
}

#[tokio::test]
async fn help_exits_0_and_names_every_flag_and_its_environment_variable() {
    let out = finish(command(&["--help"])).await;
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "--config <PATH>",
        "--listen <HOST:PORT>",
        "--workers <N>",
        "TOWER_LLM_GATEWAY_CONFIG",
        "TOWER_LLM_GATEWAY_LISTEN",
        "TOWER_LLM_GATEWAY_WORKERS",
        "TOWER_LLM_GATEWAY_ADMIN_TOKEN",
        "OpenAI-compatible LLM gateway",
        "Without --config it runs the embedded demo",
        "mock providers",
        "GET /v1/models",
        "--version",
    ] {
        assert!(help.contains(word), "{word:?} missing from:\n{help}");
    }
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn version_exits_0_and_prints_the_crate_version() {
    let out = finish(command(&["--version"])).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("tower-llm-gateway {}\n", env!("CARGO_PKG_VERSION"))
    );
    assert!(out.stderr.is_empty());
}

#[tokio::test]
async fn the_config_and_listen_address_come_from_the_environment_and_a_flag_wins() {
    let upstream = MockServer::start(Reply::openai_text("hi"))
        .await
        .expect("upstream");
    let file = config("env", &upstream);
    let client = Client::builder(TokioExecutor::new()).build_http();
    let hello = r#"{"model": "from-env-file", "messages": [{"role": "user", "content": "Hello"}]}"#;

    // No flag: both from the environment (127.0.0.2 is loopback too, and
    // never the default 127.0.0.1:8080).
    let mut env_only = command(&[]);
    env_only
        .env("TOWER_LLM_GATEWAY_CONFIG", &file)
        .env("TOWER_LLM_GATEWAY_LISTEN", "127.0.0.2:0")
        .env("UPSTREAM_KEY", "sk-test-key");
    let gw = start(env_only).await;
    assert!(gw.url.starts_with("http://127.0.0.2:"), "{}", gw.url);
    assert!(!gw.url.ends_with(":0"), "{}", gw.url);
    let chat = format!("{}/v1/chat/completions", gw.url);
    let (status, body) = send(&client, "POST", &chat, hello).await;
    assert_eq!(status, 200, "the file's route is served: {body}");
    assert_eq!(upstream.received().len(), 1);
    drop(gw);

    // `--listen` given: it wins over TOWER_LLM_GATEWAY_LISTEN.
    let mut both = command(&["--listen", "127.0.0.3:0"]);
    both.env("TOWER_LLM_GATEWAY_CONFIG", &file)
        .env("TOWER_LLM_GATEWAY_LISTEN", "127.0.0.2:0")
        .env("UPSTREAM_KEY", "sk-test-key");
    let gw = start(both).await;
    assert!(gw.url.starts_with("http://127.0.0.3:"), "{}", gw.url);
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn workers_from_the_environment_are_checked_like_the_flag() {
    let upstream = MockServer::start(Reply::openai_text("hi"))
        .await
        .expect("upstream");
    let file = config("workers", &upstream);
    let mut zero = command(&["--listen", "127.0.0.1:0"]);
    zero.arg("--config")
        .arg(&file)
        .env("TOWER_LLM_GATEWAY_WORKERS", "0")
        .env("UPSTREAM_KEY", "sk-test-key");
    let out = finish(zero).await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value '0' for '--workers <N>'")
            && err.contains("expected a number above 0"),
        "{err}"
    );
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn an_unknown_flag_exits_2_with_the_usage_on_stderr() {
    let out = finish(command(&["--bogus"])).await;
    // clap's exit code for a usage error (1 is a failure to start).
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unexpected argument '--bogus'"), "{err}");
    assert!(err.contains("Usage: tower-llm-gateway [OPTIONS]"), "{err}");
}
