//! The gateway's process: workers, their listeners, graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use crate::{ConnectionSlots, Gateway};

/// Serves a [`Gateway`] the way its binary does: one worker thread per
/// core (by default), each with a single-threaded tokio runtime and its
/// own listener on the shared port (`SO_REUSEPORT`, so the kernel spreads
/// connections across them), all under the `[server]` limits the gateway
/// started with, and one `max_connections` for all; on shutdown, every
/// worker stops accepting and calls in flight get the running policy's
/// whole budget (`body_read_timeout_ms` plus its longest route deadline).
///
/// [`bind`](Self::bind) opens every listener (so the address is known, and
/// connectable, before anything is served); [`BoundServer::serve`] runs
/// until its shutdown future resolves and the calls in flight are done.
/// Call both inside a tokio runtime: its task is worker 0, and the
/// gateway's own tasks (reloads, probes, shared stores) stay on it.
///
/// ```no_run
/// # async fn run(gateway: std::sync::Arc<tower_llm_gateway::Gateway>) -> std::io::Result<()> {
/// use std::num::NonZeroUsize;
/// use tower_llm_gateway::GatewayServer;
///
/// let server = GatewayServer::new(gateway)
///     .with_workers(NonZeroUsize::new(2).unwrap())
///     .bind("127.0.0.1:8080")
///     .await?;
/// println!("listening on http://{}", server.local_addr());
/// server.serve(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct GatewayServer {
    gateway: Arc<Gateway>,
    workers: NonZeroUsize,
}

impl GatewayServer {
    /// A server for `gateway`, one worker per core.
    pub fn new(gateway: Arc<Gateway>) -> Self {
        GatewayServer {
            gateway,
            workers: std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN),
        }
    }

    /// `workers` worker threads instead (1 where the platform cannot share
    /// a port between listeners).
    #[must_use]
    pub fn with_workers(mut self, workers: NonZeroUsize) -> Self {
        self.workers = workers;
        self
    }

    /// Resolves `listen` (`host:port`; port 0 picks a free port) and opens
    /// one listener per worker on it.
    ///
    /// # Errors
    ///
    /// An address that does not resolve or cannot be bound.
    pub async fn bind(self, listen: &str) -> std::io::Result<BoundServer> {
        let workers = if cfg!(unix) { self.workers.get() } else { 1 };
        let addr = tokio::net::lookup_host(listen)
            .await?
            .next()
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{listen:?} names no address"),
                )
            })?;
        let first = listen_shared(&addr, workers > 1)?;
        let addr = first.local_addr()?;
        let mut others = Vec::with_capacity(workers - 1);
        for _ in 1..workers {
            others.push(listen_shared(&addr, true)?.into_std()?);
        }
        Ok(BoundServer {
            gateway: self.gateway,
            addr,
            first,
            others,
        })
    }
}

/// A [`GatewayServer`] with its listeners open: serve it.
#[derive(Debug)]
pub struct BoundServer {
    gateway: Arc<Gateway>,
    addr: SocketAddr,
    first: tokio::net::TcpListener,
    others: Vec<std::net::TcpListener>,
}

impl BoundServer {
    /// The address every worker listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets calls
    /// in flight finish within the running policy's budget, and returns
    /// once every worker has stopped.
    ///
    /// # Errors
    ///
    /// A worker's runtime or thread that cannot be started.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let limits = self.gateway.server_limits();
        let router = self.gateway.clone().router();
        let slots = ConnectionSlots::new(limits.max_connections);
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
        let mut threads = Vec::with_capacity(self.others.len());
        for (worker, listener) in (1..).zip(self.others) {
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
                                crate::serve_with_slots(listener, router, limits, slots, grace())
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
        // Calls in flight at shutdown get the running policy's whole
        // budget: their body's read time and their deadline.
        let running = self.gateway.clone();
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!(target: "gateway", "shutting down: no new connections; calls in flight finish");
            let config = running.config();
            let policy = &config.policy;
            let longest = policy
                .routes
                .iter()
                .filter_map(|r| policy.resolve(r).ok())
                .map(|r| Duration::from_millis(r.total_ms))
                .max()
                .unwrap_or_else(|| policy.deadline.total());
            let _ = stop.send(Some(config.settings.server.body_read_timeout() + longest));
        });
        crate::serve_with_slots(self.first, router, limits, slots, grace()).await;
        // This runtime keeps running (the gateway's tasks live on it)
        // while the other workers finish.
        for thread in threads {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        tracing::info!(target: "gateway", "stopped");
        Ok(())
    }
}

/// A listener on `addr`; with `shared`, others may listen on the same
/// port (SO_REUSEPORT, where the platform has it).
fn listen_shared(addr: &SocketAddr, shared: bool) -> std::io::Result<tokio::net::TcpListener> {
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
