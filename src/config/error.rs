//! Why a policy was refused.

use std::fmt;

/// Why a policy (or a host's settings read with it) was refused: every
/// problem found, each a [`ConfigProblem`].
///
/// ```
/// use tower_llm::config::Policy;
///
/// let err = Policy::from_toml("[retry]\nmax_atempts = 2").unwrap_err();
/// assert!(err.is_shape());
/// assert_eq!(err.problems()[0].path(), Some("retry.max_atempts"));
///
/// let err = Policy::from_toml("[retry]\nmax_attempts = 0").unwrap_err();
/// assert!(err.is_invalid());
/// assert!(err.problems().iter().any(|p| p.message().contains("max_attempts")));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    problems: Vec<ConfigProblem>,
}

/// One problem of a policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    kind: Kind,
    path: Option<String>,
    message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Syntax,
    Shape,
    Invalid,
}

impl ConfigProblem {
    /// The dotted path of the key at fault (`routes[0].chain[1].admit`),
    /// for a problem of the file's shape.
    pub fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    /// What is wrong (a validation problem names its key first).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The text is not TOML (or JSON) at all.
    pub fn is_syntax(&self) -> bool {
        self.kind == Kind::Syntax
    }

    /// An unknown (or misspelt) key, or a value of the wrong type.
    pub fn is_shape(&self) -> bool {
        self.kind == Kind::Shape
    }

    /// A value the settings refuse: out of range, contradicting another,
    /// naming something that does not exist.
    pub fn is_invalid(&self) -> bool {
        self.kind == Kind::Invalid
    }
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "at {path}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl ConfigError {
    /// An error with one invalid value (`problem` names its key).
    pub fn new(problem: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![ConfigProblem {
                kind: Kind::Invalid,
                path: None,
                message: problem.into(),
            }],
        }
    }

    /// Text that does not parse.
    pub(crate) fn syntax(message: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![ConfigProblem {
                kind: Kind::Syntax,
                path: None,
                message: message.into(),
            }],
        }
    }

    /// A key at `path` that is unknown or of the wrong type.
    pub(crate) fn shape(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![ConfigProblem {
                kind: Kind::Shape,
                path: Some(path.into()),
                message: message.into(),
            }],
        }
    }

    /// `Ok` when `problems` is empty, else an error with every one of
    /// them, each an invalid value (for a host that validates its own
    /// settings the same way).
    ///
    /// # Errors
    ///
    /// When there is a problem.
    pub fn check(problems: Vec<String>) -> Result<(), ConfigError> {
        ConfigError::all(problems.into_iter().map(|p| Err(ConfigError::new(p))))
    }

    /// Every problem of `checks` in one error, or `Ok` if there is none.
    ///
    /// # Errors
    ///
    /// When a check failed.
    pub fn all(
        checks: impl IntoIterator<Item = Result<(), ConfigError>>,
    ) -> Result<(), ConfigError> {
        let problems: Vec<ConfigProblem> = checks
            .into_iter()
            .filter_map(Result::err)
            .flat_map(|e| e.problems)
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }

    /// The problems, in the order found.
    pub fn problems(&self) -> &[ConfigProblem] {
        &self.problems
    }

    /// A problem is the text's syntax.
    pub fn is_syntax(&self) -> bool {
        self.problems.iter().any(ConfigProblem::is_syntax)
    }

    /// A problem is an unknown key or a value of the wrong type.
    pub fn is_shape(&self) -> bool {
        self.problems.iter().any(ConfigProblem::is_shape)
    }

    /// A problem is a value the settings refuse.
    pub fn is_invalid(&self) -> bool {
        self.problems.iter().any(ConfigProblem::is_invalid)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid policy: ")?;
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}
