//! The APIs clients speak to the gateway: OpenAI's Chat Completions and
//! Anthropic's Messages. One handler serves both; this is what differs
//! (reading the request, writing the answer, the stream's events and the
//! error shape).

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower_llm::providers::{anthropic, openai};
use tower_llm::{ChatRequest, ChatResponse, ChatStream, Failure};

/// An inbound wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inbound {
    /// `POST /v1/chat/completions`.
    OpenAi,
    /// `POST /v1/messages`.
    Anthropic,
}

impl Inbound {
    /// The format a request path speaks (anything but Anthropic's path is
    /// OpenAI's, the gateway's default).
    pub(crate) fn of_path(path: &str) -> Inbound {
        if path == "/v1/messages" {
            Inbound::Anthropic
        } else {
            Inbound::OpenAi
        }
    }

    /// A request body read into a chat request, and for OpenAI whether a
    /// stream is to end with a usage chunk (Anthropic's events always
    /// carry usage).
    pub(crate) fn decode(self, body: &[u8]) -> Result<(ChatRequest, bool), Failure> {
        match self {
            Inbound::OpenAi => {
                let req = openai::server::decode_request(body)?;
                let usage = req.stream && openai::server::wants_usage(body);
                Ok((req, usage))
            }
            Inbound::Anthropic => Ok((anthropic::server::decode_request(body)?, true)),
        }
    }

    /// A unary answer's body, under the name `model`.
    pub(crate) fn write(self, res: &ChatResponse, model: &str) -> Vec<u8> {
        match self {
            Inbound::OpenAi => {
                openai::server::write_response(res, model, super::answer::now_unix())
            }
            Inbound::Anthropic => anthropic::server::write_response(res, model),
        }
    }

    /// A committed stream's server-sent events, as the answer `id`.
    pub(crate) fn frames(self, stream: ChatStream, include_usage: bool, id: String) -> Frames {
        match self {
            Inbound::OpenAi => Frames::OpenAi(openai::server::SseFrames::new(
                stream,
                include_usage,
                id,
                super::answer::now_unix(),
            )),
            Inbound::Anthropic => Frames::Anthropic(anthropic::server::SseFrames::new(stream, id)),
        }
    }

    /// The id of a streamed answer numbered `n`.
    pub(crate) fn stream_id(self, n: u64) -> String {
        match self {
            Inbound::OpenAi => format!("chatcmpl-{}-{n}", super::answer::now_unix()),
            Inbound::Anthropic => format!("msg_{}_{n}", super::answer::now_unix()),
        }
    }

    /// The event a stream ends with when `f` ends it after its commit
    /// point.
    pub(crate) fn error_event(self, f: &Failure) -> Bytes {
        match self {
            Inbound::OpenAi => openai::server::sse_error_event(f),
            Inbound::Anthropic => anthropic::server::sse_error_event(f),
        }
    }

    /// A failed call's answer (the library's mapping for the format).
    pub(crate) fn failure(self, f: &Failure) -> Response {
        match self {
            Inbound::OpenAi => openai::server::failure_response(f).map(Body::new),
            Inbound::Anthropic => anthropic::server::failure_response(f).map(Body::new),
        }
    }

    /// An answer of the gateway's own (a refused request, a limit): for
    /// OpenAI `{"error": {"message", "type": kind, "code"}}`; for
    /// Anthropic `{"type": "error", "error": {"type", "message"}}` with
    /// the type Anthropic gives `status`.
    pub(crate) fn error(
        self,
        status: StatusCode,
        message: &str,
        kind: &str,
        code: Option<&str>,
    ) -> Response {
        let body = match self {
            Inbound::OpenAi => openai::server::encode_error(message, kind, code),
            Inbound::Anthropic => anthropic::server::encode_error(anthropic_type(status), message),
        };
        let mut res = (status, axum::Json(body)).into_response();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        res
    }
}

/// Anthropic's error type for a status of the gateway's own.
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The events of a committed stream, in the client's format.
pub(crate) enum Frames {
    OpenAi(openai::server::SseFrames),
    Anthropic(anthropic::server::SseFrames),
}

impl futures_core::Stream for Frames {
    type Item = Bytes;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Bytes>> {
        match self.get_mut() {
            Frames::OpenAi(f) => std::pin::Pin::new(f).poll_next(cx),
            Frames::Anthropic(f) => std::pin::Pin::new(f).poll_next(cx),
        }
    }
}
