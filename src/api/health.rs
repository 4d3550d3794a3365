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
//! A broker that does not answer a ping within a few seconds makes the
//! status `degraded` too (200: the connectors wait for it and resume on
//! their own; `/health/live` stays 200), with a `broker` entry saying why.
//!
//! The path is public, but the connectors' details (error text can name
//! files and internal URLs) are shown only to a request carrying the API key;
//! without it the answer is the status alone, with the same HTTP status.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::api::auth::Authorized;
use crate::api::{ApiState, redact};
use crate::engine::Status;
use crate::engine::runtime::ConnectorView;

/// How long `/health` waits for the broker to answer a ping: longer, and it
/// says `degraded` (the connectors' own sends and polls are failing too).
const BROKER_TIMEOUT: Duration = Duration::from_secs(3);

/// A burst of probes sends one ping.
const BROKER_ANSWER_REUSED: Duration = Duration::from_secs(1);

pub async fn health(
    State(state): State<Arc<ApiState>>,
    authorized: Option<Extension<Authorized>>,
) -> (StatusCode, Json<Value>) {
    let broker = broker_problem(&state).await;
    let (status, Json(mut body)) = details(&state, broker);
    let authorized = authorized.is_some_and(|Extension(Authorized(authorized))| authorized);
    if !authorized && let Some(fields) = body.as_object_mut() {
        fields.retain(|name, _| name == "status");
    }
    (status, Json(body))
}

/// Why the broker did not answer a ping, or `None` when it did. One ping
/// answers every probe for `BROKER_ANSWER_REUSED`.
async fn broker_problem(state: &ApiState) -> Option<String> {
    let mut last = state.broker_answer.lock().await;
    if let Some((at, problem)) = last.as_ref()
        && at.elapsed() < BROKER_ANSWER_REUSED
    {
        return problem.clone();
    }
    let problem = match tokio::time::timeout(BROKER_TIMEOUT, state.runtime.bus().ping()).await {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(error.to_string()),
        Err(_) => Some(format!("Iggy did not answer within {BROKER_TIMEOUT:?}")),
    };
    *last = Some((Instant::now(), problem.clone()));
    problem
}

fn details(state: &ApiState, broker: Option<String>) -> (StatusCode, Json<Value>) {
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
    let (status, mut body) = if failing.is_empty() && degraded.is_empty() && broker.is_none() {
        (StatusCode::OK, json!({"status": "healthy"}))
    } else if failing.is_empty() {
        (
            StatusCode::OK,
            json!({"status": "degraded", "connectors": degraded}),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "unhealthy", "connectors": failing}),
        )
    };
    if let Some(reason) = broker {
        body["broker"] = json!({
            "reachable": false,
            "reason": redact::mask_text(&reason).unwrap_or(reason),
        });
    }
    (status, Json(body))
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
