//! The `doris` sink's `plugin_config`: upstream's fields and defaults.

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DorisSinkConfig {
    /// Base URL of a Doris frontend's HTTP port (`http://fe:8030`).
    pub fe_url: String,
    /// Target database (`[A-Za-z0-9_]+`); it must exist.
    pub database: String,
    /// Target table (`[A-Za-z0-9_]+`); it must exist (the sink never creates it).
    pub table: String,
    /// User with `LOAD_PRIV` on the table (HTTP basic auth).
    pub username: String,
    /// Password of `username`; a secret.
    #[schemars(with = "String")]
    pub password: SecretString,
    /// Start of every Stream Load label.
    #[serde(default = "default_label_prefix")]
    pub label_prefix: String,
    /// Messages per Stream Load request.
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// Timeout of one request (each redirect hop is one).
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub timeout: Duration,
    /// Timeout of connecting alone.
    #[serde(default = "default_connect_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub connect_timeout: Duration,
    /// Engine retry setting: after this many consecutive failed writes (0
    /// counts as 1) the engine reports the sink degraded. It keeps loading
    /// what is not written yet, the same rows under the same labels:
    /// nothing is dropped.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Engine retry setting: its first wait before loading again (doubling,
    /// capped at `max_retry_delay`; a longer `Retry-After` is waited instead).
    #[serde(default = "default_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_delay: Duration,
    /// Engine retry setting: its longest wait between two writes.
    #[serde(default = "default_max_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub max_retry_delay: Duration,
    /// Sent as the `max_filter_ratio` header (0 to 1): the share of rows
    /// Doris may drop as unfit and still load the rest (they are then lost
    /// without a rejection; the sink warns). Unset: Doris's 0.
    pub max_filter_ratio: Option<f64>,
    /// Sent as the `columns` header (column list and expressions); required
    /// by `csv`, whose fields follow its plain column names in order.
    pub columns: Option<String>,
    /// Sent as the `where` header: a filter Doris applies to the rows.
    #[serde(rename = "where")]
    pub where_clause: Option<String>,
    /// `json` (a JSON array of the payload objects) or `csv` (the columns'
    /// values in `columns` order, `\x01` between fields, `\x02` between rows).
    #[serde(default)]
    pub output_format: OutputFormat,
    /// Follow a redirect from https to http (credentials then cross in clear text).
    #[serde(default)]
    pub allow_insecure_redirect: bool,
    /// When set and not empty, the only redirect targets followed: `host`
    /// (any port) or `host:port`.
    #[serde(default)]
    pub allowed_redirect_hosts: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    #[default]
    Json,
    Csv,
}

impl DorisSinkConfig {
    /// Checks the fields, naming the offending one; the Stream Load URL and
    /// the plain column names (for `csv`).
    pub fn validate(&self) -> Result<(reqwest::Url, Vec<String>), PluginConfigError> {
        let base = reqwest::Url::parse(&self.fe_url).map_err(|error| {
            PluginConfigError::new("fe_url", format!("not a valid URL: {error}"))
        })?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(PluginConfigError::new(
                "fe_url",
                format!("expected an http or https URL, found {}", base.scheme()),
            ));
        }
        for (field, value) in [("database", &self.database), ("table", &self.table)] {
            if value.is_empty()
                || !value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return Err(PluginConfigError::new(
                    field,
                    format!("expected a name of letters, digits and _, found {value:?}"),
                ));
            }
        }
        if self.username.is_empty() {
            return Err(PluginConfigError::new("username", "expected a user name"));
        }
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        if let Some(ratio) = self.max_filter_ratio
            && !(ratio.is_finite() && (0.0..=1.0).contains(&ratio))
        {
            return Err(PluginConfigError::new(
                "max_filter_ratio",
                format!("expected a number from 0 to 1, found {ratio}"),
            ));
        }
        for (field, value) in [("columns", &self.columns), ("where", &self.where_clause)] {
            if let Some(value) = value
                && (value.trim().is_empty() || value.contains(['\r', '\n']))
            {
                return Err(PluginConfigError::new(
                    field,
                    "expected one line of text (it is sent as a header)",
                ));
            }
        }
        let names: Vec<String> = self
            .columns
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|column| !column.is_empty() && !column.contains('='))
            .map(|column| column.trim_matches('`').to_owned())
            .collect();
        if self.output_format == OutputFormat::Csv && names.is_empty() {
            return Err(PluginConfigError::new(
                "columns",
                "required with output_format = \"csv\" (CSV fields are positional)",
            ));
        }
        for (index, host) in self.allowed_redirect_hosts.iter().flatten().enumerate() {
            if host.trim().is_empty() || host.contains(['/', '@']) {
                return Err(PluginConfigError::new(
                    format!("allowed_redirect_hosts[{index}]"),
                    format!("expected host or host:port, found {host:?}"),
                ));
            }
        }
        let path = format!("api/{}/{}/_stream_load", self.database, self.table);
        let url = base.join(&path).map_err(|error| {
            PluginConfigError::new("fe_url", format!("cannot add {path}: {error}"))
        })?;
        Ok((url, names))
    }
}

fn default_label_prefix() -> String {
    "iggy".into()
}

fn default_batch_size() -> u32 {
    1000
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_max_retries() -> u32 {
    3
}

fn default_retry_delay() -> Duration {
    Duration::from_millis(200)
}

fn default_max_retry_delay() -> Duration {
    Duration::from_secs(5)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: serde_json::Value) -> DorisSinkConfig {
        crate::connectors::parse_plugin_config(&value).unwrap()
    }

    fn base() -> serde_json::Value {
        serde_json::json!({"fe_url": "http://fe:8030", "database": "d", "table": "t", "username": "root", "password": ""})
    }

    #[test]
    fn given_upstreams_fields_when_validated_should_build_the_stream_load_url_with_its_defaults() {
        let config = parse(base());
        let (url, _) = config.validate().unwrap();
        assert_eq!(url.as_str(), "http://fe:8030/api/d/t/_stream_load");
        assert_eq!(config.label_prefix, "iggy");
        assert_eq!(config.batch_size, 1000);
        assert_eq!(config.max_retries, 3);
        assert_eq!(config.retry_delay, Duration::from_millis(200));
        assert_eq!(config.connect_timeout, Duration::from_secs(5));
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        for (extra, field) in [
            (serde_json::json!({"table": "../x"}), "table"),
            (serde_json::json!({"database": ""}), "database"),
            (
                serde_json::json!({"max_filter_ratio": 1.5}),
                "max_filter_ratio",
            ),
            (serde_json::json!({"output_format": "csv"}), "columns"),
            (
                serde_json::json!({"output_format": "csv", "columns": "a = 1"}),
                "columns",
            ),
            (serde_json::json!({"where": "a\nb"}), "where"),
            (
                serde_json::json!({"allowed_redirect_hosts": ["http://be"]}),
                "allowed_redirect_hosts[0]",
            ),
        ] {
            let mut config = base();
            config
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let error = parse(config).validate().unwrap_err();
            assert_eq!(error.field, field, "{extra}");
        }
        let (_, names) = parse(serde_json::json!({"fe_url": "http://fe", "database": "d", "table": "t", "username": "u", "password": "p",
            "output_format": "csv", "columns": "id, `name`, total = id * 2"})).validate().unwrap();
        assert_eq!(names, vec!["id", "name"]);
    }
}
