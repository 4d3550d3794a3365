//! The runtime file (upstream's `config.toml`): `[http]`, `[iggy]`, `[state]`,
//! `[connectors]`, `[logging]`, `[telemetry]`, plus our optional `[engine]`.
//! Defaults are upstream's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;
use toml::Table;

use crate::config::env::{self, EnvVars};
use crate::config::state;
pub use crate::config::state::StateConfig;
use crate::config::{ConfigIssue, ConfigIssues, duration};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RuntimeConfig {
    pub http: HttpConfig,
    pub iggy: IggyConfig,
    pub state: StateConfig,
    pub connectors: ConnectorsConfig,
    pub logging: LoggingConfig,
    pub telemetry: TelemetryConfig,
    pub engine: EngineConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct HttpConfig {
    pub enabled: bool,
    pub address: String,
    /// Empty means no authentication.
    pub api_key: SecretString,
    pub cors: CorsConfig,
    pub metrics: MetricsConfig,
    pub tls: HttpTlsConfig,
    /// A client must send a request's complete headers within this time; an
    /// idle keep-alive connection waits no longer for its next request.
    #[serde(with = "duration")]
    pub header_read_timeout: Duration,
    /// A connection on which nothing was read or written for this long while
    /// a request is under way is closed.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// Most open connections to the API, so a flood of connections cannot
    /// take the file descriptors the connectors need. One more closes the
    /// oldest connection on which no request came yet (idle or slowloris)
    /// and takes its place; when every connection carries a request, it is
    /// answered 503 `too_many_connections` and closed.
    pub max_connections: usize,
    /// Serve `GET /{sources|sinks}/{key}/tap`, live samples of messages.
    pub tap: bool,
    /// Header names (any case) whose values a tap shows as `[REDACTED]`.
    pub tap_redact_headers: Vec<String>,
    /// Serve the status page at `/ui`.
    pub ui: bool,
}

impl HttpConfig {
    /// Zero would refuse every connection or close each at once.
    fn check(&self, path: &Path) -> Vec<ConfigIssue> {
        let zero = |field: &str| {
            ConfigIssue::error(path, format!("http.{field}"), "must be greater than 0")
        };
        let mut issues = Vec::new();
        if self.max_connections == 0 {
            issues.push(zero("max_connections"));
        }
        if self.header_read_timeout.is_zero() {
            issues.push(zero("header_read_timeout"));
        }
        if self.idle_timeout.is_zero() {
            issues.push(zero("idle_timeout"));
        }
        issues
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            address: "127.0.0.1:8081".into(),
            api_key: SecretString::from(""),
            cors: CorsConfig::default(),
            metrics: MetricsConfig::default(),
            tls: HttpTlsConfig::default(),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 256,
            tap: true,
            tap_redact_headers: [
                "authorization",
                "cookie",
                "set-cookie",
                "api-key",
                "x-api-key",
            ]
            .map(String::from)
            .to_vec(),
            ui: true,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct CorsConfig {
    pub enabled: bool,
    pub allowed_methods: Vec<String>,
    pub allowed_origins: Vec<String>,
    pub allowed_headers: Vec<String>,
    pub exposed_headers: Vec<String>,
    pub allow_credentials: bool,
    pub allow_private_network: bool,
}

impl Default for CorsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            allowed_methods: ["GET", "POST", "PUT", "DELETE"].map(String::from).into(),
            allowed_origins: vec!["*".into()],
            allowed_headers: vec!["content-type".into()],
            exposed_headers: Vec::new(),
            allow_credentials: false,
            allow_private_network: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct MetricsConfig {
    pub enabled: bool,
    pub endpoint: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            endpoint: "/metrics".into(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct HttpTlsConfig {
    pub enabled: bool,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct IggyConfig {
    pub address: String,
    pub username: String,
    pub password: SecretString,
    /// A personal access token, or `file:<path>` to read it from a file.
    pub token: SecretString,
    pub tls: IggyTlsConfig,
    /// A sink whose topic has messages past its group's stored offsets and
    /// that stored none for this long is degraded (and rebuilds a group whose
    /// partitions are held by members that never commit).
    #[serde(with = "duration")]
    pub sink_stall_timeout: Duration,
    /// Message durability of the topics the runtime creates: `replicated`
    /// (the server's default, acknowledged before it is on disk) or
    /// `persisted` (acknowledged once fsynced).
    pub topic_durability: TopicDurability,
}

/// See [`IggyConfig::topic_durability`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopicDurability {
    #[default]
    Replicated,
    Persisted,
}

impl Default for IggyConfig {
    fn default() -> Self {
        Self {
            address: "localhost:8090".into(),
            username: "iggy".into(),
            password: SecretString::from("iggy"),
            token: SecretString::from(""),
            tls: IggyTlsConfig::default(),
            sink_stall_timeout: Duration::from_secs(60),
            topic_durability: TopicDurability::default(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct IggyTlsConfig {
    pub enabled: bool,
    pub ca_file: Option<PathBuf>,
    pub domain: String,
}

/// Where connector configs come from. Upstream's internally tagged table.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "config_type", rename_all = "lowercase")]
pub enum ConnectorsConfig {
    Local {
        #[serde(default)]
        config_dir: PathBuf,
        /// Ours: reload the directory when its files change (`run --watch`).
        #[serde(default)]
        watch: bool,
    },
    /// Upstream's HTTP config provider: the active connector configs are read
    /// from `GET {base_url}/configs/active` at start and on every reload.
    Http(HttpProviderConfig),
}

/// `[connectors]` with `config_type = "http"`: upstream's fields and defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct HttpProviderConfig {
    pub base_url: String,
    #[serde(with = "duration")]
    pub timeout: Duration,
    pub request_headers: std::collections::BTreeMap<String, String>,
    /// Overrides of the request paths, by upstream's template key; only
    /// `get_active_configs` is read here.
    pub url_templates: std::collections::BTreeMap<String, String>,
    pub response: ProviderResponse,
    pub retry: ProviderRetry,
    /// Ours: with `run --watch`, how often the active configs are read again.
    #[serde(with = "duration")]
    pub watch_interval: Duration,
}

impl Default for HttpProviderConfig {
    fn default() -> Self {
        Self {
            base_url: String::new(),
            timeout: Duration::from_secs(10),
            request_headers: Default::default(),
            url_templates: Default::default(),
            response: ProviderResponse::default(),
            retry: ProviderRetry::default(),
            watch_interval: Duration::from_secs(10),
        }
    }
}

/// Where the payload (and an error) sit in the provider's answers: dot paths,
/// numeric segments index arrays.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ProviderResponse {
    pub data_path: Option<String>,
    pub error_path: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct ProviderRetry {
    pub enabled: bool,
    pub max_attempts: u32,
    #[serde(with = "duration")]
    pub initial_backoff: Duration,
    #[serde(with = "duration")]
    pub max_backoff: Duration,
    pub backoff_multiplier: f64,
}

impl Default for ProviderRetry {
    fn default() -> Self {
        Self {
            enabled: true,
            max_attempts: 3,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            backoff_multiplier: 2.0,
        }
    }
}

impl Default for ConnectorsConfig {
    fn default() -> Self {
        ConnectorsConfig::Local {
            config_dir: PathBuf::new(),
            watch: false,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct LoggingConfig {
    #[serde(deserialize_with = "log_format")]
    pub format: LogFormat,
}

/// Upstream's `[telemetry]`: OTLP export of the runtime's logs and traces
/// (src/telemetry.rs).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct TelemetryConfig {
    pub enabled: bool,
    /// `service.name` of the exported resource; upstream's default when unset.
    pub service_name: Option<String>,
    pub logs: OtlpExport,
    pub traces: OtlpExport,
}

impl TelemetryConfig {
    pub fn service_name(&self) -> &str {
        self.service_name.as_deref().unwrap_or("iggy-connectors")
    }
}

/// Where one signal is exported.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct OtlpExport {
    pub transport: OtlpTransport,
    /// gRPC: the collector's address (`http://host:4317`); HTTP: the URL
    /// posted to, `/v1/logs` or `/v1/traces` appended when it has no path.
    pub endpoint: String,
}

impl Default for OtlpExport {
    fn default() -> Self {
        Self {
            transport: OtlpTransport::Grpc,
            endpoint: "http://localhost:4317".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OtlpTransport {
    /// OTLP/gRPC (tonic).
    Grpc,
    /// OTLP/HTTP with protobuf bodies.
    Http,
}

/// Ours: settings of the engine itself.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct EngineConfig {
    /// How long a stop or shutdown waits for in-flight batches to be committed.
    #[serde(with = "duration")]
    pub shutdown_timeout: Duration,
    /// The longest wait a backend's `Retry-After` (or throttling hint) is
    /// honoured for; a longer one is waited this long, then tried again.
    #[serde(with = "duration")]
    pub max_retry_after: Duration,
    /// Attempts to open a connector whose backend is unreachable before it
    /// stops with `start_failed`; unset (the default) retries until stopped.
    pub max_open_attempts: Option<u32>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            shutdown_timeout: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(600),
            max_open_attempts: None,
        }
    }
}

impl RuntimeConfig {
    /// Loads the runtime file with environment overrides. A missing file, an
    /// unknown key (with the nearest known name) and a bad field are errors
    /// naming the file and the field; every error found is reported, not only
    /// the first. A relative `config_dir` is resolved here (see
    /// [`resolve_config_dir`]), so `validate` and `run` read the same one.
    pub fn load(path: &Path, vars: &EnvVars) -> Result<(Self, Vec<ConfigIssue>), ConfigIssues> {
        let mut issues = Vec::new();
        let mut table = match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str::<Table>(&text).map_err(|error| {
                ConfigIssues(vec![ConfigIssue::error(
                    path,
                    "",
                    format!("not valid TOML: {error}"),
                )])
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(ConfigIssues(vec![ConfigIssue::error(
                    path,
                    "",
                    "file not found",
                )]));
            }
            Err(error) => {
                return Err(ConfigIssues(vec![ConfigIssue::error(
                    path,
                    "",
                    format!("cannot read file: {error}"),
                )]));
            }
        };
        unknown_keys(path, &table, "", KNOWN_KEYS, &mut issues);
        if let Some(toml::Value::Table(state)) = table.get("state") {
            unknown_state_keys(path, state, "", &state::known_keys(), &mut issues);
        }
        let (unknown, invalid) =
            env::apply_runtime_overrides(&mut table, vars, &state::env_fields());
        for name in unknown {
            issues.push(ConfigIssue::warning(
                path,
                "",
                format!("environment variable {name} matches no setting; ignored"),
            ));
        }
        for (name, message) in invalid {
            issues.push(ConfigIssue::error(
                path,
                "",
                format!("environment variable {name}: {message}"),
            ));
        }
        let mut config: RuntimeConfig = match serde_path_to_error::deserialize(table.clone()) {
            Ok(config) => config,
            Err(_) => {
                // One error per section at least: each is read on its own.
                for (name, value) in &table {
                    let mut one = Table::new();
                    one.insert(name.clone(), value.clone());
                    if let Err(error) = serde_path_to_error::deserialize::<_, RuntimeConfig>(one) {
                        issues.push(ConfigIssue::error(
                            path,
                            error.path().to_string(),
                            error.into_inner().to_string(),
                        ));
                    }
                }
                return Err(ConfigIssues(issues));
            }
        };
        issues.extend(config.check(path));
        issues.extend(config.http.check(path));
        issues.extend(config.state.check(path));
        issues.extend(check_address(path, "http.address", &config.http.address));
        issues.extend(check_address(path, "iggy.address", &config.iggy.address));
        if let ConnectorsConfig::Local { config_dir, .. } = &mut config.connectors
            && !config_dir.as_os_str().is_empty()
        {
            match resolve_config_dir(path, config_dir) {
                Ok(resolved) => *config_dir = resolved,
                Err(issue) => issues.push(issue),
            }
        }
        if issues.iter().any(ConfigIssue::is_error) {
            return Err(ConfigIssues(issues));
        }
        Ok((config, issues))
    }

    /// Whether `[connectors] watch = true` asks to reload on file changes.
    pub fn watch(&self) -> bool {
        matches!(self.connectors, ConnectorsConfig::Local { watch: true, .. })
    }

    /// The connector directory, as [`load`](Self::load) resolved it.
    pub fn connector_dir(&self) -> Option<&Path> {
        match &self.connectors {
            ConnectorsConfig::Local { config_dir, .. } if !config_dir.as_os_str().is_empty() => {
                Some(config_dir)
            }
            _ => None,
        }
    }

    fn check(&self, path: &Path) -> Option<ConfigIssue> {
        match &self.connectors {
            ConnectorsConfig::Local { config_dir, .. } if config_dir.as_os_str().is_empty() => {
                Some(ConfigIssue::error(
                    path,
                    "connectors.config_dir",
                    "missing, expected the directory holding the connector files",
                ))
            }
            ConnectorsConfig::Http(http) if !http.base_url.starts_with("http") => {
                Some(ConfigIssue::error(
                    path,
                    "connectors.base_url",
                    format!(
                        "\"{}\" is not an http:// or https:// URL (config_type = \"http\" reads the connector configs from it)",
                        http.base_url
                    ),
                ))
            }
            ConnectorsConfig::Http(_) => None,
            ConnectorsConfig::Local { .. } => None,
        }
    }
}

/// Upstream accepts the format case-insensitively.
fn log_format<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<LogFormat, D::Error> {
    let text = String::deserialize(deserializer)?;
    match text.to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(serde::de::Error::custom(format!(
            "expected \"text\" or \"json\", found \"{text}\""
        ))),
    }
}

/// Where a relative `config_dir` is looked for: the working directory first
/// (upstream reads it from there, and its example relies on that), then the
/// directory of the config file. A directory found in neither is an error
/// naming both places, for `validate` and `run` alike (nothing is created).
pub fn resolve_config_dir(file: &Path, config_dir: &Path) -> Result<PathBuf, ConfigIssue> {
    let mut tried = vec![config_dir.to_owned()];
    if config_dir.is_relative()
        && let Some(parent) = file
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
    {
        tried.push(parent.join(config_dir));
    }
    if let Some(found) = tried.iter().find(|dir| dir.is_dir()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = tried
        .iter()
        .enumerate()
        .map(|(index, dir)| match index {
            0 if config_dir.is_relative() => {
                format!("{} (from the working directory)", dir.display())
            }
            0 => dir.display().to_string(),
            _ => format!("{} (next to the config file)", dir.display()),
        })
        .collect();
    Err(ConfigIssue::error(
        file,
        "connectors.config_dir",
        format!("directory not found; looked in {}", looked.join(" and ")),
    ))
}

/// `host:port` as the listener and the client take it: a port number and a
/// host without spaces (a name is resolved only when used).
fn check_address(file: &Path, field: &str, address: &str) -> Option<ConfigIssue> {
    if address.parse::<std::net::SocketAddr>().is_ok() {
        return None;
    }
    let valid = address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.contains(char::is_whitespace)
            && !host.contains(['/', '[', ']'])
            && port.parse::<u16>().is_ok()
    });
    (!valid).then(|| {
        ConfigIssue::error(
            file,
            field,
            format!("\"{address}\" is not an address: expected host:port (e.g. 127.0.0.1:8081)"),
        )
    })
}

/// The keys each table of the runtime file may hold, upstream's included
/// (`[telemetry]` and the HTTP config provider's settings are accepted even
/// where iggy-connect does not use them). `*` marks a table of free keys.
struct Key(&'static str, Known);
type Known = &'static [Key];

const fn leaf(name: &'static str) -> Key {
    Key(name, &[])
}

const FREE: Known = &[leaf("*")];
const KNOWN_KEYS: Known = &[
    Key("http", HTTP),
    Key("iggy", IGGY),
    // The keys of the state stores compiled in: see `unknown_state_keys`.
    Key("state", FREE),
    Key("connectors", CONNECTORS),
    Key("logging", &[leaf("format")]),
    Key("telemetry", TELEMETRY),
    Key(
        "engine",
        &[
            leaf("shutdown_timeout"),
            leaf("max_retry_after"),
            leaf("max_open_attempts"),
        ],
    ),
];
const HTTP: Known = &[
    leaf("enabled"),
    leaf("address"),
    leaf("api_key"),
    leaf("header_read_timeout"),
    leaf("idle_timeout"),
    leaf("max_connections"),
    leaf("tap"),
    leaf("tap_redact_headers"),
    leaf("ui"),
    Key(
        "cors",
        &[
            leaf("enabled"),
            leaf("allowed_methods"),
            leaf("allowed_origins"),
            leaf("allowed_headers"),
            leaf("exposed_headers"),
            leaf("allow_credentials"),
            leaf("allow_private_network"),
        ],
    ),
    Key("metrics", &[leaf("enabled"), leaf("endpoint")]),
    Key(
        "tls",
        &[leaf("enabled"), leaf("cert_file"), leaf("key_file")],
    ),
];
const IGGY: Known = &[
    leaf("address"),
    leaf("username"),
    leaf("password"),
    leaf("token"),
    leaf("sink_stall_timeout"),
    leaf("topic_durability"),
    Key("tls", &[leaf("enabled"), leaf("ca_file"), leaf("domain")]),
];
const CONNECTORS: Known = &[
    leaf("config_type"),
    leaf("config_dir"),
    leaf("watch"),
    leaf("base_url"),
    leaf("timeout"),
    Key("request_headers", FREE),
    Key("url_templates", FREE),
    Key("response", &[leaf("data_path"), leaf("error_path")]),
    Key(
        "retry",
        &[
            leaf("enabled"),
            leaf("max_attempts"),
            leaf("initial_backoff"),
            leaf("max_backoff"),
            leaf("backoff_multiplier"),
        ],
    ),
    leaf("watch_interval"),
];
const OTLP: Known = &[leaf("transport"), leaf("endpoint")];
const TELEMETRY: Known = &[
    leaf("enabled"),
    leaf("service_name"),
    Key("logs", OTLP),
    Key("traces", OTLP),
];

/// An error for every key of `table` that `known` does not list, with the
/// nearest known name when one is close.
fn unknown_keys(
    file: &Path,
    table: &Table,
    prefix: &str,
    known: Known,
    issues: &mut Vec<ConfigIssue>,
) {
    if known.iter().any(|Key(name, _)| *name == "*") {
        return;
    }
    for (key, value) in table {
        let field = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match known.iter().find(|Key(name, _)| name == key) {
            Some(Key(_, nested)) => {
                if let toml::Value::Table(nested_table) = value
                    && !nested.is_empty()
                {
                    unknown_keys(file, nested_table, &field, nested, issues);
                }
            }
            None => {
                let names: Vec<&str> = known.iter().map(|Key(name, _)| *name).collect();
                let hint = match crate::config::reader::nearest(key, &names) {
                    Some(name) => format!("; did you mean `{name}`?"),
                    None => format!("; expected one of {}", names.join(", ")),
                };
                issues.push(ConfigIssue::error(
                    file,
                    field,
                    format!("unknown key `{key}`{hint}"),
                ));
            }
        }
    }
}

/// An error for every key of `[state]` that is not one of `known` (dotted
/// paths below `[state]`; `a.*` a table of free keys), with the nearest known
/// name when one is close.
fn unknown_state_keys(
    file: &Path,
    table: &Table,
    prefix: &str,
    known: &[&str],
    issues: &mut Vec<ConfigIssue>,
) {
    if known.contains(&format!("{prefix}*").as_str()) {
        return;
    }
    for (key, value) in table {
        let path = format!("{prefix}{key}");
        let nested = format!("{path}.");
        match value {
            toml::Value::Table(inner) if known.iter().any(|name| name.starts_with(&nested)) => {
                unknown_state_keys(file, inner, &nested, known, issues);
            }
            _ if known.contains(&path.as_str()) => {}
            _ => {
                let names: Vec<&str> = known
                    .iter()
                    .filter_map(|name| name.strip_prefix(prefix))
                    .map(|name| name.split('.').next().unwrap_or(name))
                    .fold(Vec::new(), |mut names, name| {
                        if !names.contains(&name) {
                            names.push(name);
                        }
                        names
                    });
                let hint = match crate::config::reader::nearest(key, &names) {
                    Some(name) => format!("; did you mean `{name}`?"),
                    None => format!("; expected one of {}", names.join(", ")),
                };
                issues.push(ConfigIssue::error(
                    file,
                    format!("state.{path}"),
                    format!("unknown key `{key}`{hint}"),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `text` as `config.toml` in a new directory that also holds an
    /// empty `connectors` directory.
    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("connectors")).unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn with_dir(dir: &tempfile::TempDir, rest: &str) -> String {
        format!(
            "[connectors]\nconfig_type = \"local\"\nconfig_dir = \"{}\"\n{rest}",
            dir.path().join("connectors").display()
        )
    }

    fn errors(path: &Path) -> Vec<ConfigIssue> {
        match RuntimeConfig::load(path, &EnvVars::default()) {
            Ok((_, issues)) => issues,
            Err(found) => found.0,
        }
        .into_iter()
        .filter(ConfigIssue::is_error)
        .collect()
    }

    #[test]
    fn given_misspelt_keys_when_loaded_should_name_each_with_the_nearest_known_name() {
        let (dir, path) = file("");
        let text = with_dir(
            &dir,
            "[iggy]\nadress = \"localhost:8090\"\npasword = \"x\"\n\
             [logging]\nformatt = \"json\"\n[engine]\nshutdown_timout = \"1s\"\n\
             [state]\nbogus = 1\n[http.cors]\nallowed_orgins = []\n",
        );
        std::fs::write(&path, text).unwrap();
        let found = errors(&path);
        let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
        for (field, hint) in [
            ("iggy.adress", "did you mean `address`?"),
            ("iggy.pasword", "did you mean `password`?"),
            ("logging.formatt", "did you mean `format`?"),
            ("engine.shutdown_timout", "did you mean `shutdown_timeout`?"),
            ("state.bogus", "expected one of type, storage, path"),
            (
                "http.cors.allowed_orgins",
                "did you mean `allowed_origins`?",
            ),
        ] {
            assert!(
                found
                    .iter()
                    .any(|issue| issue.field == field && issue.message.contains(hint)),
                "{field}: {shown:?}"
            );
        }
        assert_eq!(found.len(), 6, "{shown:?}");
        assert!(shown[0].contains("config.toml"), "{shown:?}");
    }

    #[test]
    fn given_every_upstream_key_when_loaded_should_accept_them() {
        let (dir, path) = file("");
        let text = format!(
            "{}\n{}",
            include_str!("../../tests/fixtures/upstream_runtime_all_keys.toml"),
            with_dir(
                &dir,
                "timeout = \"10s\"\nbase_url = \"\"\n\
                 [connectors.request_headers]\nx-any = \"1\"\n\
                 [connectors.url_templates]\nget_source = \"/s\"\n\
                 [connectors.response]\ndata_path = \"data\"\nerror_path = \"error\"\n\
                 [connectors.retry]\nenabled = true\nmax_attempts = 3\ninitial_backoff = \"1s\"\n\
                 max_backoff = \"30s\"\nbackoff_multiplier = 2\n",
            )
        );
        std::fs::write(&path, text).unwrap();
        assert_eq!(errors(&path), Vec::new());
    }

    #[test]
    fn given_bad_values_in_several_sections_when_loaded_should_report_each() {
        let (dir, path) = file("");
        let text = with_dir(
            &dir,
            "[http]\nenabled = \"yes\"\n[iggy]\nusername = 5\n[logging]\nformat = \"xml\"\n",
        );
        std::fs::write(&path, text).unwrap();
        let fields: Vec<String> = errors(&path).into_iter().map(|issue| issue.field).collect();
        assert_eq!(
            fields,
            ["http.enabled", "iggy.username", "logging.format"],
            "{fields:?}"
        );
    }

    #[test]
    fn given_the_api_connection_limits_when_loaded_should_read_them_and_refuse_zero() {
        let (dir, path) = file("");
        let text = with_dir(
            &dir,
            "[http]
max_connections = 8
header_read_timeout = \"2s\"
idle_timeout = \"5s\"
",
        );
        std::fs::write(&path, text).unwrap();
        let (config, _) = RuntimeConfig::load(&path, &EnvVars::default()).unwrap();
        assert_eq!(
            (
                config.http.max_connections,
                config.http.header_read_timeout,
                config.http.idle_timeout
            ),
            (8, Duration::from_secs(2), Duration::from_secs(5))
        );
        let text = with_dir(
            &dir,
            "[http]
max_connections = 0
header_read_timeout = \"0s\"
",
        );
        std::fs::write(&path, text).unwrap();
        let fields: Vec<String> = errors(&path).into_iter().map(|issue| issue.field).collect();
        assert_eq!(
            fields,
            ["http.max_connections", "http.header_read_timeout"],
            "{fields:?}"
        );
    }

    #[test]
    fn given_a_telemetry_section_when_loaded_should_read_upstreams_fields_and_defaults() {
        let (dir, path) = file("");
        let text = with_dir(
            &dir,
            "[telemetry]\nenabled = true\n[telemetry.traces]\ntransport = \"http\"\n\
             endpoint = \"http://127.0.0.1:4318\"\n",
        );
        std::fs::write(&path, text).unwrap();
        let (config, _) = RuntimeConfig::load(&path, &EnvVars::default()).unwrap();
        let telemetry = config.telemetry;
        assert!(telemetry.enabled);
        assert_eq!(telemetry.service_name(), "iggy-connectors");
        assert_eq!(telemetry.traces.transport, OtlpTransport::Http);
        assert_eq!(telemetry.traces.endpoint, "http://127.0.0.1:4318");
        assert_eq!(telemetry.logs.transport, OtlpTransport::Grpc);
        assert_eq!(telemetry.logs.endpoint, "http://localhost:4317");

        let text = with_dir(&dir, "[telemetry.logs]\ntransport = \"udp\"\n");
        std::fs::write(&path, text).unwrap();
        let found = errors(&path);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].field, "telemetry.logs.transport");
        assert!(found[0].message.contains("grpc"), "{}", found[0].message);
    }

    #[test]
    fn given_addresses_run_cannot_use_when_loaded_should_refuse_them() {
        let (dir, path) = file("");
        let text = with_dir(
            &dir,
            "[http]\naddress = \"not-an-addr\"\n[iggy]\naddress = \"localhost:99999\"\n",
        );
        std::fs::write(&path, text).unwrap();
        let fields: Vec<String> = errors(&path).into_iter().map(|issue| issue.field).collect();
        assert_eq!(fields, ["http.address", "iggy.address"]);
        for good in [
            "127.0.0.1:0",
            "[::1]:8081",
            "localhost:8090",
            "iggy.example:8090",
        ] {
            assert_eq!(check_address(&path, "http.address", good), None, "{good}");
        }
    }

    #[test]
    fn given_a_relative_config_dir_when_resolved_should_try_the_working_directory_then_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("connectors-{}", uuid::Uuid::new_v4().simple());
        let path = dir.path().join("config.toml");
        std::fs::write(
            &path,
            format!("[connectors]\nconfig_type = \"local\"\nconfig_dir = \"{name}\"\n"),
        )
        .unwrap();
        // In neither place: one error naming both.
        let found = errors(&path);
        assert_eq!(found.len(), 1, "{found:?}");
        let message = found[0].to_string();
        assert!(
            message.contains(&format!("{name} (from the working directory)")),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "{} (next to the config file)",
                dir.path().join(&name).display()
            )),
            "{message}"
        );
        assert!(!Path::new(&name).exists(), "nothing is created");
        // Next to the config file: found there.
        std::fs::create_dir(dir.path().join(&name)).unwrap();
        let (config, _) = RuntimeConfig::load(&path, &EnvVars::default()).unwrap();
        assert_eq!(
            config.connector_dir(),
            Some(dir.path().join(&name).as_path())
        );
    }

    #[test]
    fn given_no_config_file_when_loaded_should_be_one_plain_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.toml");
        let found = match RuntimeConfig::load(&path, &EnvVars::default()) {
            Ok((_, issues)) => issues,
            Err(found) => found.0,
        };
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].is_error());
        assert!(
            found[0].to_string().contains("file not found"),
            "{}",
            found[0]
        );
    }
}
