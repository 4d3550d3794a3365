//! Upstream's HTTP config provider (`[connectors] config_type = "http"`):
//! the active connector configs come from `GET {base_url}/configs/active`
//! (or its `url_templates` override) as `{"sinks": {key: config},
//! "sources": {key: config}}`, optionally inside an envelope (`data_path`,
//! `error_path`). Each config is upstream's connector JSON and is checked
//! like a connector file; issues name `URL#sinks.KEY` as the file. As
//! upstream, no environment overrides apply to these configs.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::config::connector::parse_connector_file;
use crate::config::env::EnvVars;
use crate::config::runtime::HttpProviderConfig;
use crate::config::{ConfigIssue, ConnectorConfig};

#[derive(Debug, thiserror::Error)]
pub enum ProviderFetchError {
    #[error("config provider {url}: {reason}")]
    Request { url: String, reason: String },
    #[error("config provider {url} answered an error at `{path}`: {error}")]
    Refused {
        url: String,
        path: String,
        error: Value,
    },
    #[error("config provider {url}: {reason}")]
    Shape { url: String, reason: String },
}

/// The active configs and the issues found in them.
pub async fn active_configs(
    provider: &HttpProviderConfig,
) -> Result<(Vec<ConnectorConfig>, Vec<ConfigIssue>), ProviderFetchError> {
    let template = provider
        .url_templates
        .get("get_active_configs")
        .map_or("/configs/active", String::as_str);
    let url = format!("{}{template}", provider.base_url.trim_end_matches('/'));
    let body = fetch(provider, &url).await?;
    let shape = |reason: String| ProviderFetchError::Shape {
        url: url.clone(),
        reason,
    };
    if let Some(path) = &provider.response.error_path
        && let Some(error) = at_path(&body, path).filter(|error| !error.is_null())
    {
        return Err(ProviderFetchError::Refused {
            url,
            path: path.clone(),
            error: error.clone(),
        });
    }
    let data = match &provider.response.data_path {
        Some(path) => at_path(&body, path)
            .ok_or_else(|| shape(format!("no `{path}` (data_path) in the answer")))?,
        None => &body,
    };
    let mut configs = Vec::new();
    let mut issues = Vec::new();
    for (section, kind) in [("sources", "source"), ("sinks", "sink")] {
        let entries = match data.get(section) {
            None | Some(Value::Null) => continue,
            Some(Value::Object(entries)) => entries,
            Some(other) => {
                return Err(shape(format!(
                    "`{section}` is {other}, expected an object by key"
                )));
            }
        };
        for (key, config) in entries {
            let origin = PathBuf::from(format!("{url}#{section}.{key}"));
            match connector(kind, key, config, &origin) {
                Ok((config, warnings)) => {
                    configs.push(config);
                    issues.extend(warnings);
                }
                Err(found) => issues.extend(found),
            }
        }
    }
    Ok((configs, issues))
}

/// One connector's JSON as a connector file, checked as one.
fn connector(
    kind: &str,
    key: &str,
    config: &Value,
    origin: &std::path::Path,
) -> Result<(ConnectorConfig, Vec<ConfigIssue>), Vec<ConfigIssue>> {
    let Value::Object(fields) = config else {
        return Err(vec![ConfigIssue::error(
            origin,
            "",
            "expected a connector config object",
        )]);
    };
    let mut fields = fields.clone();
    fields.insert("type".into(), Value::from(kind));
    fields.entry("key").or_insert_with(|| Value::from(key));
    let table = toml::Value::try_from(without_nulls(Value::Object(fields)))
        .map_err(|error| vec![ConfigIssue::error(origin, "", error.to_string())])?;
    let text = toml::to_string(&table)
        .map_err(|error| vec![ConfigIssue::error(origin, "", error.to_string())])?;
    let (config, warnings) =
        parse_connector_file(origin, &text, &EnvVars::default()).map_err(|issues| issues.0)?;
    if config.key != key {
        return Err(vec![ConfigIssue::error(
            origin,
            "key",
            format!("\"{}\" under the key \"{key}\"", config.key),
        )]);
    }
    Ok((config, warnings))
}

/// TOML has no null: a null field is an absent one.
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .filter(|(_, field)| !field.is_null())
                .map(|(name, field)| (name, without_nulls(field)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// A dot path; numeric segments index arrays.
fn at_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .filter(|segment| !segment.is_empty())
        .try_fold(value, |value, segment| match value {
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?),
            other => other.get(segment),
        })
}

/// GET with the provider's headers and timeout; connection errors, timeouts,
/// 429 and 5xx retried with backoff when `retry.enabled`.
async fn fetch(provider: &HttpProviderConfig, url: &str) -> Result<Value, ProviderFetchError> {
    let failed = |reason: String| ProviderFetchError::Request {
        url: url.to_owned(),
        reason,
    };
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in &provider.request_headers {
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|error| failed(format!("request_headers: \"{name}\": {error}")))?;
        let value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|error| failed(format!("request_headers.{name}: {error}")))?;
        headers.insert(name, value);
    }
    let client = reqwest::Client::builder()
        .timeout(provider.timeout)
        .default_headers(headers)
        .build()
        .map_err(|error| failed(error.to_string()))?;
    let retry = &provider.retry;
    let attempts = if retry.enabled {
        retry.max_attempts + 1
    } else {
        1
    };
    let mut wait = retry.initial_backoff;
    let mut last = String::new();
    for attempt in 1..=attempts {
        if attempt > 1 {
            tokio::time::sleep(wait).await;
            wait = Duration::from_secs_f64(
                (wait.as_secs_f64() * retry.backoff_multiplier)
                    .min(retry.max_backoff.as_secs_f64()),
            );
        }
        let response = match client.get(url).send().await {
            Ok(response) => response,
            Err(error) => {
                last = error.to_string();
                continue;
            }
        };
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if status.is_success() {
            return serde_json::from_str(&text)
                .map_err(|error| failed(format!("the answer is not JSON: {error}")));
        }
        last = format!("HTTP {status} - {text}");
        if !(status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS) {
            break;
        }
    }
    Err(failed(last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn given_dot_paths_when_read_should_index_objects_and_arrays() {
        let value = json!({"a": {"b": [{"c": 1}, {"c": 2}]}});
        assert_eq!(at_path(&value, "a.b.1.c"), Some(&json!(2)));
        assert_eq!(at_path(&value, "a.x"), None);
        assert_eq!(at_path(&value, "a.b.9"), None);
    }

    #[test]
    fn given_upstreams_connector_json_when_read_should_be_a_connector_config() {
        let origin = PathBuf::from("http://p/configs/active#sinks.out");
        let config = json!({
            "key": "out", "enabled": true, "version": 3, "name": "Out",
            "path": "libiggy_connector_stdout_sink", "plugin_config_format": null,
            "streams": [{"stream": "s", "topics": ["t"], "schema": "json", "batch_length": 100, "poll_interval": "5ms", "consumer_group": "g"}],
            "plugin_config": {"print_payload": true}
        });
        let (parsed, _) = connector("sink", "out", &config, &origin).unwrap();
        assert_eq!(
            (
                parsed.key.as_str(),
                parsed.version,
                parsed.connector.as_str()
            ),
            ("out", 3, "stdout")
        );
        let broken =
            json!({"key": "out", "enabled": true, "version": 1, "name": "x", "path": "nope"});
        let issues = connector("sink", "out", &broken, &origin).unwrap_err();
        assert!(
            issues.iter().any(|issue| issue.file == origin),
            "{issues:?}"
        );
    }
}
