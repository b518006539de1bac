//! `GET /v1/models` and `GET /v1/models/{id}`: the running policy's route
//! aliases as OpenAI model objects, over real loopback HTTP to the
//! library's gateway; the list follows a reload.

use crate::support::{FULL_CHAIN, Harness, policy_text, start_text};
use tower_llm_providers::mock::Reply;

/// Routes `smart` (the harness's), then `fast`, `cheap` and `team/smart`:
/// written out of order.
async fn four_routes() -> Harness {
    start_text(
        Reply::openai_text("primary"),
        Reply::anthropic_text("backup"),
        |p, b| {
            format!(
                r#"{}
        [[routes]]
        model = "fast"
        chain = [{{ provider = "primary", model = "gpt-4o-mini" }}]
        [[routes]]
        model = "cheap"
        chain = [{{ provider = "backup", model = "claude-x" }}]
        [[routes]]
        model = "team/smart"
        chain = [{{ provider = "backup", model = "claude-x" }}]
        "#,
                policy_text(p, b, "", FULL_CHAIN)
            )
        },
    )
    .await
}

/// The ids of a `GET /v1/models` answer, each entry's shape checked.
async fn listed(h: &Harness) -> Vec<String> {
    let a = h.send("GET", "/v1/models", "", &[]).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("content-type"), "application/json");
    let list = a.json();
    assert_eq!(list["object"], "list", "{list}");
    let data = list["data"].as_array().expect("data is an array");
    data.iter()
        .map(|m| {
            assert_eq!(m["object"], "model", "{m}");
            assert_eq!(m["created"], 0, "{m}");
            assert_eq!(m["owned_by"], "tower-llm", "{m}");
            m["id"].as_str().expect("a string id").to_owned()
        })
        .collect()
}

#[tokio::test]
async fn the_model_list_is_exactly_the_route_aliases_sorted_by_id_in_openai_shape() {
    let h = four_routes().await;
    assert_eq!(listed(&h).await, ["cheap", "fast", "smart", "team/smart"]);
}

#[tokio::test]
async fn one_model_is_answered_by_id_and_an_unknown_one_is_404_model_not_found() {
    let h = four_routes().await;
    for id in ["fast", "team/smart"] {
        let a = h.send("GET", &format!("/v1/models/{id}"), "", &[]).await;
        assert_eq!(a.status, 200, "{id}: {}", a.body);
        assert_eq!(a.header("content-type"), "application/json");
        assert_eq!(
            a.json(),
            serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "tower-llm"})
        );
    }
    // The chat endpoint's error for an unknown route, in OpenAI's shape.
    let a = h.send("GET", "/v1/models/unknown", "", &[]).await;
    assert_eq!(a.status, 404, "{}", a.body);
    assert_eq!(a.header("content-type"), "application/json");
    let error = &a.json()["error"];
    assert_eq!(error["code"], "model_not_found", "{error}");
    assert_eq!(error["type"], "invalid_request_error", "{error}");
    assert_eq!(
        error["message"], "no route for model \"unknown\"",
        "{error}"
    );
    // A percent-encoded id is decoded before it is looked up.
    let a = h.send("GET", "/v1/models/%66ast", "", &[]).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["id"], "fast");
}

#[tokio::test]
async fn a_reload_changes_the_model_list() {
    let h = four_routes().await;
    let mut policy = h.gateway.policy();
    policy.routes.retain(|r| r.model != "fast");
    let mut turbo = policy.routes[0].clone();
    turbo.model = "turbo".to_owned();
    policy.routes.push(turbo);
    h.gateway.reload(policy).expect("a valid policy");

    assert_eq!(listed(&h).await, ["cheap", "smart", "team/smart", "turbo"]);
    assert_eq!(h.send("GET", "/v1/models/turbo", "", &[]).await.status, 200);
    let gone = h.send("GET", "/v1/models/fast", "", &[]).await;
    assert_eq!(gone.status, 404, "{}", gone.body);
    assert_eq!(gone.json()["error"]["code"], "model_not_found");
}
