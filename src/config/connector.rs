//! Connector files: upstream's per-connector TOML (`type`, `key`, `enabled`,
//! `version`, `name`, `path`, `[[streams]]`, `[plugin_config]`,
//! `[transforms.*]`, ...), plus our optional delivery settings.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::{Table, Value};

use crate::config::env::EnvVars;
use crate::config::reader::{Reader, describe};
use crate::config::{ConfigIssue, ConfigIssues, env};
use crate::connectors::registry::{Registry, RegistryError, connector_name_from_path};
use crate::connectors::{BatchPolicy, ConnectorKind};
use crate::engine::codec::Schema;
use crate::engine::transforms::TransformChain;

pub const DEFAULT_BATCH_LENGTH: u32 = 1000;
pub const DEFAULT_LINGER_TIME: Duration = Duration::from_millis(5);
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// One connector, parsed and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectorConfig {
    pub kind: ConnectorKind,
    pub key: String,
    pub enabled: bool,
    pub version: u64,
    pub name: String,
    /// As written (an upstream library path or a connector name).
    pub path: String,
    /// The registry name the connector resolves to (`postgres`, `random`, ...).
    pub connector: String,
    pub plugin_config_format: Option<String>,
    /// The connector's own settings, as JSON (what upstream hands its plugins).
    pub plugin_config: serde_json::Value,
    pub verbose: bool,
    pub benchmark: bool,
    /// `(type, table)` in file order.
    pub transforms: Vec<(String, serde_json::Value)>,
    /// Where messages that fail decode, transform or encode (and, for sinks with
    /// `on_error = "dlq"`, messages the backend refuses) are sent.
    pub dead_letter: Option<DeadLetterTarget>,
    pub kind_config: KindConfig,
    /// The file this came from, when it came from one.
    pub file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum KindConfig {
    Source {
        streams: Vec<SourceStream>,
        /// `Some(0)` means never stop; `None` keeps the connector's default.
        max_consecutive_nacks: Option<u32>,
        /// Batches in flight (`1..=MAX_IN_FLIGHT`); `None` keeps the default.
        max_in_flight: Option<u32>,
    },
    Sink {
        streams: Vec<SinkStream>,
        on_error: OnError,
    },
}

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterTarget {
    pub stream: String,
    pub topic: String,
}

/// What a sink does with a message its backend refuses for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Stop the sink (status `error`, reason `rejected`); offsets stay put.
    #[default]
    Stop,
    /// Count the message and move on.
    Skip,
    /// Send it to the dead-letter topic with headers saying why, then move on.
    Dlq,
}

impl std::str::FromStr for OnError {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "stop" => Ok(OnError::Stop),
            "skip" => Ok(OnError::Skip),
            "dlq" => Ok(OnError::Dlq),
            other => Err(format!(
                "expected \"stop\", \"skip\" or \"dlq\", found \"{other}\""
            )),
        }
    }
}

impl ConnectorConfig {
    /// The engine's NACK policy for a source, given the connector's own default.
    pub fn batch_policy(&self, connector_default: BatchPolicy) -> BatchPolicy {
        match &self.kind_config {
            KindConfig::Source {
                max_consecutive_nacks,
                ..
            } => connector_default.with_override(*max_consecutive_nacks),
            KindConfig::Sink { .. } => connector_default,
        }
    }

    /// How many batches a source runs with in flight, given how many it can
    /// have (`1` for sinks and for sources that cannot rewind).
    pub fn max_in_flight(&self, capability: usize) -> usize {
        let chosen = match &self.kind_config {
            KindConfig::Source { max_in_flight, .. } => {
                max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT)
            }
            KindConfig::Sink { .. } => 1,
        };
        (chosen as usize).min(capability).max(1)
    }

    /// Where this config came from, for messages.
    pub fn origin(&self) -> PathBuf {
        self.file
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("<{} {}>", self.kind, self.key)))
    }
}

const KNOWN_FIELDS: &[&str] = &[
    "type",
    "key",
    "enabled",
    "version",
    "name",
    "path",
    "connector",
    "plugin_config_format",
    "plugin_config",
    "verbose",
    "benchmark",
    "transforms",
    "streams",
    "max_consecutive_nacks",
    "max_in_flight",
    "on_error",
    "dead_letter",
];

/// Parses one connector file's text. Every problem found is returned; the config
/// is returned only when there is no error (warnings go with it).
pub fn parse_connector_file(
    file: &Path,
    text: &str,
    vars: &EnvVars,
) -> Result<(ConnectorConfig, Vec<ConfigIssue>), ConfigIssues> {
    let mut table: Table = toml::from_str(text).map_err(|error| {
        ConfigIssues(vec![ConfigIssue::error(
            file,
            "",
            format!("not valid TOML: {error}"),
        )])
    })?;
    let mut issues = Vec::new();
    env::apply_connector_overrides(&mut table, vars);
    let config = parse_table(file, &table, &mut issues);
    match config {
        Some(config) if !issues.iter().any(ConfigIssue::is_error) => Ok((config, issues)),
        _ => Err(ConfigIssues(issues)),
    }
}

/// Reads every connector file of `dir` (`*.toml`, not hidden, not `Cargo.toml`)
/// and picks the active version of each key (`.active_versions.toml`, else the
/// highest). Returns the chosen configs and every issue found.
pub fn load_connector_dir(dir: &Path, vars: &EnvVars) -> (Vec<ConnectorConfig>, Vec<ConfigIssue>) {
    let mut issues = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            issues.push(ConfigIssue::error(
                dir,
                "",
                format!("cannot read connector directory: {error}"),
            ));
            return (Vec::new(), issues);
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| is_connector_file(path))
        .collect();
    files.sort();

    let mut versions: BTreeMap<(ConnectorKind, String), BTreeMap<u64, ConnectorConfig>> =
        BTreeMap::new();
    for file in files {
        let text = match fs::read_to_string(&file) {
            Ok(text) => text,
            Err(error) => {
                issues.push(ConfigIssue::error(
                    &file,
                    "",
                    format!("cannot read file: {error}"),
                ));
                continue;
            }
        };
        match parse_connector_file(&file, &text, vars) {
            Ok((config, warnings)) => {
                issues.extend(warnings);
                let by_version = versions
                    .entry((config.kind, config.key.clone()))
                    .or_default();
                if let Some(previous) = by_version.get(&config.version) {
                    issues.push(ConfigIssue::error(
                        &file,
                        "version",
                        format!(
                            "{} \"{}\" version {} is also defined in {}",
                            config.kind,
                            config.key,
                            config.version,
                            previous.origin().display()
                        ),
                    ));
                    continue;
                }
                by_version.insert(config.version, config);
            }
            Err(ConfigIssues(found)) => issues.extend(found),
        }
    }

    let active = read_active_versions(dir, &mut issues);
    let mut chosen = Vec::with_capacity(versions.len());
    for ((kind, key), mut by_version) in versions {
        let pinned = active.get(&(kind, key.clone())).copied();
        let picked = match pinned {
            Some(version) => by_version.remove(&version).or_else(|| {
                issues.push(ConfigIssue::error(
                    &dir.join(ACTIVE_VERSIONS_FILE),
                    format!("{kind}s.{key}"),
                    format!(
                        "active version {version} does not exist (found: {:?})",
                        by_version.keys().collect::<Vec<_>>()
                    ),
                ));
                None
            }),
            None => by_version.pop_last().map(|(_, config)| config),
        };
        chosen.extend(picked);
    }
    (chosen, issues)
}

const ACTIVE_VERSIONS_FILE: &str = ".active_versions.toml";

fn is_connector_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
        return false;
    };
    path.is_file() && name.ends_with(".toml") && !name.starts_with('.') && name != "Cargo.toml"
}

fn read_active_versions(
    dir: &Path,
    issues: &mut Vec<ConfigIssue>,
) -> BTreeMap<(ConnectorKind, String), u64> {
    let path = dir.join(ACTIVE_VERSIONS_FILE);
    let mut active = BTreeMap::new();
    let Ok(text) = fs::read_to_string(&path) else {
        return active;
    };
    let table: Table = match toml::from_str(&text) {
        Ok(table) => table,
        Err(error) => {
            issues.push(ConfigIssue::error(
                &path,
                "",
                format!("not valid TOML: {error}"),
            ));
            return active;
        }
    };
    for (section, kind) in [
        ("sinks", ConnectorKind::Sink),
        ("sources", ConnectorKind::Source),
    ] {
        let Some(Value::Table(entries)) = table.get(section) else {
            continue;
        };
        for (key, version) in entries {
            match version {
                Value::Integer(version) if *version >= 0 => {
                    active.insert((kind, key.clone()), *version as u64);
                }
                other => issues.push(ConfigIssue::error(
                    &path,
                    format!("{section}.{key}"),
                    format!("expected a version number, found {}", describe(other)),
                )),
            }
        }
    }
    active
}

fn parse_table(
    file: &Path,
    table: &Table,
    issues: &mut Vec<ConfigIssue>,
) -> Option<ConnectorConfig> {
    let mut reader = Reader::new(file, table, issues);
    reader.warn_unknown(KNOWN_FIELDS);
    let kind: Option<ConnectorKind> = reader.required_parsed("type");
    let key = reader
        .required_string("key")
        .filter(|key| check_key(&mut reader, key));
    let enabled = reader.bool_or("enabled", true);
    let version = reader.u64_or("version", 0);
    let name = reader.optional_string("name");
    let path = reader.optional_string("path");
    let explicit = reader.optional_string("connector");
    let plugin_config_format = reader.optional_string("plugin_config_format");
    let plugin_config = match reader.optional_table("plugin_config") {
        Some(table) => toml_to_json(&Value::Table(table.clone())),
        None => serde_json::Value::Object(Default::default()),
    };
    let verbose = reader.bool_or("verbose", false);
    let benchmark = reader.bool_or("benchmark", false);
    let transforms = read_transforms(&mut reader);
    let dead_letter = read_dead_letter(&mut reader);

    let kind = kind?;
    let connector = match (explicit, &path) {
        (Some(name), _) => Some(name),
        (None, Some(path)) => Some(connector_name_from_path(path, kind)),
        (None, None) => {
            reader.error(
                "path",
                "missing required field, expected the connector's library path or name",
            );
            None
        }
    };
    let kind_config = match kind {
        ConnectorKind::Source => {
            let streams = read_source_streams(&mut reader);
            let max_consecutive_nacks = read_nack_limit(&mut reader);
            let max_in_flight = read_max_in_flight(&mut reader);
            if reader.get("on_error").is_some() {
                reader.warning("on_error", "only sinks have an on_error policy; ignored");
            }
            KindConfig::Source {
                streams,
                max_consecutive_nacks,
                max_in_flight,
            }
        }
        ConnectorKind::Sink => {
            let streams = read_sink_streams(&mut reader, key.as_deref().unwrap_or(""));
            let on_error = reader.parsed_or("on_error", OnError::Stop);
            if reader.get("max_consecutive_nacks").is_some() {
                reader.warning(
                    "max_consecutive_nacks",
                    "only sources have a NACK limit; ignored",
                );
            }
            if reader.get("max_in_flight").is_some() {
                reader.warning(
                    "max_in_flight",
                    "only sources have batches in flight; ignored",
                );
            }
            if on_error == OnError::Dlq && dead_letter.is_none() {
                reader.error(
                    "on_error",
                    "\"dlq\" needs a [dead_letter] table with stream and topic",
                );
            }
            KindConfig::Sink { streams, on_error }
        }
    };

    let field = if reader.get("connector").is_some() {
        "connector"
    } else {
        "path"
    };
    let connector = connector?;
    check_connector(
        &mut reader,
        field,
        kind,
        &connector,
        &plugin_config,
        enabled,
    );
    check_transforms(&mut reader, &transforms);

    let key = key?;
    Some(ConnectorConfig {
        kind,
        name: name.unwrap_or_else(|| key.clone()),
        key,
        enabled,
        version,
        path: path.unwrap_or_else(|| connector.clone()),
        connector,
        plugin_config_format,
        plugin_config,
        verbose,
        benchmark,
        transforms,
        dead_letter,
        kind_config,
        file: Some(file.to_owned()),
    })
}

fn check_key(reader: &mut Reader, key: &str) -> bool {
    let valid = !key.is_empty()
        && key.chars().all(|character| {
            character.is_ascii_alphanumeric() || character == '_' || character == '-'
        });
    if !valid {
        reader.error(
            "key",
            format!("expected letters, digits, '_' or '-', found \"{key}\""),
        );
    }
    valid
}

fn check_connector(
    reader: &mut Reader,
    field: &str,
    kind: ConnectorKind,
    connector: &str,
    plugin_config: &serde_json::Value,
    enabled: bool,
) {
    let built = match kind {
        ConnectorKind::Source => {
            Registry::source(connector).map(|entry| (entry.build)(plugin_config).map(drop))
        }
        ConnectorKind::Sink => {
            Registry::sink(connector).map(|entry| (entry.build)(plugin_config).map(drop))
        }
    };
    match built {
        // A shared config directory may hold connectors another build runs: a
        // disabled one this binary lacks is only worth a warning.
        Err(error @ RegistryError::NotCompiledIn { .. }) if !enabled => {
            reader.warning(field, format!("{error} (the connector is disabled)"));
        }
        Err(error) => reader.error(field, error.to_string()),
        Ok(Err(error)) => {
            let path = if error.field.is_empty() {
                "plugin_config".to_owned()
            } else {
                format!("plugin_config.{}", error.field)
            };
            reader.error(&path, error.message);
        }
        Ok(Ok(())) => {}
    }
}

fn read_transforms(reader: &mut Reader) -> Vec<(String, serde_json::Value)> {
    let Some(table) = reader.optional_table("transforms") else {
        return Vec::new();
    };
    let mut transforms = Vec::with_capacity(table.len());
    for (kind, config) in table {
        match config {
            Value::Table(_) => transforms.push((kind.clone(), toml_to_json(config))),
            other => reader.error(
                &format!("transforms.{kind}"),
                format!("expected a table, found {}", describe(other)),
            ),
        }
    }
    transforms
}

fn check_transforms(reader: &mut Reader, transforms: &[(String, serde_json::Value)]) {
    // Each transform is checked on its own so every bad one is reported.
    for transform in transforms {
        if let Err(error) = TransformChain::build(std::slice::from_ref(transform)) {
            let path = if error.field.is_empty() {
                format!("transforms.{}", error.transform)
            } else {
                format!("transforms.{}.{}", error.transform, error.field)
            };
            reader.error(&path, error.message);
        }
    }
}

fn read_dead_letter(reader: &mut Reader) -> Option<DeadLetterTarget> {
    let table = reader.optional_table("dead_letter")?;
    let mut nested = reader.nested("dead_letter".into(), table);
    let stream = nested.required_string("stream");
    let topic = nested.required_string("topic");
    nested.warn_unknown(&["stream", "topic"]);
    Some(DeadLetterTarget {
        stream: stream?,
        topic: topic?,
    })
}

/// The most batches a source may have in flight.
pub const MAX_IN_FLIGHT: u32 = 64;

/// Batches in flight for sources that can have several and whose file does
/// not say (`cargo bench --bench engine random_to_iggy_in_flight`, BENCHMARKS.md).
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 4;

fn read_max_in_flight(reader: &mut Reader) -> Option<u32> {
    match reader.get("max_in_flight")? {
        Value::Integer(count) if (1..=i64::from(MAX_IN_FLIGHT)).contains(count) => {
            Some(*count as u32)
        }
        other => {
            let message = format!(
                "expected an integer from 1 to {MAX_IN_FLIGHT}, found {}",
                describe(other)
            );
            reader.error("max_in_flight", message);
            None
        }
    }
}

fn read_nack_limit(reader: &mut Reader) -> Option<u32> {
    match reader.get("max_consecutive_nacks")? {
        Value::Integer(limit) if (0..=i64::from(u32::MAX)).contains(limit) => Some(*limit as u32),
        Value::String(text) if text == "none" => Some(0),
        other => {
            let message = format!(
                "expected a non-negative integer or \"none\" (never stop), found {}",
                describe(other)
            );
            reader.error("max_consecutive_nacks", message);
            None
        }
    }
}

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

fn read_source_streams(reader: &mut Reader) -> Vec<SourceStream> {
    let mut streams = Vec::new();
    for (index, table) in stream_tables(reader).into_iter().enumerate() {
        let mut nested = reader.nested(format!("streams[{index}]"), table);
        nested.warn_unknown(&[
            "stream",
            "topic",
            "schema",
            "batch_length",
            "linger_time",
            "partitions",
            "avro_schema_json",
            "avro_schema_path",
        ]);
        let stream = nested.required_string("stream");
        let topic = nested.required_string("topic");
        let schema = nested.required_parsed("schema");
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

fn read_sink_streams(reader: &mut Reader, key: &str) -> Vec<SinkStream> {
    let mut streams = Vec::new();
    for (index, table) in stream_tables(reader).into_iter().enumerate() {
        let mut nested = reader.nested(format!("streams[{index}]"), table);
        nested.warn_unknown(&[
            "stream",
            "topics",
            "schema",
            "batch_length",
            "poll_interval",
            "consumer_group",
            "avro_schema_json",
            "avro_schema_path",
        ]);
        let stream = nested.required_string("stream");
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
        let schema = nested.required_parsed("schema");
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

/// Converts a TOML value to JSON (date-times become RFC 3339 strings).
pub fn toml_to_json(value: &Value) -> serde_json::Value {
    match value {
        Value::String(text) => serde_json::Value::String(text.clone()),
        Value::Integer(number) => serde_json::Value::from(*number),
        Value::Float(number) => serde_json::Number::from_f64(*number)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Value::Boolean(flag) => serde_json::Value::Bool(*flag),
        Value::Datetime(datetime) => serde_json::Value::String(datetime.to_string()),
        Value::Array(items) => serde_json::Value::Array(items.iter().map(toml_to_json).collect()),
        Value::Table(table) => serde_json::Value::Object(
            table
                .iter()
                .map(|(key, value)| (key.clone(), toml_to_json(value)))
                .collect(),
        ),
    }
}
