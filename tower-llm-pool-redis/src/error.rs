//! Why a [`RedisPacing`](crate::RedisPacing) could not be made.

use std::fmt;

use crate::inner::STORE;

/// Why a [`RedisPacing`](crate::RedisPacing) could not be made: its URL
/// does not parse, there is no tokio runtime, the connection manager
/// could not be made, or the local share is out of range. It never quotes
/// the URL.
#[derive(Debug, Clone)]
pub struct RedisPacingError {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Redis(tower_llm_redis::Error),
    Share(f64),
}

impl RedisPacingError {
    pub(crate) fn share(share: f64) -> Self {
        RedisPacingError {
            kind: Kind::Share(share),
        }
    }

    /// The URL does not parse as a Redis URL.
    pub fn is_invalid_url(&self) -> bool {
        matches!(&self.kind, Kind::Redis(e) if e.is_invalid_url())
    }

    /// The store was built outside a tokio runtime.
    pub fn is_no_runtime(&self) -> bool {
        matches!(&self.kind, Kind::Redis(e) if e.is_no_runtime())
    }

    /// The `redis` crate refused to make a connection manager.
    pub fn is_connection_manager(&self) -> bool {
        matches!(&self.kind, Kind::Redis(e) if e.is_connection_manager())
    }

    /// The local share is not above 0 and at most 1.
    pub fn is_invalid_share(&self) -> bool {
        matches!(self.kind, Kind::Share(_))
    }
}

impl From<tower_llm_redis::Error> for RedisPacingError {
    fn from(e: tower_llm_redis::Error) -> Self {
        RedisPacingError {
            kind: Kind::Redis(e),
        }
    }
}

impl fmt::Display for RedisPacingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Redis(e) => write!(f, "{e}"),
            Kind::Share(s) => write!(
                f,
                "{STORE}: local_share = {s}: must be above 0 and at most 1"
            ),
        }
    }
}

impl std::error::Error for RedisPacingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Redis(e) => Some(e),
            Kind::Share(_) => None,
        }
    }
}
