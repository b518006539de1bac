//! Reading a policy file (TOML or JSON), alone or beside the settings of
//! the program that hosts the stacks.

use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::DeTable;

use super::{ConfigError, Policy};

/// Settings of the program that hosts the stacks (a gateway's listen
/// address, its server limits, its shared stores), kept in the same
/// policy file beside the library's: the top-level keys in
/// [`KEYS`](Self::KEYS) are the host's, every other key the [`Policy`]'s.
/// [`Policy::from_toml_with`] reads both from one file, and an unknown key
/// anywhere is still refused with its path.
///
/// A missing host key takes the host's default, so the type is usually
/// `#[serde(default, deny_unknown_fields)]`.
///
/// ```
/// use serde::Deserialize;
/// use tower_llm::config::{HostSettings, Policy};
///
/// #[derive(Debug, Default, Deserialize)]
/// #[serde(default, deny_unknown_fields)]
/// struct MyApp {
///     listen: Option<String>,
///     workers: Option<usize>,
/// }
///
/// impl HostSettings for MyApp {
///     const KEYS: &'static [&'static str] = &["listen", "workers"];
/// }
///
/// let (policy, app) = Policy::from_toml_with::<MyApp>(r#"
///     listen = "127.0.0.1:8080"
///     [[providers]]
///     name = "a"
///     kind = "openai"
///     api_key_env = "A_KEY"
///     [[routes]]
///     model = "smart"
///     chain = [{ provider = "a", model = "gpt-4o-mini" }]
/// "#).unwrap();
/// assert_eq!(app.listen.as_deref(), Some("127.0.0.1:8080"));
/// assert_eq!(policy.routes.len(), 1);
/// // Neither the host nor the library knows `workrs`.
/// let err = Policy::from_toml_with::<MyApp>("workrs = 2").unwrap_err();
/// assert!(err.to_string().contains("unknown field `workrs`"));
/// ```
pub trait HostSettings: DeserializeOwned {
    /// The top-level keys that belong to the host.
    const KEYS: &'static [&'static str];
}

/// No host settings: every key is the library's.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoHost {}

impl HostSettings for NoHost {
    const KEYS: &'static [&'static str] = &[];
}

impl Policy {
    /// Reads and validates a TOML policy.
    ///
    /// # Errors
    ///
    /// A syntax error (with its line), an unknown key or a value of the
    /// wrong type (with its dotted path, `routes[0].chain[1].admit`, and
    /// its line), or every problem [`validate`](Self::validate) finds.
    pub fn from_toml(text: &str) -> Result<Policy, ConfigError> {
        Ok(Policy::from_toml_with::<NoHost>(text)?.0)
    }

    /// Reads a TOML file holding a policy and the host's own settings
    /// (`H`, the top-level keys [`H::KEYS`](HostSettings::KEYS)); validates
    /// the policy (the host validates its settings).
    ///
    /// # Errors
    ///
    /// As [`from_toml`](Self::from_toml), for either part.
    pub fn from_toml_with<H: HostSettings>(text: &str) -> Result<(Policy, H), ConfigError> {
        let root = DeTable::parse(text).map_err(|e| ConfigError::syntax(e.to_string()))?;
        let span = root.span();
        let mut library = root.into_inner();
        let mut host = DeTable::new();
        for key in H::KEYS {
            if let Some((k, v)) = library.remove_entry(*key) {
                host.insert(k, v);
            }
        }
        let policy: Policy = toml_part(text, Spanned::new(span.clone(), library))?;
        let host: H = toml_part(text, Spanned::new(span, host))?;
        policy.validate()?;
        Ok((policy, host))
    }

    /// Reads and validates a JSON policy (the same shape).
    ///
    /// # Errors
    ///
    /// As [`from_toml`](Self::from_toml).
    pub fn from_json(text: &str) -> Result<Policy, ConfigError> {
        Ok(Policy::from_json_with::<NoHost>(text)?.0)
    }

    /// As [`from_toml_with`](Self::from_toml_with), from JSON.
    ///
    /// # Errors
    ///
    /// As [`from_json`](Self::from_json), for either part.
    pub fn from_json_with<H: HostSettings>(text: &str) -> Result<(Policy, H), ConfigError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let root: serde_json::Map<String, serde_json::Value> =
            serde_path_to_error::deserialize(&mut de).map_err(|e| {
                let path = e.path().to_string();
                let e = e.into_inner();
                if e.is_syntax() || e.is_eof() {
                    ConfigError::syntax(e.to_string())
                } else {
                    ConfigError::shape(path, e.to_string())
                }
            })?;
        de.end().map_err(|e| ConfigError::syntax(e.to_string()))?;
        let (host, library): (serde_json::Map<_, _>, serde_json::Map<_, _>) = root
            .into_iter()
            .partition(|(k, _)| H::KEYS.contains(&k.as_str()));
        let policy: Policy = json_part(library)?;
        let host: H = json_part(host)?;
        policy.validate()?;
        Ok((policy, host))
    }
}

/// `T` from a part of a TOML document, its errors with their path and
/// their place in `text`.
fn toml_part<T: DeserializeOwned>(
    text: &str,
    part: Spanned<DeTable<'_>>,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(toml::de::Deserializer::from(part)).map_err(|e| {
        let path = e.path().to_string();
        let mut inner = e.into_inner();
        inner.set_input(Some(text));
        ConfigError::shape(path, inner.to_string())
    })
}

/// `T` from a part of a JSON document, its errors with their path.
fn json_part<T: DeserializeOwned>(
    part: serde_json::Map<String, serde_json::Value>,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(serde_json::Value::Object(part)).map_err(|e| {
        let path = e.path().to_string();
        ConfigError::shape(path, e.into_inner().to_string())
    })
}
