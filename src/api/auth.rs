//! `api-key` header authentication (upstream's scheme), compared in constant
//! time so response timing does not reveal how much of a guess was right.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use secrecy::{ExposeSecret, SecretString};
use subtle::ConstantTimeEq;

/// The paths an orchestrator probes without credentials.
const PUBLIC_PATHS: &[&str] = &["/", "/health", "/health/live"];

const HEADER: &str = "api-key";

/// The configured key; `None` when empty (no authentication, as upstream).
#[derive(Clone)]
pub struct ApiKey(Option<Arc<SecretString>>);

impl ApiKey {
    pub fn new(key: &SecretString) -> Self {
        if key.expose_secret().is_empty() {
            Self(None)
        } else {
            Self(Some(Arc::new(key.clone())))
        }
    }

    fn accepts(&self, offered: Option<&[u8]>) -> bool {
        match (&self.0, offered) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(key), Some(offered)) => key.expose_secret().as_bytes().ct_eq(offered).into(),
        }
    }
}

/// Whether the request carried the right key (or none is configured): set on
/// requests for public paths, which show details only to those that did.
#[derive(Debug, Clone, Copy)]
pub struct Authorized(pub bool);

/// Answers 401 with an empty body (upstream's answer) unless the request is
/// for a public path or carries the right key.
pub async fn require_api_key(
    State(key): State<ApiKey>,
    mut request: Request,
    next: Next,
) -> Response {
    let offered = request.headers().get(HEADER).map(|value| value.as_bytes());
    let authorized = key.accepts(offered);
    if PUBLIC_PATHS.contains(&request.uri().path()) {
        request.extensions_mut().insert(Authorized(authorized));
        return next.run(request).await;
    }
    if authorized {
        next.run(request).await
    } else {
        StatusCode::UNAUTHORIZED.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_no_key_configured_when_checked_should_accept_anything() {
        let key = ApiKey::new(&SecretString::from(""));
        assert!(key.accepts(None));
        assert!(key.accepts(Some(b"whatever")));
    }

    #[test]
    fn given_a_key_when_checked_should_accept_only_that_exact_key() {
        let key = ApiKey::new(&SecretString::from("s3cret"));
        assert!(key.accepts(Some(b"s3cret")));
        assert!(!key.accepts(None));
        assert!(!key.accepts(Some(b"s3cre")));
        assert!(!key.accepts(Some(b"s3cret!")));
        assert!(!key.accepts(Some(b"")));
    }
}
