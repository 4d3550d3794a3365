//! What preparing a connector gives the slot that runs it: a pipeline ready
//! to run, or why it did not start.

use std::path::PathBuf;

use crate::connectors::{BuildError, ConnectorKind};
use crate::engine::sink::SinkPipeline;
use crate::engine::source::SourcePipeline;
use crate::iggy::BusError;
use crate::state::StateError;
use crate::transforms::TransformConfigError;

pub(super) enum Prepared {
    Source(SourcePipeline),
    Sink(SinkPipeline),
}

/// Why a connector did not start; shown as its stop message.
#[derive(Debug, thiserror::Error)]
pub(super) enum SetupError {
    /// A stop was requested while the connector was still starting.
    #[error("stopped while starting")]
    Shutdown,
    #[error("not a {0} config")]
    WrongKind(ConnectorKind),
    #[error("{}: {error}", file.display())]
    Build {
        file: PathBuf,
        #[source]
        error: BuildError,
    },
    #[error("{}: transforms.{}{}: {}", file.display(), error.transform, field_suffix(&error.field), error.message)]
    Transforms {
        file: PathBuf,
        #[source]
        error: TransformConfigError,
    },
    #[error(transparent)]
    LoadState(#[from] StateError),
    #[error(
        "state {location} was written by the \"{found}\" connector, not \"{expected}\"; refusing to start from it"
    )]
    ForeignState {
        location: String,
        found: String,
        expected: String,
    },
    /// `open` failed (or panicked: `reason` is then the panic message).
    #[error("open failed{}: {reason}", restoring_from.as_ref().map(|location| format!(" (restoring state from {location})")).unwrap_or_default())]
    Open {
        restoring_from: Option<String>,
        reason: String,
    },
    /// The bus refused a producer or consumer (not merely unreachable).
    #[error("{0}")]
    Bus(BusError),
}

fn field_suffix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!(".{field}")
    }
}
