//! The Converse request, signed with SigV4 (`aws-sigv4`).

use std::time::SystemTime;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use tower_llm_core::{ChatRequest, Failure};

use super::config::{BedrockConfig, PROVIDER};
use super::converse::{bad_request, encode};
use crate::failure::to_json;
use crate::transport::RequestBody;

/// Characters kept as they are in a path segment (RFC 3986 unreserved).
fn encode_path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(b));
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The Converse request for `req`, signed with SigV4 (with the trace
/// context, as the [`Bedrock`](crate::Bedrock) service sends it).
///
/// # Errors
///
/// A request Converse cannot take (an image by URL), or one that cannot
/// be signed: a bad-request failure.
pub fn signed_request(
    config: &BedrockConfig,
    req: &ChatRequest,
) -> Result<http::Request<RequestBody>, Failure> {
    crate::dialect::request(config, req, false)
}

/// The unsigned request for `req`: `POST {endpoint}/model/{modelId}/converse`
/// (or `converse-stream`).
pub(super) fn unsigned(
    config: &BedrockConfig,
    req: &ChatRequest,
    stream: bool,
) -> Result<http::Request<Bytes>, Failure> {
    let action = if stream {
        "converse-stream"
    } else {
        "converse"
    };
    let body = to_json(PROVIDER, &encode(req)?)?;
    let uri = format!(
        "{}/model/{}/{action}",
        config.endpoint,
        encode_path_segment(&req.model)
    );
    http::Request::post(&uri)
        .header(CONTENT_TYPE, "application/json")
        .body(Bytes::from(body))
        .map_err(|e| bad_request(format!("cannot build the request: {e}")))
}

/// Signs `http_req` with SigV4 (`Authorization`, `x-amz-date`, the
/// session token), as of the configured fixed time or now.
pub(super) fn sign(
    config: &BedrockConfig,
    http_req: &mut http::Request<Bytes>,
) -> Result<(), Failure> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    use aws_sigv4::sign::v4;

    let creds = aws_credential_types::Credentials::new(
        &config.credentials.access_key_id,
        config.credentials.secret_access_key.expose(),
        config
            .credentials
            .session_token
            .as_ref()
            .map(|t| t.expose().to_owned()),
        None,
        "tower-llm",
    );
    let identity = creds.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(&config.region)
        .name("bedrock")
        .time(config.fixed_time.unwrap_or_else(SystemTime::now))
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| bad_request(format!("cannot sign the request: {e}")))?
        .into();
    let uri = http_req.uri().to_string();
    let headers: Vec<(&str, &str)> = http_req
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
        .collect();
    let signable = SignableRequest::new(
        http_req.method().as_str(),
        uri.as_str(),
        headers.into_iter(),
        SignableBody::Bytes(http_req.body()),
    )
    .map_err(|e| bad_request(format!("cannot sign the request: {e}")))?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|e| bad_request(format!("cannot sign the request: {e}")))?
        .into_parts();
    instructions.apply_to_request_http1x(http_req);
    // aws-sigv4 marks the session token sensitive but not `Authorization`,
    // which names the access key id: keep it out of the request's `Debug`.
    if let Some(auth) = http_req.headers_mut().get_mut(http::header::AUTHORIZATION) {
        auth.set_sensitive(true);
    }
    Ok(())
}
