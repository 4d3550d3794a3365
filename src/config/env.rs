//! Environment overrides with upstream's names: `IGGY_CONNECTORS_<SECTION>_<FIELD>`
//! for the runtime file, `IGGY_CONNECTORS_{SOURCE|SINK}_<KEY>_<FIELD>` for
//! connector files.

use std::collections::BTreeMap;

use toml::{Table, Value};

pub const PREFIX: &str = "IGGY_CONNECTORS_";

/// A snapshot of the `IGGY_CONNECTORS_*` variables (taken once, so parsing is
/// deterministic and testable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvVars {
    /// Name without the prefix -> value.
    vars: BTreeMap<String, String>,
}

impl EnvVars {
    pub fn from_process() -> Self {
        Self::from_pairs(std::env::vars())
    }

    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        Self {
            vars: pairs
                .into_iter()
                .filter_map(|(name, value)| Some((name.strip_prefix(PREFIX)?.to_owned(), value)))
                .collect(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.vars
            .iter()
            .filter_map(move |(name, value)| Some((name.strip_prefix(prefix)?, value.as_str())))
    }
}

/// The type an override's text is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Str,
    Bool,
    Int,
    Float,
    List,
}

/// Every runtime field that can be overridden: the variable name (without the
/// prefix), the field's path in the file, and its type.
const RUNTIME_FIELDS: &[(&str, &[&str], Kind)] = &[
    ("HTTP_ENABLED", &["http", "enabled"], Kind::Bool),
    ("HTTP_ADDRESS", &["http", "address"], Kind::Str),
    ("HTTP_API_KEY", &["http", "api_key"], Kind::Str),
    (
        "HTTP_HEADER_READ_TIMEOUT",
        &["http", "header_read_timeout"],
        Kind::Str,
    ),
    ("HTTP_IDLE_TIMEOUT", &["http", "idle_timeout"], Kind::Str),
    (
        "HTTP_MAX_CONNECTIONS",
        &["http", "max_connections"],
        Kind::Int,
    ),
    ("HTTP_TAP", &["http", "tap"], Kind::Bool),
    (
        "HTTP_TAP_REDACT_HEADERS",
        &["http", "tap_redact_headers"],
        Kind::List,
    ),
    ("HTTP_UI", &["http", "ui"], Kind::Bool),
    (
        "HTTP_CORS_ENABLED",
        &["http", "cors", "enabled"],
        Kind::Bool,
    ),
    (
        "HTTP_CORS_ALLOWED_METHODS",
        &["http", "cors", "allowed_methods"],
        Kind::List,
    ),
    (
        "HTTP_CORS_ALLOWED_ORIGINS",
        &["http", "cors", "allowed_origins"],
        Kind::List,
    ),
    (
        "HTTP_CORS_ALLOWED_HEADERS",
        &["http", "cors", "allowed_headers"],
        Kind::List,
    ),
    (
        "HTTP_CORS_EXPOSED_HEADERS",
        &["http", "cors", "exposed_headers"],
        Kind::List,
    ),
    (
        "HTTP_CORS_ALLOW_CREDENTIALS",
        &["http", "cors", "allow_credentials"],
        Kind::Bool,
    ),
    (
        "HTTP_CORS_ALLOW_PRIVATE_NETWORK",
        &["http", "cors", "allow_private_network"],
        Kind::Bool,
    ),
    (
        "HTTP_METRICS_ENABLED",
        &["http", "metrics", "enabled"],
        Kind::Bool,
    ),
    (
        "HTTP_METRICS_ENDPOINT",
        &["http", "metrics", "endpoint"],
        Kind::Str,
    ),
    ("HTTP_TLS_ENABLED", &["http", "tls", "enabled"], Kind::Bool),
    (
        "HTTP_TLS_CERT_FILE",
        &["http", "tls", "cert_file"],
        Kind::Str,
    ),
    ("HTTP_TLS_KEY_FILE", &["http", "tls", "key_file"], Kind::Str),
    ("IGGY_ADDRESS", &["iggy", "address"], Kind::Str),
    ("IGGY_USERNAME", &["iggy", "username"], Kind::Str),
    ("IGGY_PASSWORD", &["iggy", "password"], Kind::Str),
    ("IGGY_TOKEN", &["iggy", "token"], Kind::Str),
    ("IGGY_TLS_ENABLED", &["iggy", "tls", "enabled"], Kind::Bool),
    ("IGGY_TLS_CA_FILE", &["iggy", "tls", "ca_file"], Kind::Str),
    ("IGGY_TLS_DOMAIN", &["iggy", "tls", "domain"], Kind::Str),
    // A state store's own fields come with its registration (`extra`).
    ("STATE_TYPE", &["state", "type"], Kind::Str),
    ("STATE_STORAGE", &["state", "storage"], Kind::Str),
    ("STATE_PATH", &["state", "path"], Kind::Str),
    (
        "CONNECTORS_CONFIG_TYPE",
        &["connectors", "config_type"],
        Kind::Str,
    ),
    (
        "CONNECTORS_CONFIG_DIR",
        &["connectors", "config_dir"],
        Kind::Str,
    ),
    (
        "CONNECTORS_BASE_URL",
        &["connectors", "base_url"],
        Kind::Str,
    ),
    ("CONNECTORS_TIMEOUT", &["connectors", "timeout"], Kind::Str),
    (
        "CONNECTORS_RESPONSE_DATA_PATH",
        &["connectors", "response", "data_path"],
        Kind::Str,
    ),
    (
        "CONNECTORS_RESPONSE_ERROR_PATH",
        &["connectors", "response", "error_path"],
        Kind::Str,
    ),
    (
        "CONNECTORS_RETRY_ENABLED",
        &["connectors", "retry", "enabled"],
        Kind::Bool,
    ),
    (
        "CONNECTORS_RETRY_MAX_ATTEMPTS",
        &["connectors", "retry", "max_attempts"],
        Kind::Int,
    ),
    (
        "CONNECTORS_RETRY_INITIAL_BACKOFF",
        &["connectors", "retry", "initial_backoff"],
        Kind::Str,
    ),
    (
        "CONNECTORS_RETRY_MAX_BACKOFF",
        &["connectors", "retry", "max_backoff"],
        Kind::Str,
    ),
    (
        "CONNECTORS_RETRY_BACKOFF_MULTIPLIER",
        &["connectors", "retry", "backoff_multiplier"],
        Kind::Float,
    ),
    ("TELEMETRY_ENABLED", &["telemetry", "enabled"], Kind::Bool),
    (
        "TELEMETRY_SERVICE_NAME",
        &["telemetry", "service_name"],
        Kind::Str,
    ),
    (
        "TELEMETRY_LOGS_TRANSPORT",
        &["telemetry", "logs", "transport"],
        Kind::Str,
    ),
    (
        "TELEMETRY_LOGS_ENDPOINT",
        &["telemetry", "logs", "endpoint"],
        Kind::Str,
    ),
    (
        "TELEMETRY_TRACES_TRANSPORT",
        &["telemetry", "traces", "transport"],
        Kind::Str,
    ),
    (
        "TELEMETRY_TRACES_ENDPOINT",
        &["telemetry", "traces", "endpoint"],
        Kind::Str,
    ),
    ("LOGGING_FORMAT", &["logging", "format"], Kind::Str),
    (
        "ENGINE_SHUTDOWN_TIMEOUT",
        &["engine", "shutdown_timeout"],
        Kind::Str,
    ),
    (
        "ENGINE_MAX_RETRY_AFTER",
        &["engine", "max_retry_after"],
        Kind::Str,
    ),
    (
        "ENGINE_MAX_OPEN_ATTEMPTS",
        &["engine", "max_open_attempts"],
        Kind::Int,
    ),
];

/// Variables that are not runtime fields but are still ours.
const NON_FIELD_VARS: &[&str] = &["CONFIG_PATH", "ENV_PATH"];

/// Applies runtime overrides to the parsed runtime file: its own fields and
/// `extra` ones (a state store's: name without the prefix, path, type).
/// Returns the names of `IGGY_CONNECTORS_*` variables that match nothing
/// (likely typos), and values that do not fit their field as `(name, message)`.
pub fn apply_runtime_overrides(
    table: &mut Table,
    vars: &EnvVars,
    extra: &[(String, Vec<&str>, Kind)],
) -> (Vec<String>, Vec<(String, String)>) {
    let mut unknown = Vec::new();
    let mut invalid = Vec::new();
    for (name, value) in &vars.vars {
        if NON_FIELD_VARS.contains(&name.as_str())
            || name.starts_with("SOURCE_")
            || name.starts_with("SINK_")
        {
            continue;
        }
        let field = RUNTIME_FIELDS
            .iter()
            .find(|(field, _, _)| field == name)
            .map(|(_, path, kind)| (*path, *kind))
            .or_else(|| {
                extra
                    .iter()
                    .find(|(field, _, _)| field == name)
                    .map(|(_, path, kind)| (path.as_slice(), *kind))
            });
        let Some((path, kind)) = field else {
            unknown.push(format!("{PREFIX}{name}"));
            continue;
        };
        match typed(value, kind) {
            Ok(value) => set_path(table, path, value),
            Err(message) => invalid.push((format!("{PREFIX}{name}"), message)),
        }
    }
    (unknown, invalid)
}

/// Applies `IGGY_CONNECTORS_{SOURCE|SINK}_{KEY}_*` overrides to a connector file,
/// for the `type` and `key` the file declares.
pub fn apply_connector_overrides(table: &mut Table, vars: &EnvVars) {
    let (Some(Value::String(kind)), Some(Value::String(key))) =
        (table.get("type"), table.get("key"))
    else {
        return;
    };
    let prefix = format!("{}_{}_", kind.to_uppercase(), key.to_uppercase());
    let overrides: Vec<(String, String)> = vars
        .with_prefix(&prefix)
        .map(|(field, value)| (field.to_owned(), value.to_owned()))
        .collect();
    for (field, value) in overrides {
        apply_connector_field(table, &field, &value);
    }
}

fn apply_connector_field(table: &mut Table, field: &str, value: &str) {
    let plain = |kind| typed(value, kind).ok();
    let top_level = [
        ("ENABLED", Kind::Bool),
        ("NAME", Kind::Str),
        ("PATH", Kind::Str),
        ("VERSION", Kind::Int),
        ("VERBOSE", Kind::Bool),
        ("BENCHMARK", Kind::Bool),
        ("PLUGIN_CONFIG_FORMAT", Kind::Str),
        ("MAX_CONSECUTIVE_NACKS", Kind::Int),
        ("ON_ERROR", Kind::Str),
    ];
    if let Some((name, kind)) = top_level.iter().find(|(name, _)| *name == field) {
        if let Some(parsed) = plain(*kind) {
            table.insert(name.to_lowercase(), parsed);
        }
        return;
    }
    if let Some(plugin_field) = field.strip_prefix("PLUGIN_CONFIG_") {
        // Upstream semantics: a top-level key, lower-cased, value typed by its look.
        let plugin = table
            .entry("plugin_config")
            .or_insert_with(|| Value::Table(Table::new()));
        if let Value::Table(plugin) = plugin {
            plugin.insert(plugin_field.to_lowercase(), guess(value));
        }
        return;
    }
    if let Some(rest) = field.strip_prefix("STREAMS_") {
        let Some((index, stream_field)) = rest.split_once('_') else {
            return;
        };
        let Ok(index) = index.parse::<usize>() else {
            return;
        };
        let kind = match stream_field {
            "TOPICS" | "PROTO_INCLUDE_PATHS" => Kind::List,
            "BATCH_LENGTH" | "PARTITIONS" => Kind::Int,
            _ => Kind::Str,
        };
        let (Some(parsed), Some(Value::Array(streams))) = (plain(kind), table.get_mut("streams"))
        else {
            return;
        };
        if let Some(Value::Table(stream)) = streams.get_mut(index) {
            stream.insert(stream_field.to_lowercase(), parsed);
        }
    }
}

fn typed(value: &str, kind: Kind) -> Result<Value, String> {
    match kind {
        Kind::Str => Ok(Value::String(value.to_owned())),
        Kind::Bool => match value.to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(Value::Boolean(true)),
            "false" | "0" => Ok(Value::Boolean(false)),
            _ => Err(format!("expected true or false, found \"{value}\"")),
        },
        Kind::Int => value
            .trim()
            .parse::<i64>()
            .map(Value::Integer)
            .map_err(|_| format!("expected an integer, found \"{value}\"")),
        Kind::Float => value
            .trim()
            .parse::<f64>()
            .map(Value::Float)
            .map_err(|_| format!("expected a number, found \"{value}\"")),
        Kind::List => Ok(Value::Array(
            value
                .trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(|item| Value::String(item.trim_matches('"').to_owned()))
                .collect(),
        )),
    }
}

/// Upstream's guess for untyped values: bool, then integer, then float, then string.
fn guess(value: &str) -> Value {
    if let Ok(flag) = value.parse::<bool>() {
        Value::Boolean(flag)
    } else if let Ok(number) = value.parse::<i64>() {
        Value::Integer(number)
    } else if let Ok(number) = value.parse::<f64>() {
        Value::Float(number)
    } else {
        Value::String(value.to_owned())
    }
}

fn set_path(table: &mut Table, path: &[&str], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut current = table;
    for parent in parents {
        let entry = current
            .entry(parent.to_string())
            .or_insert_with(|| Value::Table(Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(Table::new());
        }
        let Value::Table(next) = entry else {
            return;
        };
        current = next;
    }
    current.insert(last.to_string(), value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> EnvVars {
        EnvVars::from_pairs(
            pairs
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string())),
        )
    }

    #[test]
    fn given_runtime_overrides_when_applied_should_set_typed_fields_and_report_unknown() {
        let mut table: Table = toml::from_str("[http]\nenabled = true\n").unwrap();
        let (unknown, invalid) = apply_runtime_overrides(
            &mut table,
            &vars(&[
                ("IGGY_CONNECTORS_HTTP_ENABLED", "false"),
                ("IGGY_CONNECTORS_HTTP_API_KEY", "1234"),
                ("IGGY_CONNECTORS_HTTP_CORS_ALLOWED_ORIGINS", "[a, b]"),
                ("IGGY_CONNECTORS_HTTP_ENABLD", "true"),
                ("IGGY_CONNECTORS_CONFIG_PATH", "x.toml"),
                ("IGGY_CONNECTORS_SOURCE_X_ENABLED", "true"),
                ("IGGY_CONNECTORS_STATE_STORE_RETRIES", "7"),
            ]),
            &[(
                "STATE_STORE_RETRIES".to_owned(),
                vec!["state", "store", "retries"],
                Kind::Int,
            )],
        );
        assert_eq!(table["state"]["store"]["retries"], Value::Integer(7));
        assert_eq!(table["http"]["enabled"], Value::Boolean(false));
        assert_eq!(table["http"]["api_key"], Value::String("1234".into()));
        assert_eq!(
            table["http"]["cors"]["allowed_origins"],
            Value::Array(vec![Value::String("a".into()), Value::String("b".into())])
        );
        assert_eq!(unknown, vec!["IGGY_CONNECTORS_HTTP_ENABLD".to_string()]);
        assert!(invalid.is_empty());
    }

    #[test]
    fn given_connector_overrides_when_applied_should_set_fields_streams_and_plugin_config() {
        let mut table: Table = toml::from_str(
            "type = \"sink\"\nkey = \"pg\"\nenabled = true\n[[streams]]\nstream = \"s\"\ntopics = [\"t\"]\nschema = \"json\"\n",
        )
        .unwrap();
        apply_connector_overrides(
            &mut table,
            &vars(&[
                ("IGGY_CONNECTORS_SINK_PG_ENABLED", "false"),
                ("IGGY_CONNECTORS_SINK_PG_STREAMS_0_TOPICS", "[a, b]"),
                ("IGGY_CONNECTORS_SINK_PG_PLUGIN_CONFIG_BATCH_SIZE", "50"),
                ("IGGY_CONNECTORS_SOURCE_PG_ENABLED", "true"),
            ]),
        );
        assert_eq!(table["enabled"], Value::Boolean(false));
        assert_eq!(table["streams"][0]["topics"].as_array().unwrap().len(), 2);
        assert_eq!(table["plugin_config"]["batch_size"], Value::Integer(50));
    }

    #[test]
    fn given_schema_overrides_when_applied_should_set_registry_password_and_include_paths() {
        let mut table: Table = toml::from_str(
            "type = \"source\"\nkey = \"rnd\"\n[[streams]]\nstream = \"s\"\ntopic = \"t\"\nschema = \"avro\"\n",
        )
        .unwrap();
        apply_connector_overrides(
            &mut table,
            &vars(&[
                (
                    "IGGY_CONNECTORS_SOURCE_RND_STREAMS_0_SCHEMA_REGISTRY_PASSWORD",
                    "s3cret",
                ),
                (
                    "IGGY_CONNECTORS_SOURCE_RND_STREAMS_0_PROTO_INCLUDE_PATHS",
                    "[a, b]",
                ),
            ]),
        );
        let stream = &table["streams"][0];
        assert_eq!(stream["schema_registry_password"].as_str(), Some("s3cret"));
        let include_paths: Vec<&str> = stream["proto_include_paths"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(include_paths, ["a", "b"]);
    }
}
