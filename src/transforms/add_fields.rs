//! `add_fields`: writes static or computed values into top-level keys,
//! overwriting what is there.
//!
//! ```toml
//! [transforms.add_fields]
//! enabled = true
//! [[transforms.add_fields.fields]]
//! key = "source"
//! value.static = "orders-db"
//! [[transforms.add_fields.fields]]
//! key = "received_at"
//! value.computed = "date_time"
//! ```

use serde::Deserialize;
use serde_json::Value;

use crate::message::Payload;
use crate::transforms::field_value::{FieldValue, Now, set_field};
use crate::transforms::{FieldError, Transform, TransformError, Verdict};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddFieldsConfig {
    #[serde(default)]
    pub fields: Vec<AddField>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddField {
    pub key: String,
    pub value: FieldValue,
}

#[derive(Debug)]
pub struct AddFields {
    fields: Vec<AddField>,
}

impl AddFields {
    pub(crate) fn build(config: AddFieldsConfig) -> Result<Self, FieldError> {
        Ok(Self {
            fields: config.fields,
        })
    }
}

impl Transform for AddFields {
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        let Payload::Json(Value::Object(map)) = payload else {
            return Ok(Verdict::Keep);
        };
        let mut now = Now::default();
        for field in &self.fields {
            set_field(map, &field.key, field.value.produce(&mut now));
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
    fn given_static_and_computed_fields_when_applied_should_write_them() {
        let chain = chain(
            "add_fields",
            json!({"enabled": true, "fields": [
                {"key": "message", "value": {"static": "hello"}},
                {"key": "id", "value": {"static": {"nested": [1, 2]}}},
                {"key": "at", "value": {"computed": "timestamp_millis"}},
            ]}),
        );
        let out = run(&chain, json!({"id": 7, "name": "x"}));
        assert_eq!(out["message"], "hello");
        assert_eq!(out["id"], json!({"nested": [1, 2]}), "overwrites");
        assert!(out["at"].as_i64().is_some_and(|millis| millis > 0));
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["id", "name", "message", "at"],
            "overwrite keeps position"
        );
    }

    #[test]
    fn given_non_object_payloads_when_applied_should_pass_them_through() {
        let chain = chain(
            "add_fields",
            json!({"fields": [{"key": "k", "value": {"static": 1}}]}),
        );
        for payload in [
            Payload::Text("{\"a\":1}".into()),
            Payload::Raw(bytes::Bytes::from_static(b"\x00\x01")),
            Payload::Json(json!([1, 2])),
            Payload::Json(json!("text")),
        ] {
            let mut changed = payload.clone();
            chain.apply(&mut changed).unwrap();
            assert_eq!(changed, payload);
        }
    }

    #[test]
    fn given_invalid_config_when_built_should_name_the_field() {
        let error = build_error(
            "add_fields",
            json!({"fields": [{"key": "k", "value": {"computed": "uuid_v9"}}]}),
        );
        assert_eq!(error.field, "fields[0].value.computed");
        assert!(error.message.contains("uuid_v9"), "{}", error.message);
        let error = build_error("add_fields", json!({"fields": [{"value": {"static": 1}}]}));
        assert_eq!(error.field, "fields[0].key");
        let error = build_error("add_fields", json!({"fields": [], "feilds": []}));
        assert_eq!(error.field, "feilds");
        let error = build_error(
            "add_fields",
            json!({"fields": [{"key": "k", "valeu": {"static": 1}}]}),
        );
        assert_eq!(error.field, "fields[0].valeu");
    }
}
