//! `/health` reflects the connectors; `/health/live` only the process.
//!
//! Healthy means every enabled connector is `running`, and no connector is in
//! `error`. Two stopped states also count as healthy: a finite source that
//! `completed` did what it was asked, and a connector an operator stopped
//! through the API is stopped on purpose (failing the probe would make an
//! orchestrator restart the process and undo the stop). `starting` and
//! `stopping` are not healthy: a connector still waiting for Iggy at startup
//! is not doing its job yet.
//!
//! A running connector that reports itself degraded (a sink whose group stores
//! no offsets while messages wait, an open circuit breaker) keeps the answer
//! 200, so an orchestrator does not restart what a restart cannot fix, but the
//! status says `degraded` and names each with its reason.
//!
//! The path is public, but the connectors' details (error text can name
//! files and internal URLs) are shown only to a request carrying the API key;
//! without it the answer is the status alone, with the same HTTP status.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::api::auth::Authorized;
use crate::api::{ApiState, redact};
use crate::engine::Status;
use crate::engine::runtime::ConnectorView;

pub async fn health(
    State(state): State<Arc<ApiState>>,
    authorized: Option<Extension<Authorized>>,
) -> (StatusCode, Json<Value>) {
    let (status, Json(mut body)) = details(&state);
    let authorized = authorized.is_some_and(|Extension(Authorized(authorized))| authorized);
    if !authorized && let Some(fields) = body.as_object_mut() {
        fields.retain(|name, _| name == "status");
    }
    (status, Json(body))
}

fn details(state: &ApiState) -> (StatusCode, Json<Value>) {
    let failing: Vec<Value> = state
        .runtime
        .views()
        .iter()
        .filter(|view| is_failing(view))
        .map(describe)
        .collect();
    let degraded: Vec<Value> = state
        .runtime
        .views()
        .iter()
        .filter(|view| !is_failing(view))
        .filter_map(|view| {
            let reason = view.degraded.as_ref()?;
            Some(json!({
                "key": view.config.key,
                "connector_type": view.config.kind,
                "status": view.status.status,
                "degraded": redact::mask_text(reason).unwrap_or_else(|| reason.clone()),
            }))
        })
        .collect();
    if failing.is_empty() && degraded.is_empty() {
        (StatusCode::OK, Json(json!({"status": "healthy"})))
    } else if failing.is_empty() {
        (
            StatusCode::OK,
            Json(json!({"status": "degraded", "connectors": degraded})),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unhealthy", "connectors": failing})),
        )
    }
}

pub async fn live() -> Json<Value> {
    Json(json!({"status": "alive"}))
}

fn is_failing(view: &ConnectorView) -> bool {
    match view.status.status {
        Status::Running | Status::Stopped | Status::Standby => false,
        Status::Error => true,
        Status::Starting | Status::Stopping => view.config.enabled,
    }
}

fn describe(view: &ConnectorView) -> Value {
    let status = &view.status;
    json!({
        "key": view.config.key,
        "connector_type": view.config.kind,
        "status": status.status,
        "stop_reason": status.stop_reason,
        "last_error": status.last_error.as_ref().map(|error| json!({
            "message": redact::mask_text(&error.message).unwrap_or_else(|| error.message.clone()),
            "timestamp": error.timestamp,
        })),
        "open_attempts": status.open_attempts,
    })
}
