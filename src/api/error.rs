//! Errors as upstream returns them: a status and `{"code", "reason"}`, plus the
//! config issues when a config is refused.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::config::ConfigIssue;
use crate::connectors::ConnectorKind;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{kind} with key \"{key}\" not found")]
    NotFound { kind: ConnectorKind, key: String },
    #[error("{kind} \"{key}\" has no config version {version}")]
    VersionNotFound {
        kind: ConnectorKind,
        key: String,
        version: u64,
    },
    #[error("{kind} \"{key}\" has no config in the connector directory")]
    NoConfig { kind: ConnectorKind, key: String },
    #[error("invalid configuration: {reason}")]
    InvalidConfiguration {
        reason: String,
        issues: Vec<ConfigIssue>,
    },
    #[error("{0}")]
    BadRequest(String),
    /// The request needs the connector stopped.
    #[error("{kind} \"{key}\" is {status}: stop it first (POST /{kind}s/{key}/stop)")]
    Running {
        kind: ConnectorKind,
        key: String,
        status: String,
    },
    /// A request body that is not the JSON the endpoint takes (syntax, shape or
    /// content type), with the status axum chose for it.
    #[error("invalid request body: {reason}")]
    InvalidBody { status: StatusCode, reason: String },
    #[error("no endpoint {method} {path}")]
    NoEndpoint { method: String, path: String },
    /// A known path asked with a method it does not take (the answer's
    /// `Allow` header lists those it takes).
    #[error("{path} does not take {method} (see the Allow header)")]
    MethodNotAllowed { method: String, path: String },
    /// Upstream answers a config it cannot render in the asked format with 400
    /// and code `error`.
    #[error("cannot convert the configuration: {0}")]
    CannotConvert(String),
    #[error("{0}")]
    Internal(String),
    /// Answered by the listener itself, before any request is read.
    #[error(
        "the API already has its {limit} connections ([http] max_connections) open; retry later"
    )]
    TooManyConnections { limit: usize },
    #[error("the tap is turned off ([http] tap = false)")]
    TapDisabled,
    /// The request clashes with one in progress.
    #[error("{0}")]
    Conflict(String),
    /// The bus (Iggy) did not answer.
    #[error("{0}")]
    Unavailable(String),
}

#[derive(Serialize)]
struct Body {
    code: String,
    reason: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    issues: Vec<IssueBody>,
}

#[derive(Serialize)]
struct IssueBody {
    field: String,
    message: String,
    severity: &'static str,
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, String) {
        match self {
            ApiError::NotFound { kind, .. } => (StatusCode::NOT_FOUND, format!("{kind}_not_found")),
            ApiError::VersionNotFound { kind, .. } | ApiError::NoConfig { kind, .. } => {
                (StatusCode::NOT_FOUND, format!("{kind}_config_not_found"))
            }
            ApiError::InvalidConfiguration { .. } => {
                (StatusCode::BAD_REQUEST, "invalid_configuration".into())
            }
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request".into()),
            ApiError::Running { .. } => (StatusCode::CONFLICT, "connector_running".into()),
            ApiError::InvalidBody { status, .. } => (*status, "invalid_body".into()),
            ApiError::NoEndpoint { .. } => (StatusCode::NOT_FOUND, "not_found".into()),
            ApiError::MethodNotAllowed { .. } => {
                (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed".into())
            }
            ApiError::CannotConvert(_) => (StatusCode::BAD_REQUEST, "error".into()),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "error".into()),
            ApiError::TapDisabled => (StatusCode::FORBIDDEN, "tap_disabled".into()),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict".into()),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "bus_unavailable".into()),
            ApiError::TooManyConnections { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_connections".into(),
            ),
        }
    }

    /// The JSON body of the answer, for a listener that writes it itself.
    pub(crate) fn json_text(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_default()
    }

    fn body(&self) -> Body {
        let (_, code) = self.status_and_code();
        let issues = match self {
            ApiError::InvalidConfiguration { issues, .. } => issues
                .iter()
                .map(|issue| IssueBody {
                    field: issue.field.clone(),
                    message: issue.message.clone(),
                    severity: if issue.is_error() { "error" } else { "warning" },
                })
                .collect(),
            _ => Vec::new(),
        };
        Body {
            code,
            reason: self.to_string(),
            issues,
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        ApiError::InvalidBody {
            status: rejection.status(),
            reason: rejection.body_text(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, _) = self.status_and_code();
        (status, Json(self.body())).into_response()
    }
}
