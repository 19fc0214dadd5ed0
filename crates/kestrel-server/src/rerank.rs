//! `POST /v1/rerank`: llama.cpp server's, Jina's and Cohere's rerank endpoint
//! (`kestrel_engine::rerank` parses the request and writes the answer) over the server's
//! reranker, which runs on the embedding thread; an embedding model or a chat model answers 400
//! `invalid_option`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kestrel_engine::rerank::RerankRequest;

use crate::embeddings::submit_and_wait;
use crate::state::{AppState, Outcome};

pub async fn rerank(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    // Dropped unrecorded when the client goes away while the request waits: `client_gone`.
    let mut outcome = Outcome::new(state.metrics.clone(), "rerank");
    match submit_and_wait::<RerankRequest>(&state, body).await {
        Ok((request, ranking)) => {
            let metrics = &state.metrics;
            metrics.rerank_documents.inc_by(ranking.scores.len() as u64);
            metrics.rerank_tokens.inc_by(ranking.prompt_tokens as u64);
            metrics.rerank_duration.observe(arrived.elapsed().as_secs_f64());
            outcome.record("ok");
            Json(request.response(&state.model_name, &ranking)).into_response()
        }
        Err(e) => {
            outcome.record(e.code);
            e.into_response()
        }
    }
}
