//! The links of a chain and how they are built.

use std::fmt;
use std::sync::Arc;

use tower::util::BoxCloneSyncService;
use tower_llm_core::{ChatRequest, Failure, Link};

/// A type-erased link service: any `Service<Req, Response = Res>` whose
/// error converts into a [`Failure`], boxed so that links of different
/// types fit in one chain (`Send + Sync`, so the whole stack stays usable
/// from axum and across tasks).
pub type LinkService<Req, Res> = BoxCloneSyncService<Req, Res, Failure>;

type Rewrite<Req> = Arc<dyn Fn(&mut Req, &Link) + Send + Sync>;
type Admit<Req> = Arc<dyn Fn(&Req) -> bool + Send + Sync>;

/// One link of a fallback chain: which provider and model, and how the
/// request is adapted for it.
///
/// ```
/// use tower_llm_core::ChatRequest;
/// use tower_llm_fallback::LinkSpec;
///
/// #[derive(Clone)]
/// struct Region(&'static str);
///
/// let us_only = LinkSpec::<ChatRequest>::new("openai", "gpt-4o")
///     .rewrite_model()                                  // send this link's model id
///     .with_admission(|req: &ChatRequest| {             // never serve EU-bound requests
///         req.extensions.get::<Region>().map_or(true, |r| r.0 != "eu")
///     });
/// assert_eq!(us_only.link().model(), "gpt-4o");
/// ```
pub struct LinkSpec<Req> {
    pub(crate) link: Link,
    pub(crate) rewrite: Option<Rewrite<Req>>,
    pub(crate) admit: Option<Admit<Req>>,
    pub(crate) long_context: bool,
    pub(crate) allows_filtered: bool,
}

impl<Req> Clone for LinkSpec<Req> {
    fn clone(&self) -> Self {
        LinkSpec {
            link: self.link.clone(),
            rewrite: self.rewrite.clone(),
            admit: self.admit.clone(),
            long_context: self.long_context,
            allows_filtered: self.allows_filtered,
        }
    }
}

impl<Req> fmt::Debug for LinkSpec<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkSpec")
            .field("link", &self.link)
            .field("rewrite", &self.rewrite.is_some())
            .field("admission", &self.admit.is_some())
            .field("long_context", &self.long_context)
            .field("allows_filtered", &self.allows_filtered)
            .finish()
    }
}

impl<Req> LinkSpec<Req> {
    /// A link to `model` at `provider`.
    pub fn new(provider: impl Into<Arc<str>>, model: impl Into<Arc<str>>) -> Self {
        LinkSpec {
            link: Link::new(provider, model),
            rewrite: None,
            admit: None,
            long_context: false,
            allows_filtered: false,
        }
    }

    /// Adapts the request for this link before it is sent (the model id,
    /// `max_tokens`, ...).
    #[must_use]
    pub fn with_rewrite(
        mut self,
        rewrite: impl Fn(&mut Req, &Link) + Send + Sync + 'static,
    ) -> Self {
        self.rewrite = Some(Arc::new(rewrite));
        self
    }

    /// Only requests for which `admit` is `true` may use this link; for the
    /// others it is skipped, never called, and the attempt log says so
    /// (a data-residency or tenant rule, say).
    #[must_use]
    pub fn with_admission(mut self, admit: impl Fn(&Req) -> bool + Send + Sync + 'static) -> Self {
        self.admit = Some(Arc::new(admit));
        self
    }

    /// Marks this link as having a larger context window: a
    /// context-window-exceeded failure fails over to it (opt-in).
    #[must_use]
    pub fn serves_long_context(mut self) -> Self {
        self.long_context = true;
        self
    }

    /// Marks this link as allowed to serve requests another link's content
    /// filter refused: a content-filtered failure fails over to it (opt-in).
    #[must_use]
    pub fn allows_filtered_content(mut self) -> Self {
        self.allows_filtered = true;
        self
    }

    /// The link descriptor (its position is set when the chain is built).
    pub fn link(&self) -> &Link {
        &self.link
    }

    pub(crate) fn admits(&self, req: &Req) -> bool {
        self.admit.as_ref().is_none_or(|admit| admit(req))
    }

    /// Stores the link in the request's [`Call`](tower_llm_core::Call) and
    /// applies the rewrite.
    pub(crate) fn prepare(&self, req: &mut Req)
    where
        Req: tower_llm_core::LlmRequest,
    {
        self.link.clone().store(req);
        if let Some(rewrite) = &self.rewrite {
            rewrite(req, &self.link);
        }
    }
}

impl LinkSpec<ChatRequest> {
    /// Sends this link's model id as the request's `model`.
    #[must_use]
    pub fn rewrite_model(self) -> Self {
        self.with_rewrite(|req: &mut ChatRequest, link: &Link| {
            if *req.model != *link.model() {
                req.model = link.model_arc().clone();
            }
        })
    }
}

/// Why a chain was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidChain(pub(crate) String);

impl fmt::Display for InvalidChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid fallback chain: {}", self.0)
    }
}

impl std::error::Error for InvalidChain {}
