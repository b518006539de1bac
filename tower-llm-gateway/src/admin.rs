//! Operator endpoints: manual control of the circuits.
//!
//! `POST /health/circuits` with a JSON body
//! `{"action": "open" | "close" | "reset" | "probe", "provider": "...", "model": "..."}`
//! (and `"scope"` for a scoped key) forces a circuit open (isolates it
//! until closed), closes it, resets it (closes it and forgets its counts;
//! the same as close), or ends its cooldown so the next call probes. It
//! needs `Authorization: Bearer <token>` with the token the gateway was
//! given ([`Gateway::set_admin_token`]; the binary reads
//! `TOWER_LLM_GATEWAY_ADMIN_TOKEN`). Without a token configured the
//! circuits are read-only: every control request is refused with 403; a
//! missing or wrong token gets 401.

use std::fmt;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower_llm::breaker::BreakerKey;

use crate::Gateway;

/// The operator endpoints' bearer token. Its `Debug` never shows it.
pub(crate) struct AdminToken(String);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken([redacted])")
    }
}

impl AdminToken {
    /// `true` when `offered` is the token, compared in time that does not
    /// depend on where they differ.
    pub(crate) fn matches(&self, offered: &[u8]) -> bool {
        let (a, b) = (self.0.as_bytes(), offered);
        let mut diff = u8::from(a.len() != b.len());
        for (i, x) in a.iter().enumerate() {
            diff |= x ^ b.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }
}

/// The bearer token a request offers in `Authorization`, as bytes (a
/// value that is not ASCII is compared as it is, never read as absent).
pub(crate) fn bearer(headers: &http::HeaderMap) -> Option<&[u8]> {
    headers
        .get(http::header::AUTHORIZATION)?
        .as_bytes()
        .strip_prefix(b"Bearer ")
}

impl Gateway {
    /// Turns the operator endpoints on with `token` (their bearer token),
    /// or off with `None` (the circuits are then read-only). An empty token
    /// counts as none.
    pub fn set_admin_token(&self, token: Option<String>) {
        self.admin_token.store(
            token
                .filter(|t| !t.is_empty())
                .map(|t| Arc::new(AdminToken(t))),
        );
    }
}

/// A control request's body.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Control {
    action: Action,
    provider: String,
    model: String,
    #[serde(default)]
    scope: Option<String>,
}

#[derive(Clone, Copy, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Action {
    Open,
    Close,
    Reset,
    Probe,
}

fn refuse(status: StatusCode, message: &str) -> Response {
    let mut res = (
        status,
        axum::Json(tower_llm::providers::openai::server::encode_error(
            message,
            "permission_error",
            None,
        )),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        res.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    res
}

/// `POST /health/circuits`: manual control of one circuit.
pub(crate) async fn control(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(token) = gw.admin_token.load_full() else {
        return refuse(
            StatusCode::FORBIDDEN,
            "manual circuit control is off: no admin token is configured",
        );
    };
    if !bearer(&headers).is_some_and(|t| token.matches(t)) {
        return refuse(StatusCode::UNAUTHORIZED, "a valid bearer token is required");
    }
    let control: Control = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(tower_llm::providers::openai::server::encode_error(
                    &format!("invalid control request: {e}"),
                    "invalid_request_error",
                    None,
                )),
            )
                .into_response();
        }
    };
    let mut key = BreakerKey::new(control.provider.as_str(), control.model.as_str());
    if let Some(scope) = control.scope {
        key = key.with_scope(scope);
    }
    let breaker = gw.breaker();
    match control.action {
        Action::Open => {
            if !breaker.isolate(&key) {
                return refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the breaker store is full: nothing was isolated",
                );
            }
        }
        Action::Close | Action::Reset => breaker.close(&key),
        Action::Probe => breaker.probe_now(&key),
    }
    tracing::warn!(target: "gateway", provider = %key.provider(), model = %key.model(), action = ?serde_json::to_value(control.action).ok(), "manual circuit control");
    let state = breaker
        .get(&key)
        .map_or("closed", |c| c.state.as_metric_label());
    axum::Json(serde_json::json!({
        "provider": key.provider(),
        "model": key.model(),
        "scope": key.scope(),
        "state": state,
    }))
    .into_response()
}
