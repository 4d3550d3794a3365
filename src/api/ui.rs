//! `GET /ui`: the status page, one self-contained HTML file (inline script
//! and style, no network but the API's own endpoints) compiled into the
//! binary. The page itself is public; everything it reads or changes goes
//! through the API with the key typed into it (kept in session storage).

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::api::ApiState;

const PAGE: &str = include_str!("ui.html");

/// The page allows only its own inline script and style and requests to the
/// API it came from.
const POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                      connect-src 'self'; img-src data:; form-action 'none'; frame-ancestors 'none'";

/// Adds `/ui` to `router` (outside the API key check: the page holds no
/// data) when `enabled`.
pub fn route(router: Router<Arc<ApiState>>, enabled: bool) -> Router<Arc<ApiState>> {
    if enabled {
        router.route("/ui", get(page))
    } else {
        router
    }
}

async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
}
