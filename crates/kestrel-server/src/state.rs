//! What every handler shares: the server's state (the served model, metrics, the response cache,
//! the API key, shutdown), the admission of a request's body, and the count of each request's
//! outcome. Below the handlers (`routes`, `embeddings`, `rerank`) and above what they serve.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use kestrel_engine::Generation;

use crate::cache::ResponseCache;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::served::Served;

pub struct AppState {
    pub served: Served,
    pub metrics: Arc<Metrics>,
    pub cache: ResponseCache,
    pub api_key: Option<String>,
    pub model_name: String,
    /// Set once shutdown begins: new requests get 503.
    pub draining: AtomicBool,
    /// Numbers the answers' ids.
    pub serial: AtomicU64,
}

impl AppState {
    pub fn new(served: Served, metrics: Arc<Metrics>, cache: ResponseCache, api_key: Option<String>, model_name: String) -> Self {
        Self { served, metrics, cache, api_key, model_name, draining: AtomicBool::new(false), serial: AtomicU64::new(0) }
    }
}

/// A request's body, unless the server is shutting down or the body was refused (too large, or
/// not read).
pub fn admit(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    if state.draining.load(Ordering::Relaxed) {
        return Err(ApiError::shutting_down());
    }
    body.map_err(|rejection| {
        let code = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE { "request_too_large" } else { "invalid_body" };
        ApiError::new(rejection.status(), "invalid_request_error", code, rejection.body_text())
    })
}

/// Counts a request's outcome once; a request dropped before it ended (the client went away)
/// counts as `client_gone`.
pub struct Outcome {
    metrics: Arc<Metrics>,
    /// The endpoint's metrics label.
    endpoint: &'static str,
    recorded: bool,
}

impl Outcome {
    pub fn new(metrics: Arc<Metrics>, endpoint: &'static str) -> Self {
        Self { metrics, endpoint, recorded: false }
    }

    pub fn record(&mut self, outcome: &str) {
        if !self.recorded {
            self.recorded = true;
            self.metrics.count_request(self.endpoint, outcome);
        }
    }

    pub fn finished(&mut self, generation: &Generation) {
        self.record(generation.finish_reason.as_str());
    }

    /// Hands the recording over to a new owner (a stream that outlives the handler).
    pub fn hand_over(&mut self) -> Outcome {
        let recorded = std::mem::replace(&mut self.recorded, true);
        Outcome { metrics: self.metrics.clone(), endpoint: self.endpoint, recorded }
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        self.record("client_gone");
    }
}
