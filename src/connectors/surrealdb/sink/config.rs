//! The `surrealdb` sink's `plugin_config`: upstream's fields and defaults,
//! plus TLS options.

use std::path::PathBuf;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SurrealdbSinkConfig {
    /// SurrealDB's HTTP address: `host:port` (upstream's form; `use_tls`
    /// picks the scheme), or a `http://` / `https://` URL. A `ws://` /
    /// `wss://` URL (the SDKs' form, `/rpc` path allowed) is taken as
    /// `http://` / `https://` on the same host and port.
    pub endpoint: String,
    /// Namespace written to (the `surreal-ns` header).
    pub namespace: String,
    /// Database written to (the `surreal-db` header).
    pub database: String,
    /// Target table (any name: it is sent escaped).
    pub table: String,
    /// User signed in as (Basic auth on every request, checked with
    /// `POST /signin` at open). Needed unless `auth_scope = "none"`.
    #[serde(default)]
    pub username: Option<String>,
    /// That user's password.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub password: Option<SecretString>,
    /// Where the user is defined: `root` (the default), `namespace` (a user of
    /// `namespace`), `database` (a user of `namespace`/`database`), or
    /// `none` (no credentials sent).
    #[serde(default)]
    pub auth_scope: AuthScope,
    /// With `endpoint` as `host:port`: `https` when true, `http` otherwise.
    #[serde(default)]
    pub use_tls: bool,
    /// At open, define what is missing: the namespace (root or no auth),
    /// the database (root, namespace or no auth) and the table
    /// (`DEFINE TABLE IF NOT EXISTS ... SCHEMALESS`). Off: a missing
    /// namespace or database is fatal at open.
    #[serde(default)]
    pub auto_define_table: bool,
    /// With `auto_define_table`: also define the index
    /// `{table}_iggy_offset_idx` on `iggy_stream, iggy_topic,
    /// iggy_partition_id, iggy_offset` (needs `include_metadata`).
    #[serde(default)]
    pub define_indexes: bool,
    /// Most records in one request (one statement per record).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Largest request body in bytes (ours; SurrealDB refuses `/rpc` bodies
    /// over `SURREAL_HTTP_MAX_RPC_BODY_SIZE`, 4 MiB by default): a batch is
    /// split to stay under it, a request answered 413 is split in halves,
    /// and a record too large alone is rejected (`on_error`).
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
    /// How `payload` is stored: `auto` (the default: JSON as a value, text as a string,
    /// anything else base64), `json` (must parse as JSON), `text` (must be
    /// UTF-8), `base64` (alias `binary`).
    #[serde(default)]
    pub payload_format: PayloadFormat,
    /// Store `iggy_stream`, `iggy_topic`, `iggy_partition_id`,
    /// `iggy_offset`, `iggy_timestamp` and `iggy_schema` (as strings, like
    /// upstream).
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Store the message headers as `iggy_headers` (raw values as
    /// `{data: base64, iggy_header_encoding: "base64"}`).
    #[serde(default = "default_true")]
    pub include_headers: bool,
    /// Store `iggy_checksum` (a string).
    #[serde(default = "default_true")]
    pub include_checksum: bool,
    /// Store `iggy_origin_timestamp` (a string, microseconds).
    #[serde(default = "default_true")]
    pub include_origin_timestamp: bool,
    /// Timeout of one HTTP request. A write without an answer in time is
    /// transient: the engine writes it again (its records may be stored
    /// already: a replay ignores them).
    #[serde(default = "default_query_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub query_timeout: Duration,
    /// Engine retry setting: after this many consecutive failed writes (0
    /// counts as 1, like upstream) the engine reports the sink degraded. It
    /// keeps writing what is not stored yet: nothing is dropped.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Engine retry setting: its first wait before writing again (doubling,
    /// with jitter; a longer `Retry-After` is waited instead).
    #[serde(default = "default_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_delay: Duration,
    /// Engine retry setting: its longest wait between writes (at least
    /// `retry_delay`).
    #[serde(default = "default_max_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub max_retry_delay: Duration,
    /// Log every written batch at `info` (otherwise `debug`).
    #[serde(default)]
    pub verbose_logging: bool,
    /// PEM file of CA certificates trusted besides the built-in roots.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// Accept any TLS certificate (development only).
    #[serde(default)]
    pub tls_danger_accept_invalid_certs: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthScope {
    #[default]
    Root,
    Namespace,
    Database,
    None,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PayloadFormat {
    #[default]
    Auto,
    Json,
    Text,
    #[serde(alias = "binary")]
    Base64,
}

fn default_true() -> bool {
    true
}

fn default_batch_size() -> usize {
    1000
}

fn default_max_request_bytes() -> usize {
    4 << 20
}

fn default_query_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_max_retries() -> u32 {
    3
}

fn default_retry_delay() -> Duration {
    Duration::from_millis(100)
}

fn default_max_retry_delay() -> Duration {
    Duration::from_secs(5)
}

impl SurrealdbSinkConfig {
    /// Checks the fields, naming the offending one; the base URL.
    pub fn validate(&self) -> Result<reqwest::Url, PluginConfigError> {
        let url = base_url(&self.endpoint, self.use_tls)?;
        for (field, value) in [
            ("namespace", &self.namespace),
            ("database", &self.database),
            ("table", &self.table),
        ] {
            if value.is_empty() {
                return Err(PluginConfigError::new(
                    field,
                    "expected a name, found an empty string",
                ));
            }
            if value.chars().any(char::is_control) {
                return Err(PluginConfigError::new(
                    field,
                    "a name cannot hold control characters",
                ));
            }
        }
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        if self.max_request_bytes < 1024 {
            return Err(PluginConfigError::new(
                "max_request_bytes",
                "expected at least 1024",
            ));
        }
        if self.auth_scope != AuthScope::None {
            if self.username.as_deref().is_none_or(str::is_empty) {
                return Err(PluginConfigError::new(
                    "username",
                    "needed unless auth_scope = \"none\"",
                ));
            }
            if self.password.is_none() {
                return Err(PluginConfigError::new(
                    "password",
                    "needed unless auth_scope = \"none\"",
                ));
            }
        }
        if self.define_indexes && !self.include_metadata {
            return Err(PluginConfigError::new(
                "define_indexes",
                "the index is on the metadata fields: needs include_metadata = true",
            ));
        }
        Ok(url)
    }

    /// Consecutive failed writes before the engine reports the sink
    /// degraded (upstream raises a `max_retries` of 0 to 1).
    pub fn degraded_after(&self) -> u32 {
        self.max_retries.max(1)
    }
}

/// `endpoint` as an http(s) base URL ending in `/`.
fn base_url(endpoint: &str, use_tls: bool) -> Result<reqwest::Url, PluginConfigError> {
    let endpoint = endpoint.trim();
    if endpoint.is_empty() {
        return Err(PluginConfigError::new(
            "endpoint",
            "expected host:port or an http(s) URL, found an empty string",
        ));
    }
    let text = match endpoint.split_once("://") {
        Some(("ws", rest)) => format!("http://{rest}"),
        Some(("wss", rest)) => format!("https://{rest}"),
        Some(_) => endpoint.to_owned(),
        None => format!("{}://{endpoint}", if use_tls { "https" } else { "http" }),
    };
    let mut url = reqwest::Url::parse(&text).map_err(|error| {
        PluginConfigError::new("endpoint", format!("not a valid address: {error}"))
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(PluginConfigError::new(
            "endpoint",
            format!(
                "expected host:port or an http, https, ws or wss URL, found scheme \"{}\"",
                url.scheme()
            ),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(PluginConfigError::new("endpoint", "no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(PluginConfigError::new(
            "endpoint",
            "credentials do not go in the address: use username and password",
        ));
    }
    // The SDKs' `ws://host:8000/rpc` names the RPC route, not a prefix.
    let path = url.path().trim_end_matches('/');
    let path = path.strip_suffix("/rpc").unwrap_or(path);
    let path = format!("{path}/");
    url.set_path(&path);
    url.set_query(None);
    url.set_fragment(None);
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(value: serde_json::Value) -> Result<SurrealdbSinkConfig, PluginConfigError> {
        let config: SurrealdbSinkConfig = parse_plugin_config(&value)?;
        config.validate()?;
        Ok(config)
    }

    fn minimal() -> serde_json::Value {
        serde_json::json!({
            "endpoint": "127.0.0.1:8000", "namespace": "iggy", "database": "connectors",
            "table": "iggy_messages", "username": "root", "password": "root",
        })
    }

    #[test]
    fn given_upstreams_required_fields_when_parsed_should_take_upstreams_defaults() {
        let config = parse(minimal()).unwrap();
        assert_eq!(config.auth_scope, AuthScope::Root);
        assert_eq!(config.payload_format, PayloadFormat::Auto);
        assert!(!config.auto_define_table && !config.define_indexes && !config.use_tls);
        assert!(config.include_metadata && config.include_headers);
        assert!(config.include_checksum && config.include_origin_timestamp);
        assert_eq!(config.batch_size, 1000);
        assert_eq!(config.max_request_bytes, 4 * 1024 * 1024);
        assert_eq!(config.query_timeout, Duration::from_secs(30));
        assert_eq!(config.degraded_after(), 3);
        assert_eq!(config.retry_delay, Duration::from_millis(100));
        assert_eq!(config.max_retry_delay, Duration::from_secs(5));
    }

    #[test]
    fn given_each_endpoint_form_when_validated_should_give_an_http_base() {
        for (endpoint, tls, expected) in [
            ("127.0.0.1:8000", false, "http://127.0.0.1:8000/"),
            ("db.local:8000", true, "https://db.local:8000/"),
            ("http://h:8000", true, "http://h:8000/"),
            ("ws://h:8000/rpc", false, "http://h:8000/"),
            ("wss://h:8000", false, "https://h:8000/"),
            ("https://h/prefix/", false, "https://h/prefix/"),
        ] {
            let mut value = minimal();
            value["endpoint"] = endpoint.into();
            value["use_tls"] = tls.into();
            let config = parse(value).unwrap();
            assert_eq!(config.validate().unwrap().as_str(), expected, "{endpoint}");
        }
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        for (field, value, named) in [
            ("endpoint", serde_json::json!(""), "endpoint"),
            ("endpoint", serde_json::json!("ftp://h"), "endpoint"),
            ("endpoint", serde_json::json!("http://u:p@h"), "endpoint"),
            ("table", serde_json::json!(""), "table"),
            ("batch_size", serde_json::json!(0), "batch_size"),
            (
                "max_request_bytes",
                serde_json::json!(10),
                "max_request_bytes",
            ),
            ("auth_scope", serde_json::json!("scope"), "auth_scope"),
            ("payload_format", serde_json::json!("xml"), "payload_format"),
            ("username", serde_json::Value::Null, "username"),
        ] {
            let mut config = minimal();
            config[field] = value;
            let error = parse(config).unwrap_err();
            assert_eq!(error.field, named, "{field}: {error}");
        }
        let mut config = minimal();
        config["define_indexes"] = true.into();
        config["include_metadata"] = false.into();
        assert_eq!(parse(config).unwrap_err().field, "define_indexes");
        let mut config = minimal();
        config["auth_scope"] = "none".into();
        config.as_object_mut().unwrap().remove("password");
        parse(config).unwrap();
    }

    #[test]
    fn given_binary_when_parsed_should_be_base64_and_zero_retries_count_as_one() {
        let mut config = minimal();
        config["payload_format"] = "binary".into();
        config["max_retries"] = 0.into();
        let config = parse(config).unwrap();
        assert_eq!(config.payload_format, PayloadFormat::Base64);
        assert_eq!(config.degraded_after(), 1);
    }
}
