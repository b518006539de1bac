//! Embeddings in and out: an OpenAI Embeddings request body read into an
//! [`EmbeddingRequest`], and an [`EmbeddingResponse`] written as a `list`
//! of `embedding` objects.

use base64::Engine as _;
use serde::Deserialize;
use serde::ser::{Serialize, SerializeSeq, Serializer};
use serde_json::Value;
use tower_llm_core::{EmbeddingRequest, EmbeddingResponse, Failure, FailureClass};

/// The most texts one request may embed (OpenAI's own limit).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// How the vectors of an answer are written, as the request's
/// `encoding_format` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EncodingFormat {
    /// JSON arrays of numbers (`"float"`, the default).
    #[default]
    Float,
    /// The little-endian `f32` bytes of each vector in standard base64
    /// (`"base64"`, what OpenAI's SDKs ask for by default).
    Base64,
}

#[derive(Deserialize)]
struct WireRequest {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<u32>,
}

fn bad(message: impl Into<String>) -> Failure {
    Failure::new(FailureClass::BadRequest).with_message(crate::failure::bounded(&message.into()))
}

/// Reads an OpenAI Embeddings request body (`POST /v1/embeddings`) into an
/// [`EmbeddingRequest`] (`model` as sent: a gateway treats it as a route
/// alias) and the [`EncodingFormat`] its answer is to be written in.
/// `input` is one string or an array of at most
/// [`MAX_EMBEDDING_INPUTS`] strings; `user` and unknown fields are
/// ignored.
///
/// # Errors
///
/// A bad-request failure naming what is wrong: malformed JSON, a missing
/// `model` or `input`, an empty input array, too many inputs, token-id
/// arrays (not every upstream takes them: send text), or an
/// `encoding_format` other than `float` and `base64`.
///
/// ```
/// use tower_llm_providers::openai::server::{EncodingFormat, decode_embedding_request};
///
/// let (req, format) = decode_embedding_request(
///     br#"{"model": "embed", "input": ["a", "b"], "encoding_format": "base64"}"#,
/// )
/// .unwrap();
/// assert_eq!(&*req.model, "embed");
/// assert_eq!(req.input.len(), 2);
/// assert_eq!(format, EncodingFormat::Base64);
/// assert!(decode_embedding_request(br#"{"model": "embed", "input": [1, 2]}"#)
///     .unwrap_err()
///     .is_bad_request());
/// ```
pub fn decode_embedding_request(
    body: &[u8],
) -> Result<(EmbeddingRequest, EncodingFormat), Failure> {
    let wire: WireRequest =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid request body: {e}")))?;
    let texts = match wire.input {
        Value::String(text) => vec![text],
        Value::Array(items) => {
            if items.is_empty() {
                return Err(bad("`input` is an empty array"));
            }
            if items.len() > MAX_EMBEDDING_INPUTS {
                return Err(bad(format!(
                    "`input` has {} items: at most {MAX_EMBEDDING_INPUTS} per request",
                    items.len()
                )));
            }
            let mut texts = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(text) => texts.push(text),
                    Value::Number(_) | Value::Array(_) => {
                        return Err(bad(
                            "token-id inputs are not supported: send `input` as text",
                        ));
                    }
                    _ => return Err(bad("`input` items must be strings")),
                }
            }
            texts
        }
        _ => return Err(bad("`input` must be a string or an array of strings")),
    };
    let format = match wire.encoding_format.as_deref() {
        None | Some("float") => EncodingFormat::Float,
        Some("base64") => EncodingFormat::Base64,
        Some(_) => return Err(bad("`encoding_format` must be \"float\" or \"base64\"")),
    };
    let mut req = EmbeddingRequest::new(wire.model, texts);
    req.dimensions = wire.dimensions;
    Ok((req, format))
}

/// The bytes of an Embeddings answer for `res` under the name `model`
/// (the alias the client asked for): `{"object": "list", "data": [{"object":
/// "embedding", "index", "embedding"}], "model", "usage": {"prompt_tokens",
/// "total_tokens"}}`, each vector as `format` says.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::EmbeddingResponse;
/// use tower_llm_providers::openai::server::{EncodingFormat, write_embeddings};
///
/// let res = EmbeddingResponse {
///     model: "text-embedding-3-small".into(),
///     provider: "openai".into(),
///     embeddings: vec![vec![1.0, -0.5]],
///     prompt_tokens: 3,
///     latency: Duration::ZERO,
///     attempts: Vec::new(),
/// };
/// let body: serde_json::Value =
///     serde_json::from_slice(&write_embeddings(&res, "embed", EncodingFormat::Float)).unwrap();
/// assert_eq!(body["data"][0]["embedding"], serde_json::json!([1.0, -0.5]));
/// let body: serde_json::Value =
///     serde_json::from_slice(&write_embeddings(&res, "embed", EncodingFormat::Base64)).unwrap();
/// assert_eq!(body["data"][0]["embedding"], "AACAPwAAAL8=");
/// assert_eq!(body["usage"]["total_tokens"], 3);
/// ```
pub fn write_embeddings(res: &EmbeddingResponse, model: &str, format: EncodingFormat) -> Vec<u8> {
    let dims: usize = res.embeddings.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(128 + dims * 12 + res.embeddings.len() * 48);
    let body = ListBody {
        object: "list",
        data: Data {
            vectors: &res.embeddings,
            format,
        },
        model,
        usage: UsageBody {
            prompt_tokens: res.prompt_tokens,
            total_tokens: res.prompt_tokens,
        },
    };
    // Writing borrowed strings and numbers to a Vec cannot fail (a
    // non-finite float is written as `null`).
    let _ = serde_json::to_writer(&mut out, &body);
    out
}

#[derive(serde::Serialize)]
struct ListBody<'a> {
    object: &'static str,
    data: Data<'a>,
    model: &'a str,
    usage: UsageBody,
}

#[derive(serde::Serialize)]
struct UsageBody {
    prompt_tokens: u32,
    total_tokens: u32,
}

struct Data<'a> {
    vectors: &'a [Vec<f32>],
    format: EncodingFormat,
}

impl Serialize for Data<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.vectors.len()))?;
        for (index, vector) in self.vectors.iter().enumerate() {
            match self.format {
                EncodingFormat::Float => seq.serialize_element(&Item {
                    object: "embedding",
                    index,
                    embedding: vector.as_slice(),
                })?,
                EncodingFormat::Base64 => {
                    let mut bytes = Vec::with_capacity(vector.len() * 4);
                    for x in vector {
                        bytes.extend_from_slice(&x.to_le_bytes());
                    }
                    seq.serialize_element(&Item {
                        object: "embedding",
                        index,
                        embedding: base64::engine::general_purpose::STANDARD.encode(bytes),
                    })?;
                }
            }
        }
        seq.end()
    }
}

#[derive(serde::Serialize)]
struct Item<E> {
    object: &'static str,
    index: usize,
    embedding: E,
}
