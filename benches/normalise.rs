//! Parse + normalise of a typical 2 KB completion per provider, side by
//! side with a bare `serde_json::from_slice` of the same bytes into a
//! `serde_json::Value`.
//!
//! ```text
//! cargo bench --bench normalise
//! ```

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::Value;
use tower_llm::providers::{anthropic, bedrock, openai};

/// About 1,800 characters of answer text, as a model would write it.
fn text() -> String {
    "The circuit breaker keeps a sick provider from costing anything: calls fail fast \
     while a probe finds out when it is back. "
        .repeat(15)
}

fn bodies() -> [(&'static str, Vec<u8>); 3] {
    let t = text();
    let openai = serde_json::json!({
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT", "object": "chat.completion",
        "created": 1741569952, "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": t,
            "refusal": null, "annotations": []}, "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1200, "completion_tokens": 400, "total_tokens": 1600,
            "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0}},
        "service_tier": "default", "system_fingerprint": "fp_5050236cbd"
    });
    let anthropic = serde_json::json!({
        "model": "claude-sonnet-4-5", "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message",
        "role": "assistant", "content": [{"type": "text", "text": t}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 176, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 1024, "output_tokens": 400, "service_tier": "standard"}
    });
    let bedrock = serde_json::json!({
        "metrics": {"latencyMs": 811},
        "output": {"message": {"content": [{"text": t}], "role": "assistant"}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 176, "outputTokens": 400, "totalTokens": 1600,
            "cacheReadInputTokens": 1024, "cacheWriteInputTokens": 0}
    });
    [
        ("openai", serde_json::to_vec(&openai).expect("json")),
        ("anthropic", serde_json::to_vec(&anthropic).expect("json")),
        ("bedrock", serde_json::to_vec(&bedrock).expect("json")),
    ]
}

fn bench(c: &mut Criterion) {
    for (provider, body) in bodies() {
        let mut group = c.benchmark_group(format!("normalise/{provider}"));
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function("serde_json_value", |b| {
            b.iter(|| serde_json::from_slice::<Value>(black_box(&body)).is_ok())
        });
        group.bench_function("tower_llm", |b| {
            b.iter(|| match provider {
                "openai" => openai::decode(black_box(&body), Duration::ZERO).is_ok(),
                "anthropic" => anthropic::decode(black_box(&body), Duration::ZERO).is_ok(),
                _ => bedrock::decode(black_box(&body), "req", "m", Duration::ZERO).is_ok(),
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
