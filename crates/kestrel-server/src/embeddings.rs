//! `POST /v1/embeddings`: OpenAI's embeddings endpoint (`kestrel_engine::embeddings` parses the
//! request and writes the answer) over the server's embedding model, which runs on the embedding
//! thread; a chat model answers 400 `invalid_option`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kestrel_engine::embeddings::EmbeddingRequest;

use crate::embedder::Work;
use crate::error::ApiError;
use crate::state::{admit, AppState, Outcome};

pub async fn embeddings(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    // Dropped unrecorded when the client goes away while the request waits: `client_gone`.
    let mut outcome = Outcome::new(state.metrics.clone(), "embeddings");
    match submit_and_wait::<EmbeddingRequest>(&state, body).await {
        Ok((request, embeddings)) => {
            let metrics = &state.metrics;
            metrics.embedding_inputs.inc_by(embeddings.vectors.len() as u64);
            metrics.embedding_tokens.inc_by(embeddings.prompt_tokens as u64);
            metrics.embedding_duration.observe(arrived.elapsed().as_secs_f64());
            outcome.record("ok");
            Json(request.response(&state.model_name, &embeddings)).into_response()
        }
        Err(e) => {
            outcome.record(e.code);
            e.into_response()
        }
    }
}

/// Checks and parses a request of an embedding-thread endpoint and waits for the thread's
/// answer. The request is shared with the thread, not copied: it may be megabytes, and the
/// answer's JSON is written from it.
pub async fn submit_and_wait<W: Work>(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<(Arc<W>, W::Output), ApiError> {
    let body = admit(state, body)?;
    let worker = state.served.embedder(W::not_for_chat)?;
    let request = Arc::new(W::parse_body(&body).map_err(|e| ApiError::from(&e))?);
    let answer = worker.submit(request.clone())?;
    let output = answer
        .await
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal", "the embedding thread stopped"))??;
    Ok((request, output))
}
