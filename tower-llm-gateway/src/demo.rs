//! The demo: two in-process mock providers and a policy that routes the
//! model `smart` to them (what the binary serves without `--config`).

use std::sync::atomic::{AtomicUsize, Ordering};

use tower_llm::config::Policy;
use tower_llm_providers::mock::{MockServer, Recorded, Reply};

/// Every third call to the embedded primary fails with a 503.
fn flaky_primary(req: &Recorded) -> Reply {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    if CALLS.fetch_add(1, Ordering::Relaxed) % 3 == 2 {
        return Reply::openai_error(503, "server_error", "the primary is overloaded");
    }
    if wants_stream(req) {
        Reply::openai_stream(&["Hello", " from", " the", " primary"])
    } else {
        Reply::openai_text("Hello from the primary")
    }
}

fn healthy_backup(req: &Recorded) -> Reply {
    if wants_stream(req) {
        Reply::anthropic_stream(&["Hello", " from", " the", " backup"])
    } else {
        Reply::anthropic_text("Hello from the backup")
    }
}

fn wants_stream(req: &Recorded) -> bool {
    serde_json::from_slice::<serde_json::Value>(&req.body)
        .ok()
        .and_then(|b| b.get("stream").and_then(serde_json::Value::as_bool))
        .unwrap_or(false)
}

/// The demo: a flaky OpenAI-format primary (503 on every third call) and a
/// healthy Anthropic-format backup, both mock servers on loopback, and the
/// policy routing the model `smart` to them, primary first. Keep the
/// servers alive as long as the gateway serves.
///
/// # Errors
///
/// A mock server that cannot bind a loopback port.
pub async fn embedded() -> std::io::Result<(Policy, Vec<MockServer>)> {
    let primary = MockServer::start(Reply::With(flaky_primary)).await?;
    let backup = MockServer::start(Reply::With(healthy_backup)).await?;
    let text = format!(
        r#"
        [deadline]
        total_ms = 10000

        [retry]
        max_attempts = 2
        attempt_timeout_ms = 5000
        base_ms = 50
        factor = 4
        max_ms = 800
        jitter = 0.2

        [breaker]
        consecutive_failures = 5
        cooldown_ms = 10000

        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "MOCK_KEY"

        [[providers]]
        name = "backup"
        kind = "anthropic"
        base_url = "{}"
        api_key_env = "MOCK_KEY"

        [[routes]]
        model = "smart"
        chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "backup", model = "claude-sonnet-4-5" }}]
        "#,
        primary.url(),
        backup.url()
    );
    let policy = Policy::from_toml(&text)
        .map_err(|e| std::io::Error::other(format!("embedded policy: {e}")))?;
    Ok((policy, vec![primary, backup]))
}
