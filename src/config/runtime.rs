//! The runtime file (upstream's `config.toml`): `[http]`, `[iggy]`, `[state]`,
//! `[connectors]`, `[logging]`, `[telemetry]`, plus our optional `[engine]`.
//! Defaults are upstream's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;
use toml::Table;

use crate::config::env::{self, EnvVars};
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

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct StateConfig {
    pub path: PathBuf,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("local_state"),
        }
    }
}

/// Where connector configs come from. Upstream's internally tagged table.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "config_type", rename_all = "lowercase")]
pub enum ConnectorsConfig {
    Local {
        #[serde(default)]
        config_dir: PathBuf,
    },
    /// Upstream's HTTP config provider. Parsed so upstream files load; not
    /// supported by `run` yet.
    Http {
        #[serde(default)]
        base_url: String,
    },
}

impl Default for ConnectorsConfig {
    fn default() -> Self {
        ConnectorsConfig::Local {
            config_dir: PathBuf::new(),
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

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct TelemetryConfig {
    pub enabled: bool,
    pub service_name: Option<String>,
}

/// Ours: settings of the engine itself.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct EngineConfig {
    /// How long a stop or shutdown waits for in-flight batches to be committed.
    #[serde(with = "duration")]
    pub shutdown_timeout: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

impl RuntimeConfig {
    /// Loads the runtime file with environment overrides. A missing file means
    /// upstream's defaults (with a warning); a bad field is an error naming it.
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
                issues.push(ConfigIssue::warning(
                    path,
                    "",
                    "file not found, using defaults",
                ));
                Table::new()
            }
            Err(error) => {
                return Err(ConfigIssues(vec![ConfigIssue::error(
                    path,
                    "",
                    format!("cannot read file: {error}"),
                )]));
            }
        };
        let (unknown, invalid) = env::apply_runtime_overrides(&mut table, vars);
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
        let config: RuntimeConfig = match serde_path_to_error::deserialize(table) {
            Ok(config) => config,
            Err(error) => {
                issues.push(ConfigIssue::error(
                    path,
                    error.path().to_string(),
                    error.into_inner().to_string(),
                ));
                return Err(ConfigIssues(issues));
            }
        };
        issues.extend(config.check(path));
        if issues.iter().any(ConfigIssue::is_error) {
            return Err(ConfigIssues(issues));
        }
        Ok((config, issues))
    }

    /// The connector directory (relative paths are relative to the working
    /// directory, as upstream reads them).
    pub fn connector_dir(&self) -> Option<&Path> {
        match &self.connectors {
            ConnectorsConfig::Local { config_dir } if !config_dir.as_os_str().is_empty() => {
                Some(config_dir)
            }
            _ => None,
        }
    }

    fn check(&self, path: &Path) -> Option<ConfigIssue> {
        match &self.connectors {
            ConnectorsConfig::Local { config_dir } if config_dir.as_os_str().is_empty() => {
                Some(ConfigIssue::error(
                    path,
                    "connectors.config_dir",
                    "missing, expected the directory holding the connector files",
                ))
            }
            ConnectorsConfig::Http { .. } => Some(ConfigIssue::error(
                path,
                "connectors.config_type",
                "\"http\" (remote config provider) is not supported by iggy-connect yet; use \"local\"",
            )),
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
