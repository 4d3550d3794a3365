//! `/{sources,sinks}/{key}/configs...`: config versions in the connector
//! directory, the active pointer, and the running `plugin_config` in several
//! formats. Upstream's shapes; upstream's bugs fixed: a missing version is 404,
//! `active` means the provider's active version (what the next restart runs),
//! not the running one (`running` says that).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::Value;

use crate::api::connectors::provider_error;
use crate::api::error::ApiError;
use crate::api::extract::{Path, Query};
use crate::api::provider::{LocalProvider, ProviderError, StoredConfig};
use crate::api::{ApiState, provider, render};
use crate::connectors::ConnectorKind;
use crate::engine::runtime::ConnectorView;

pub fn routes(kind: ConnectorKind) -> Router<Arc<ApiState>> {
    Router::new()
        .route("/{key}/configs", get(list).post(create).delete(delete))
        .route("/{key}/configs/active", get(active).put(set_active))
        .route("/{key}/configs/plugin", get(plugin))
        .route("/{key}/configs/{version}", get(version))
        .layer(Extension(kind))
}

async fn list(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let running = state.runtime.view(kind, &key).ok();
    let Some(provider) = &state.provider else {
        let view = running.ok_or_else(|| not_found(kind, &key))?;
        return Ok(Json(Value::Array(vec![running_only(&view)])));
    };
    let versions = provider
        .versions(kind, &key)
        .map_err(|error| provider_error(kind, &key, error))?;
    if versions.is_empty() && running.is_none() {
        return Err(not_found(kind, &key));
    }
    let active = provider.active_version(kind, &key).ok();
    Ok(Json(Value::Array(
        versions
            .iter()
            .map(|stored| stored_json(stored, active, running.as_ref()))
            .collect(),
    )))
}

async fn version(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path((key, version)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let version: u64 = version.parse().map_err(|_| {
        ApiError::BadRequest(format!("invalid version \"{version}\": expected a number"))
    })?;
    let running = state.runtime.view(kind, &key).ok();
    let provider = directory(&state)?;
    let stored = provider
        .version(kind, &key, version)
        .map_err(|error| provider_error(kind, &key, error))?;
    let active = provider.active_version(kind, &key).ok();
    Ok(Json(stored_json(&stored, active, running.as_ref())))
}

/// The active version: what the next start or restart runs.
async fn active(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let running = state.runtime.view(kind, &key).ok();
    if let Some(provider) = &state.provider {
        match provider.active(kind, &key) {
            Ok(stored) => {
                let version = Some(stored.config.version);
                return Ok(Json(stored_json(&stored, version, running.as_ref())));
            }
            Err(ProviderError::NoConfig) => {}
            Err(error) => return Err(provider_error(kind, &key, error)),
        }
    }
    let view = running.ok_or_else(|| not_found(kind, &key))?;
    Ok(Json(running_only(&view)))
}

#[derive(Deserialize)]
struct SetActive {
    version: u64,
}

/// Points `.active_versions.toml` at a version. Takes effect at the next
/// start or restart, as upstream: nothing is restarted here.
async fn set_active(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
    body: Result<Json<SetActive>, JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let Json(body) = body?;
    directory(&state)?
        .set_active(kind, &key, body.version)
        .map_err(|error| provider_error(kind, &key, error))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Creates the next version from upstream's body (`enabled`, `name`, `path`,
/// `streams`, `plugin_config`, ...). It is checked like a file read at
/// startup; an invalid config is refused with 400 and every issue.
async fn create(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body?;
    let stored = directory(&state)?
        .create(kind, &key, body)
        .map_err(|error| provider_error(kind, &key, error))?;
    let running = state.runtime.view(kind, &key).ok();
    Ok(Json(stored_json(&stored, None, running.as_ref())))
}

#[derive(Deserialize)]
struct DeleteQuery {
    version: Option<u64>,
}

/// Deletes a version (the active one when no version is given).
async fn delete(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
    Query(query): Query<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    directory(&state)?
        .delete(kind, &key, query.version)
        .map_err(|error| provider_error(kind, &key, error))?;
    Ok(StatusCode::NO_CONTENT)
}

/// The running `plugin_config`, redacted, as json, yaml, toml or text.
async fn plugin(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let view = state
        .runtime
        .view(kind, &key)
        .map_err(|_| not_found(kind, &key))?;
    let format = match query.get("format") {
        Some(format) => Format::parse(format).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "unknown format \"{format}\": expected json, yaml, toml or text"
            ))
        })?,
        None => view
            .config
            .plugin_config_format
            .as_deref()
            .and_then(Format::parse)
            .unwrap_or(Format::Toml),
    };
    let config = render::plugin_config(&view.config);
    let (content_type, body) = format.render(&config)?;
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Yaml,
    Toml,
    Text,
}

impl Format {
    fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "json" => Some(Format::Json),
            "yaml" | "yml" => Some(Format::Yaml),
            "toml" => Some(Format::Toml),
            "text" => Some(Format::Text),
            _ => None,
        }
    }

    fn render(self, config: &Value) -> Result<(&'static str, String), ApiError> {
        match self {
            Format::Json => Ok(("application/json", config.to_string())),
            Format::Text => Ok(("text/plain", config.to_string())),
            Format::Yaml => serde_yaml_ng::to_string(config)
                .map(|text| ("application/yaml", text))
                .map_err(|error| ApiError::CannotConvert(error.to_string())),
            Format::Toml => match provider::json_to_toml(config.clone()) {
                Some(toml::Value::Table(table)) => toml::to_string(&table)
                    .map(|text| ("application/toml", text))
                    .map_err(|error| ApiError::CannotConvert(error.to_string())),
                _ => Err(ApiError::CannotConvert(
                    "only a table can be written as TOML".into(),
                )),
            },
        }
    }
}

fn directory(state: &ApiState) -> Result<&LocalProvider, ApiError> {
    state.provider.as_ref().ok_or_else(|| {
        ApiError::BadRequest(
            "this runtime has no connector directory ([connectors] config_dir)".into(),
        )
    })
}

fn not_found(kind: ConnectorKind, key: &str) -> ApiError {
    ApiError::NotFound {
        kind,
        key: key.to_owned(),
    }
}

fn stored_json(
    stored: &StoredConfig,
    active: Option<u64>,
    running: Option<&ConnectorView>,
) -> Value {
    let version = stored.config.version;
    let mut value = render::config(&stored.config, active == Some(version));
    if let Value::Object(fields) = &mut value {
        let is_running = running.is_some_and(|view| view.config.version == version);
        fields.insert("running".into(), Value::Bool(is_running));
        fields.insert("created_at".into(), Value::from(stored.created_at));
    }
    value
}

/// Without a connector directory, the running config is the only version.
fn running_only(view: &ConnectorView) -> Value {
    let mut value = render::config(&view.config, true);
    if let Value::Object(fields) = &mut value {
        fields.insert("running".into(), Value::Bool(true));
    }
    value
}
