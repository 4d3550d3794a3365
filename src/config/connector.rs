//! Connector files: upstream's per-connector TOML (`type`, `key`, `enabled`,
//! `version`, `name`, `path`, `[[streams]]`, `[plugin_config]`,
//! `[transforms.*]`, ...), plus our optional delivery settings.

use std::path::{Path, PathBuf};

use toml::{Table, Value};

use crate::config::env::EnvVars;
use crate::config::reader::{Reader, describe};
use crate::config::streams::{SinkStream, SourceStream, read_sink_streams, read_source_streams};
use crate::config::{ConfigIssue, ConfigIssues, env};

use crate::config::size::parse_size;
pub use crate::config::streams::{
    DEFAULT_BATCH_LENGTH, DEFAULT_LINGER_TIME, DEFAULT_POLL_INTERVAL,
};
use crate::connectors::registry::{BuildError, Registry, RegistryError, connector_name_from_path};
use crate::connectors::{BatchPolicy, ConnectorKind};
pub use crate::delivery::OnError;
use crate::transforms::TransformChain;

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
        /// Bytes of payload in flight, at most (one batch always may be);
        /// `None` keeps [`DEFAULT_MAX_IN_FLIGHT_BYTES`].
        max_in_flight_bytes: Option<u64>,
    },
    Sink {
        streams: Vec<SinkStream>,
        on_error: OnError,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterTarget {
    pub stream: String,
    pub topic: String,
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
    /// have (`1` for sinks and for sources that stage one batch only).
    pub fn max_in_flight(&self, capability: usize) -> usize {
        let chosen = match &self.kind_config {
            KindConfig::Source { max_in_flight, .. } => {
                max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT)
            }
            KindConfig::Sink { .. } => 1,
        };
        (chosen as usize).min(capability).max(1)
    }

    /// How many payload bytes a source's batches in flight may hold before
    /// it polls another (a batch alone may hold more).
    pub fn max_in_flight_bytes(&self) -> u64 {
        match &self.kind_config {
            KindConfig::Source {
                max_in_flight_bytes,
                ..
            } => max_in_flight_bytes.unwrap_or(DEFAULT_MAX_IN_FLIGHT_BYTES),
            KindConfig::Sink { .. } => u64::MAX,
        }
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
    "max_in_flight_bytes",
    "on_error",
    "dead_letter",
    // `iggy-connect test` reads them; the runtime ignores them.
    "tests",
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

fn parse_table(
    file: &Path,
    table: &Table,
    issues: &mut Vec<ConfigIssue>,
) -> Option<ConnectorConfig> {
    let mut reader = Reader::new(file, table, issues);
    reader.refuse_unknown(KNOWN_FIELDS);
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
            let max_in_flight_bytes = read_max_in_flight_bytes(&mut reader);
            if reader.get("on_error").is_some() {
                reader.warning("on_error", "only sinks have an on_error policy; ignored");
            }
            KindConfig::Source {
                streams,
                max_consecutive_nacks,
                max_in_flight,
                max_in_flight_bytes,
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
            if reader.get("max_in_flight_bytes").is_some() {
                reader.warning(
                    "max_in_flight_bytes",
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
    match Registry::check(kind, connector, plugin_config) {
        // A shared config directory may hold connectors another build runs: a
        // disabled one this binary lacks is only worth a warning.
        Err(BuildError::Registry(error @ RegistryError::NotCompiledIn(_))) if !enabled => {
            reader.warning(field, format!("{error} (the connector is disabled)"));
        }
        Err(BuildError::Registry(error)) => reader.error(field, error.to_string()),
        Err(BuildError::PluginConfig(error)) => {
            for error in error.all() {
                reader.error(&error.path(), error.message.clone());
            }
        }
        Ok(()) => {}
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
                format!(
                    "expected a table, found {}{}",
                    describe(other),
                    if other.is_array() {
                        "; to run one type several times, name each table and give its type: [transforms.NAME] type = \"...\""
                    } else {
                        ""
                    }
                ),
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
    nested.refuse_unknown(&["stream", "topic"]);
    Some(DeadLetterTarget {
        stream: stream?,
        topic: topic?,
    })
}

/// The most batches a source may have in flight.
pub const MAX_IN_FLIGHT: u32 = 64;

/// Batches in flight for sources that can have several and whose file does
/// not say, chosen by measurement (`cargo bench --bench backends --
/// pipeline random_to_iggy_in_flight`, BENCHMARKS.md): on a disk where a state save
/// takes several ms, 16 covered three times the batches per save of 4.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 16;

/// Payload bytes a source's batches in flight hold before it waits for a
/// commit: 16 batches of 1000 records of 1 KB, so small records keep the full
/// window and large ones cannot hold 16 large batches at once.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: u64 = 16 << 20;

/// `max_in_flight_bytes`: a size (`"16MiB"`, `"500KB"`) or a number of bytes.
fn read_max_in_flight_bytes(reader: &mut Reader) -> Option<u64> {
    let expected = "expected a size such as \"16MiB\" or a number of bytes, at least 1";
    let bytes = match reader.get("max_in_flight_bytes")? {
        Value::Integer(bytes) => u64::try_from(*bytes).ok(),
        Value::String(text) => parse_size(text).ok(),
        _ => None,
    };
    match bytes {
        Some(bytes) if bytes > 0 => Some(bytes),
        _ => {
            let found = describe(reader.get("max_in_flight_bytes")?);
            reader.error("max_in_flight_bytes", format!("{expected}, found {found}"));
            None
        }
    }
}

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

/// Converts a TOML value to JSON (date-times become RFC 3339 strings). JSON
/// has no `nan` or `inf`: they stay the strings TOML spells them as, so a
/// number field refuses them (as `null` an optional one took them for unset).
pub fn toml_to_json(value: &Value) -> serde_json::Value {
    match value {
        Value::String(text) => serde_json::Value::String(text.clone()),
        Value::Integer(number) => serde_json::Value::from(*number),
        Value::Float(number) => serde_json::Number::from_f64(*number).map_or_else(
            || serde_json::Value::String(Value::Float(*number).to_string()),
            serde_json::Value::Number,
        ),
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
