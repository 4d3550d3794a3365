//! The Prometheus exporter behind `GET /metrics`. The engine records through
//! the `metrics` facade; this installs the process-wide recorder that turns
//! those records into Prometheus text.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use crate::api::ApiState;

/// Upstream's buckets for `iggy_connector_stage_duration_seconds`: 50 µs to 5 s.
pub const STAGE_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

static INSTALLED: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs the Prometheus recorder for the whole process, once; later calls
/// return the same handle. Must run before connectors are added: metric
/// handles resolved earlier record nowhere.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let mut installed = INSTALLED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("iggy_connector_stage_duration_seconds".into()),
            STAGE_BUCKETS,
        )?
        .install_recorder()?;
    let upkeep = handle.clone();
    // Drains histogram samples between scrapes, so memory stays flat when
    // nobody scrapes.
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(5));
                upkeep.run_upkeep();
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "cannot start the metrics upkeep thread; histograms are drained at each scrape only");
    }
    *installed = Some(handle.clone());
    Ok(handle)
}

pub async fn render(State(state): State<Arc<ApiState>>) -> impl IntoResponse {
    let text = state
        .prometheus
        .as_ref()
        .map(PrometheusHandle::render)
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}
