//! `GET /events`: what `/stats`, `/sources` and `/sinks` answer, pushed as
//! Server-Sent Events, so the status page (and any client) follows the
//! connectors without polling.
//!
//! Each `snapshot` event is one JSON object: `stats` (the `/stats` answer),
//! `sources` and `sinks` (the list answers: status, lag, last error) and
//! `tap` (whether `[http] tap` serves the tap endpoints). One is sent at once,
//! then whenever a connector's status, lag or last error changes (checked
//! every [`CHANGE_CHECK`]) and at least every `interval_ms` (default 1 s), so
//! a client can turn the counters into rates. A quiet stream carries
//! keep-alive comments; the stream ends when the API shuts down.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use axum::{Extension, Router};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::api::extract::Query;
use crate::api::{ApiError, ApiState, connectors, stats};
use crate::config::runtime::HttpConfig;
use crate::connectors::ConnectorKind;

/// How often the connectors' status is compared with the last snapshot's.
const CHANGE_CHECK: Duration = Duration::from_millis(250);
const DEFAULT_INTERVAL_MS: u64 = 1000;
const MIN_INTERVAL_MS: u64 = 100;
const MAX_INTERVAL_MS: u64 = 60_000;

#[derive(Debug, Clone)]
struct EventSettings {
    /// Whether the tap endpoints are served (the page hides its tap if not).
    tap: bool,
    /// Comments sent on a quiet stream, so `idle_timeout` does not close it.
    keep_alive: Duration,
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    interval_ms: Option<u64>,
}

pub fn routes(config: &HttpConfig) -> Router<Arc<ApiState>> {
    let settings = EventSettings {
        tap: config.tap,
        keep_alive: (config.idle_timeout / 2)
            .clamp(Duration::from_millis(100), Duration::from_secs(15)),
    };
    Router::new()
        .route("/events", get(events))
        .layer(Extension(Arc::new(settings)))
}

async fn events(
    State(state): State<Arc<ApiState>>,
    Extension(settings): Extension<Arc<EventSettings>>,
    Query(query): Query<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let interval_ms = query.interval_ms.unwrap_or(DEFAULT_INTERVAL_MS);
    if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&interval_ms) {
        return Err(ApiError::BadRequest(format!(
            "interval_ms must be between {MIN_INTERVAL_MS} and {MAX_INTERVAL_MS}"
        )));
    }
    let keep_alive = KeepAlive::new().interval(settings.keep_alive);
    let closing = state.closing.clone();
    let snapshots = Snapshots {
        state,
        tap: settings.tap,
        interval: Duration::from_millis(interval_ms),
        due: Instant::now(),
        last: None,
    };
    Ok(Sse::new(
        snapshots
            .into_stream()
            .take_until(closing.cancelled_owned()),
    )
    .keep_alive(keep_alive))
}

/// Sends a snapshot when the connectors changed or the interval is up.
struct Snapshots {
    state: Arc<ApiState>,
    tap: bool,
    interval: Duration,
    /// When the next snapshot is sent even if nothing changed.
    due: Instant,
    /// The connector lists of the last snapshot sent.
    last: Option<(Value, Value)>,
}

impl Snapshots {
    fn into_stream(self) -> impl Stream<Item = Result<Event, Infallible>> {
        futures::stream::unfold(self, |mut snapshots| async move {
            let event = snapshots.next_event().await;
            Some((Ok(event), snapshots))
        })
    }

    async fn next_event(&mut self) -> Event {
        loop {
            let views = self.state.runtime.views();
            let lists = (
                connectors::listing(&views, ConnectorKind::Source),
                connectors::listing(&views, ConnectorKind::Sink),
            );
            let now = Instant::now();
            if now >= self.due || self.last.as_ref() != Some(&lists) {
                self.due = now + self.interval;
                let stats = stats::body(&self.state, &views).await;
                let (sources, sinks) = &lists;
                let value = json!({
                    "stats": stats,
                    "sources": sources,
                    "sinks": sinks,
                    "tap": self.tap,
                });
                self.last = Some(lists);
                return Event::default().event("snapshot").data(value.to_string());
            }
            tokio::time::sleep(CHANGE_CHECK.min(self.due - now)).await;
        }
    }
}
