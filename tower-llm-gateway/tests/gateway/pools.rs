//! `[[pools]]` through the gateway: a deployment's 429 moves the call to
//! another deployment of the pool within the same attempt, the answer
//! names the deployment that served, an affinity header keeps a session
//! on one deployment, and the status page shows each deployment's load.

use tower_llm_providers::mock::{MockServer, Reply};

use crate::support::{HELLO, Harness, start_text};

/// The two mock providers as deployments of one pool `both`, the route
/// `smart` over it (one attempt per link: a move inside the pool is not a
/// retry).
fn pooled(primary: &MockServer, backup: &MockServer, pool: &str) -> String {
    format!(
        r#"
        [deadline]
        total_ms = 2000
        [retry]
        max_attempts = 1
        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "UNUSED"
        [[providers]]
        name = "backup"
        kind = "anthropic"
        base_url = "{}"
        api_key_env = "UNUSED"
        [[pools]]
        name = "both"
        {pool}
        [[routes]]
        model = "smart"
        chain = [{{ provider = "both", model = "m" }}]
        "#,
        primary.url(),
        backup.url()
    )
}

const BOTH: &str = r#"deployments = [{ provider = "primary" }, { provider = "backup" }]"#;

async fn session(h: &Harness, id: &str) -> crate::support::Answer {
    h.send(
        "POST",
        "/v1/chat/completions",
        HELLO,
        &[("x-session-id", id)],
    )
    .await
}

#[tokio::test]
async fn a_deployment_s_429_moves_the_call_to_another_deployment_in_the_same_attempt() {
    let limited = Reply::openai_error(429, "rate_limit_exceeded", "slow down")
        .with_header("retry-after", "30");
    let h = start_text(limited, Reply::anthropic_text("from backup"), |p, b| {
        pooled(p, b, BOTH)
    })
    .await;
    for _ in 0..4 {
        let a = h.chat(HELLO).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.header("x-llm-provider"), "backup");
        assert_eq!(a.header("x-llm-attempts"), "1", "a move is not a retry");
    }
    // The primary said wait 30 s: it was asked once, then skipped.
    assert!(
        h.primary.received().len() <= 1,
        "{}",
        h.primary.received().len()
    );
    assert_eq!(h.backup.received().len(), 4);
}

#[tokio::test]
async fn an_affinity_header_keeps_a_session_on_one_deployment() {
    let h = start_text(
        Reply::openai_text("a"),
        Reply::anthropic_text("b"),
        |p, b| pooled(p, b, &format!("affinity_header = \"x-session-id\"\n{BOTH}")),
    )
    .await;
    let mut served = std::collections::BTreeSet::new();
    for session_id in ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"] {
        let first = session(&h, session_id)
            .await
            .header("x-llm-provider")
            .to_owned();
        for _ in 0..5 {
            assert_eq!(
                session(&h, session_id).await.header("x-llm-provider"),
                first
            );
        }
        served.insert(first);
    }
    assert_eq!(served.len(), 2, "six sessions spread over both: {served:?}");
}

#[tokio::test]
async fn the_status_page_shows_each_deployment_of_a_pool() {
    let h = start_text(
        Reply::openai_text("a"),
        Reply::anthropic_text("b"),
        |p, b| pooled(p, b, BOTH),
    )
    .await;
    assert_eq!(h.chat(HELLO).await.status, 200);
    let page = h.send("GET", "/status", "", &[]).await;
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("Pool <code>both</code>"),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("<code>primary</code>") && page.body.contains("<code>backup</code>")
    );
}
