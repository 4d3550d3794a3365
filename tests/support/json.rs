//! JSON configs for tests that build a connector from its `plugin_config`.

use serde_json::Value;

/// `base` with the fields of `extra` added (both objects).
pub fn with(base: &Value, extra: Value) -> Value {
    let mut config = base.clone();
    let (Some(config_fields), Value::Object(extra)) = (config.as_object_mut(), extra) else {
        panic!("both are objects: {base}")
    };
    config_fields.extend(extra);
    config
}
