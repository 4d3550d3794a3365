//! The listener's routes: one POST route per endpoint, the health check, and
//! the answers clients get (JSON bodies naming the problem).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{
    AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use secrecy::ExposeSecret;
use serde_json::json;
use subtle::ConstantTimeEq;
use tracing::debug;

use super::body::{self, BodyFormat};
use super::config::{AckMode, HttpSourceConfig};
use crate::connectors::kit::inbox::{Delivery, Inbox, SubmitError};
use crate::connectors::record_check::RecordCheck;
use crate::message::{HeaderValue, Headers, SourceRecord};

/// What every handler of one listener shares.
pub struct Shared {
    pub inbox: Arc<Inbox>,
    pub key: String,
    /// Whether the engine will store a message: one it would drop is refused
    /// to the client, never acknowledged.
    record_check: RecordCheck,
    config: Arc<HttpSourceConfig>,
    endpoints: Vec<Endpoint>,
    idempotency_header: HeaderName,
    /// (request header, user header name)
    forward_headers: Vec<(HeaderName, String)>,
}

struct Endpoint {
    stream_index: usize,
    /// BLAKE3 of the bearer token: comparing fixed-size digests in constant
    /// time leaks neither the token's bytes nor its length.
    token_digest: Option<[u8; 32]>,
}

impl Shared {
    pub fn new(
        config: Arc<HttpSourceConfig>,
        inbox: Arc<Inbox>,
        key: String,
        record_check: RecordCheck,
    ) -> Self {
        let endpoints = config
            .endpoints
            .iter()
            .map(|endpoint| Endpoint {
                stream_index: endpoint.stream_index,
                token_digest: endpoint
                    .token
                    .as_ref()
                    .map(|token| *blake3::hash(token.expose_secret().as_bytes()).as_bytes()),
            })
            .collect();
        // Names were checked when the config was built.
        let header = |name: &str| HeaderName::try_from(name).ok();
        let forward_headers = config
            .forward_headers
            .iter()
            .filter_map(|name| header(name).map(|header| (header, name.to_ascii_lowercase())))
            .collect();
        Self {
            inbox,
            key,
            record_check,
            idempotency_header: header(&config.idempotency_header)
                .unwrap_or(HeaderName::from_static("idempotency-key")),
            forward_headers,
            endpoints,
            config,
        }
    }
}

pub fn router(shared: Arc<Shared>) -> Router {
    let mut router = Router::new();
    for (index, endpoint) in shared.config.endpoints.iter().enumerate() {
        let shared = shared.clone();
        router = router.route(
            &endpoint.path,
            post(move |request: Request| async move {
                let response = ingest(&shared, index, request).await;
                count_response(&shared.key, response.status());
                response
            }),
        );
    }
    let health_shared = shared.clone();
    router
        .route(
            &shared.config.health_path,
            get(move || async move { health(&health_shared) }),
        )
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no endpoint at this path",
            )
        })
        .layer(axum::middleware::from_fn(method_not_allowed))
}

/// axum's 405 for a known path asked with another method has an empty body
/// (its `Allow` header is added outside this layer): give it the JSON error
/// every other answer has.
async fn method_not_allowed(request: Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let response = next.run(request).await;
    if response.status() != StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        &format!("{path} does not take {method} (see the Allow header)"),
    )
}

async fn ingest(shared: &Shared, endpoint_index: usize, request: Request) -> Response {
    let Some(endpoint) = shared.endpoints.get(endpoint_index) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no endpoint at this path",
        );
    };
    let (parts, body) = request.into_parts();
    if let Some(expected) = &endpoint.token_digest
        && !authorized(&parts.headers, expected)
    {
        let mut response = error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        );
        response.headers_mut().insert(
            WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
        return response;
    }
    let limit = shared.config.max_request_bytes;
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return too_large_request(limit);
    }
    let body = match read_body(body, limit).await {
        Ok(body) => body,
        Err(ReadError::TooLarge) => return too_large_request(limit),
        Err(ReadError::Io(message)) => {
            return error(StatusCode::BAD_REQUEST, "unreadable_body", &message);
        }
    };
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok());
    let format = BodyFormat::from_content_type(content_type);
    let payloads = match body::parse(
        format,
        body,
        shared.config.max_message_bytes,
        shared.config.max_json_depth,
    ) {
        Ok(payloads) => payloads,
        Err(problem @ body::BodyError::MessageTooLarge { .. }) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                problem.code(),
                &problem.to_string(),
            );
        }
        Err(problem) => {
            return error(
                StatusCode::BAD_REQUEST,
                problem.code(),
                &problem.to_string(),
            );
        }
    };
    if payloads.is_empty() {
        return accepted(StatusCode::OK, 0, true);
    }
    if let Some(refusal) = unstorable(shared, endpoint.stream_index, &payloads) {
        return refusal;
    }
    let records = records(shared, endpoint.stream_index, &parts.headers, payloads);
    let count = records.len();
    match shared.config.ack {
        AckMode::Accepted => match shared.inbox.submit(records, None) {
            Ok(_) => accepted(StatusCode::ACCEPTED, count, false),
            Err(refusal) => refused(shared, refusal, StatusCode::TOO_MANY_REQUESTS),
        },
        AckMode::Durable => wait_for_commit(shared, records).await,
    }
}

/// 422 `unstorable_message` when the engine would drop one of the messages
/// (no dead-letter topic takes it): nothing of the request is queued.
fn unstorable(
    shared: &Shared,
    stream_index: usize,
    payloads: &[crate::message::Payload],
) -> Option<Response> {
    payloads.iter().enumerate().find_map(|(index, payload)| {
        let reason = shared.record_check.check(stream_index, payload).err()?;
        debug!(connector_key = %shared.key, index, %reason, "refusing a message the engine would drop");
        Some(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unstorable_message",
            &format!("message {index} would not be stored: {reason}; nothing of this request was accepted"),
        ))
    })
}

/// Queues the records and answers once their batch is committed, or 503 when
/// the broker does not take them in time.
async fn wait_for_commit(shared: &Shared, records: Vec<SourceRecord>) -> Response {
    let count = records.len();
    match shared
        .inbox
        .deliver(records, shared.config.request_timeout)
        .await
    {
        Delivery::Committed => accepted(StatusCode::OK, count, true),
        Delivery::Refused(refusal) => refused(shared, refusal, StatusCode::SERVICE_UNAVAILABLE),
        Delivery::NotCommitted {
            closing: false,
            maybe_delivered,
        } => {
            debug!(connector_key = %shared.key, messages = count, maybe_delivered, "request timed out waiting for the broker");
            unavailable(
                shared,
                "timeout",
                if maybe_delivered {
                    "the messages were in a batch the broker has not acknowledged; they may have been or may still be delivered, so a retry may duplicate them"
                } else {
                    "the broker did not take the messages in time; they were not delivered, retry later"
                },
                maybe_delivered,
            )
        }
        Delivery::NotCommitted {
            closing: true,
            maybe_delivered,
        } => unavailable(
            shared,
            "closing",
            if maybe_delivered {
                "the source is stopping; the messages were in a batch being delivered and may still be in the topic"
            } else {
                "the source is stopping; the messages were not delivered"
            },
            maybe_delivered,
        ),
    }
}

fn records(
    shared: &Shared,
    stream_index: usize,
    headers: &HeaderMap,
    payloads: Vec<crate::message::Payload>,
) -> Vec<SourceRecord> {
    let user_headers: Headers = shared
        .forward_headers
        .iter()
        .filter_map(|(header, name)| {
            headers.get(header).map(|value| {
                let value = match value.to_str() {
                    Ok(text) => HeaderValue::String(text.into()),
                    Err(_) => HeaderValue::Raw(Bytes::copy_from_slice(value.as_bytes())),
                };
                (name.as_str().into(), value)
            })
        })
        .collect();
    let user_headers = with_trace_context(user_headers, headers);
    let idempotency_key = headers
        .get(&shared.idempotency_header)
        .map(|value| value.as_bytes())
        .filter(|key| !key.is_empty());
    payloads
        .into_iter()
        .enumerate()
        .map(|(index, payload)| SourceRecord {
            id: Some(match idempotency_key {
                Some(key) => message_id(key, index),
                None => uuid::Uuid::now_v7().as_u128(),
            }),
            stream_index,
            headers: user_headers.clone(),
            payload,
            partition: None,
            origin_timestamp: None,
        })
        .collect()
}

/// The request's W3C trace context (a valid `traceparent`, and `tracestate`
/// beside it) added to the message headers, unless `forward_headers` already
/// copied it: the source's batch span links to it (src/telemetry.rs) and
/// downstream consumers can continue the trace.
fn with_trace_context(mut user_headers: Headers, headers: &HeaderMap) -> Headers {
    use crate::telemetry::{TRACEPARENT, TRACESTATE, TraceParent};
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let Some(parent) = text(TRACEPARENT).filter(|value| TraceParent::parse(value).is_some()) else {
        return user_headers;
    };
    if user_headers.iter().any(|(name, _)| name == TRACEPARENT) {
        return user_headers;
    }
    user_headers.push((TRACEPARENT.into(), HeaderValue::String(parent.into())));
    if let Some(state) = text(TRACESTATE) {
        user_headers.push((TRACESTATE.into(), HeaderValue::String(state.into())));
    }
    user_headers
}

/// The id of message `index` of a request with this idempotency key: the same
/// request sent again gets the same ids, so Iggy's deduplication (when enabled
/// on the topic) and downstream consumers can drop the repeat.
pub fn message_id(key: &[u8], index: usize) -> u128 {
    let mut hasher = blake3::Hasher::new_derive_key("iggy-connect http source message id v1");
    hasher.update(&(key.len() as u64).to_le_bytes());
    hasher.update(key);
    hasher.update(&(index as u64).to_le_bytes());
    let digest = hasher.finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest.as_bytes()[..16]);
    u128::from_le_bytes(id)
}

fn authorized(headers: &HeaderMap, expected: &[u8; 32]) -> bool {
    let Some(value) = headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let Some((scheme, token)) = value.split_once(' ') else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return false;
    }
    let digest = blake3::hash(token.trim().as_bytes());
    digest.as_bytes().ct_eq(expected).into()
}

enum ReadError {
    TooLarge,
    Io(String),
}

async fn read_body(body: Body, limit: usize) -> Result<Bytes, ReadError> {
    let mut stream = body.into_data_stream();
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut size = 0;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|error| ReadError::Io(format!("cannot read the body: {error}")))?;
        size += chunk.len();
        if size > limit {
            return Err(ReadError::TooLarge);
        }
        chunks.push(chunk);
    }
    if chunks.len() == 1 {
        return Ok(chunks.pop().unwrap_or_default());
    }
    let mut buffer = BytesMut::with_capacity(size);
    for chunk in chunks {
        buffer.extend_from_slice(&chunk);
    }
    Ok(buffer.freeze())
}

fn health(shared: &Shared) -> Response {
    let health = shared.inbox.health();
    let status = if health.healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let millis = |duration: Option<std::time::Duration>| duration.map(|d| d.as_millis() as u64);
    let body = json!({
        "status": if health.healthy { "healthy" } else { "unhealthy" },
        "closed": health.closed,
        "waiting_requests": health.waiting_requests,
        "waiting_messages": health.waiting_messages,
        "in_flight_messages": health.in_flight_messages,
        "in_flight_age_ms": millis(health.in_flight_age),
        "stalled_for_ms": millis(health.stalled_for),
        "unhealthy_after_ms": shared.config.unhealthy_after.as_millis() as u64,
    });
    (status, axum::Json(body)).into_response()
}

fn accepted(status: StatusCode, count: usize, durable: bool) -> Response {
    (
        status,
        axum::Json(json!({"accepted": count, "durable": durable})),
    )
        .into_response()
}

fn refused(shared: &Shared, refusal: SubmitError, when_full: StatusCode) -> Response {
    match refusal {
        SubmitError::Closed => unavailable(shared, "closing", "the source is stopping", false),
        SubmitError::Full { .. } => {
            let mut response = error(when_full, "queue_full", &refusal.to_string());
            set_retry_after(&mut response, shared.config.retry_after_secs());
            response
        }
    }
}

fn unavailable(shared: &Shared, code: &str, message: &str, maybe_delivered: bool) -> Response {
    let body = json!({"error": code, "message": message, "maybe_delivered": maybe_delivered});
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    set_retry_after(&mut response, shared.config.retry_after_secs());
    response
}

fn too_large_request(limit: usize) -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        &format!("the request body is larger than max_request_bytes ({limit})"),
    )
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": code, "message": message})),
    )
        .into_response()
}

fn set_retry_after(response: &mut Response, seconds: u64) {
    response
        .headers_mut()
        .insert(RETRY_AFTER, axum::http::HeaderValue::from(seconds));
}

fn count_response(key: &str, status: StatusCode) {
    metrics::counter!(
        "iggy_connector_http_source_responses_total",
        "connector_key" => key.to_owned(),
        "status" => status.as_str().to_owned()
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_same_key_and_index_when_hashed_should_give_the_same_id() {
        assert_eq!(message_id(b"order-42", 0), message_id(b"order-42", 0));
        assert_ne!(message_id(b"order-42", 0), message_id(b"order-42", 1));
        assert_ne!(message_id(b"order-42", 0), message_id(b"order-43", 0));
    }

    #[test]
    fn given_bearer_headers_when_checked_should_accept_only_the_token() {
        let expected = *blake3::hash(b"s3cret").as_bytes();
        let check = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(AUTHORIZATION, value.parse().unwrap());
            authorized(&headers, &expected)
        };
        assert!(check("Bearer s3cret"));
        assert!(check("bearer s3cret"));
        assert!(!check("Bearer s3cre"));
        assert!(!check("Basic s3cret"));
        assert!(!check("s3cret"));
        assert!(!authorized(&HeaderMap::new(), &expected));
    }
}
