//! `tower-llm-gateway`: an OpenAI-compatible LLM gateway on the tower-llm
//! stack.
//!
//! ```text
//! cargo run --release -p tower-llm-gateway --features demo   # the demo, no keys
//! tower-llm-gateway --config gateway.toml --listen 127.0.0.1:8080 [--workers N]
//! tower-llm-gateway --help | --version
//! ```
//!
//! Each flag falls back to an environment variable:
//! `TOWER_LLM_GATEWAY_CONFIG`, `TOWER_LLM_GATEWAY_LISTEN`,
//! `TOWER_LLM_GATEWAY_WORKERS` (a flag given wins). `--help` and
//! `--version` print to stdout and exit 0; a usage error (an unknown flag,
//! `--workers 0`) is printed to stderr with exit code 2; a failure to
//! start (an unreadable or invalid policy, an address in use) exits 1.
//!
//! Without `--config` it starts two in-process mock providers (a flaky
//! OpenAI-format primary that answers 503 to every third call, and a
//! healthy Anthropic-format backup) and routes the model `smart` to them.
//!
//! - `POST /v1/chat/completions` (OpenAI format; `model` is the route;
//!   `stream: true` answers server-sent events), with `x-llm-provider`,
//!   `x-llm-model-used` and `x-llm-attempts` headers.
//! - `GET /v1/models` (the running policy's route aliases, sorted, in
//!   OpenAI's list shape) and `GET /v1/models/{id}` (one, or 404
//!   `model_not_found`).
//! - `GET /metrics`, `GET /health`, `GET /health/circuits`,
//!   `GET /health/providers`; probes follow `[health]` of the running
//!   policy.
//! - `POST /health/circuits` (force a circuit open, close, reset it, probe
//!   it) with `Authorization: Bearer $TOWER_LLM_GATEWAY_ADMIN_TOKEN`;
//!   without that variable set the circuits are read-only.
//! - The config file is reloaded on SIGHUP and when it changes (once it
//!   has stayed unchanged for `server.reload_settle_ms`); an invalid file
//!   is refused and the running policy stays.
//! - One worker thread per core (`--workers N` to choose), each with a
//!   single-threaded tokio runtime and its own listener on the same port
//!   (`SO_REUSEPORT`: the kernel spreads connections across them) and its
//!   own pool of provider connections: a call is served start to end on
//!   the thread that accepted its connection, and wakes no other.
//! - The server enforces the `[server]` limits (header, idle, body and send
//!   timeouts, connection and in-flight caps) and shuts down gracefully on
//!   SIGTERM or ctrl-c: it stops accepting, lets calls in flight finish up
//!   to their deadline, then exits.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use tower_llm_gateway::{Gateway, GatewayConfig, GatewayServer, KeySource};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// An OpenAI-compatible LLM gateway on the tower-llm stack: routes model
/// aliases to provider fallback chains with deadlines, retries, circuit
/// breakers and hedging, and reloads its policy file on change.
///
/// Without --config it runs the embedded demo: two in-process mock
/// providers behind the route "smart" (no keys needed).
#[derive(Debug, clap::Parser)]
#[command(name = "tower-llm-gateway", version, after_help = AFTER_HELP)]
struct Args {
    /// The policy file (TOML) to serve; reloaded on SIGHUP and when it
    /// changes. Without it: the embedded demo with mock providers.
    #[arg(long, value_name = "PATH", env = "TOWER_LLM_GATEWAY_CONFIG")]
    config: Option<PathBuf>,
    /// The address to listen on (port 0: any free port). Default: the
    /// policy's `listen`, else 127.0.0.1:8080.
    #[arg(long, value_name = "HOST:PORT", env = "TOWER_LLM_GATEWAY_LISTEN")]
    listen: Option<String>,
    /// Worker threads, each with its own runtime and listener on the
    /// shared port (at least 1). Default: one per core.
    #[arg(
        long,
        value_name = "N",
        env = "TOWER_LLM_GATEWAY_WORKERS",
        value_parser = workers,
        allow_negative_numbers = true
    )]
    workers: Option<usize>,
}

/// The end of `--help`: what is read from the environment besides the
/// flags' fallbacks, and the endpoints.
const AFTER_HELP: &str = "\
Environment:
  TOWER_LLM_GATEWAY_ADMIN_TOKEN  Bearer token for POST /health/circuits (force a
                                 circuit open, close, reset, probe); unset: the
                                 circuits are read-only.
  Each provider's key is read from the variable its `api_key_env` names.

Endpoints: POST /v1/chat/completions, POST /v1/messages (Anthropic),
POST /v1/embeddings, GET /v1/models, GET /v1/models/{id}, GET /metrics,
GET /health, GET /health/circuits, GET /health/providers, GET /status.";

/// `--workers`: a whole number of at least 1 (clap names the flag and the
/// value in its error).
fn workers(n: &str) -> Result<usize, String> {
    match n.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a number above 0".to_owned()),
    }
}

fn main() {
    // Help and version: stdout, exit 0; a usage error: stderr, exit 2.
    let args = <Args as clap::Parser>::parse();
    let started = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Into::into)
        .and_then(|runtime| runtime.block_on(run(args)));
    if let Err(e) = started {
        eprintln!("tower-llm-gateway: {e}");
        std::process::exit(1);
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn run(args: Args) -> Result<(), Error> {
    // Logs to stderr: the gateway's own events at info, everything else
    // (per-request spans included) only from warn, so the log layer costs
    // nothing per request. Spans carry OpenTelemetry context so an inbound
    // `traceparent` is continued to the providers; calls that arrive
    // without one are not sampled, and none of their spans is created
    // (`TracedCallsOnly`). Add an exporter in a real deployment.
    let tracer = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_sampler(opentelemetry_sdk::trace::Sampler::ParentBased(Box::new(
            opentelemetry_sdk::trace::Sampler::AlwaysOff,
        )))
        .build();
    let logs = tracing_subscriber::filter::Targets::new()
        .with_default(tracing::Level::WARN)
        .with_target("gateway", tracing::Level::INFO);
    // Lines are written by a thread of their own, never by a worker: a
    // slow reader of stderr (a terminal, a log shipper) must not stall
    // calls (it did: 1,000 calls failing at once wrote 1,000 lines, and a
    // reader of 2,000 lines a second held the last answer 450 ms past its
    // deadline). When the reader falls 64k lines behind, lines are
    // dropped rather than waited for.
    let (stderr, _flush_on_exit) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .thread_name("gateway-log")
        .finish(std::io::stderr());
    tracing_subscriber::registry()
        .with(tower_llm_gateway::telemetry::TracedCallsOnly)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_filter(logs),
        )
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(tracer.tracer("gateway"))
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .try_init()?;

    let (config, keys, _demo) = load(&args).await?;
    let listen = args
        .listen
        .clone()
        .or_else(|| config.settings.listen.clone())
        .unwrap_or_else(|| "127.0.0.1:8080".to_owned());
    let transport = tower_llm_gateway::Transport::per_thread(Duration::from_secs(5));
    let gateway = Gateway::new(config, transport, keys)?;
    if let Some(path) = args.config.clone() {
        tokio::spawn(tower_llm_gateway::reload_on_change(gateway.clone(), path));
    }
    gateway.set_admin_token(std::env::var("TOWER_LLM_GATEWAY_ADMIN_TOKEN").ok());
    // Probes follow `[health] probe_interval_ms` of the running policy.
    tokio::spawn(tower_llm_gateway::probe_loop(gateway.clone()));

    let mut server = GatewayServer::new(gateway);
    if let Some(workers) = args.workers.and_then(NonZeroUsize::new) {
        server = server.with_workers(workers);
    }
    // Every worker's listener is open before the address is printed.
    let server = server.bind(&listen).await?;
    let addr = server.local_addr();
    println!("tower-llm gateway listening on http://{addr}");
    if args.config.is_none() {
        println!(
            "embedded default: route \"smart\" = mock primary (503 every third call) -> mock backup"
        );
    }
    println!("try:");
    println!(
        "  curl -si http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"smart\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'"
    );
    println!("  curl -s http://{addr}/v1/models    curl -s http://{addr}/health/circuits");
    println!("  curl -s http://{addr}/metrics");
    server.serve(shutdown_signal()).await?;
    Ok(())
}

/// What the demo keeps alive while it runs (its mock providers).
#[cfg(feature = "demo")]
type Demo = Vec<tower_llm_providers::mock::MockServer>;
#[cfg(not(feature = "demo"))]
type Demo = ();

/// The configuration to serve: the `--config` file, else the embedded
/// demo (built with the `demo` feature).
async fn load(args: &Args) -> Result<(GatewayConfig, KeySource, Demo), Error> {
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let keys: KeySource = Arc::new(|p| p.api_key_from_env());
        #[cfg(feature = "demo")]
        let demo = Vec::new();
        #[cfg(not(feature = "demo"))]
        let demo = ();
        return Ok((GatewayConfig::from_toml(&text)?, keys, demo));
    }
    #[cfg(feature = "demo")]
    {
        let (policy, mocks) = tower_llm_gateway::demo::embedded().await?;
        let keys: KeySource = Arc::new(|_| Ok(Some(tower_llm::providers::ApiKey::new("mock"))));
        Ok((GatewayConfig::from(policy), keys, mocks))
    }
    #[cfg(not(feature = "demo"))]
    Err("no --config given (TOWER_LLM_GATEWAY_CONFIG); the embedded demo needs the `demo` feature: cargo run -p tower-llm-gateway --features demo".into())
}

/// Resolves on ctrl-c or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
