//! The HTTP API: OpenAI's generation endpoints (streamed as server-sent events exactly as
//! OpenAI sends them, or whole), the embeddings endpoint (`embeddings`), the rerank endpoint
//! (`rerank`), the model list, health
//! and metrics; API-key checks; every failure as OpenAI-shaped error JSON.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream;
use kestrel_engine::openai::{self, Answer, Endpoint, ResponseMeta};
use kestrel_engine::{Generation, TokenEvent};
use serde_json::{json, Value};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::cache;
use crate::embeddings::embeddings;
use crate::engine::{Event, Ticket};
use crate::error::ApiError;
use crate::rerank::rerank;
use crate::state::{admit, AppState, Outcome};

/// The response header that says whether the exact-response cache answered (`hit`) or was
/// looked in first (`miss`); absent when the request could not be cached.
pub const CACHE_HEADER: &str = "x-kestrel-response-cache";

pub fn router(state: Arc<AppState>, max_body_bytes: usize, cors_origins: &[String]) -> std::io::Result<Router> {
    let router = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/rerank", post(rerank))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), check_api_key))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state);
    if cors_origins.is_empty() {
        return Ok(router);
    }
    Ok(router.layer(cors(cors_origins)?))
}

/// CORS for pages of `origins` (`*`: any): the methods, headers and response header the API
/// uses. Outermost, so preflight requests need no API key.
fn cors(origins: &[String]) -> std::io::Result<CorsLayer> {
    let allowed = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let values: Result<Vec<HeaderValue>, _> = origins.iter().map(|o| HeaderValue::from_str(o)).collect();
        AllowOrigin::list(values.map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("bad CORS origin: {e}")))?)
    };
    Ok(CorsLayer::new()
        .allow_origin(allowed)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION, header::CACHE_CONTROL])
        .expose_headers([HeaderName::from_static(CACHE_HEADER)]))
}

/// The metrics label of a path (a fixed set, so clients cannot grow the label space).
fn endpoint_label(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "chat_completions",
        "/v1/completions" => "completions",
        "/v1/embeddings" => "embeddings",
        "/v1/rerank" => "rerank",
        "/v1/models" => "models",
        "/health" => "health",
        "/metrics" => "metrics",
        _ => "other",
    }
}

/// With `--api-key`, every path but `/health` (for probes) needs `Authorization: Bearer KEY`.
async fn check_api_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let path = request.uri().path();
        let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if path != "/health" && !given.is_some_and(|given| same_secret(given.as_bytes(), key.as_bytes())) {
            state.metrics.count_request(endpoint_label(path), "invalid_api_key");
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_api_key",
                "a valid API key is required: Authorization: Bearer KEY",
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// Compares without stopping at the first difference, so timing does not reveal the key.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(request: Request) -> ApiError {
    let message = format!("no route for {} {}", request.method(), request.uri().path());
    ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", message)
}

async fn method_not_allowed(request: Request) -> ApiError {
    let message = format!("{} is not allowed on {}", request.method(), request.uri().path());
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "method_not_allowed", message)
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "shutting_down" }))).into_response();
    }
    Json(state.served.health()).into_response()
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.metrics.count_request("models", "ok");
    Json(json!({ "object": "list", "data": [{ "id": state.model_name, "object": "model", "created": 0, "owned_by": "kestrel" }] }))
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    match state.metrics.render() {
        Ok(text) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response(),
        Err(e) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal", format!("could not encode the metrics: {e}"))
                .into_response()
        }
    }
}

async fn chat_completions(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    generate(state, Endpoint::Chat, headers, body).await
}

async fn completions(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    generate(state, Endpoint::Completions, headers, body).await
}

async fn generate(state: Arc<AppState>, endpoint: Endpoint, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    let mut outcome = Outcome::new(state.metrics.clone(), endpoint.label());
    match respond(&state, endpoint, &headers, body, &mut outcome).await {
        Ok(response) => response,
        Err(e) => {
            outcome.record(e.code);
            e.into_response()
        }
    }
}

async fn respond(
    state: &Arc<AppState>,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    outcome: &mut Outcome,
) -> Result<Response, ApiError> {
    let body = admit(state, body)?;
    let engine = state.served.chat()?;
    let api = openai::parse_body(endpoint, &body).map_err(|e| ApiError::from(&e))?;
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let meta = ResponseMeta::new(endpoint, state.serial.fetch_add(1, Ordering::Relaxed), created, &state.model_name);
    let key = if may_cache(headers) { cache::key(endpoint, &api.request) } else { None };
    let reply = Reply { state: state.clone(), answer: Answer::new(meta, api.stream, api.include_usage), key };
    if let Some(hit) = reply.key.as_deref().and_then(|key| state.cache.get(key)) {
        state.metrics.response_cache_hits.inc();
        outcome.finished(&hit);
        let response = if api.stream { reply.stream_stored(Generation::clone(&hit), outcome.hand_over()) } else { reply.whole(&hit, true) };
        return Ok(with_cache_header(response, "hit"));
    }
    let mut ticket = engine.submit(api.request)?;
    let cache_state = reply.key.as_ref().map(|_| "miss");
    let response = if api.stream {
        // The first event decides the response: an error before any token is a plain 4xx/5xx.
        let first = match ticket.next().await {
            Some(Event::Done(Err(e))) => return Err(e),
            Some(event) => event,
            None => return Err(engine_gone()),
        };
        reply.stream_with(Some(ticket), first, VecDeque::new(), outcome.hand_over(), false)
    } else {
        let generation = loop {
            match ticket.next().await {
                Some(Event::Token(_)) => {}
                Some(Event::Done(result)) => break result?,
                None => return Err(engine_gone()),
            }
        };
        reply.store(&generation);
        outcome.finished(&generation);
        reply.whole(&generation, false)
    };
    Ok(match cache_state {
        Some(value) => with_cache_header(response, value),
        None => response,
    })
}

fn engine_gone() -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal", "the engine stopped")
}

/// `Cache-Control: no-store` or `no-cache` on the request keeps it out of the response cache.
fn may_cache(headers: &HeaderMap) -> bool {
    !headers.get_all(header::CACHE_CONTROL).iter().any(|v| v.to_str().is_ok_and(|v| v.contains("no-store") || v.contains("no-cache")))
}

fn with_cache_header(mut response: Response, value: &'static str) -> Response {
    response.headers_mut().insert(CACHE_HEADER, HeaderValue::from_static(value));
    response
}

/// How one request's answer is written.
struct Reply {
    state: Arc<AppState>,
    answer: Answer,
    key: Option<String>,
}

impl Reply {
    fn store(&self, generation: &Generation) {
        if let Some(key) = &self.key {
            if openai::is_complete(generation) {
                let bytes = self.state.cache.put(key.clone(), Arc::new(generation.clone()));
                self.state.metrics.response_cache_bytes.set(bytes as i64);
            }
        }
    }

    fn whole(mut self, generation: &Generation, cache_hit: bool) -> Response {
        let body = self.answer.on_done(generation, Some(cache_hit)).pop().unwrap_or(Value::Null);
        Json(body).into_response()
    }

    /// A stored answer as a stream: the whole text in one chunk.
    fn stream_stored(mut self, generation: Generation, outcome: Outcome) -> Response {
        let text = TokenEvent { text: generation.text.clone(), id: None, logprobs: None };
        let queued = self.answer.on_token(&text).iter().map(data).collect();
        self.stream_with(None, Event::Done(Ok(generation)), queued, outcome, true)
    }

    /// A stream of the `queued` chunks, then of `first` and the ticket's events.
    fn stream_with(self, ticket: Option<Ticket>, first: Event, queued: VecDeque<SseEvent>, outcome: Outcome, cache_hit: bool) -> Response {
        let sse = SseStream { reply: self, ticket, first: Some(first), queued, done: false, outcome, cache_hit };
        let events = stream::unfold(sse, |mut sse| async move { sse.next().await.map(|event| (Ok::<_, Infallible>(event), sse)) });
        Sse::new(events).keep_alive(KeepAlive::default()).into_response()
    }
}

fn data(value: &Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}

/// The state of one streamed answer: the chunks ready to send and where the next come from.
/// Dropped when the client goes away, which drops the ticket and so cancels the generation.
struct SseStream {
    reply: Reply,
    ticket: Option<Ticket>,
    first: Option<Event>,
    queued: VecDeque<SseEvent>,
    done: bool,
    outcome: Outcome,
    cache_hit: bool,
}

impl SseStream {
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Some(event);
            }
            if self.done {
                return None;
            }
            let event = match self.first.take() {
                Some(event) => Some(event),
                None => match self.ticket.as_mut() {
                    Some(ticket) => ticket.next().await,
                    None => None,
                },
            };
            let answer = &mut self.reply.answer;
            match event {
                Some(Event::Token(token)) => self.queued.extend(answer.on_token(&token).iter().map(data)),
                Some(Event::Done(Ok(generation))) => {
                    self.queued.extend(answer.on_done(&generation, Some(self.cache_hit)).iter().map(data));
                    if !self.cache_hit {
                        self.reply.store(&generation);
                    }
                    self.outcome.finished(&generation);
                    self.queued.push_back(SseEvent::default().data("[DONE]"));
                    self.finish();
                }
                Some(Event::Done(Err(e))) => {
                    // After the stream began the status is sent; the error is its last event.
                    self.outcome.record(e.code);
                    self.queued.push_back(data(&e.body()));
                    self.finish();
                }
                None => {
                    let e = engine_gone();
                    self.outcome.record(e.code);
                    self.queued.push_back(data(&e.body()));
                    self.finish();
                }
            }
        }
    }

    fn finish(&mut self) {
        self.done = true;
        self.ticket = None;
    }
}
