//! `tower-llm-gateway`: an OpenAI-compatible LLM gateway on the tower-llm
//! stack.
//!
//! ```text
//! cargo run --release -p tower-llm-gateway                   # the demo, no keys
//! tower-llm-gateway --config gateway.toml --listen 127.0.0.1:8080 [--workers N]
//! ```
//!
//! Without `--config` it starts two in-process mock providers (a flaky
//! OpenAI-format primary that answers 503 to every third call, and a
//! healthy Anthropic-format backup) and routes the model `smart` to them.
//!
//! - `POST /v1/chat/completions` (OpenAI format; `model` is the route;
//!   `stream: true` answers server-sent events), with `x-llm-provider`,
//!   `x-llm-model-used` and `x-llm-attempts` headers.
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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use tower_llm::config::Policy;
use tower_llm::providers::ApiKey;
use tower_llm_gateway::{Gateway, KeySource};
use tower_llm_providers::mock::MockServer;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    config: Option<PathBuf>,
    listen: Option<String>,
    workers: Option<usize>,
}

const USAGE: &str =
    "usage: tower-llm-gateway [--config PATH.toml] [--listen HOST:PORT] [--workers N]";

fn args() -> Result<Args, String> {
    let mut args = Args {
        config: None,
        listen: None,
        workers: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--config" => args.config = Some(it.next().ok_or("--config needs a path")?.into()),
            "--listen" => args.listen = Some(it.next().ok_or("--listen needs host:port")?),
            "--workers" => {
                let n = it.next().ok_or("--workers needs a number")?;
                match n.parse::<usize>() {
                    Ok(n) if n > 0 => args.workers = Some(n),
                    _ => return Err(format!("--workers needs a number above 0, not {n:?}")),
                }
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(args)
}

fn main() {
    let started = args().map_err(Into::into).and_then(|args| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(run(args))
    });
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
    tracing_subscriber::registry()
        .with(tower_llm_gateway::telemetry::TracedCallsOnly)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(logs),
        )
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(tracer.tracer("gateway"))
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .try_init()?;

    let (policy, keys, _mocks): (Policy, KeySource, Vec<MockServer>) = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)?;
            let keys: KeySource = Arc::new(|p| p.api_key_from_env());
            (Policy::from_toml(&text)?, keys, Vec::new())
        }
        None => {
            let (policy, mocks) = tower_llm_gateway::demo::embedded().await?;
            let keys: KeySource = Arc::new(|_| Ok(Some(ApiKey::new("mock"))));
            (policy, keys, mocks)
        }
    };
    let listen = args
        .listen
        .clone()
        .or_else(|| policy.listen.clone())
        .unwrap_or_else(|| "127.0.0.1:8080".to_owned());
    let limits = policy.server;
    let transport = tower_llm_gateway::Transport::per_thread(Duration::from_secs(5));
    let gateway = Gateway::new(policy, transport, keys)?;

    if let Some(path) = args.config.clone() {
        tokio::spawn(tower_llm_gateway::reload_on_change(gateway.clone(), path));
    }
    gateway.set_admin_token(std::env::var("TOWER_LLM_GATEWAY_ADMIN_TOKEN").ok());
    // Probes follow `[health] probe_interval_ms` of the running policy.
    tokio::spawn(tower_llm_gateway::probe_loop(gateway.clone()));

    // One worker per core by default; a port is shared only where
    // SO_REUSEPORT exists.
    let workers = if cfg!(unix) {
        args.workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
    } else {
        1
    };
    let addr = tokio::net::lookup_host(&listen)
        .await?
        .next()
        .ok_or_else(|| format!("{listen:?} names no address"))?;
    // Every worker's listener is open before the address is printed.
    let listener = listen_shared(&addr, workers > 1)?;
    let addr = listener.local_addr()?;
    let mut others = Vec::new();
    for _ in 1..workers {
        others.push(listen_shared(&addr, true)?.into_std()?);
    }
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
    println!("  curl -s http://{addr}/health/circuits    curl -s http://{addr}/metrics");
    // Calls in flight at shutdown get the running policy's whole budget:
    // their body's read time and their deadline.
    let running = gateway.clone();
    let (stop, stopping) = tokio::sync::watch::channel(None::<Duration>);
    let grace = move || {
        let mut stopping = stopping.clone();
        async move {
            match stopping.wait_for(Option::is_some).await {
                Ok(grace) => grace.unwrap_or_default(),
                Err(_) => Duration::ZERO,
            }
        }
    };
    // Workers 1.. each run a single-threaded runtime of their own; worker
    // 0 is this thread, which also runs the reload and probe tasks. They
    // share `[server] max_connections`.
    let router = gateway.router();
    let slots = tower_llm_gateway::ConnectionSlots::new(limits.max_connections);
    let mut threads = Vec::new();
    for (worker, listener) in (1..).zip(others) {
        let (router, grace, slots) = (router.clone(), grace.clone(), slots.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name(format!("gateway-worker-{worker}"))
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => {
                            tower_llm_gateway::serve_with_slots(
                                listener,
                                router,
                                limits,
                                slots,
                                grace(),
                            )
                            .await;
                        }
                        Err(e) => {
                            tracing::error!(target: "gateway", error = %e, worker, "a worker could not listen");
                        }
                    }
                });
            })?;
        threads.push(thread);
    }
    tokio::spawn(async move {
        shutdown_signal().await;
        let policy = running.policy();
        let longest = policy
            .routes
            .iter()
            .filter_map(|r| policy.resolve(r).ok())
            .map(|r| Duration::from_millis(r.total_ms))
            .max()
            .unwrap_or_else(|| policy.deadline.total());
        let _ = stop.send(Some(policy.server.body_read_timeout() + longest));
    });
    tower_llm_gateway::serve_with_slots(listener, router, limits, slots, grace()).await;
    // This runtime keeps running (the shared stores' tasks live on it)
    // while the other workers finish.
    for thread in threads {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    tracing::info!(target: "gateway", "stopped");
    Ok(())
}

/// A listener on `addr`; with `shared`, others may listen on the same
/// port (SO_REUSEPORT, where the platform has it).
fn listen_shared(
    addr: &std::net::SocketAddr,
    shared: bool,
) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    if shared {
        socket.set_reuseport(true)?;
    }
    #[cfg(not(unix))]
    let _ = shared;
    socket.bind(*addr)?;
    socket.listen(1024)
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
    tracing::info!(target: "gateway", "shutting down: no new connections; calls in flight finish");
}
