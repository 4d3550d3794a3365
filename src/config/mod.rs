//! Configuration: the runtime file (upstream's `config.toml` format), the
//! connector files in its `config_dir`, and environment overrides.
//!
//! Problems are collected rather than returned one at a time, so `validate` can
//! report every bad field of every file in one go.

pub mod connector;
mod connector_dir;
pub mod duration;
pub mod env;
pub mod http_provider;
mod reader;
pub mod runtime;
pub mod size;
pub mod state;
mod streams;

use std::fmt;
use std::path::{Path, PathBuf};

pub use connector::{ConnectorConfig, DeadLetterTarget, KindConfig, OnError, parse_connector_file};
pub use connector_dir::{is_connector_file, load_connector_dir};
pub use runtime::RuntimeConfig;
pub use streams::{SinkStream, SourceStream};

/// One problem found in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    pub file: PathBuf,
    /// Dotted path of the field (`streams[0].linger_time`,
    /// `plugin_config.connection_string`); empty for the file as a whole.
    pub field: String,
    pub message: String,
    pub severity: Severity,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

impl ConfigIssue {
    pub fn error(file: &Path, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            field: field.into(),
            message: message.into(),
            severity: Severity::Error,
        }
    }

    pub fn warning(file: &Path, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(file, field, message)
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The issue without its level: `file: field `x`: message`, for a
    /// caller that prints its own prefix.
    pub fn located(&self) -> String {
        match self.field.is_empty() {
            true => format!("{}: {}", self.file.display(), self.message),
            false => format!(
                "{}: field `{}`: {}",
                self.file.display(),
                self.field,
                self.message
            ),
        }
    }
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{level}: {}", self.located())
    }
}

/// A set of issues, displayed one per line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigIssues(pub Vec<ConfigIssue>);

impl ConfigIssues {
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(ConfigIssue::is_error)
    }
}

impl fmt::Display for ConfigIssues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, issue) in self.0.iter().enumerate() {
            if index > 0 {
                writeln!(f)?;
            }
            write!(f, "{issue}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigIssues {}
