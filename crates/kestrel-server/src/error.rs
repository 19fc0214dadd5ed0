//! Errors as OpenAI's API sends them: an HTTP status and `{"error": {"message", "type", "param",
//! "code"}}`, so OpenAI clients raise their usual exceptions with Kestrel's stable codes.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kestrel_engine::EngineError;
use serde_json::json;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's error class: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// Kestrel's stable code (the CLI's and the npm package's, where one exists).
    pub code: &'static str,
    pub message: String,
    /// The request field at fault, where one is.
    pub param: Option<String>,
    /// Seconds a client should wait before trying again (429 and 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, kind, code, message: message.into(), param: None, retry_after: None }
    }

    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", code, message)
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// All slots and the queue are taken.
    pub fn busy(retry_after: u64) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "rate_limit_exceeded",
            "the server is busy: every slot and the queue are taken; retry later",
        );
        e.retry_after = Some(retry_after);
        e
    }

    pub fn shutting_down() -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "shutting_down", "the server is shutting down")
    }

    /// The JSON body, also sent as the last event of a stream that fails after it started.
    pub fn body(&self) -> serde_json::Value {
        json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }
}

impl From<&EngineError> for ApiError {
    fn from(e: &EngineError) -> Self {
        let (status, kind) = match e.code {
            "invalid_option" | "invalid_json" | "context_overflow" | "template" | "tokenizer" => {
                (StatusCode::BAD_REQUEST, "invalid_request_error")
            }
            "device_lost" | "out_of_memory" => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        };
        // OpenAI's own name for a prompt that does not fit.
        let code = if e.code == "context_overflow" { "context_length_exceeded" } else { e.code };
        let mut error = Self::new(status, kind, code, e.message.clone());
        error.param = e.param.clone();
        error
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use kestrel_model::ModelError;

    use super::*;

    fn api(e: ModelError) -> ApiError {
        ApiError::from(&EngineError::from(e))
    }

    #[test]
    fn model_errors_map_to_openai_statuses_and_codes() {
        let e = api(ModelError::InvalidOption { name: "temperature", reason: "must be >= 0".into() });
        assert_eq!(
            (e.status, e.kind, e.code, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_option", Some("temperature"))
        );
        let e = api(ModelError::ContextOverflow { needed: 10, context: 8 });
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "context_length_exceeded"));
        assert!(e.message.contains("10") && e.message.contains('8'), "{}", e.message);
        let e = api(ModelError::BadModel("x".into()));
        assert_eq!((e.status, e.kind), (StatusCode::INTERNAL_SERVER_ERROR, "server_error"));
        let body = ApiError::busy(3).body();
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert!(body["error"]["param"].is_null());
    }

    #[test]
    fn busy_responses_say_when_to_retry() {
        let response = ApiError::busy(7).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("7"));
    }
}
