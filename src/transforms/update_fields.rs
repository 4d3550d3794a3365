//! `update_fields`: sets top-level keys under a condition: `always` (the
//! default), `key_exists` (only replace) or `key_not_exists` (only add).
//!
//! ```toml
//! [transforms.update_fields]
//! enabled = true
//! [[transforms.update_fields.fields]]
//! key = "status"
//! value.static = "processed"
//! condition = "key_exists"
//! ```

use serde::Deserialize;
use serde_json::Value;

use crate::message::Payload;
use crate::transforms::field_value::{FieldValue, Now, set_field};
use crate::transforms::{FieldError, Transform, TransformError, Verdict};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateFieldsConfig {
    #[serde(default)]
    pub fields: Vec<UpdateField>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateField {
    pub key: String,
    pub value: FieldValue,
    #[serde(default)]
    pub condition: Condition,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    #[default]
    Always,
    KeyExists,
    KeyNotExists,
}

#[derive(Debug)]
pub struct UpdateFields {
    fields: Vec<UpdateField>,
}

impl UpdateFields {
    pub(crate) fn build(config: UpdateFieldsConfig) -> Result<Self, FieldError> {
        Ok(Self {
            fields: config.fields,
        })
    }
}

impl Transform for UpdateFields {
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        let Payload::Json(Value::Object(map)) = payload else {
            return Ok(Verdict::Keep);
        };
        let mut now = Now::default();
        for field in &self.fields {
            let applies = match field.condition {
                Condition::Always => true,
                Condition::KeyExists => map.contains_key(&field.key),
                Condition::KeyNotExists => !map.contains_key(&field.key),
            };
            if applies {
                set_field(map, &field.key, field.value.produce(&mut now));
            }
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
    fn given_each_condition_when_applied_should_update_only_where_it_holds() {
        let chain = chain(
            "update_fields",
            json!({"enabled": true, "fields": [
                {"key": "status", "value": {"static": "done"}},
                {"key": "name", "value": {"static": "replaced"}, "condition": "key_exists"},
                {"key": "absent", "value": {"static": "no"}, "condition": "key_exists"},
                {"key": "name", "value": {"static": "no"}, "condition": "key_not_exists"},
                {"key": "added", "value": {"static": 1}, "condition": "key_not_exists"},
                {"key": "id", "value": {"computed": "uuid_v7"}, "condition": "always"},
            ]}),
        );
        let out = run(&chain, json!({"name": "x", "status": "new", "id": 1}));
        assert_eq!(out["status"], "done");
        assert_eq!(out["name"], "replaced");
        assert!(out.get("absent").is_none());
        assert_eq!(out["added"], 1);
        assert!(uuid::Uuid::parse_str(out["id"].as_str().unwrap()).is_ok());
    }

    #[test]
    fn given_non_object_payloads_when_applied_should_pass_them_through() {
        let chain = chain(
            "update_fields",
            json!({"fields": [{"key": "a", "value": {"static": 1}}]}),
        );
        for payload in [
            Payload::Text("a".into()),
            Payload::Raw(bytes::Bytes::from_static(b"\xff")),
            Payload::Json(json!(null)),
        ] {
            let mut changed = payload.clone();
            chain.apply(&mut changed).unwrap();
            assert_eq!(changed, payload);
        }
    }

    #[test]
    fn given_invalid_config_when_built_should_name_the_field() {
        let error = build_error(
            "update_fields",
            json!({"fields": [
                {"key": "a", "value": {"static": 1}},
                {"key": "b", "value": {"static": 1}, "condition": "sometimes"},
            ]}),
        );
        assert_eq!(error.field, "fields[1].condition");
        assert!(error.message.contains("sometimes"), "{}", error.message);
    }
}
