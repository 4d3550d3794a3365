//! `/sources` and `/sinks`: list, details, transforms, lifecycle (restart, stop,
//! start) and a source's committed state.

use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{Value, json};

use crate::api::error::ApiError;
use crate::api::extract::Path;
use crate::api::provider::ProviderError;
use crate::api::{ApiState, redact, render};
use crate::config::{ConfigIssue, ConnectorConfig};
use crate::connectors::ConnectorKind;
use crate::engine::Status;
use crate::engine::offsets::{self, OffsetsError};
use crate::engine::runtime::{ConnectorView, RuntimeError};
use crate::iggy::{BusError, OffsetReset};
use crate::state::{StateError, StoredState, json as state_json};

pub fn routes(kind: ConnectorKind) -> Router<Arc<ApiState>> {
    let mut router = Router::new()
        .route("/", get(list))
        .route("/{key}", get(details))
        .route("/{key}/transforms", get(transforms))
        .route("/{key}/restart", post(restart))
        .route("/{key}/stop", post(stop))
        .route("/{key}/start", post(start));
    if kind == ConnectorKind::Sink {
        router = router.route("/{key}/offsets", post(reset_sink_offsets));
    }
    if kind == ConnectorKind::Source {
        router = router.route(
            "/{key}/state",
            get(source_state)
                .put(replace_source_state)
                .delete(clear_source_state),
        );
    }
    router.layer(Extension(kind))
}

/// Every configured connector of a kind, disabled ones included.
async fn list(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
) -> Json<Value> {
    Json(listing(&state.runtime.views(), kind))
}

/// The list answer of one kind (`/events` sends it too).
pub(super) fn listing(views: &[ConnectorView], kind: ConnectorKind) -> Value {
    Value::Array(
        numbered(views)
            .filter(|(_, view)| view.config.kind == kind)
            .map(|(id, view)| render::info(id, view))
            .collect(),
    )
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
    let stored = state
        .state_store
        .load(&key)
        .await
        .map_err(|error| ApiError::Internal(error.to_string()))?;
    let mut shown = state_json::shown(state.state_store.as_ref(), &key, stored.as_ref())
        .map_err(ApiError::Internal)?;
    redact::by_name(&mut shown["state"]);
    Ok(Json(shown))
}

/// The body of `PUT /sources/{key}/state`: the state as `GET` shows it (the
/// other fields of `GET`'s answer may be sent back too; the store sets them).
#[derive(serde::Deserialize)]
struct NewState {
    state: Value,
    /// When given, must name the source's connector (a state is only ever
    /// read by the connector that wrote it).
    #[serde(default)]
    connector: Option<String>,
}

/// Replaces a stopped source's committed state with the given one (JSON,
/// stored as MessagePack with field names, as the source writes it); the
/// source resumes from it at its next start and checks it then.
async fn replace_source_state(
    State(state): State<Arc<ApiState>>,
    Path(key): Path<String>,
    body: Result<Json<NewState>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body?;
    let lock = state.lifecycle_lock(ConnectorKind::Source, &key);
    let _serialized = lock.lock().await;
    let view = stopped(&state, ConnectorKind::Source, &key)?;
    let connector = view.config.connector.clone();
    if let Some(named) = &body.connector
        && *named != connector
    {
        return Err(ApiError::BadRequest(format!(
            "source \"{key}\" is a \"{connector}\" connector; a state for \"{named}\" cannot be given to it"
        )));
    }
    if body.state.to_string().contains(redact::REDACTED) {
        return Err(ApiError::BadRequest(format!(
            "`state` holds {} where GET hid a secret: give the real value",
            redact::REDACTED
        )));
    }
    let data = state_json::encode(&body.state)
        .map_err(|error| ApiError::BadRequest(format!("`state`: {error}")))?;
    let previous = load_state(&state, &key).await?;
    let stored = StoredState { connector, data };
    state
        .state_store
        .save(&key, &stored)
        .await
        .map_err(|error| state_change_refused(&key, error))?;
    tracing::warn!(
        connector_key = %key,
        location = %state.state_store.location(&key),
        previous_size = previous.map_or(0, |previous| previous.data.len()),
        size = stored.data.len(),
        "source state replaced through the API"
    );
    source_state(State(state), Path(key)).await
}

/// Removes a stopped source's committed state: its next start is a fresh
/// start.
async fn clear_source_state(
    State(state): State<Arc<ApiState>>,
    Path(key): Path<String>,
) -> Result<StatusCode, ApiError> {
    let lock = state.lifecycle_lock(ConnectorKind::Source, &key);
    let _serialized = lock.lock().await;
    stopped(&state, ConnectorKind::Source, &key)?;
    let previous = load_state(&state, &key).await?;
    state
        .state_store
        .clear(&key)
        .await
        .map_err(|error| state_change_refused(&key, error))?;
    tracing::warn!(
        connector_key = %key,
        location = %state.state_store.location(&key),
        previous_size = previous.map_or(0, |previous| previous.data.len()),
        "source state cleared through the API"
    );
    Ok(StatusCode::NO_CONTENT)
}

/// The body of `POST /sinks/{key}/offsets`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct OffsetsRequest {
    /// `"earliest"`, `"latest"`, `{"timestamp": <RFC 3339 or microseconds>}`
    /// or `{"offsets": {"<partition>": <next offset to read>}}`.
    to: Value,
    /// With `topic`: move only this topic of the sink.
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    topic: Option<String>,
}

/// `to` of an [`OffsetsRequest`].
fn offset_target(to: &Value) -> Result<OffsetReset, String> {
    let expected = "expected \"earliest\", \"latest\", {\"timestamp\": <RFC 3339 time or microseconds>} or {\"offsets\": {\"<partition>\": <next offset to read>}}";
    let one_field = |name: &str| {
        to.as_object()
            .filter(|fields| fields.len() == 1)
            .and_then(|fields| fields.get(name))
    };
    if let Some(name) = to.as_str() {
        return match name {
            "earliest" => Ok(OffsetReset::Earliest),
            "latest" => Ok(OffsetReset::Latest),
            _ => Err(format!("`to` is \"{name}\"; {expected}")),
        };
    }
    if let Some(timestamp) = one_field("timestamp") {
        return match timestamp {
            Value::String(text) => offsets::parse_timestamp(text),
            other => other
                .as_u64()
                .ok_or_else(|| format!("`to.timestamp` is {other}; {expected}")),
        }
        .map(OffsetReset::Timestamp);
    }
    if let Some(Value::Object(given)) = one_field("offsets") {
        let mut parsed = std::collections::BTreeMap::new();
        for (partition, offset) in given {
            let (Ok(partition), Some(offset)) = (partition.parse::<u32>(), offset.as_u64()) else {
                return Err(format!(
                    "`to.offsets` has \"{partition}\": {offset}; expected a partition number and an offset"
                ));
            };
            parsed.insert(partition, offset);
        }
        return Ok(OffsetReset::Offsets(parsed));
    }
    Err(format!("`to` is {to}; {expected}"))
}

/// Moves a stopped sink's consumer-group offsets; its next start reads from
/// there. Answers each topic's partitions with the next offset to read before
/// and after.
async fn reset_sink_offsets(
    State(state): State<Arc<ApiState>>,
    Path(key): Path<String>,
    body: Result<Json<OffsetsRequest>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body?;
    let to = offset_target(&body.to).map_err(ApiError::BadRequest)?;
    let only = match (&body.stream, &body.topic) {
        (Some(stream), Some(topic)) => Some((stream.as_str(), topic.as_str())),
        (None, None) => None,
        _ => {
            return Err(ApiError::BadRequest(
                "`stream` and `topic` go together: give both or neither".into(),
            ));
        }
    };
    let lock = state.lifecycle_lock(ConnectorKind::Sink, &key);
    let _serialized = lock.lock().await;
    let view = stopped(&state, ConnectorKind::Sink, &key)?;
    let moved = offsets::reset(state.runtime.bus(), &view.config, &to, only)
        .await
        .map_err(|error| match error {
            OffsetsError::Bus {
                source: BusError::Unavailable(_),
                ..
            } => ApiError::Internal(error.to_string()),
            other => ApiError::BadRequest(other.to_string()),
        })?;
    Ok(Json(json!({"key": key, "topics": moved})))
}

/// The stored state, or `None`; a corrupt one counts as none here, so it
/// can be replaced or cleared.
async fn load_state(state: &ApiState, key: &str) -> Result<Option<StoredState>, ApiError> {
    match state.state_store.load(key).await {
        Ok(stored) => Ok(stored),
        Err(StateError::Read { path, source }) => Err(ApiError::Internal(format!(
            "cannot read state file {}: {source}",
            path.display()
        ))),
        Err(error @ StateError::Database { .. }) => Err(ApiError::Internal(error.to_string())),
        Err(_) => Ok(None),
    }
}

/// A refused state change: a source another instance runs (a shared store)
/// is a conflict like one running here.
fn state_change_refused(key: &str, error: StateError) -> ApiError {
    match error {
        StateError::Leased { holder, .. } => ApiError::Running {
            kind: ConnectorKind::Source,
            key: key.to_owned(),
            status: format!("running on instance {holder}"),
        },
        other => ApiError::Internal(other.to_string()),
    }
}

/// The connector's view, when it is not running (stopped, or stopped by an
/// error); a running one is a conflict.
fn stopped(state: &ApiState, kind: ConnectorKind, key: &str) -> Result<ConnectorView, ApiError> {
    let (_, view) = find(state, kind, key)?;
    match view.status.status {
        Status::Stopped | Status::Error => Ok(view),
        running => Err(ApiError::Running {
            kind,
            key: key.to_owned(),
            status: serde_json::to_value(running)
                .ok()
                .and_then(|name| name.as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("{running:?}")),
        }),
    }
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
