//! What `iggy-connect describe` shows about a connector, read from the JSON
//! Schema of its config type (so the fields are documented once, in the config
//! type's doc comments): its fields, an example connector file and a JSON Schema
//! of the whole connector file. `pages` turns the same into the connector
//! pages, the connector index and features.md.

pub mod pages;

use serde_json::{Map, Value, json};

use crate::config::connector::{DEFAULT_MAX_IN_FLIGHT, MAX_IN_FLIGHT};
use crate::connectors::ConnectorKind;
use crate::connectors::registry::ConnectorInfo;

/// One `plugin_config` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Dotted path inside `plugin_config`; `[]` marks the elements of an array
    /// (`endpoints[].path`).
    pub name: String,
    pub kind: String,
    /// The default as TOML would write it, when the field has one.
    pub default: Option<String>,
    pub required: bool,
    pub description: String,
}

/// Every field of a connector's `plugin_config`, nested tables flattened.
pub fn fields(info: &ConnectorInfo) -> Vec<Field> {
    let schema = (info.config_schema)().to_value();
    let mut out = Vec::new();
    collect_fields(&schema, &schema, "", &mut out);
    out
}

fn collect_fields(root: &Value, schema: &Value, prefix: &str, out: &mut Vec<Field>) {
    let schema = resolve(root, schema);
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, property) in properties {
        let path = format!("{prefix}{name}");
        let resolved = resolve(root, property);
        out.push(Field {
            name: path.clone(),
            kind: type_name(root, property),
            default: property
                .get("default")
                .filter(|value| !value.is_null())
                .map(toml_text),
            required: required.contains(&name.as_str()),
            description: description(property)
                .or_else(|| description(resolved))
                .unwrap_or_default(),
        });
        let element = non_null(root, property);
        if let Some(items) = element.get("items") {
            collect_fields(root, items, &format!("{path}[]."), out);
        } else if element.get("properties").is_some() {
            collect_fields(root, element, &format!("{path}."), out);
        }
    }
}

/// Follows a `$ref` into the root's `$defs`.
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|reference| reference.strip_prefix("#/$defs/"))
        .and_then(|name| root.get("$defs")?.get(name))
        .unwrap_or(schema)
}

/// The schema without its `null` alternative (an `Option`).
fn non_null<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    let schema = resolve(root, schema);
    match schema.get("anyOf").and_then(Value::as_array) {
        Some(options) => options
            .iter()
            .find(|option| option.get("type").and_then(Value::as_str) != Some("null"))
            .map_or(schema, |option| resolve(root, option)),
        None => schema,
    }
}

fn description(schema: &Value) -> Option<String> {
    let text = schema.get("description")?.as_str()?;
    Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// A short type for people: `string`, `integer`, `duration`, `"a" | "b"`,
/// `array of string`, `table of string`.
fn type_name(root: &Value, schema: &Value) -> String {
    let schema = non_null(root, schema);
    if let Some(title) = schema.get("title").and_then(Value::as_str) {
        return title.to_owned();
    }
    let values = enum_values(schema);
    if !values.is_empty() {
        return values.join(" | ");
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(name)) => vec![name.as_str()],
        Some(Value::Array(names)) => names
            .iter()
            .filter_map(Value::as_str)
            .filter(|name| *name != "null")
            .collect(),
        _ => Vec::new(),
    };
    match types.first().copied() {
        Some("array") => match schema.get("items") {
            Some(items) => format!("array of {}", type_name(root, items)),
            None => "array".to_owned(),
        },
        Some("object") => match schema.get("additionalProperties") {
            Some(values @ Value::Object(_)) => format!("table of {}", type_name(root, values)),
            _ => "table".to_owned(),
        },
        Some(name) => name.to_owned(),
        None => "any".to_owned(),
    }
}

fn enum_values(schema: &Value) -> Vec<String> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values.iter().map(|value| value.to_string()).collect();
    }
    if let Some(value) = schema.get("const") {
        return vec![value.to_string()];
    }
    match schema.get("oneOf").and_then(Value::as_array) {
        Some(options) => options.iter().flat_map(enum_values).collect(),
        None => Vec::new(),
    }
}

fn toml_text(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(toml_text).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) if map.is_empty() => "{}".to_owned(),
        other => other.to_string(),
    }
}

/// The fields as a table for the terminal.
pub fn fields_table(info: &ConnectorInfo) -> String {
    let fields = fields(info);
    let width = |column: fn(&Field) -> usize, title: &str| {
        fields
            .iter()
            .map(column)
            .max()
            .unwrap_or(0)
            .max(title.len())
    };
    let name_width = width(|field| field.name.len(), "FIELD");
    let kind_width = width(|field| field.kind.len(), "TYPE");
    let default_width = width(
        |field| field.default.as_deref().map_or(1, str::len),
        "DEFAULT",
    );
    let mut out = format!(
        "{} {} ({}): {}\n\n",
        info.kind, info.name, info.feature, info.description
    );
    let mut row = |name: &str, kind: &str, default: &str, required: &str, description: &str| {
        let line = format!(
            "{name:<name_width$}  {kind:<kind_width$}  {default:<default_width$}  {required:<8}  {description}"
        );
        out.push_str(line.trim_end());
        out.push('\n');
    };
    row("FIELD", "TYPE", "DEFAULT", "REQUIRED", "DESCRIPTION");
    for field in &fields {
        row(
            &field.name,
            &field.kind,
            field.default.as_deref().unwrap_or("-"),
            if field.required { "yes" } else { "no" },
            &field.description,
        );
    }
    if info.kind == ConnectorKind::Source {
        out.push_str(&format!(
            "\nTop level of the file: `max_in_flight` (1-{MAX_IN_FLIGHT}, default {DEFAULT_MAX_IN_FLIGHT}), \
             the batches polled and not yet committed, capped by what the source supports; \
             after a crash at most that many batches are sent again. `max_in_flight_bytes` \
             (a size, default 16MiB): no further poll while those batches hold that much payload.\n"
        ));
    }
    out.push_str(&format!(
        "\n`iggy-connect describe {} {} --example` prints a complete connector file.\n",
        info.kind, info.name
    ));
    out
}

/// A complete connector file in upstream's format, with the connector's sample
/// `plugin_config`; `validate` accepts it as it is.
pub fn example_file(info: &ConnectorInfo) -> String {
    let streams = match info.kind {
        ConnectorKind::Source => {
            "[[streams]]\nstream = \"example_stream\"\ntopic = \"example_topic\"\nschema = \"json\"\nbatch_length = 1000\nlinger_time = \"5ms\"\n"
        }
        ConnectorKind::Sink => {
            "[[streams]]\nstream = \"example_stream\"\ntopics = [\"example_topic\"]\nschema = \"json\"\nbatch_length = 1000\npoll_interval = \"5ms\"\nconsumer_group = \"example_group\"\n"
        }
    };
    let plugin_config = match toml::from_str::<toml::Table>(info.sample_config) {
        Ok(table) => {
            let mut wrapper = toml::Table::new();
            wrapper.insert("plugin_config".into(), toml::Value::Table(table));
            toml::to_string(&wrapper).unwrap_or_default()
        }
        Err(_) => format!("[plugin_config]\n{}", info.sample_config),
    };
    format!(
        "# {kind} connector `{name}`: {description}\n# Fields: `iggy-connect describe {kind} {name}`.\ntype = \"{kind}\"\nkey = \"{name}_{kind}\"\nenabled = true\nversion = 0\nname = \"{name} {kind}\"\npath = \"libiggy_connector_{name}_{kind}\"\n\n{streams}\n{plugin_config}",
        kind = info.kind,
        name = info.name,
        description = info.description,
    )
}

/// `[[tests]]`, read by `iggy-connect test` (src/cli/testing.rs) and
/// ignored by the runtime.
fn tests_schema() -> Value {
    let any = json!({});
    json!({
        "type": "array",
        "description": "unit tests run by `iggy-connect test`: inputs sent through the file's decode, transforms and encode, and the outputs expected, in order",
        "items": {
            "type": "object",
            "required": ["name", "inputs", "outputs"],
            "additionalProperties": false,
            "properties": {
                "name": {"type": "string"},
                "inputs": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {
                        "json": any, "text": {"type": "string"},
                        "headers": {"type": "object"}, "key": {"type": "string"},
                        "id": {"type": "integer"}, "partition": {"type": "integer"},
                        "offset": {"type": "integer"}, "timestamp": {"type": "integer"},
                    },
                }},
                "outputs": {"type": "array", "description": "empty: nothing may come out", "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {
                        "json_equals": any, "json_contains": any,
                        "text_equals": {"type": "string"}, "text_contains": {"type": "string"},
                        "fields": {"type": "object"}, "headers": {"type": "object"},
                        "key": {"type": "string"}, "condition": {"type": "string"},
                        "error_contains": {"type": "string"},
                    },
                }},
            },
        },
    })
}

/// A JSON Schema (2020-12) of a whole connector file for this connector.
pub fn file_schema(info: &ConnectorInfo) -> Value {
    let mut plugin_config = (info.config_schema)().to_value();
    let definitions = plugin_config
        .as_object_mut()
        .and_then(|schema| {
            schema.remove("$schema");
            schema.remove("$defs")
        })
        .unwrap_or_else(|| json!({}));
    let duration =
        json!({"type": "string", "description": "a duration such as \"5ms\" or \"10s\""});
    let positive = json!({"type": "integer", "minimum": 1});
    let schema_names =
        json!({"type": "string", "enum": ["json", "raw", "text", "proto", "flatbuffer", "avro"]});
    let stream = match info.kind {
        ConnectorKind::Source => json!({
            "type": "object",
            "required": ["stream", "topic", "schema"],
            "properties": {
                "stream": {"type": "string", "minLength": 1},
                "topic": {"type": "string", "minLength": 1},
                "schema": schema_names,
                "batch_length": positive,
                "linger_time": duration,
                "partitions": positive,
            },
        }),
        ConnectorKind::Sink => json!({
            "type": "object",
            "required": ["stream", "topics", "schema"],
            "properties": {
                "stream": {"type": "string", "minLength": 1},
                "topics": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                "schema": schema_names,
                "batch_length": positive,
                "poll_interval": duration,
                "consumer_group": {"type": "string"},
            },
        }),
    };
    let mut properties = Map::new();
    properties.insert("type".into(), json!({"const": info.kind.to_string()}));
    properties.insert(
        "key".into(),
        json!({"type": "string", "pattern": "^[A-Za-z0-9_-]+$"}),
    );
    properties.insert(
        "enabled".into(),
        json!({"type": "boolean", "default": true}),
    );
    properties.insert(
        "version".into(),
        json!({"type": "integer", "minimum": 0, "default": 0}),
    );
    properties.insert("name".into(), json!({"type": "string"}));
    properties.insert(
        "path".into(),
        json!({"type": "string", "description": format!("the connector's name (`{}`) or upstream's library path (`libiggy_connector_{}_{}`)", info.name, info.name, info.kind)}),
    );
    properties.insert("connector".into(), json!({"const": info.name}));
    properties.insert("plugin_config_format".into(), json!({"type": "string"}));
    properties.insert("verbose".into(), json!({"type": "boolean"}));
    properties.insert("benchmark".into(), json!({"type": "boolean"}));
    properties.insert(
        "streams".into(),
        json!({"type": "array", "minItems": 1, "items": stream}),
    );
    properties.insert("plugin_config".into(), plugin_config);
    properties.insert(
        "transforms".into(),
        json!({"type": "object", "additionalProperties": {"type": "object", "properties": {"type": {"type": "string", "description": "the transform's type when the table is named otherwise"}, "enabled": {"type": "boolean"}}}}),
    );
    properties.insert("tests".into(), tests_schema());
    properties.insert(
        "dead_letter".into(),
        json!({"type": "object", "required": ["stream", "topic"], "properties": {"stream": {"type": "string"}, "topic": {"type": "string"}}}),
    );
    match info.kind {
        ConnectorKind::Source => {
            properties.insert(
                "max_in_flight".into(),
                json!({
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_IN_FLIGHT,
                    "default": DEFAULT_MAX_IN_FLIGHT,
                    "description": "batches polled and not yet committed, at most (capped by what the source supports); after a crash at most this many batches are sent again",
                }),
            );
            properties.insert(
                "max_in_flight_bytes".into(),
                json!({
                    "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string"}],
                    "default": "16MiB",
                    "description": "payload bytes of the batches in flight before the next poll waits (\"16MiB\", \"500KB\" or bytes); one batch may always be in flight",
                }),
            );
            properties.insert(
                "max_consecutive_nacks".into(),
                json!({"anyOf": [{"type": "integer", "minimum": 0}, {"const": "none"}]}),
            )
        }
        ConnectorKind::Sink => properties.insert(
            "on_error".into(),
            json!({"enum": ["stop", "skip", "dlq"], "default": "stop"}),
        ),
    };
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": format!("iggy-connect {} connector file: {}", info.kind, info.name),
        "type": "object",
        "required": ["type", "key", "streams"],
        "anyOf": [{"required": ["path"]}, {"required": ["connector"]}],
        "properties": properties,
        "$defs": definitions,
    })
}
