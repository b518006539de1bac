//! The policy file parser, fuzzed: arbitrary text, and real policy files
//! (the reference policy of `docs/policy-file.md`, the demo's, seed 004's two JSON
//! examples) damaged (truncated, bytes flipped, spliced, duplicated). No
//! input may panic; a refusal is a `ConfigError` with a message.
//!
//! 10,000 cases by default; `FUZZ_CASES=1000000` for the long run. A
//! failing case's seed is kept in `proptest-regressions/policy_fuzz.txt`.

use proptest::prelude::*;
use tower_llm::config::Policy;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("FUZZ_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(10_000),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "proptest-regressions/policy_fuzz.txt",
            ),
        )),
        ..ProptestConfig::default()
    }
}

/// Real policy files: a JSON policy around seed 004's two examples (as
/// the gateway's `seed004.rs` test loads them) and a TOML policy.
fn samples() -> Vec<(bool, String)> {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tower-llm-gateway/tests/fixtures"
    );
    let read = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).expect("fixture");
    let mut out = vec![(
        true,
        format!(
            r#"{{"retry_policies": [{}], "fallback_policies": [{}],
            "breaker_policies": {{"provider-A": {{"consecutive_failures": 100, "cooldown_ms": 10000}}}},
            "providers": [
                {{"name": "provider_A", "kind": "openai", "base_url": "http://127.0.0.1:1/v1", "api_key_env": "UNUSED"}},
                {{"name": "provider_B", "kind": "anthropic", "base_url": "http://127.0.0.1:2", "api_key_env": "UNUSED"}}
            ],
            "routes": [{{"model": "smart", "chain": [{{"provider": "provider_A", "model": "model_Y"}}],
                "retry_policy": "model.generate"}}]}}"#,
            read("seed004_retry_policy.json"),
            read("seed004_fallback_policy.json")
        ),
    )];
    out.push((
        false,
        r#"
[deadline]
total_ms = 2000
[retry]
max_attempts = 3
attempt_timeout_ms = 2000
[breaker]
consecutive_failures = 5
cooldown_ms = 30000
[[providers]]
name = "primary"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "UNUSED"
[[routes]]
model = "smart"
chain = [{ provider = "primary", model = "gpt-4o-mini" }]
"#
        .to_owned(),
    ));
    out
}

fn damaged() -> impl Strategy<Value = (bool, String)> {
    let samples = samples();
    (
        0..samples.len(),
        prop::collection::vec(
            (
                0u8..4,
                any::<prop::sample::Index>(),
                any::<prop::sample::Index>(),
                prop::collection::vec(any::<u8>(), 0..24),
            ),
            1..4,
        ),
    )
        .prop_map(move |(i, edits)| {
            let (json, text) = &samples[i];
            let mut bytes = text.clone().into_bytes();
            for (op, a, b, junk) in edits {
                if bytes.is_empty() {
                    break;
                }
                let len = bytes.len();
                let (a, b) = (a.index(len), b.index(len));
                let (from, to) = (a.min(b), a.max(b));
                match op {
                    0 => bytes.truncate(a),
                    1 => bytes[a] ^= junk.first().copied().unwrap_or(1) | 1,
                    2 => {
                        bytes.splice(from..to, junk);
                    }
                    _ => {
                        let piece = bytes[from..to].to_vec();
                        bytes.splice(a..a, piece);
                    }
                }
            }
            (*json, String::from_utf8_lossy(&bytes).into_owned())
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_policy_text_parses_or_is_refused_with_a_message(
        input in prop_oneof![
            any::<String>().prop_map(|s| (false, s)),
            any::<String>().prop_map(|s| (true, s)),
            damaged(),
        ],
    ) {
        let (json, text) = input;
        let parsed = if json { Policy::from_json(&text) } else { Policy::from_toml(&text) };
        if let Err(e) = parsed {
            prop_assert!(!e.to_string().is_empty());
        }
    }
}

#[test]
fn the_undamaged_samples_load() {
    for (json, text) in samples() {
        let parsed = if json {
            Policy::from_json(&text)
        } else {
            Policy::from_toml(&text)
        };
        assert!(parsed.is_ok(), "{parsed:?}");
    }
}
