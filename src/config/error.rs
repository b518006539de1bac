//! Why a policy was refused.

use std::fmt;

/// Why a policy was refused: every problem found, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub(super) problems: Vec<String>,
}

impl ConfigError {
    /// An error with one problem.
    pub fn new(problem: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![problem.into()],
        }
    }

    /// `Ok` when `problems` is empty, else an error with every one of
    /// them (for a host that validates its own settings the same way).
    ///
    /// # Errors
    ///
    /// When there is a problem.
    pub fn check(problems: Vec<String>) -> Result<(), ConfigError> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }

    /// The problems, one message each.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid policy: ")?;
        f.write_str(&self.problems.join("; "))
    }
}

impl std::error::Error for ConfigError {}
