//! The Bedrock [`Dialect`] and the [`Bedrock`] service.

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass};

use super::config::{BedrockConfig, PROVIDER};
use super::converse::{classify, decode, error_body};
use super::event_stream::EventStreamWire;
use super::sign::{sign, unsigned};
use crate::dialect::{Dialect, ErrorBody};
use crate::failure::Scrub;
use crate::provider::Provider;
use crate::secret::ApiKey;

/// AWS Bedrock Converse (`POST /model/{modelId}/converse`) as a
/// `Service<ChatRequest>`, signed with SigV4 by the `aws-sigv4` crate (not
/// the whole AWS SDK, which retries on its own): the [`Provider`] speaking
/// the Bedrock dialect, [`BedrockConfig`].
///
/// Errors are classified by `x-amzn-ErrorType`: throttling is rate
/// limited, service unavailable / internal / model not ready are
/// transient, model timeout is a timeout, validation is a bad request (or
/// context window exceeded when the input is too long), access denied is
/// auth, resource not found is not found, service quota exceeded is quota
/// exhausted. Streams ([`streaming`](Provider::streaming)) are
/// ConverseStream, in AWS event-stream framing.
pub type Bedrock<T> = Provider<BedrockConfig, T>;

/// Bedrock Converse and ConverseStream, signed with SigV4 in
/// [`sign`](Dialect::sign); the answer's id is its `x-amzn-RequestId`.
impl Dialect for BedrockConfig {
    type Wire = EventStreamWire;

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn encode(&self, req: &ChatRequest, stream: bool) -> Result<http::Request<Bytes>, Failure> {
        unsigned(self, req, stream)
    }

    fn sign(&self, req: &mut http::Request<Bytes>) -> Result<(), Failure> {
        sign(self, req)
    }

    fn decode(
        &self,
        req: &ChatRequest,
        answer: &http::Response<Bytes>,
        latency: Duration,
    ) -> Result<ChatResponse, Failure> {
        let request_id = answer
            .headers()
            .get("x-amzn-requestid")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        decode(answer.body(), request_id, &req.model, latency)
    }

    fn error_body<'a>(&self, headers: &'a HeaderMap, body: &'a [u8]) -> ErrorBody<'a> {
        error_body(headers, body)
    }

    fn classify(&self, class: FailureClass, error: &ErrorBody<'_>) -> FailureClass {
        classify(class, error)
    }

    /// The access key id (sent in `Authorization`), the session token
    /// (sent as `x-amz-security-token`) and the secret key.
    fn secrets(&self) -> Vec<&str> {
        let c = &self.credentials;
        [c.access_key_id.as_str(), c.secret_access_key.expose()]
            .into_iter()
            .chain(c.session_token.as_ref().map(ApiKey::expose))
            .collect()
    }

    fn wire(&self) -> EventStreamWire {
        EventStreamWire::new(Scrub::new(self.secrets()))
    }

    fn max_body(&self) -> usize {
        self.max_body
    }
}
