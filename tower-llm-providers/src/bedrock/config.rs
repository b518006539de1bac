//! The settings of the Bedrock service: credentials, region, endpoint.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::secret::ApiKey;
use crate::transport::DEFAULT_MAX_BODY;

/// The provider name in failures and metrics.
pub(crate) const PROVIDER: &str = "bedrock";

/// AWS credentials. `Debug` prints none of them (access key id, secret,
/// session token: all `[redacted]`).
///
/// ```
/// use tower_llm_providers::AwsCredentials;
///
/// let creds = AwsCredentials::new("AKIDEXAMPLE", "secret").with_session_token("token");
/// let shown = format!("{creds:?}");
/// assert!(!shown.contains("AKIDEXAMPLE") && !shown.contains("secret\"") && !shown.contains("token\""));
/// ```
#[derive(Clone)]
pub struct AwsCredentials {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: ApiKey,
    pub(crate) session_token: Option<ApiKey>,
}

impl AwsCredentials {
    /// Long-term credentials.
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        AwsCredentials {
            access_key_id: access_key_id.into(),
            secret_access_key: ApiKey::new(secret_access_key),
            session_token: None,
        }
    }

    /// Adds a session token (temporary credentials).
    #[must_use]
    pub fn with_session_token(mut self, token: impl Into<String>) -> Self {
        self.session_token = Some(ApiKey::new(token));
        self
    }

    /// From the standard environment variables `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY` and (optional) `AWS_SESSION_TOKEN`.
    pub fn from_env() -> Option<Self> {
        let id = std::env::var("AWS_ACCESS_KEY_ID")
            .ok()
            .filter(|v| !v.is_empty())?;
        let secret = ApiKey::from_env("AWS_SECRET_ACCESS_KEY")?;
        Some(AwsCredentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: ApiKey::from_env("AWS_SESSION_TOKEN"),
        })
    }
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &format_args!("[redacted]"))
            .field("secret_access_key", &self.secret_access_key)
            .field("session_token", &self.session_token)
            .finish()
    }
}

/// Settings of a [`Bedrock`](crate::Bedrock) service, and the Bedrock
/// [`Dialect`](crate::Dialect): `Bedrock::new(transport, config)` is
/// [`Provider::new`](crate::Provider::new) with this dialect.
///
/// ```
/// use tower_llm_providers::{AwsCredentials, BedrockConfig};
///
/// let cfg = BedrockConfig::new(AwsCredentials::new("AKIDEXAMPLE", "secret"), "eu-west-1");
/// assert_eq!(cfg.endpoint(), "https://bedrock-runtime.eu-west-1.amazonaws.com");
/// assert!(!format!("{cfg:?}").contains("secret\""));
/// ```
#[derive(Debug, Clone)]
pub struct BedrockConfig {
    pub(crate) credentials: AwsCredentials,
    pub(crate) region: Arc<str>,
    pub(crate) endpoint: Arc<str>,
    pub(crate) max_body: usize,
    pub(crate) fixed_time: Option<SystemTime>,
}

impl BedrockConfig {
    /// Bedrock Runtime in `region`.
    pub fn new(credentials: AwsCredentials, region: &str) -> Self {
        BedrockConfig {
            credentials,
            region: region.into(),
            endpoint: format!("https://bedrock-runtime.{region}.amazonaws.com").into(),
            max_body: DEFAULT_MAX_BODY,
            fixed_time: None,
        }
    }

    /// Another endpoint (a VPC endpoint, a test server). The signature
    /// still names `region`.
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: &str) -> Self {
        self.endpoint = endpoint.trim_end_matches('/').into();
        self
    }

    /// The largest response body read (default 16 MiB).
    #[must_use]
    pub fn with_max_body(mut self, max_body: usize) -> Self {
        self.max_body = max_body;
        self
    }

    /// Signs every request as if at `time` (for tests and known vectors).
    #[must_use]
    pub fn with_fixed_time(mut self, time: SystemTime) -> Self {
        self.fixed_time = Some(time);
        self
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }
}
