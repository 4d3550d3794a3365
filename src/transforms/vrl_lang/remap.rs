//! `remap` (as Vector's): runs a VRL program on each message, changing its
//! payload (`.`) and its headers and key (`%headers`, `%key`).
//!
//! ```toml
//! [transforms.remap]
//! source = '''
//! .user_id = del(.uid)
//! .email = redact(.email, filters: [r'^[^@]+']) ?? null
//! .at = parse_timestamp!(.at, "%Y-%m-%d %H:%M:%S")
//! %key = .user_id
//! '''
//! # or file = "mask.vrl"
//! drop_on_error = true     # a runtime error fails the message (on_error); false: it goes on unchanged
//! drop_on_abort = true     # `abort` drops the message (counted as filtered); false: it goes on unchanged
//! ```

use serde::Deserialize;
use vrl::compiler::runtime::Terminate;

use crate::message::Payload;
use crate::transforms::vrl_lang::target::{
    self, FieldChanges, Shape, Tracked, View, apply_field_changes, field_changes, into_payload,
};
use crate::transforms::vrl_lang::{
    Access, Compiled, ProgramOptions, ProgramText, apply_without_meta, compile,
};
use crate::transforms::{FieldError, MessageMeta, Transform, TransformError, Verdict};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemapConfig {
    pub source: Option<String>,
    pub file: Option<String>,
    #[serde(default = "default_true")]
    pub drop_on_error: bool,
    #[serde(default = "default_true")]
    pub drop_on_abort: bool,
    #[serde(default)]
    pub enable_env_functions: bool,
    #[serde(default)]
    pub enable_system_functions: bool,
    #[serde(default)]
    pub enable_network_functions: bool,
    pub timezone: Option<String>,
}

fn default_true() -> bool {
    true
}

#[derive(Debug)]
pub struct Remap {
    compiled: Compiled,
    drop_on_error: bool,
    drop_on_abort: bool,
}

impl Remap {
    pub(crate) fn build(config: RemapConfig) -> Result<Self, FieldError> {
        let text = ProgramText::load(config.source, config.file)?;
        let options = ProgramOptions {
            enable_env_functions: config.enable_env_functions,
            enable_system_functions: config.enable_system_functions,
            enable_network_functions: config.enable_network_functions,
            timezone: config.timezone,
        };
        Ok(Self {
            compiled: compile(&text, &options, Access::Remap)?,
            drop_on_error: config.drop_on_error,
            drop_on_abort: config.drop_on_abort,
        })
    }

    /// The program's result written into the message: the payload and the
    /// metadata it changed. Nothing is changed when the result does not fit.
    fn commit(
        &self,
        target: Tracked,
        shape: Shape,
        payload: &mut Payload,
        meta: &mut MessageMeta<'_>,
    ) -> Result<(), String> {
        enum Change {
            None,
            Whole(Payload),
            Fields(FieldChanges),
        }
        let change = match (target.value_changed, shape, &self.compiled.view) {
            (false, _, _) => Change::None,
            (true, Shape::Fields, View::Fields(fields)) => {
                Change::Fields(field_changes(target.value, &target.changed_fields, fields)?)
            }
            (true, shape, _) => Change::Whole(into_payload(target.value, shape)?),
        };
        if target.metadata_changed {
            target::write_back(target.metadata, meta)?;
        }
        match change {
            Change::None => {}
            Change::Whole(changed) => *payload = changed,
            Change::Fields(changes) => apply_field_changes(payload, changes),
        }
        Ok(())
    }

    fn failed(&self, message: String) -> Result<Verdict, TransformError> {
        if self.drop_on_error {
            return Err(TransformError {
                transform: "remap".into(),
                message,
            });
        }
        tracing::warn!(error = %message, "remap failed; the message goes on unchanged (drop_on_error = false)");
        Ok(Verdict::Keep)
    }
}

impl Transform for Remap {
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        apply_without_meta(self, payload)
    }

    fn apply_with(
        &self,
        payload: &mut Payload,
        meta: &mut MessageMeta<'_>,
    ) -> Result<Verdict, TransformError> {
        if self.compiled.inert {
            return Ok(Verdict::Keep);
        }
        match self.compiled.run(payload, meta) {
            Err(message) => self.failed(message),
            Ok((target, shape, Ok(_))) => match self.commit(target, shape, payload, meta) {
                Ok(()) => Ok(Verdict::Keep),
                Err(message) => self.failed(message),
            },
            Ok((_, _, Err(Terminate::Abort(_)))) if self.drop_on_abort => Ok(Verdict::Drop),
            Ok((_, _, Err(Terminate::Abort(_)))) => Ok(Verdict::Keep),
            Ok((_, _, Err(error))) => self.failed(error.to_string()),
        }
    }
}
