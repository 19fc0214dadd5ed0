//! `POST /v1/embeddings`: OpenAI's embeddings endpoint (`kestrel_engine::embeddings` parses the
//! request and writes the answer) over the server's embedding model, which runs on the embedding
//! thread; a chat model answers 400 `invalid_option`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kestrel_engine::embeddings::EmbeddingRequest;

use crate::embedder::submit_and_wait;
use crate::routes::{AppState, Outcome};

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
