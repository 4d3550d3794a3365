//! OTLP/HTTP: `POST /v1/logs`, `/v1/traces`, `/v1/metrics` with protobuf
//! (`application/x-protobuf`) or JSON (`application/json`) bodies, gzip or
//! not; answers in the request's encoding, errors as a `google.rpc.Status`.

use std::io::Read;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{
    AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{Refusal, Shared};
use crate::connectors::otlp::{Encoding, Signal, decode, response_json};

pub(super) async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let health = shared.clone();
    let router = Router::new()
        .route(
            "/v1/logs",
            post(handler::<ExportLogsServiceRequest>(&shared)),
        )
        .route(
            "/v1/traces",
            post(handler::<ExportTraceServiceRequest>(&shared)),
        )
        .route(
            "/v1/metrics",
            post(handler::<ExportMetricsServiceRequest>(&shared)),
        )
        .route("/health", get(move || async move { health_check(&health) }));
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}

fn handler<S: Signal>(
    shared: &Arc<Shared>,
) -> impl Fn(Request) -> std::pin::Pin<Box<dyn Future<Output = Response> + Send>> + Clone + Send + 'static
{
    let shared = shared.clone();
    move |request| {
        let shared = shared.clone();
        Box::pin(async move {
            let response = export::<S>(&shared, request).await;
            metrics::counter!(
                "iggy_connector_otlp_source_responses_total",
                "connector_key" => shared.key.clone(),
                "protocol" => "http",
                "status" => response.status().as_str().to_owned()
            )
            .increment(1);
            response
        })
    }
}

async fn export<S: Signal>(shared: &Shared, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    // Without a known content type the answer is protobuf, the OTLP default.
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let encoding = match content_type.split(';').next().map(str::trim) {
        Some("application/x-protobuf") => Encoding::Protobuf,
        Some("application/json") => Encoding::Json,
        _ => {
            return status(
                Encoding::Protobuf,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!(
                    "expected Content-Type application/x-protobuf or application/json, found \"{content_type}\""
                ),
                None,
            );
        }
    };
    if !shared.authorized(parts.headers.get(AUTHORIZATION).map(HeaderValue::as_bytes)) {
        let mut response = refusal(shared, encoding, Refusal::Unauthorized);
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    let limit = shared.config.max_request_bytes;
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return refusal(shared, encoding, too_large(limit));
    }
    let body = match read(body, limit).await {
        Ok(body) => body,
        Err(problem) => return refusal(shared, encoding, problem),
    };
    let gzip = match parts
        .headers
        .get(CONTENT_ENCODING)
        .map(|value| {
            value
                .to_str()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .as_deref()
    {
        None | Some("identity") | Some("") => false,
        Some("gzip") => true,
        Some(other) => {
            return status(
                encoding,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("unsupported Content-Encoding \"{other}\" (gzip or none)"),
                None,
            );
        }
    };
    let body = if gzip {
        match gunzip(&body, limit) {
            Ok(body) => body,
            Err(problem) => return refusal(shared, encoding, problem),
        }
    } else {
        body
    };
    let request: S = match decode(encoding, &body) {
        Ok(request) => request,
        Err(error) => return refusal(shared, encoding, Refusal::BadRequest(error.to_string())),
    };
    match shared.export(request).await {
        Ok(answer) => (
            StatusCode::OK,
            [(CONTENT_TYPE, encoding.content_type())],
            match encoding {
                Encoding::Json => response_json(&answer),
                Encoding::Protobuf => answer.encode_to_vec(),
            },
        )
            .into_response(),
        Err(problem) => refusal(shared, encoding, problem),
    }
}

fn too_large(limit: usize) -> Refusal {
    Refusal::TooLarge(format!(
        "the request is larger than max_request_bytes ({limit})"
    ))
}

async fn read(body: Body, limit: usize) -> Result<Vec<u8>, Refusal> {
    let mut stream = body.into_data_stream();
    let mut body = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|error| Refusal::BadRequest(format!("cannot read the body: {error}")))?;
        if body.len() + chunk.len() > limit {
            return Err(too_large(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The decompressed body, refused once it grows beyond `limit` (a small gzip
/// body may inflate to far more than it weighs).
fn gunzip(body: &[u8], limit: usize) -> Result<Vec<u8>, Refusal> {
    let mut inflated = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(limit as u64 + 1)
        .read_to_end(&mut inflated)
        .map_err(|error| Refusal::BadRequest(format!("the body is not valid gzip: {error}")))?;
    if inflated.len() > limit {
        return Err(too_large(limit));
    }
    Ok(inflated)
}

fn refusal(shared: &Shared, encoding: Encoding, refusal: Refusal) -> Response {
    let retry_after = Some(shared.config.retry_after_secs());
    match refusal {
        Refusal::Unauthorized => status(
            encoding,
            StatusCode::UNAUTHORIZED,
            "a valid `Authorization: Bearer <token>` header is required",
            None,
        ),
        Refusal::BadRequest(message) => status(encoding, StatusCode::BAD_REQUEST, &message, None),
        Refusal::TooLarge(message) => {
            status(encoding, StatusCode::PAYLOAD_TOO_LARGE, &message, None)
        }
        Refusal::NotReceived(signal) => status(
            encoding,
            StatusCode::NOT_FOUND,
            &format!("this receiver takes no {signal} (no [[streams]] entry for it)"),
            None,
        ),
        Refusal::Unavailable(message) => status(
            encoding,
            StatusCode::SERVICE_UNAVAILABLE,
            &message,
            retry_after,
        ),
        Refusal::Exhausted(message) => status(
            encoding,
            StatusCode::TOO_MANY_REQUESTS,
            &message,
            retry_after,
        ),
    }
}

/// An error answer: a `google.rpc.Status` in the request's encoding.
fn status(
    encoding: Encoding,
    code: StatusCode,
    message: &str,
    retry_after: Option<u64>,
) -> Response {
    let grpc_code = match code {
        StatusCode::UNAUTHORIZED => tonic::Code::Unauthenticated,
        StatusCode::NOT_FOUND => tonic::Code::Unimplemented,
        StatusCode::SERVICE_UNAVAILABLE => tonic::Code::Unavailable,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::PAYLOAD_TOO_LARGE => {
            tonic::Code::ResourceExhausted
        }
        _ => tonic::Code::InvalidArgument,
    } as i32;
    let body = match encoding {
        Encoding::Json => json!({"code": grpc_code, "message": message})
            .to_string()
            .into_bytes(),
        Encoding::Protobuf => tonic_types::Status {
            code: grpc_code,
            message: message.to_owned(),
            details: Vec::new(),
        }
        .encode_to_vec(),
    };
    let mut response = (code, [(CONTENT_TYPE, encoding.content_type())], body).into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

fn health_check(shared: &Shared) -> Response {
    let health = shared.inbox.health();
    let code = if health.healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if health.healthy { "healthy" } else { "unhealthy" },
        "closed": health.closed,
        "waiting_requests": health.waiting_requests,
        "waiting_messages": health.waiting_messages,
        "in_flight_messages": health.in_flight_messages,
    });
    (code, axum::Json(body)).into_response()
}
