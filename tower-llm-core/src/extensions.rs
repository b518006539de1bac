//! Uniform access to a request's extensions and headers.

use http::{Extensions, HeaderMap};

use crate::ChatRequest;

/// A request that carries [`http::Extensions`] (and maybe HTTP headers).
///
/// tower-llm layers pass their per-call state (the [`Deadline`](crate::Deadline),
/// the [`AttemptLog`](crate::AttemptLog), the [`Link`](crate::Link) being called)
/// inward through the request's extensions. This trait lets one layer work on
/// [`http::Request`] and on [`ChatRequest`] alike; implement it for your own
/// request type to use the layers with it.
///
/// When the retry or fallback layer copies a request whose only extension
/// is tower-llm's own state, it takes the extensions out for the moment of
/// the `clone` and puts them back after (so the copy costs no extension
/// map): a `Clone` impl of your own type must not rely on its extensions.
///
/// ```
/// use tower_llm_core::{ChatRequest, HasExtensions, Message};
///
/// fn tag<R: HasExtensions>(req: &mut R) {
///     req.extensions_mut().insert(42u32);
/// }
///
/// let mut chat = ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")]);
/// tag(&mut chat);
/// assert_eq!(chat.extensions().get::<u32>(), Some(&42));
/// assert!(chat.headers().is_none());
///
/// let mut req = http::Request::new(());
/// tag(&mut req);
/// assert!(HasExtensions::headers(&req).is_some());
/// ```
pub trait HasExtensions {
    /// The request's extensions.
    fn extensions(&self) -> &Extensions;
    /// The request's extensions, mutably.
    fn extensions_mut(&mut self) -> &mut Extensions;
    /// The request's HTTP headers, for requests that have them. The deadline
    /// layer reads `grpc-timeout` and `x-request-timeout-ms` from here.
    fn headers(&self) -> Option<&HeaderMap> {
        None
    }
}

impl<B> HasExtensions for http::Request<B> {
    fn extensions(&self) -> &Extensions {
        http::Request::extensions(self)
    }
    fn extensions_mut(&mut self) -> &mut Extensions {
        http::Request::extensions_mut(self)
    }
    fn headers(&self) -> Option<&HeaderMap> {
        Some(http::Request::headers(self))
    }
}

impl HasExtensions for ChatRequest {
    fn extensions(&self) -> &Extensions {
        &self.extensions
    }
    fn extensions_mut(&mut self) -> &mut Extensions {
        &mut self.extensions
    }
}
