//! Why a store could not be made.

use std::fmt;

use tower_llm_cost::InvalidQuota;

use crate::inner::STORE;

/// Why a [`RedisQuota`](crate::RedisQuota) could not be made: its URL
/// does not parse, there is no tokio runtime, the quota settings or the
/// local share are invalid. It never quotes the URL.
#[derive(Debug, Clone)]
pub struct RedisQuotaError {
    kind: ErrorKind,
}

#[derive(Debug, Clone)]
enum ErrorKind {
    Redis(tower_llm_redis::Error),
    Quota(InvalidQuota),
    Share(f64),
    /// The `redis` crate refused to make the commands' connection manager.
    ConnectionManager,
}

impl RedisQuotaError {
    pub(crate) fn quota(e: InvalidQuota) -> Self {
        RedisQuotaError {
            kind: ErrorKind::Quota(e),
        }
    }

    pub(crate) fn connection_manager() -> Self {
        RedisQuotaError {
            kind: ErrorKind::ConnectionManager,
        }
    }

    pub(crate) fn share(share: f64) -> Self {
        RedisQuotaError {
            kind: ErrorKind::Share(share),
        }
    }

    /// The URL does not parse as a Redis URL.
    pub fn is_invalid_url(&self) -> bool {
        matches!(&self.kind, ErrorKind::Redis(e) if e.is_invalid_url())
    }

    /// The store was built outside a tokio runtime.
    pub fn is_no_runtime(&self) -> bool {
        matches!(&self.kind, ErrorKind::Redis(e) if e.is_no_runtime())
    }

    /// The `redis` crate refused to make a connection manager.
    pub fn is_connection_manager(&self) -> bool {
        match &self.kind {
            ErrorKind::Redis(e) => e.is_connection_manager(),
            ErrorKind::ConnectionManager => true,
            _ => false,
        }
    }

    /// The [`QuotaConfig`](tower_llm_cost::QuotaConfig) does not validate.
    pub fn is_invalid_quota(&self) -> bool {
        matches!(self.kind, ErrorKind::Quota(_))
    }

    /// The local share is not above 0 and at most 1.
    pub fn is_invalid_share(&self) -> bool {
        matches!(self.kind, ErrorKind::Share(_))
    }
}

impl From<tower_llm_redis::Error> for RedisQuotaError {
    fn from(e: tower_llm_redis::Error) -> Self {
        RedisQuotaError {
            kind: ErrorKind::Redis(e),
        }
    }
}

impl fmt::Display for RedisQuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Redis(e) => write!(f, "{e}"),
            ErrorKind::Quota(e) => write!(f, "{STORE}: {e}"),
            ErrorKind::Share(s) => write!(
                f,
                "{STORE}: local_share = {s}: must be above 0 and at most 1"
            ),
            ErrorKind::ConnectionManager => write!(f, "{STORE}: cannot make a connection manager"),
        }
    }
}

impl std::error::Error for RedisQuotaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Redis(e) => Some(e),
            ErrorKind::Quota(e) => Some(e),
            ErrorKind::Share(_) | ErrorKind::ConnectionManager => None,
        }
    }
}
