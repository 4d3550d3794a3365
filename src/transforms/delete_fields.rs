//! `delete_fields`: removes top-level keys.
//!
//! ```toml
//! [transforms.delete_fields]
//! enabled = true
//! fields = ["password", "internal_id"]
//! ```

use serde::Deserialize;
use serde_json::Value;

use crate::message::Payload;
use crate::transforms::{FieldError, Transform, TransformError, Verdict};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteFieldsConfig {
    #[serde(default)]
    pub fields: Vec<String>,
}

#[derive(Debug)]
pub struct DeleteFields {
    fields: Vec<String>,
}

impl DeleteFields {
    pub(crate) fn build(config: DeleteFieldsConfig) -> Result<Self, FieldError> {
        let mut fields = config.fields;
        // A key listed twice would only cost a second lookup.
        let mut seen = std::collections::HashSet::with_capacity(fields.len());
        fields.retain(|field| seen.insert(field.clone()));
        Ok(Self { fields })
    }
}

impl Transform for DeleteFields {
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        let Payload::Json(Value::Object(map)) = payload else {
            return Ok(Verdict::Keep);
        };
        for field in &self.fields {
            // `shift_remove` keeps the other keys in their order.
            map.shift_remove(field);
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
    fn given_listed_keys_when_applied_should_remove_them_and_keep_order() {
        let chain = chain(
            "delete_fields",
            json!({"enabled": true, "fields": ["b", "missing", "d"]}),
        );
        let out = run(
            &chain,
            json!({"a": 1, "b": 2, "c": {"b": 3}, "d": 4, "e": 5}),
        );
        assert_eq!(out, json!({"a": 1, "c": {"b": 3}, "e": 5}));
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["a", "c", "e"]);
    }

    #[test]
    fn given_non_object_payloads_when_applied_should_pass_them_through() {
        let chain = chain("delete_fields", json!({"fields": ["a"]}));
        for payload in [
            Payload::Text("a".into()),
            Payload::Raw(bytes::Bytes::from_static(b"{\"a\":1}")),
            Payload::Json(json!(["a"])),
        ] {
            let mut changed = payload.clone();
            chain.apply(&mut changed).unwrap();
            assert_eq!(changed, payload);
        }
    }

    #[test]
    fn given_invalid_config_when_built_should_name_the_field() {
        let error = build_error("delete_fields", json!({"fields": ["a", 2]}));
        assert_eq!(error.field, "fields[1]");
        let error = build_error("delete_fields", json!({"fields": "a"}));
        assert_eq!(error.field, "fields");
    }
}
