//! [`MalformedChunks`]: what a committed stream does with an event it
//! cannot read.

use serde::{Deserialize, Serialize};

/// What a streaming service does with a malformed event (one whose framing
/// is whole but whose content does not decode: JSON that is not the shape
/// the provider's stream documents). In a policy file, `"fail"` or
/// `"skip"`. Set it with
/// [`Streaming::with_malformed_chunks`](crate::Streaming::with_malformed_chunks).
///
/// Before the commit point (the first content frame) a malformed event
/// fails the call in both modes: nothing was handed on yet, so retry or
/// fallback can still get a whole answer. Framing failures (an event over
/// [`MAX_EVENT`](crate::stream::MAX_EVENT), a line that is not UTF-8, a
/// broken Bedrock frame) and in-band error events always end the stream.
///
/// ```
/// use tower_llm_providers::streaming::MalformedChunks;
///
/// assert_eq!(MalformedChunks::default(), MalformedChunks::Fail);
/// let skip: MalformedChunks = serde_json::from_str(r#""skip""#).unwrap();
/// assert_eq!(skip, MalformedChunks::Skip);
/// assert!(serde_json::from_str::<MalformedChunks>(r#""ignore""#).is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MalformedChunks {
    /// A malformed event after the commit point ends the stream with one
    /// terminal invalid-response failure (the default). The event may
    /// have carried text: a stream that went on without it would hand
    /// the caller an answer with a hole in it as if it were whole.
    #[default]
    Fail,
    /// A malformed event after the commit point is skipped: the stream
    /// goes on with the next event. The first one skipped in a stream is
    /// logged at `warn` through `tracing` (feature `otel`), with the
    /// provider, the failure class and the number of chunks handed on
    /// before it, never the event's text; each one is counted
    /// ([`Streaming::malformed_skipped`](crate::Streaming::malformed_skipped)).
    /// The server-sent-event wires (OpenAI, Azure OpenAI, Anthropic,
    /// Gemini and every [`SseWire`](crate::dialect::SseWire)) skip an
    /// event that does not decode, Bedrock's event stream a whole,
    /// checksummed event whose payload does not; a
    /// [`Wire`](crate::dialect::Wire) that cannot
    /// ([`Wire::skip_malformed`](crate::dialect::Wire::skip_malformed)
    /// returns `false`) fails as with [`Fail`](Self::Fail).
    Skip,
}
