//! Why a Redis-backed store could not be made.

use std::fmt;

/// Why a Redis-backed store could not be made: its URL does not parse,
/// there is no tokio runtime to run its tasks on, or its connection
/// manager could not be made.
///
/// Neither its `Display` nor its `Debug` ever quotes the URL (it may carry
/// a password). A server that does not answer is never this error: the
/// stores start without Redis and connect in the background.
#[derive(Debug, Clone)]
pub struct Error {
    store: &'static str,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    InvalidUrl,
    NoRuntime,
    ConnectionManager,
}

impl Error {
    pub(crate) fn invalid_url(store: &'static str) -> Self {
        Error {
            store,
            kind: Kind::InvalidUrl,
        }
    }

    pub(crate) fn no_runtime(store: &'static str) -> Self {
        Error {
            store,
            kind: Kind::NoRuntime,
        }
    }

    pub(crate) fn connection_manager(store: &'static str) -> Self {
        Error {
            store,
            kind: Kind::ConnectionManager,
        }
    }

    /// The URL does not parse as a Redis URL.
    pub fn is_invalid_url(&self) -> bool {
        self.kind == Kind::InvalidUrl
    }

    /// The store was built outside a tokio runtime.
    pub fn is_no_runtime(&self) -> bool {
        self.kind == Kind::NoRuntime
    }

    /// The `redis` crate refused to make a connection manager.
    pub fn is_connection_manager(&self) -> bool {
        self.kind == Kind::ConnectionManager
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            Kind::InvalidUrl => "invalid Redis URL",
            Kind::NoRuntime => "must be built inside a tokio runtime",
            Kind::ConnectionManager => "cannot make a connection manager",
        };
        write!(f, "{}: {what}", self.store)
    }
}

impl std::error::Error for Error {}
