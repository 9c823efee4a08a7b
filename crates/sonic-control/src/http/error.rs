//! The one HTTP error type: every refusal maps to a status and a JSON body here, and nowhere else.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use sonic_api::agent::ErrorBody;
use sonic_api::control::DagErrorBody;
use sonic_core::dag::DagError;

use crate::admission::AdmitError;
use crate::store::StoreError;

/// Why a request was refused.
#[derive(Debug)]
pub enum ApiError {
    /// The request is malformed: a bad JSON body, an invalid name, ...
    BadRequest(String),
    /// A DAG file that does not parse or check.
    InvalidDag(DagError),
    /// No token, or the wrong one. Says nothing more.
    Unauthorized,
    /// A valid token, but not for this (an agent reporting a run sent to another agent).
    Forbidden(String),
    /// No such DAG, job, agent or object.
    NotFound(String),
    /// The resource is not in a state that allows the request (a DAG whose models cannot
    /// predict yet).
    Conflict(String),
    /// Well-formed, but impossible to satisfy (no plan meets the DAG's bounds).
    Unprocessable(String),
    /// The route exists, not with this method.
    MethodNotAllowed,
    /// A body over the limit (bytes).
    PayloadTooLarge(usize),
    /// A body in a format the route does not take.
    UnsupportedMediaType(String),
    /// This control plane cannot serve the request as configured (jobs without an object store).
    Unavailable(String),
    /// Something failed on our side; the detail goes to the log, never to the client.
    Internal(String),
}

impl ApiError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::InvalidDag(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl From<AdmitError> for ApiError {
    fn from(e: AdmitError) -> Self {
        match e {
            AdmitError::Invalid(m) => ApiError::BadRequest(m),
            AdmitError::NotFound(m) => ApiError::NotFound(m),
            AdmitError::NotReady(m) | AdmitError::Conflict(m) => ApiError::Conflict(m),
            AdmitError::Infeasible(m) => ApiError::Unprocessable(m),
            AdmitError::NoJobs(m) | AdmitError::Busy(m) => ApiError::Unavailable(m),
            AdmitError::Internal(m) => ApiError::Internal(m),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = match self {
            ApiError::InvalidDag(e) => {
                let body = DagErrorBody {
                    error: e.to_string(),
                    file: e.file,
                    line: e.line,
                    column: e.column,
                    field: e.field,
                };
                return (status, Json(body)).into_response();
            }
            ApiError::BadRequest(m)
            | ApiError::Forbidden(m)
            | ApiError::NotFound(m)
            | ApiError::Conflict(m)
            | ApiError::Unprocessable(m)
            | ApiError::UnsupportedMediaType(m)
            | ApiError::Unavailable(m) => m,
            ApiError::Unauthorized => {
                let body = Json(ErrorBody {
                    error: "missing or wrong token".to_owned(),
                });
                return (status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response();
            }
            ApiError::MethodNotAllowed => "method not allowed on this route".to_owned(),
            ApiError::PayloadTooLarge(limit) => format!("request body over the {limit}-byte limit"),
            ApiError::Internal(detail) => {
                tracing::error!(error = %detail, "internal error");
                "internal error".to_owned()
            }
        };
        (status, Json(ErrorBody { error: message })).into_response()
    }
}
