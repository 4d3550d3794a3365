//! Chain tests (order, `enabled`, unknown types) and helpers for the tests of
//! each transform.

use serde_json::{Value, json};

use crate::message::Payload;
use crate::transforms::{TransformChain, TransformConfigError, Verdict};

/// A chain of one transform; panics on a bad config.
pub(crate) fn chain(kind: &str, config: Value) -> TransformChain {
    TransformChain::build(&[(kind.to_owned(), config)]).unwrap()
}

/// The error of building one transform; panics when it builds.
pub(crate) fn build_error(kind: &str, config: Value) -> TransformConfigError {
    let error = TransformChain::build(&[(kind.to_owned(), config)]).unwrap_err();
    assert_eq!(error.transform, kind);
    error
}

/// Runs `value` through the chain, expecting it kept and still JSON.
pub(crate) fn run(chain: &TransformChain, value: Value) -> Value {
    let mut payload = Payload::Json(value);
    assert_eq!(chain.apply(&mut payload).unwrap(), Verdict::Keep);
    match payload {
        Payload::Json(value) => value,
        other => panic!("expected JSON, found {other:?}"),
    }
}

fn add_then_delete() -> Vec<(String, Value)> {
    vec![
        (
            "add_fields".into(),
            json!({"enabled": true, "fields": [{"key": "tag", "value": {"static": "added"}}]}),
        ),
        (
            "delete_fields".into(),
            json!({"enabled": true, "fields": ["tag"]}),
        ),
    ]
}

#[test]
fn given_add_then_delete_of_the_same_key_when_applied_should_end_without_it() {
    let chain = TransformChain::build(&add_then_delete()).unwrap();
    assert_eq!(
        chain.names().collect::<Vec<_>>(),
        ["add_fields", "delete_fields"]
    );
    assert_eq!(
        run(&chain, json!({"id": 1, "tag": "old"})),
        json!({"id": 1})
    );
}

#[test]
fn given_delete_then_add_of_the_same_key_when_applied_should_end_with_it() {
    let mut configs = add_then_delete();
    configs.reverse();
    let chain = TransformChain::build(&configs).unwrap();
    assert_eq!(
        chain.names().collect::<Vec<_>>(),
        ["delete_fields", "add_fields"]
    );
    assert_eq!(
        run(&chain, json!({"id": 1, "tag": "old"})),
        json!({"id": 1, "tag": "added"})
    );
}

#[test]
fn given_connector_file_when_parsed_should_run_transforms_in_file_order() {
    let text = r#"
type = "source"
key = "order"
path = "random"
[[streams]]
stream = "s"
topic = "t"
schema = "json"
[plugin_config]
[transforms.unwrap_envelope]
enabled = true
field = "data"
[transforms.delete_fields]
enabled = true
fields = ["secret"]
[transforms.add_fields]
enabled = true
[[transforms.add_fields.fields]]
key = "secret"
value.static = "kept, added after the delete"
"#;
    let (config, _) = crate::config::parse_connector_file(
        std::path::Path::new("order.toml"),
        text,
        &crate::config::env::EnvVars::default(),
    )
    .unwrap();
    let chain = TransformChain::build(&config.transforms).unwrap();
    assert_eq!(
        chain.names().collect::<Vec<_>>(),
        ["unwrap_envelope", "delete_fields", "add_fields"]
    );
    assert_eq!(
        run(&chain, json!({"data": {"id": 1, "secret": "x"}})),
        json!({"id": 1, "secret": "kept, added after the delete"})
    );
}

#[test]
fn given_enabled_false_when_built_should_skip_that_transform() {
    let configs = vec![
        (
            "add_fields".to_owned(),
            json!({"enabled": false, "fields": [{"key": "a", "value": {"static": 1}}]}),
        ),
        (
            "delete_fields".to_owned(),
            json!({"enabled": true, "fields": ["b"]}),
        ),
    ];
    let chain = TransformChain::build(&configs).unwrap();
    assert_eq!(chain.len(), 1);
    assert_eq!(run(&chain, json!({"b": 2, "c": 3})), json!({"c": 3}));
}

#[test]
fn given_disabled_transform_with_bad_settings_when_built_should_still_skip_it() {
    // A disabled table is not read further, so a half-written one can be parked.
    let chain = chain(
        "add_fields",
        json!({"enabled": false, "fields": "nonsense"}),
    );
    assert!(chain.is_empty());
}

#[test]
fn given_unknown_type_or_bad_enabled_when_built_should_say_so() {
    let error = build_error("rename_fields", json!({"enabled": true}));
    assert_eq!(error.field, "");
    assert!(error.message.contains("add_fields"), "{}", error.message);
    let error = build_error("delete_fields", json!({"enabled": "yes"}));
    assert_eq!(error.field, "enabled");
    let error = build_error("delete_fields", Value::Bool(true));
    assert_eq!(error.field, "");
}

#[test]
fn given_filter_that_drops_when_chained_should_stop_before_later_transforms() {
    let configs = vec![
        (
            "filter_messages".to_owned(),
            json!({"include_matching": false, "patterns": [{"key_pattern": {"exact": "skip"}}]}),
        ),
        ("unwrap_envelope".to_owned(), json!({"field": "skip"})),
    ];
    let chain = TransformChain::build(&configs).unwrap();
    let mut payload = Payload::Json(json!({"skip": 1}));
    assert_eq!(chain.apply(&mut payload).unwrap(), Verdict::Drop);
    assert_eq!(payload, Payload::Json(json!({"skip": 1})));
}

#[test]
fn given_invalid_transform_in_connector_file_when_validated_should_name_file_transform_and_field() {
    let text = r#"
type = "sink"
key = "bad"
path = "stdout"
[[streams]]
stream = "s"
topics = ["t"]
schema = "json"
[plugin_config]
[transforms.filter_fields]
enabled = true
[[transforms.filter_fields.patterns]]
key_pattern = { regex = "(" }
[transforms.unwrap_envelope]
enabled = true
field = ""
"#;
    let issues = crate::config::parse_connector_file(
        std::path::Path::new("/etc/connectors/bad.toml"),
        text,
        &crate::config::env::EnvVars::default(),
    )
    .unwrap_err();
    let lines: Vec<String> = issues.0.iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines[0].starts_with(
            "error: /etc/connectors/bad.toml: field `transforms.filter_fields.patterns[0].key_pattern.regex`: invalid regex"
        ),
        "{lines:#?}"
    );
    assert!(
        lines[1].starts_with(
            "error: /etc/connectors/bad.toml: field `transforms.unwrap_envelope.field`"
        ),
        "{lines:#?}"
    );
}

#[test]
fn given_json_kept_as_text_when_a_chain_runs_should_transform_it_as_a_value() {
    let chain = chain(
        "add_fields",
        json!({"fields": [{"key": "tag", "value": {"static": "added"}}]}),
    );
    let mut payload = Payload::JsonBytes(bytes::Bytes::from_static(br#"{"id": 1}"#));
    assert_eq!(chain.apply(&mut payload).unwrap(), Verdict::Keep);
    assert_eq!(payload, Payload::Json(json!({"id": 1, "tag": "added"})));

    let mut broken = Payload::JsonBytes(bytes::Bytes::from_static(b"{nope"));
    let error = chain.apply(&mut broken).unwrap_err();
    assert!(error.message.contains("not valid JSON"), "{error}");
}
