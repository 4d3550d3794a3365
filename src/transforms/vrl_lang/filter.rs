//! `filter` (as Vector's): keeps the messages for which a VRL condition is
//! `true` and drops the others, counted as filtered. The condition reads the
//! payload (`.`) and metadata (`%`) and changes nothing; it must resolve to a
//! boolean, checked when the file is read. An error while evaluating it fails
//! the message (`on_error`); an `abort` drops it.
//!
//! ```toml
//! [transforms.filter]
//! condition = '''.level == "error" && to_int(.latency_ms) ?? 0 > 500'''
//! ```

use serde::Deserialize;
use vrl::compiler::runtime::Terminate;
use vrl::value::Value;

use crate::message::Payload;
use crate::transforms::vrl_lang::{
    Access, Compiled, ProgramOptions, ProgramText, apply_without_meta, compile,
};
use crate::transforms::{FieldError, MessageMeta, Transform, TransformError, Verdict};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterConfig {
    pub condition: String,
    #[serde(default)]
    pub enable_env_functions: bool,
    #[serde(default)]
    pub enable_system_functions: bool,
    #[serde(default)]
    pub enable_network_functions: bool,
    pub timezone: Option<String>,
}

#[derive(Debug)]
pub struct Filter {
    compiled: Compiled,
}

impl Filter {
    pub(crate) fn build(config: FilterConfig) -> Result<Self, FieldError> {
        let text = ProgramText {
            text: config.condition,
            name: "condition".into(),
            field: "condition",
        };
        let options = ProgramOptions {
            enable_env_functions: config.enable_env_functions,
            enable_system_functions: config.enable_system_functions,
            enable_network_functions: config.enable_network_functions,
            timezone: config.timezone,
        };
        let compiled = compile(&text, &options, Access::ReadOnly)?;
        let result = compiled.program.final_type_info().result;
        if !result.is_boolean() {
            return Err(FieldError::new(
                "condition",
                format!(
                    "the condition must resolve to a boolean, but it can be {}; compare (`.ok == true`) or convert (`to_bool(.ok) ?? false`)",
                    result.kind()
                ),
            ));
        }
        Ok(Self { compiled })
    }
}

impl Transform for Filter {
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        apply_without_meta(self, payload)
    }

    fn apply_with(
        &self,
        payload: &mut Payload,
        meta: &mut MessageMeta<'_>,
    ) -> Result<Verdict, TransformError> {
        let error = |message: String| TransformError {
            transform: "filter".into(),
            message,
        };
        match self.compiled.run(payload, meta).map_err(error)?.2 {
            Ok(Value::Boolean(true)) => Ok(Verdict::Keep),
            Ok(Value::Boolean(false)) | Err(Terminate::Abort(_)) => Ok(Verdict::Drop),
            Ok(other) => Err(error(format!(
                "the condition resolved to {}, not a boolean",
                other.kind()
            ))),
            Err(failure) => Err(error(self.compiled.error_text(&failure))),
        }
    }
}
