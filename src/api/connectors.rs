//! `/sources` and `/sinks`: list, details, transforms, lifecycle (restart, stop,
//! start) and a source's committed state.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{Value, json};

use crate::api::error::ApiError;
use crate::api::provider::ProviderError;
use crate::api::{ApiState, redact, render};
use crate::config::{ConfigIssue, ConnectorConfig};
use crate::connectors::ConnectorKind;
use crate::engine::Status;
use crate::engine::runtime::{ConnectorView, RuntimeError};

pub fn routes(kind: ConnectorKind) -> Router<Arc<ApiState>> {
    let mut router = Router::new()
        .route("/", get(list))
        .route("/{key}", get(details))
        .route("/{key}/transforms", get(transforms))
        .route("/{key}/restart", post(restart))
        .route("/{key}/stop", post(stop))
        .route("/{key}/start", post(start));
    if kind == ConnectorKind::Source {
        router = router.route("/{key}/state", get(source_state));
    }
    router.layer(Extension(kind))
}

/// Every configured connector of a kind, disabled ones included.
async fn list(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
) -> Json<Value> {
    let views = state.runtime.views();
    Json(Value::Array(
        numbered(&views)
            .filter(|(_, view)| view.config.kind == kind)
            .map(|(id, view)| render::info(id, view))
            .collect(),
    ))
}

async fn details(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (id, view) = find(&state, kind, &key)?;
    Ok(Json(render::details(id, &view)))
}

async fn transforms(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (_, view) = find(&state, kind, &key)?;
    Ok(Json(render::transforms(&view.config)))
}

/// Stops the connector, loads its active config version (so a rollback with
/// `PUT .../configs/active` takes effect here) and starts it again if that
/// version is enabled.
async fn restart(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
) -> Result<StatusCode, ApiError> {
    let lock = state.lifecycle_lock(kind, &key);
    let _serialized = lock.lock().await;
    let active = active_config(&state, kind, &key)?;
    let loaded = ensure_loaded(&state, kind, &key, active.as_ref())?;
    state.runtime.stop(kind, &key).await.map_err(not_found)?;
    if let (Some(config), true) = (active, loaded) {
        state.runtime.replace_config(config).map_err(not_found)?;
    }
    let view = state.runtime.view(kind, &key).map_err(not_found)?;
    if view.config.enabled {
        state.runtime.start(kind, &key).await.map_err(not_found)?;
    } else {
        tracing::info!(connector_key = %key, connector_type = %kind, "restart: the active config is disabled; the connector stays stopped");
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Stops the connector; it stays stopped until started or restarted.
async fn stop(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
) -> Result<StatusCode, ApiError> {
    let lock = state.lifecycle_lock(kind, &key);
    let _serialized = lock.lock().await;
    state.runtime.stop(kind, &key).await.map_err(not_found)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Starts a stopped connector with its active config, enabled or not. A
/// running connector is left alone.
async fn start(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
) -> Result<StatusCode, ApiError> {
    let lock = state.lifecycle_lock(kind, &key);
    let _serialized = lock.lock().await;
    if let Ok(view) = state.runtime.view(kind, &key)
        && matches!(view.status.status, Status::Running | Status::Starting)
    {
        return Ok(StatusCode::NO_CONTENT);
    }
    let active = active_config(&state, kind, &key)?;
    let loaded = ensure_loaded(&state, kind, &key, active.as_ref())?;
    if let (Some(config), true) = (active, loaded) {
        state.runtime.replace_config(config).map_err(not_found)?;
    }
    state.runtime.start(kind, &key).await.map_err(not_found)?;
    Ok(StatusCode::NO_CONTENT)
}

/// The source's committed state, decoded from MessagePack, secrets redacted.
async fn source_state(
    State(state): State<Arc<ApiState>>,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    find(&state, ConnectorKind::Source, &key)?;
    let location = state.state_store.location(&key);
    let stored = state
        .state_store
        .load(&key)
        .await
        .map_err(|error| ApiError::Internal(error.to_string()))?;
    let Some(stored) = stored else {
        return Ok(Json(json!({
            "key": key,
            "connector": null,
            "location": location,
            "size": 0,
            "state": null,
        })));
    };
    let decoded = rmpv::decode::read_value(&mut stored.data.as_slice()).map_err(|error| {
        ApiError::Internal(format!(
            "state {location} is not valid MessagePack: {error}"
        ))
    })?;
    let mut value = msgpack_to_json(decoded);
    redact::by_name(&mut value);
    Ok(Json(json!({
        "key": key,
        "connector": stored.connector,
        "location": location,
        "size": stored.data.len(),
        "state": value,
    })))
}

/// Pairs each view with upstream's numeric `id`: its position among all
/// connectors, from 1 (stable: connectors are never removed).
fn numbered(views: &[ConnectorView]) -> impl Iterator<Item = (usize, &ConnectorView)> {
    views
        .iter()
        .enumerate()
        .map(|(index, view)| (index + 1, view))
}

fn find(
    state: &ApiState,
    kind: ConnectorKind,
    key: &str,
) -> Result<(usize, ConnectorView), ApiError> {
    let views = state.runtime.views();
    numbered(&views)
        .find(|(_, view)| view.config.kind == kind && view.config.key == key)
        .map(|(id, view)| (id, view.clone()))
        .ok_or_else(|| ApiError::NotFound {
            kind,
            key: key.to_owned(),
        })
}

/// The active version in the connector directory; `None` when the runtime has
/// no directory or the directory has no file for the key (the running config
/// is then used as it is).
fn active_config(
    state: &ApiState,
    kind: ConnectorKind,
    key: &str,
) -> Result<Option<ConnectorConfig>, ApiError> {
    let Some(provider) = &state.provider else {
        return Ok(None);
    };
    match provider.active(kind, key) {
        Ok(stored) => Ok(Some(stored.config)),
        Err(ProviderError::NoConfig) => Ok(None),
        Err(error) => Err(provider_error(kind, key, error)),
    }
}

/// Adds a key that exists only in the connector directory (created through
/// the API) to the runtime. Returns whether the key was already loaded.
fn ensure_loaded(
    state: &ApiState,
    kind: ConnectorKind,
    key: &str,
    active: Option<&ConnectorConfig>,
) -> Result<bool, ApiError> {
    if state.runtime.view(kind, key).is_ok() {
        return Ok(true);
    }
    let Some(config) = active else {
        return Err(ApiError::NotFound {
            kind,
            key: key.to_owned(),
        });
    };
    state
        .runtime
        .add(config.clone())
        .map_err(|error| ApiError::Internal(error.to_string()))?;
    Ok(false)
}

pub fn not_found(error: RuntimeError) -> ApiError {
    match error {
        RuntimeError::NotFound { kind, key } => ApiError::NotFound { kind, key },
        other => ApiError::Internal(other.to_string()),
    }
}

/// Maps a provider failure to the API's error, redacting issue messages.
pub fn provider_error(kind: ConnectorKind, key: &str, error: ProviderError) -> ApiError {
    match error {
        ProviderError::VersionNotFound { version } => ApiError::VersionNotFound {
            kind,
            key: key.to_owned(),
            version,
        },
        ProviderError::NoConfig => ApiError::NoConfig {
            kind,
            key: key.to_owned(),
        },
        ProviderError::Invalid(issues) => {
            let issues: Vec<ConfigIssue> = issues
                .0
                .into_iter()
                .map(|mut issue| {
                    issue.message = redact::issue_message(&issue.field, &issue.message);
                    issue
                })
                .collect();
            let errors = issues.iter().filter(|issue| issue.is_error()).count();
            ApiError::InvalidConfiguration {
                reason: format!("{errors} error(s) in the {kind} \"{key}\" config"),
                issues,
            }
        }
        ProviderError::BadRequest(message) => ApiError::BadRequest(message),
        // The path stays in the log: API answers never show the file system.
        ProviderError::Io { path, source } => {
            tracing::error!(path = %path.display(), error = %source, "connector directory I/O failed");
            ApiError::Internal(format!(
                "cannot read or write the connector directory: {}",
                source.kind()
            ))
        }
    }
}

/// MessagePack to JSON, generically: binary becomes a list of bytes, map keys
/// that are not strings become their JSON text.
fn msgpack_to_json(value: rmpv::Value) -> Value {
    use rmpv::Value as Pack;
    match value {
        Pack::Nil => Value::Null,
        Pack::Boolean(flag) => Value::Bool(flag),
        Pack::Integer(integer) => integer
            .as_u64()
            .map(Value::from)
            .or_else(|| integer.as_i64().map(Value::from))
            .unwrap_or(Value::Null),
        Pack::F32(number) => json!(number),
        Pack::F64(number) => json!(number),
        Pack::String(text) => match text.into_str() {
            Some(text) => Value::String(text),
            None => Value::Null,
        },
        Pack::Binary(bytes) => json!(bytes),
        Pack::Array(items) => Value::Array(items.into_iter().map(msgpack_to_json).collect()),
        Pack::Map(entries) => Value::Object(
            entries
                .into_iter()
                .map(|(name, value)| {
                    let name = match name {
                        Pack::String(text) => text.into_str().unwrap_or_default(),
                        other => msgpack_to_json(other).to_string(),
                    };
                    (name, msgpack_to_json(value))
                })
                .collect(),
        ),
        Pack::Ext(kind, data) => json!({"ext_type": kind, "data": data}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_named_state_when_decoded_should_give_json_with_field_names() {
        #[derive(serde::Serialize)]
        struct State {
            messages_produced: u64,
            offsets: std::collections::BTreeMap<String, i64>,
            raw: serde_bytes::ByteBuf,
        }
        let bytes = crate::connectors::encode_state(&State {
            messages_produced: 42,
            offsets: [("orders".to_owned(), -1)].into(),
            raw: serde_bytes::ByteBuf::from(vec![1, 2]),
        })
        .unwrap();
        let decoded = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        assert_eq!(
            msgpack_to_json(decoded),
            json!({"messages_produced": 42, "offsets": {"orders": -1}, "raw": [1, 2]})
        );
    }
}
