//! The one error shape of every route: `{"error":{"code","message"}}` with a
//! PascalCase code a client can branch on and a message that says what is wrong and
//! where. Internal failures are logged with their cause and answered without it.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds, for 429.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    /// A failure of NATS or the Kubernetes API: logged here with its cause, answered
    /// 503 without it (the cause may name internal addresses).
    pub fn unavailable(what: &str, error: impl std::fmt::Display) -> Self {
        tracing::warn!(%error, what, "request failed");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            format!("{what} failed; try again"),
        )
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after
            && let Ok(value) = HeaderValue::from_str(&secs.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

impl From<async_nats::Error> for ApiError {
    fn from(error: async_nats::Error) -> Self {
        Self::unavailable("reading or writing NATS", error)
    }
}
