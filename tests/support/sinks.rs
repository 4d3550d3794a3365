//! A registered sink built straight from its `plugin_config`, for tests that
//! drive one without the engine.

use iggy_connect::connectors::{Registry, Sink};
use iggy_connect::message::TopicRef;
use serde_json::Value;

/// The sink registered as `name`, built from `config` (which must be valid).
pub fn build(name: &str, config: &Value) -> Box<dyn Sink> {
    let entry = Registry::sinks()
        .iter()
        .find(|entry| entry.name == name)
        .unwrap_or_else(|| panic!("no sink {name} in this build"));
    (entry.build)(config).expect("a valid config")
}

/// The same, opened.
pub async fn open(name: &str, config: &Value) -> Box<dyn Sink> {
    let mut sink = build(name, config);
    sink.open().await.expect("open");
    sink
}

/// The topic the tests' messages come from.
pub fn topic() -> TopicRef {
    TopicRef {
        stream: "s".into(),
        topic: "t".into(),
    }
}
