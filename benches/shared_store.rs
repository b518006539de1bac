//! The healthy path through a breaker whose store is a `MemoryStore`,
//! side by side with one whose store is a `RedisBreakerStore` (issue 19: at most
//! 1.1× the local store; the hot path must not touch the network), in the
//! same run. The Redis store is connected when a `redis-server` is on
//! `PATH` (the bench starts its own on a free loopback port) or
//! `TOWER_LLM_REDIS_URL` names one; otherwise it runs local-only and the
//! bench says so.
//!
//! ```text
//! cargo bench --bench shared_store
//! ```

use std::hint::black_box;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tower::Layer;
use tower_llm::breaker::{BreakerConfig, BreakerLayer};
use tower_llm_breaker_redis::RedisBreakerStore;

mod support;
use support::{bare, call, current_thread};

/// A `redis-server` of the bench's own, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis() -> (String, Option<Server>) {
    if let Ok(url) = std::env::var("TOWER_LLM_REDIS_URL") {
        return (url, None);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(6399);
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok();
    (format!("redis://127.0.0.1:{port}"), child.map(Server))
}

fn healthy(c: &mut Criterion) {
    let (url, _server) = redis();
    // The store's background tasks run on a runtime of their own, as in a
    // server; the calls are driven by hand on this thread.
    let background = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let store = {
        let _entered = background.enter();
        Arc::new(RedisBreakerStore::open(&url, BreakerConfig::default()).expect("store"))
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while !store.is_up() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "shared_store: Redis store {}",
        if store.is_up() {
            "connected"
        } else {
            "NOT connected (local-only)"
        }
    );

    let rt = current_thread();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("shared_store");
    let mut svc = BreakerLayer::http().layer(bare());
    group.bench_function("memory_store", |b| b.iter(|| black_box(call(&mut svc))));
    let mut svc = BreakerLayer::http().with_store(store.clone()).layer(bare());
    group.bench_function("redis_store", |b| b.iter(|| black_box(call(&mut svc))));
    group.finish();
    assert_eq!(store.dropped_reports(), 0, "a healthy path reports nothing");
}

criterion_group!(benches, healthy);
criterion_main!(benches);
