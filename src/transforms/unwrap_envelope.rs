//! `unwrap_envelope`: replaces a JSON object with the value of one of its
//! top-level fields (any JSON type), e.g. the `data` of a change record. A
//! payload without that field, or that is not an object, passes through.
//!
//! ```toml
//! [transforms.unwrap_envelope]
//! enabled = true
//! field = "data"
//! ```

use serde::Deserialize;
use serde_json::Value;

use crate::message::Payload;
use crate::transforms::{FieldError, Transform, TransformError, Verdict};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnwrapEnvelopeConfig {
    pub field: String,
}

#[derive(Debug)]
pub struct UnwrapEnvelope {
    field: String,
}

impl UnwrapEnvelope {
    pub(crate) fn build(config: UnwrapEnvelopeConfig) -> Result<Self, FieldError> {
        if config.field.is_empty() {
            return Err(FieldError::new(
                "field",
                "expected a field name, found \"\"",
            ));
        }
        Ok(Self {
            field: config.field,
        })
    }
}

impl Transform for UnwrapEnvelope {
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        if let Payload::Json(value) = payload
            && let Value::Object(map) = value
            // The rest of the envelope is dropped, so its order does not matter.
            && let Some(inner) = map.swap_remove(&self.field)
        {
            *value = inner;
        }
        Ok(Verdict::Keep)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::message::Payload;
    use crate::transforms::tests::{build_error, chain, run};

    #[test]
    fn given_envelope_when_applied_should_promote_the_field() {
        let chain = chain("unwrap_envelope", json!({"enabled": true, "field": "data"}));
        let out = run(
            &chain,
            json!({"table_name": "users", "data": {"id": 1, "name": "x"}, "old_data": null}),
        );
        assert_eq!(out, json!({"id": 1, "name": "x"}));
        assert_eq!(run(&chain, json!({"data": [1, 2]})), json!([1, 2]));
        assert_eq!(run(&chain, json!({"data": null})), json!(null));
    }

    #[test]
    fn given_missing_field_or_non_object_when_applied_should_pass_through() {
        let chain = chain("unwrap_envelope", json!({"field": "data"}));
        assert_eq!(run(&chain, json!({"other": 1})), json!({"other": 1}));
        for payload in [
            Payload::Text("{\"data\":1}".into()),
            Payload::Raw(bytes::Bytes::from_static(b"{\"data\":1}")),
            Payload::Json(json!([{"data": 1}])),
        ] {
            let mut changed = payload.clone();
            chain.apply(&mut changed).unwrap();
            assert_eq!(changed, payload);
        }
    }

    #[test]
    fn given_invalid_config_when_built_should_name_the_field() {
        assert_eq!(
            build_error("unwrap_envelope", json!({"field": ""})).field,
            "field"
        );
        assert_eq!(
            build_error("unwrap_envelope", json!({"field": 1})).field,
            "field"
        );
        assert_eq!(build_error("unwrap_envelope", json!({})).field, "field");
    }
}
