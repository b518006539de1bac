//! Per-chunk cost of a normalised [`ChatStream`] after its commit point
//! (body frames, SSE framing, event decoding, idle-timer bookkeeping,
//! chunk hand-off) side by side with a bare parse of the same bytes (the
//! SSE parser plus the provider's event decoder, nothing else), for
//! 500-chunk OpenAI and Anthropic streams delivered one event per body
//! frame. The call up to the commit point is set-up, not measured.
//!
//! ```text
//! cargo bench --bench stream
//! ```

use std::hint::black_box;
use std::pin::Pin;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use futures_core::Stream;
use tower::Service;
use tower_llm::providers::stream::{
    SseEvent, SseParser, StreamItem, anthropic_event, openai_event,
};
use tower_llm::{ChatRequest, ChatStream, Failure, Message};
use tower_llm_providers::mock::{
    Reply, ScriptedTransport, Step, anthropic_stream_steps, openai_stream_steps,
};

mod support;
use support::{current_thread, now_or_never};

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Heap allocations per chunk of `f`, run once.
fn allocations_per_chunk(f: impl FnOnce() -> usize) -> f64 {
    let region = Region::new(GLOBAL);
    let n = f();
    let stats = region.change();
    (stats.allocations + stats.reallocations) as f64 / n.max(1) as f64
}

const CHUNKS: usize = 500;

/// A provider's event decoder.
type Decode = fn(&SseEvent) -> Result<StreamItem, Failure>;

/// A realistic token-sized OpenAI chunk (the fields OpenAI sends).
fn openai_steps() -> Vec<Step> {
    let mut steps = openai_stream_steps(&[], false);
    for i in 0..CHUNKS {
        let chunk = serde_json::json!({
            "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT", "object": "chat.completion.chunk",
            "created": 1741569952, "model": "gpt-4o-2024-08-06",
            "system_fingerprint": "fp_44709d6fcb", "service_tier": "default",
            "choices": [{"index": 0, "delta": {"content": format!(" word{i}")},
                         "logprobs": null, "finish_reason": null}],
            "obfuscation": "r4N7vQ2m"
        });
        steps.push(Step::sse(None, &chunk.to_string()));
    }
    let mut tail = openai_stream_steps(&[], true);
    steps.extend(tail.drain(1..));
    steps
}

fn anthropic_steps() -> Vec<Step> {
    let words: Vec<String> = (0..CHUNKS).map(|i| format!(" word{i}")).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    anthropic_stream_steps(&words, true)
}

fn frames(steps: &[Step]) -> Vec<Bytes> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Send(b) => Some(b.clone()),
            _ => None,
        })
        .collect()
}

/// The bare parse: SSE framing and the provider's event decoder.
fn bare(frames: &[Bytes], decode: Decode) -> usize {
    let mut parser = SseParser::new();
    let mut n = 0;
    for frame in frames {
        parser
            .push_with(frame, |event| {
                if let Ok(StreamItem::Chunk(c)) = decode(&event) {
                    black_box(&c);
                    n += 1;
                }
            })
            .expect("well-formed");
    }
    n
}

/// SSE framing only (no JSON), for reference.
fn framing_only(frames: &[Bytes]) -> usize {
    let mut parser = SseParser::new();
    let mut n = 0;
    for frame in frames {
        parser
            .push_with(frame, |event| {
                black_box(&event);
                n += 1;
            })
            .expect("well-formed");
    }
    n
}

/// The streaming call up to its commit point (request, transport, peek to
/// the first content frame): the set-up, not measured.
fn open<S>(svc: &mut S) -> ChatStream
where
    S: Service<ChatRequest, Response = ChatStream, Error = Failure>,
{
    let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
    // A call deadline, as under a deadline layer: checked before each chunk.
    tower_llm::Deadline::after(std::time::Duration::from_secs(3600)).store(&mut req);
    now_or_never(svc.call(req)).expect("commits")
}

/// Every chunk after the commit point through the `ChatStream`: body
/// frames, SSE framing, event decoding, idle-timer bookkeeping, hand-off.
fn drain(mut stream: ChatStream) -> usize {
    let mut n = 0;
    while let Some(item) = now_or_never(std::future::poll_fn(|cx| {
        Pin::new(&mut stream).poll_next(cx)
    })) {
        black_box(item.expect("chunk"));
        n += 1;
    }
    n
}

/// Times the bare parse and the stream alternately, 41 rounds of each, so
/// that this VM's drift hits both alike; prints the median per-chunk times
/// and the median of the per-round ratios.
fn report_paired<S>(provider: &str, svc: &mut S, bytes: &[Bytes], decode: Decode)
where
    S: Service<ChatRequest, Response = ChatStream, Error = Failure>,
{
    let per_chunk = |d: std::time::Duration| d.as_nanos() as f64 / CHUNKS as f64;
    let (mut bare_ns, mut stream_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..41 {
        let t = std::time::Instant::now();
        for _ in 0..10 {
            black_box(bare(bytes, decode));
        }
        let b = per_chunk(t.elapsed()) / 10.0;
        let streams: Vec<ChatStream> = (0..10).map(|_| open(svc)).collect();
        let t = std::time::Instant::now();
        for stream in streams {
            black_box(drain(stream));
        }
        let s = per_chunk(t.elapsed()) / 10.0;
        bare_ns.push(b);
        stream_ns.push(s);
        ratios.push(s / b);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "{provider}: paired medians per chunk: bare parse {:.0} ns, chat_stream {:.0} ns, overhead {:+.1} %",
        median(&mut bare_ns),
        median(&mut stream_ns),
        (median(&mut ratios) - 1.0) * 100.0
    );
}

/// Prints the heap allocations per chunk of the bare parse and the stream.
fn report_allocations<S>(provider: &str, svc: &mut S, bytes: &[Bytes], decode: Decode)
where
    S: Service<ChatRequest, Response = ChatStream, Error = Failure>,
{
    let stream = open(svc);
    let streamed = allocations_per_chunk(|| drain(stream));
    let parsed = allocations_per_chunk(|| bare(bytes, decode));
    println!(
        "{provider}: heap allocations per chunk: bare parse {parsed:.2}, chat_stream {streamed:.2}"
    );
}

fn bench(c: &mut Criterion) {
    // The streaming services read the tokio clock: run inside a runtime.
    let rt = current_thread();
    let _guard = rt.enter();

    let cases: [(&str, Vec<Step>, Decode); 2] = [
        ("openai", openai_steps(), openai_event),
        ("anthropic", anthropic_steps(), anthropic_event),
    ];
    for (provider, steps, decode) in cases {
        let bytes = frames(&steps);
        let mut group = c.benchmark_group(format!("stream/{provider}"));
        group.throughput(Throughput::Elements(CHUNKS as u64));
        group.bench_function("sse_framing_only", |b| b.iter(|| framing_only(&bytes)));
        group.bench_function("bare_parse", |b| b.iter(|| bare(&bytes, decode)));
        let transport = ScriptedTransport::new(Reply::sse_steps(steps));
        match provider {
            "openai" => {
                let mut svc = transport.openai().streaming();
                report_allocations(provider, &mut svc, &bytes, decode);
                report_paired(provider, &mut svc, &bytes, decode);
                group.bench_function("chat_stream", |b| {
                    b.iter_batched(|| open(&mut svc), drain, BatchSize::SmallInput)
                });
            }
            _ => {
                let mut svc = transport.anthropic().streaming();
                report_allocations(provider, &mut svc, &bytes, decode);
                report_paired(provider, &mut svc, &bytes, decode);
                group.bench_function("chat_stream", |b| {
                    b.iter_batched(|| open(&mut svc), drain, BatchSize::SmallInput)
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
