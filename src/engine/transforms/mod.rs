//! Transforms: per-message changes applied between decode and encode, in the
//! order they appear in the connector file.

use std::fmt;

use crate::message::Payload;

/// One transform. Built once per connector from its config and shared read-only
/// by every message of that connector.
pub trait Transform: Send + Sync + fmt::Debug {
    /// Changes the payload in place, or says the message should be dropped.
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    Drop,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transform {transform} failed: {message}")]
pub struct TransformError {
    pub transform: String,
    pub message: String,
}

/// An invalid `[transforms.<type>]` table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TransformConfigError {
    /// The transform type, as written in the file.
    pub transform: String,
    /// The offending field inside the transform's table (empty for the table).
    pub field: String,
    pub message: String,
}

/// The configured transforms of one connector, in file order.
#[derive(Debug, Default)]
pub struct TransformChain {
    steps: Vec<(String, Box<dyn Transform>)>,
}

impl TransformChain {
    /// Builds the chain from `(type, table)` pairs in file order. A table with
    /// `enabled = false` is skipped.
    pub fn build(configs: &[(String, serde_json::Value)]) -> Result<Self, TransformConfigError> {
        let mut steps = Vec::with_capacity(configs.len());
        for (kind, config) in configs {
            if let Some(transform) = build_one(kind, config)? {
                steps.push((kind.clone(), transform));
            }
        }
        Ok(Self { steps })
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Runs every transform in order; stops at the first that drops the message.
    pub fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        for (_, transform) in &self.steps {
            if transform.apply(payload)? == Verdict::Drop {
                return Ok(Verdict::Drop);
            }
        }
        Ok(Verdict::Keep)
    }
}

fn build_one(
    kind: &str,
    config: &serde_json::Value,
) -> Result<Option<Box<dyn Transform>>, TransformConfigError> {
    let error = |field: &str, message: String| TransformConfigError {
        transform: kind.to_owned(),
        field: field.to_owned(),
        message,
    };
    match config.get("enabled") {
        // Upstream requires `enabled`; a missing flag is read as enabled here.
        None | Some(serde_json::Value::Bool(true)) => {}
        Some(serde_json::Value::Bool(false)) => return Ok(None),
        Some(_) => return Err(error("enabled", "expected a boolean".into())),
    }
    Err(error("", format!("unknown transform type \"{kind}\"")))
}
