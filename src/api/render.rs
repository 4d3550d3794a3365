//! JSON shapes of connectors and their configs, upstream's field names first,
//! ours after. Every config passes through [`redact`] here, so no handler can
//! forget it.

use serde_json::{Value, json};

use crate::api::redact;
use crate::config::duration;
use crate::config::{ConnectorConfig, KindConfig, OnError};
use crate::connectors::Registry;
use crate::engine::runtime::ConnectorView;

/// A connector in `GET /sources` and `GET /sinks`.
pub fn info(id: usize, view: &ConnectorView) -> Value {
    let config = &view.config;
    let status = &view.status;
    json!({
        "id": id,
        "key": config.key,
        "name": config.name,
        "path": config.path,
        "enabled": config.enabled,
        "status": status.status,
        "last_error": status.last_error.as_ref().map(|error| json!({
            "message": redact::mask_text(&error.message).unwrap_or_else(|| error.message.clone()),
            "timestamp": error.timestamp,
        })),
        "open_attempts": status.open_attempts,
        "plugin_config_format": config.plugin_config_format,
        "connector": config.connector,
        "version": config.version,
        "stop_reason": status.stop_reason,
        "status_since": status.since,
        "degraded": view.degraded.as_ref().map(|reason| {
            redact::mask_text(reason).unwrap_or_else(|| reason.clone())
        }),
        "lag": view.lag,
    })
}

/// `GET /sources/{key}`: the info plus the running streams.
pub fn details(id: usize, view: &ConnectorView) -> Value {
    let mut value = info(id, view);
    if let Value::Object(fields) = &mut value {
        fields.insert("streams".into(), streams(&view.config));
    }
    value
}

/// A config version as the configs endpoints return it (upstream's connector
/// file fields, flattened with `active`).
pub fn config(config: &ConnectorConfig, active: bool) -> Value {
    let mut value = json!({
        "key": config.key,
        "enabled": config.enabled,
        "version": config.version,
        "name": config.name,
        "path": config.path,
        "transforms": transforms_table(config),
        "streams": streams(config),
        "plugin_config_format": config.plugin_config_format,
        "plugin_config": plugin_config(config),
        "verbose": config.verbose,
        "benchmark": config.benchmark,
        "connector": config.connector,
        "dead_letter": config.dead_letter.as_ref().map(|target| json!({
            "stream": target.stream,
            "topic": target.topic,
        })),
        "active": active,
    });
    if let Value::Object(fields) = &mut value {
        match &config.kind_config {
            KindConfig::Source {
                max_consecutive_nacks,
                ..
            } => {
                fields.insert("max_consecutive_nacks".into(), json!(max_consecutive_nacks));
            }
            KindConfig::Sink { on_error, .. } => {
                let on_error = match on_error {
                    OnError::Stop => "stop",
                    OnError::Skip => "skip",
                    OnError::Dlq => "dlq",
                };
                fields.insert("on_error".into(), json!(on_error));
            }
        }
    }
    value
}

/// The connector's `plugin_config`, redacted.
pub fn plugin_config(config: &ConnectorConfig) -> Value {
    let mut value = config.plugin_config.clone();
    redact::plugin_config(
        &mut value,
        Registry::secret_fields(&config.connector, config.kind),
    );
    value
}

/// `[{"type", "config"}]`, in file order.
pub fn transforms(config: &ConnectorConfig) -> Value {
    Value::Array(
        config
            .transforms
            .iter()
            .map(|(kind, settings)| {
                let mut settings = settings.clone();
                redact::by_name(&mut settings);
                json!({"type": kind, "config": settings})
            })
            .collect(),
    )
}

fn transforms_table(config: &ConnectorConfig) -> Value {
    if config.transforms.is_empty() {
        return Value::Null;
    }
    Value::Object(
        config
            .transforms
            .iter()
            .map(|(kind, settings)| {
                let mut settings = settings.clone();
                redact::by_name(&mut settings);
                (kind.clone(), settings)
            })
            .collect(),
    )
}

fn streams(config: &ConnectorConfig) -> Value {
    match &config.kind_config {
        KindConfig::Source { streams, .. } => streams
            .iter()
            .map(|stream| {
                json!({
                    "stream": stream.stream,
                    "topic": stream.topic,
                    "schema": stream.schema.to_string(),
                    "batch_length": stream.batch_length,
                    "linger_time": duration::format(stream.linger_time),
                    "partitions": stream.partitions,
                })
            })
            .collect(),
        KindConfig::Sink { streams, .. } => streams
            .iter()
            .map(|stream| {
                json!({
                    "stream": stream.stream,
                    "topics": stream.topics,
                    "schema": stream.schema.to_string(),
                    "batch_length": stream.batch_length,
                    "poll_interval": duration::format(stream.poll_interval),
                    "consumer_group": stream.consumer_group,
                })
            })
            .collect(),
    }
}
