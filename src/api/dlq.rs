//! `GET /{sources|sinks}/{key}/dlq` lists a connector's dead letters, read
//! from its dead-letter topic; `POST /{sources|sinks}/{key}/dlq/replay`
//! delivers a range of them again (see [`crate::engine::runtime`]'s `dlq`).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::api::extract::{Path, Query};
use crate::api::redact::REDACTED;
use crate::api::tap::excerpt;
use crate::api::{ApiError, ApiState};
use crate::config::runtime::HttpConfig;
use crate::connectors::ConnectorKind;
use crate::engine::runtime::{DeadLetter, DlqError, ReplayTarget, Selection};

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;
const DEFAULT_MAX_BYTES: usize = 4096;
const MAX_MAX_BYTES: usize = 1 << 20;
const DEFAULT_TIMEOUT_MS: u64 = 30_000;
const MAX_TIMEOUT_MS: u64 = 600_000;

/// Lower-case header names whose values are never shown (`[http]
/// tap_redact_headers`, as for the tap).
#[derive(Debug, Clone)]
struct Redacted(Arc<Vec<String>>);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    from: Option<u64>,
    limit: Option<usize>,
    partition: Option<u32>,
    max_bytes: Option<usize>,
}

/// The replay request's body; every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    partition: Option<u32>,
    from: Option<u64>,
    to: Option<u64>,
    count: Option<usize>,
    #[serde(default)]
    filter: Filter,
    target: Option<String>,
    #[serde(default)]
    again: bool,
    timeout_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Filter {
    error_class: Option<String>,
    stage: Option<String>,
}

pub fn routes(kind: ConnectorKind, config: &HttpConfig) -> Router<Arc<ApiState>> {
    let redacted = config
        .tap_redact_headers
        .iter()
        .map(|name| name.to_ascii_lowercase())
        .collect();
    Router::new()
        .route("/{key}/dlq", get(list))
        .route("/{key}/dlq/replay", post(replay))
        .layer(Extension(Redacted(Arc::new(redacted))))
        .layer(Extension(kind))
}

async fn list(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Extension(redacted): Extension<Redacted>,
    Path(key): Path<String>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::BadRequest(format!(
            "limit must be 1 to {MAX_LIMIT}"
        )));
    }
    let max_bytes = query.max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    if max_bytes > MAX_MAX_BYTES {
        return Err(ApiError::BadRequest(format!(
            "max_bytes must be at most {MAX_MAX_BYTES}"
        )));
    }
    let page = state
        .runtime
        .dead_letters(
            kind,
            &key,
            query.partition.unwrap_or(0),
            query.from.unwrap_or(0),
            limit,
        )
        .await
        .map_err(ApiError::from)?;
    let dead_letters: Vec<Value> = page
        .dead_letters
        .iter()
        .map(|dead| render(dead, &redacted.0, max_bytes))
        .collect();
    Ok(Json(json!({
        "connector": key,
        "type": kind.to_string(),
        "stream": page.topic.stream,
        "topic": page.topic.topic,
        "partition": page.partition_id,
        "dead_letters": dead_letters,
        "next": page.next,
    })))
}

async fn replay(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Path(key): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    // An empty body takes every default.
    let body: ReplayBody = if body.iter().all(u8::is_ascii_whitespace) {
        ReplayBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|error| ApiError::InvalidBody {
            status: axum::http::StatusCode::BAD_REQUEST,
            reason: error.to_string(),
        })?
    };
    let target = match body.target.as_deref() {
        Some(target) => target.parse().map_err(ApiError::BadRequest)?,
        None if kind == ConnectorKind::Source => ReplayTarget::Origin,
        None => ReplayTarget::Sink,
    };
    if let (Some(from), Some(to)) = (body.from, body.to)
        && from > to
    {
        return Err(ApiError::BadRequest("from must not be past to".into()));
    }
    if body.count == Some(0) {
        return Err(ApiError::BadRequest("count must be at least 1".into()));
    }
    let timeout_ms = body.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    if timeout_ms == 0 || timeout_ms > MAX_TIMEOUT_MS {
        return Err(ApiError::BadRequest(format!(
            "timeout_ms must be 1 to {MAX_TIMEOUT_MS}"
        )));
    }
    let selection = Selection {
        partition_id: body.partition.unwrap_or(0),
        from: body.from.unwrap_or(0),
        to: body.to,
        count: body.count,
        error_class: body.filter.error_class,
        stage: body.filter.stage,
        again: body.again,
    };
    // In a task of its own: a client that goes away (or a connection closed
    // by `idle_timeout`) does not cut the replay short before it records
    // what it delivered.
    let runtime = state.runtime.clone();
    let replaying = key.clone();
    let replay = tokio::spawn(async move {
        let timeout = Duration::from_millis(timeout_ms);
        (runtime.replay_dead_letters(kind, &replaying, &selection, target, timeout)).await
    });
    let report = replay
        .await
        .map_err(|error| ApiError::Internal(format!("the replay failed: {error}")))?
        .map_err(ApiError::from)?;
    let mut answer =
        serde_json::to_value(&report).map_err(|error| ApiError::Internal(error.to_string()))?;
    answer["connector"] = json!(key);
    Ok(Json(answer))
}

/// One dead letter as JSON: where it came from and why, its headers
/// (redacted) and its payload cut to `max_bytes`, as UTF-8 text or base64.
fn render(dead: &DeadLetter, redacted: &[String], max_bytes: usize) -> Value {
    let context = &dead.context;
    let headers: Map<String, Value> = dead
        .headers
        .iter()
        .map(|(name, value)| {
            let shown = if redacted.contains(&name.as_str().to_ascii_lowercase()) {
                REDACTED.to_owned()
            } else {
                value.to_string()
            };
            (name.to_string(), Value::String(shown))
        })
        .collect();
    let stored = UNIX_EPOCH + Duration::from_micros(dead.timestamp);
    let (payload, encoding) = excerpt(&dead.payload, max_bytes);
    json!({
        "offset": dead.offset,
        "timestamp": humantime::format_rfc3339_micros(stored).to_string(),
        "error": context.error,
        "error_class": context.class,
        "stage": context.stage,
        "attempts": context.attempts,
        "origin": {
            "stream": context.origin.as_ref().map(|origin| &origin.stream),
            "topic": context.origin.as_ref().map(|origin| &origin.topic),
            "partition": context.partition_id,
            "offset": context.offset,
        },
        "replayed": dead.replayed,
        "headers": headers,
        "payload": payload,
        "encoding": encoding,
        "size": dead.payload.len(),
        "truncated": dead.payload.len() > max_bytes,
    })
}

impl From<DlqError> for ApiError {
    fn from(error: DlqError) -> Self {
        match error {
            DlqError::NotFound { kind, key } => ApiError::NotFound { kind, key },
            DlqError::NoDeadLetterTopic { .. } | DlqError::Refused(_) => {
                ApiError::BadRequest(error.to_string())
            }
            DlqError::Busy(_) => ApiError::Conflict(error.to_string()),
            DlqError::Bus(_) => ApiError::Unavailable(error.to_string()),
            DlqError::State(_) | DlqError::Setup(_) => ApiError::Internal(error.to_string()),
        }
    }
}
