//! The `[[streams]]` tables of a connector file.

use std::time::Duration;

use toml::{Table, Value};

use crate::codec::{Schema, SchemaName, SchemaOptions};
use crate::config::reader::{Reader, describe};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceStream {
    pub stream: String,
    pub topic: String,
    pub schema: Schema,
    pub batch_length: u32,
    pub linger_time: Duration,
    /// Partitions for a topic we create (ours; upstream always creates 1).
    pub partitions: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkStream {
    pub stream: String,
    pub topics: Vec<String>,
    pub schema: Schema,
    pub batch_length: u32,
    pub poll_interval: Duration,
    pub consumer_group: String,
}

pub const DEFAULT_BATCH_LENGTH: u32 = 1000;
pub const DEFAULT_LINGER_TIME: Duration = Duration::from_millis(5);
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(5);

fn stream_tables<'a>(reader: &mut Reader<'a>) -> Vec<&'a Table> {
    match reader.get("streams") {
        None => {
            reader.error("streams", "missing required [[streams]] entry");
            Vec::new()
        }
        Some(Value::Array(items)) if !items.is_empty() => {
            let mut tables = Vec::with_capacity(items.len());
            for (index, item) in items.iter().enumerate() {
                match item {
                    Value::Table(table) => tables.push(table),
                    other => reader.error(
                        &format!("streams[{index}]"),
                        format!("expected a table, found {}", describe(other)),
                    ),
                }
            }
            tables
        }
        Some(other) => {
            reader.error(
                "streams",
                format!(
                    "expected at least one [[streams]] table, found {}",
                    describe(other)
                ),
            );
            Vec::new()
        }
    }
}

pub(super) fn read_source_streams(reader: &mut Reader) -> Vec<SourceStream> {
    let mut streams = Vec::new();
    for (index, table) in stream_tables(reader).into_iter().enumerate() {
        let mut nested = reader.nested(format!("streams[{index}]"), table);
        nested.refuse_unknown(&stream_fields(&[
            "stream",
            "topic",
            "schema",
            "batch_length",
            "linger_time",
            "partitions",
        ]));
        let stream = required_name(&mut nested, "stream");
        let topic = required_name(&mut nested, "topic");
        let schema = read_schema(&mut nested, topic.as_deref());
        let batch_length = read_batch_length(&mut nested);
        let linger_time = nested.duration_or("linger_time", DEFAULT_LINGER_TIME);
        let partitions = read_positive_u32(&mut nested, "partitions", 1);
        if let (Some(stream), Some(topic), Some(schema)) = (stream, topic, schema) {
            streams.push(SourceStream {
                stream,
                topic,
                schema,
                batch_length,
                linger_time,
                partitions,
            });
        }
    }
    streams
}

pub(super) fn read_sink_streams(reader: &mut Reader, key: &str) -> Vec<SinkStream> {
    let mut streams = Vec::new();
    for (index, table) in stream_tables(reader).into_iter().enumerate() {
        let mut nested = reader.nested(format!("streams[{index}]"), table);
        nested.refuse_unknown(&stream_fields(&[
            "stream",
            "topics",
            "schema",
            "batch_length",
            "poll_interval",
            "consumer_group",
        ]));
        let stream = required_name(&mut nested, "stream");
        let topics = match nested.string_list("topics") {
            Some(topics) if !topics.is_empty() => Some(topics),
            Some(_) => {
                nested.error("topics", "expected at least one topic");
                None
            }
            None => {
                if nested.get("topics").is_none() {
                    nested.error(
                        "topics",
                        "missing required field, expected a list of topic names",
                    );
                }
                None
            }
        };
        let schema = read_schema(&mut nested, None);
        let batch_length = read_batch_length(&mut nested);
        let poll_interval = nested.duration_or("poll_interval", DEFAULT_POLL_INTERVAL);
        let consumer_group = nested
            .optional_string("consumer_group")
            .unwrap_or_else(|| format!("iggy-connect-sink-{key}"));
        if let (Some(stream), Some(topics), Some(schema)) = (stream, topics, schema) {
            streams.push(SinkStream {
                stream,
                topics,
                schema,
                batch_length,
                poll_interval,
                consumer_group,
            });
        }
    }
    streams
}

/// A stream or topic name: a string that is not empty (upstream's templates ship
/// `stream = ""`).
fn required_name(reader: &mut Reader, field: &str) -> Option<String> {
    let name = reader.required_string(field)?;
    if name.is_empty() {
        reader.error(field, "expected a name, found an empty string");
        return None;
    }
    Some(name)
}

fn read_batch_length(reader: &mut Reader) -> u32 {
    read_positive_u32(reader, "batch_length", DEFAULT_BATCH_LENGTH)
}

fn read_positive_u32(reader: &mut Reader, field: &str, default: u32) -> u32 {
    match reader.optional_u64(field) {
        None => default,
        Some(value) if value >= 1 && value <= u64::from(u32::MAX) => value as u32,
        Some(value) => {
            reader.error(
                field,
                format!("expected a number from 1 to {}, found {value}", u32::MAX),
            );
            default
        }
    }
}

/// A stream's own fields and those of its schema.
fn stream_fields<'a>(own: &[&'a str]) -> Vec<&'a str> {
    own.iter().copied().chain(SchemaOptions::FIELDS).collect()
}

/// The stream's `schema`, loaded with the fields that say where an `avro` or
/// `proto` schema is; a schema that cannot be loaded is an error on the field
/// to blame.
fn read_schema(reader: &mut Reader, topic: Option<&str>) -> Option<Schema> {
    let name: SchemaName = reader.required_parsed("schema")?;
    let options = SchemaOptions {
        avro_schema_json: reader.optional_string("avro_schema_json"),
        avro_schema_path: reader.optional_string("avro_schema_path"),
        proto_schema_path: reader.optional_string("proto_schema_path"),
        proto_descriptor_set: reader.optional_string("proto_descriptor_set"),
        proto_message_type: reader.optional_string("proto_message_type"),
        proto_include_paths: reader
            .string_list("proto_include_paths")
            .unwrap_or_default(),
        flatbuffer_schema_path: reader.optional_string("flatbuffer_schema_path"),
        flatbuffer_root_table_name: reader.optional_string("flatbuffer_root_table_name"),
        schema_registry_url: reader.optional_string("schema_registry_url"),
        schema_registry_subject: reader
            .optional_string("schema_registry_subject")
            .or_else(|| topic.map(|topic| format!("{topic}-value"))),
        schema_registry_username: reader.optional_string("schema_registry_username"),
        schema_registry_password: reader
            .optional_string("schema_registry_password")
            .map(secrecy::SecretString::from),
        schema_registry_ca_file: reader.optional_string("schema_registry_ca_file"),
    };
    match Schema::load(name, &options) {
        Ok(schema) => Some(schema),
        Err(error) => {
            reader.error(error.field, error.message);
            None
        }
    }
}
