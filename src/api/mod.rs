//! The HTTP control plane: upstream's endpoints (`/`, `/health`, `/stats`,
//! `/metrics`, `/sources`, `/sinks`, per-key details, configs, restart) plus
//! stop, start, a source's committed state and a liveness probe.
//!
//! Every config and state the API returns goes through [`redact`]: secrets are
//! never sent in clear text, whatever the format asked for.

mod auth;
mod configs;
mod connectors;
mod dlq;
mod error;
mod events;
mod extract;
mod health;
pub mod metrics;
pub mod provider;
pub mod redact;
mod render;
mod server;
mod stats;
mod tap;
mod ui;

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::now_micros;
use crate::config::env::EnvVars;
use crate::config::runtime::HttpConfig;
use crate::connectors::ConnectorKind;
use crate::engine::Runtime;
use crate::state::StateStore;

pub use error::ApiError;
pub use provider::LocalProvider;
pub use server::{ApiServer, ApiSetupError};

/// What the handlers share.
use crate::engine::runtime::LifecycleLock;

pub struct ApiState {
    runtime: Arc<Runtime>,
    state_store: Arc<dyn StateStore>,
    provider: Option<LocalProvider>,
    prometheus: Option<PrometheusHandle>,
    started_at: u64,
    /// When `/health` last pinged the broker, and why it did not answer.
    broker_answer: tokio::sync::Mutex<Option<(std::time::Instant, Option<String>)>>,
    /// Cancelled when the API shuts down: long-lived answers (a tap's event
    /// stream) end on it instead of holding the graceful shutdown to its grace.
    closing: CancellationToken,
}

impl ApiState {
    pub fn new(runtime: Arc<Runtime>, state_store: Arc<dyn StateStore>) -> Self {
        Self {
            runtime,
            state_store,
            provider: None,
            prometheus: None,
            started_at: now_micros(),
            broker_answer: tokio::sync::Mutex::new(None),
            closing: CancellationToken::new(),
        }
    }

    /// The connector directory the runtime was loaded from: the config
    /// endpoints read and write it, and start/restart load the active version
    /// from it.
    pub fn with_config_dir(mut self, dir: impl Into<PathBuf>, vars: EnvVars) -> Self {
        self.provider = Some(LocalProvider::new(dir.into(), vars));
        self
    }

    /// Serves `/metrics` from this recorder (see [`metrics::install`]).
    pub fn with_prometheus(mut self, handle: PrometheusHandle) -> Self {
        self.prometheus = Some(handle);
        self
    }

    /// The runtime's lock of one connector's lifecycle (see
    /// [`Runtime::lifecycle_lock`]): hot reload takes it too.
    fn lifecycle_lock(&self, kind: ConnectorKind, key: &str) -> LifecycleLock {
        self.runtime.lifecycle_lock(kind, key)
    }
}

/// Builds the router: public `/`, `/health` and `/health/live`; everything
/// else behind the API key when one is set; CORS outermost.
pub fn router(config: &HttpConfig, state: Arc<ApiState>) -> Result<Router, ApiSetupError> {
    let mut routes = Router::new()
        .route("/stats", get(stats::stats))
        .merge(events::routes(config))
        .nest(
            "/sources",
            connectors::routes(ConnectorKind::Source)
                .merge(configs::routes(ConnectorKind::Source))
                .merge(tap::routes(ConnectorKind::Source, config))
                .merge(dlq::routes(ConnectorKind::Source, config)),
        )
        .nest(
            "/sinks",
            connectors::routes(ConnectorKind::Sink)
                .merge(configs::routes(ConnectorKind::Sink))
                .merge(tap::routes(ConnectorKind::Sink, config))
                .merge(dlq::routes(ConnectorKind::Sink, config)),
        );
    if config.metrics.enabled && state.prometheus.is_some() {
        check_metrics_endpoint(&config.metrics.endpoint)?;
        routes = routes.route(&config.metrics.endpoint, get(metrics::render));
    }
    let routes = routes
        .route("/", get(root))
        .route("/health", get(health::health))
        .route("/health/live", get(health::live))
        // Only matched routes ask for the key: an unknown path is a JSON 404
        // with or without one.
        .route_layer(axum::middleware::from_fn_with_state(
            auth::ApiKey::new(&config.api_key),
            auth::require_api_key,
        ));
    let routes = ui::route(routes, config.ui)
        .fallback(no_endpoint)
        .layer(axum::middleware::from_fn(method_not_allowed))
        .with_state(state);
    match server::cors_layer(&config.cors)? {
        Some(cors) => Ok(routes.layer(cors)),
        None => Ok(routes),
    }
}

/// Refuses a metrics path that would shadow another endpoint or that the
/// router cannot take (it would panic on it).
fn check_metrics_endpoint(endpoint: &str) -> Result<(), ApiSetupError> {
    let message = if !endpoint.starts_with('/') {
        Some("must start with '/'")
    } else if endpoint.contains(['{', '}', '*']) || endpoint.contains("//") {
        Some("must be a plain path, without '{', '}', '*' or empty segments")
    } else if ["/", "/health", "/health/live", "/stats", "/events", "/ui"].contains(&endpoint)
        || ["/sources", "/sinks"]
            .iter()
            .any(|prefix| endpoint == *prefix || endpoint.starts_with(&format!("{prefix}/")))
    {
        Some("is already an endpoint of the API")
    } else {
        None
    };
    match message {
        Some(message) => Err(ApiSetupError::MetricsEndpoint {
            endpoint: endpoint.to_owned(),
            message: message.to_owned(),
        }),
        None => Ok(()),
    }
}

async fn no_endpoint(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::NoEndpoint {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

/// axum answers a known path asked with another method 405 with an empty
/// body (its `Allow` header is added outside this layer): this gives it the
/// JSON error every other answer has.
async fn method_not_allowed(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (method, path) = (
        request.method().to_string(),
        request.uri().path().to_owned(),
    );
    let response = next.run(request).await;
    if response.status() != axum::http::StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    ApiError::MethodNotAllowed { method, path }.into_response()
}

async fn root() -> &'static str {
    "Connector Runtime API"
}
