//! axum's `Path` and `Query` with the API's JSON errors: axum's own extractors
//! answer a malformed path or query string with plain text.

use axum::extract::FromRequestParts;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::api::ApiError;

/// [`axum::extract::Path`], rejected with `{code, reason}`.
pub struct Path<T>(pub T);

/// [`axum::extract::Query`], rejected with `400 bad_request`.
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(ApiError::from)
    }
}

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(ApiError::from)
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        if rejection.status().is_client_error() {
            ApiError::BadRequest(format!("invalid path: {}", rejection.body_text()))
        } else {
            ApiError::Internal(rejection.body_text())
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::BadRequest(format!("invalid query string: {}", rejection.body_text()))
    }
}
