//! Request encoding per provider for 1k, 10k and 100k one-word user
//! messages in a row (the shape of a hostile body: ~34,000 of them fit in
//! 1 MiB). Throughput is per message, so a flat time per message from 1k
//! to 100k shows the encoding is linear; Anthropic and Bedrock merge the
//! run into one user turn.
//!
//! ```text
//! cargo bench --bench encode
//! ```

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tower_llm::providers::{anthropic, bedrock, openai};
use tower_llm::{ChatRequest, Message};

fn request(n: usize) -> ChatRequest {
    ChatRequest::new("m", (0..n).map(|_| Message::user("word")).collect())
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for n in [1_000usize, 10_000, 100_000] {
        let req = request(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("openai", n), &req, |b, req| {
            b.iter(|| openai::encode(black_box(req)))
        });
        group.bench_with_input(BenchmarkId::new("anthropic", n), &req, |b, req| {
            b.iter(|| anthropic::encode(black_box(req)))
        });
        group.bench_with_input(BenchmarkId::new("bedrock", n), &req, |b, req| {
            b.iter(|| bedrock::encode(black_box(req)).is_ok())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
