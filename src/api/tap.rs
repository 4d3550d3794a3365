//! `GET /{sources|sinks}/{key}/tap`: a connector's messages, sampled live, as
//! Server-Sent Events.
//!
//! Each `message` event is one JSON frame; `notice` events say when the
//! subscription started, when an interval first dropped a message over its
//! `limit`, and how many messages an interval dropped (over the limit, skipped in large batches, or
//! lost because this client fell behind). The pipeline never waits for a
//! client: see [`crate::engine::tap`].

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use axum::{Extension, Router};
use base64::Engine;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::api::extract::{Path, Query};
use crate::api::redact::REDACTED;
use crate::api::{ApiError, ApiState};
use crate::config::runtime::HttpConfig;
use crate::connectors::ConnectorKind;
use crate::engine::tap::{TapEvent, TapFrame, TapStage, TapSubscription};

const DEFAULT_LIMIT: usize = 100;
const DEFAULT_INTERVAL_MS: u64 = 500;
const DEFAULT_MAX_BYTES: usize = 4096;
/// The largest payload excerpt a client may ask for.
const MAX_MAX_BYTES: usize = 1 << 20;

/// `[http]`'s tap settings, shared by the tap routes.
#[derive(Debug, Clone)]
struct TapSettings {
    enabled: bool,
    /// Lower-case header names whose values are never shown.
    redacted_headers: Vec<String>,
    /// Comments sent on a quiet stream, so `idle_timeout` does not close it.
    keep_alive: Duration,
}

#[derive(Debug, Deserialize)]
struct TapQuery {
    stage: Option<String>,
    limit: Option<usize>,
    interval_ms: Option<u64>,
    max_bytes: Option<usize>,
}

/// What one client asked for, checked.
#[derive(Debug, Clone)]
struct Request {
    connector: String,
    stage: TapStage,
    limit: usize,
    interval: Duration,
    max_bytes: usize,
}

pub fn routes(kind: ConnectorKind, config: &HttpConfig) -> Router<Arc<ApiState>> {
    let settings = TapSettings {
        enabled: config.tap,
        redacted_headers: config
            .tap_redact_headers
            .iter()
            .map(|name| name.to_ascii_lowercase())
            .collect(),
        keep_alive: (config.idle_timeout / 2)
            .clamp(Duration::from_millis(100), Duration::from_secs(15)),
    };
    Router::new()
        .route("/{key}/tap", get(tap))
        .layer(Extension(Arc::new(settings)))
        .layer(Extension(kind))
}

async fn tap(
    State(state): State<Arc<ApiState>>,
    Extension(kind): Extension<ConnectorKind>,
    Extension(settings): Extension<Arc<TapSettings>>,
    Path(key): Path<String>,
    Query(query): Query<TapQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    if !settings.enabled {
        return Err(ApiError::TapDisabled);
    }
    let view = state
        .runtime
        .view(kind, &key)
        .map_err(|_| ApiError::NotFound {
            kind,
            key: key.clone(),
        })?;
    let request = Request::checked(key, query)?;
    let subscription = view.tap.subscribe(request.stage);
    let keep_alive = KeepAlive::new().interval(settings.keep_alive);
    Ok(Sse::new(
        Sampler::new(request, settings, subscription)
            .into_stream()
            .take_until(state.closing.clone().cancelled_owned()),
    )
    .keep_alive(keep_alive))
}

impl Request {
    fn checked(connector: String, query: TapQuery) -> Result<Self, ApiError> {
        let stage = match query.stage.as_deref() {
            None => TapStage::In,
            Some(stage) => stage.parse().map_err(ApiError::BadRequest)?,
        };
        let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
        let interval_ms = query.interval_ms.unwrap_or(DEFAULT_INTERVAL_MS);
        let max_bytes = query.max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
        let bad = |message: &str| Err(ApiError::BadRequest(message.to_owned()));
        if limit == 0 {
            return bad("limit must be at least 1");
        }
        if interval_ms == 0 {
            return bad("interval_ms must be at least 1");
        }
        if max_bytes > MAX_MAX_BYTES {
            return bad("max_bytes must be at most 1048576");
        }
        Ok(Self {
            connector,
            stage,
            limit,
            interval: Duration::from_millis(interval_ms),
            max_bytes,
        })
    }
}

/// Forwards at most `limit` messages per interval and counts the rest.
struct Sampler {
    request: Request,
    settings: Arc<TapSettings>,
    subscription: TapSubscription,
    interval_ends: Instant,
    sent: usize,
    dropped: u64,
    /// Whether this interval's `limit` notice was sent.
    limit_noticed: bool,
    pending: VecDeque<Event>,
}

impl Sampler {
    fn new(request: Request, settings: Arc<TapSettings>, subscription: TapSubscription) -> Self {
        let subscribed = notice(
            "subscribed",
            format!(
                "tapping {} at stage {}",
                request.connector,
                request.stage.as_str()
            ),
            None,
        );
        Self {
            interval_ends: Instant::now() + request.interval,
            request,
            settings,
            subscription,
            sent: 0,
            dropped: 0,
            limit_noticed: false,
            pending: VecDeque::from([subscribed]),
        }
    }

    fn into_stream(self) -> impl Stream<Item = Result<Event, Infallible>> {
        futures::stream::unfold(self, |mut sampler| async move {
            let event = sampler.next_event().await;
            Some((Ok(event), sampler))
        })
    }

    async fn next_event(&mut self) -> Event {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return event;
            }
            tokio::select! {
                received = self.subscription.receiver.recv() => {
                    if let Some(event) = self.received(received) {
                        return event;
                    }
                }
                () = tokio::time::sleep_until(self.interval_ends) => self.end_interval(),
            }
        }
    }

    fn received(&mut self, received: Result<TapEvent, RecvError>) -> Option<Event> {
        match received {
            Ok(TapEvent::Message(frame)) if self.sent < self.request.limit => {
                self.sent += 1;
                Some(self.message(&frame))
            }
            // The first message over the limit in an interval is announced.
            Ok(TapEvent::Message(_)) => {
                self.dropped += 1;
                (!std::mem::replace(&mut self.limit_noticed, true)).then(|| {
                    let message = format!(
                        "limit of {} reached; the rest of this {} ms interval is dropped",
                        self.request.limit,
                        self.request.interval.as_millis()
                    );
                    notice("limit", message, None)
                })
            }
            Ok(TapEvent::Skipped(count)) | Err(RecvError::Lagged(count)) => {
                self.dropped += count;
                None
            }
            // The connector's tap outlives every subscription; a closed ring
            // would only mean the runtime is going away.
            Err(RecvError::Closed) => {
                self.interval_ends = Instant::now() + Duration::from_secs(3600);
                None
            }
        }
    }

    fn end_interval(&mut self) {
        if self.dropped > 0 {
            let dropped = self.dropped;
            let message = format!("{dropped} dropped");
            self.pending
                .push_back(notice("dropped", message, Some(dropped)));
        }
        self.sent = 0;
        self.dropped = 0;
        self.limit_noticed = false;
        self.interval_ends = Instant::now() + self.request.interval;
    }

    fn message(&self, frame: &TapFrame) -> Event {
        let value = render_frame(&self.request, &self.settings.redacted_headers, frame);
        Event::default().event("message").data(value.to_string())
    }
}

fn notice(kind: &str, message: String, dropped: Option<u64>) -> Event {
    let mut value = json!({ "notice": kind, "message": message });
    if let Some(dropped) = dropped {
        value["dropped"] = json!(dropped);
    }
    Event::default().event("notice").data(value.to_string())
}

/// One frame as JSON: where it was seen, its headers (redacted) and its
/// payload cut to `max_bytes`, as UTF-8 text or else base64.
fn render_frame(request: &Request, redacted: &[String], frame: &TapFrame) -> Value {
    let time = UNIX_EPOCH + Duration::from_micros(frame.time_micros);
    let headers: Map<String, Value> = frame
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
    let (payload, encoding) = excerpt(&frame.payload, request.max_bytes);
    json!({
        "time": humantime::format_rfc3339_micros(time).to_string(),
        "connector": request.connector,
        "stage": request.stage.as_str(),
        "stream": frame.topic.as_ref().map(|topic| &topic.stream),
        "topic": frame.topic.as_ref().map(|topic| &topic.topic),
        "partition": frame.partition,
        "offset": frame.offset,
        "headers": headers,
        "payload": payload,
        "encoding": encoding,
        "size": frame.payload.len(),
        "truncated": frame.payload.len() > request.max_bytes,
    })
}

/// The first `max_bytes` of a payload as text when they are UTF-8 (a
/// character cut at the end is left out), else as base64.
pub(super) fn excerpt(payload: &[u8], max_bytes: usize) -> (String, &'static str) {
    let cut = &payload[..payload.len().min(max_bytes)];
    let text = match std::str::from_utf8(cut) {
        Ok(text) => Some(text),
        // Only the last character was cut in two.
        Err(error) if error.error_len().is_none() && cut.len() < payload.len() => {
            std::str::from_utf8(&cut[..error.valid_up_to()]).ok()
        }
        Err(_) => None,
    };
    match text {
        Some(text) => (text.to_owned(), "utf8"),
        None => (
            base64::engine::general_purpose::STANDARD.encode(cut),
            "base64",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_utf8_cut_inside_a_character_when_excerpted_should_drop_the_partial_character() {
        let (text, encoding) = excerpt("aé".as_bytes(), 2);
        assert_eq!((text.as_str(), encoding), ("a", "utf8"));
    }

    #[test]
    fn given_binary_payload_when_excerpted_should_be_base64() {
        let (text, encoding) = excerpt(&[0xff, 0x00, 0x01], 2);
        assert_eq!((text.as_str(), encoding), ("/wA=", "base64"));
    }

    #[test]
    fn given_a_query_when_checked_should_refuse_zero_limit_and_unknown_stage() {
        let query = |stage: Option<&str>, limit| TapQuery {
            stage: stage.map(str::to_owned),
            limit,
            interval_ms: None,
            max_bytes: None,
        };
        assert!(Request::checked("k".into(), query(None, Some(0))).is_err());
        assert!(Request::checked("k".into(), query(Some("nope"), None)).is_err());
        let request = Request::checked("k".into(), query(Some("dlq"), None));
        assert!(request.is_ok_and(|request| request.stage == TapStage::Dlq));
    }
}
