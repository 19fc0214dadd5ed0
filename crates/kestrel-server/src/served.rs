//! The one model a server holds, of either kind: a chat model behind the engine thread, or an
//! embedding model or a reranker behind the embedding thread. Each endpoint asks for the kind it needs; the
//! other kind is a 400 that says what the model is.

use std::sync::Arc;

use kestrel_engine::EngineError;
use kestrel_model::{not_a_chat_model, LoadedModel};
use serde_json::{json, Value};

use crate::embedder::EmbeddingWorker;
use crate::engine::{Engine, Speculation};
use crate::error::ApiError;
use crate::metrics::Metrics;

#[derive(Clone)]
pub enum Served {
    Chat(Arc<Engine>),
    Embedding(Arc<EmbeddingWorker>),
}

impl Served {
    /// The metrics' slot count for `model`: its KV slots, or the one request an embedding model
    /// runs at a time.
    pub fn slots_of(model: &LoadedModel) -> usize {
        match model {
            LoadedModel::Chat(model) => model.slots(),
            LoadedModel::Embedding(_) => 1,
        }
    }

    /// Starts the thread that owns `model`, with `queue` requests allowed to wait, and a chat
    /// model's speculative decoding where `speculation` sets it (an embedding model has none).
    pub fn start(
        model: LoadedModel,
        queue: usize,
        prefill_chunk: usize,
        speculation: Option<Speculation>,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        Ok(match model {
            LoadedModel::Chat(model) => Self::Chat(Arc::new(Engine::start(*model, queue, prefill_chunk, speculation, metrics)?)),
            LoadedModel::Embedding(embedder) => Self::Embedding(Arc::new(EmbeddingWorker::start(*embedder, queue, metrics)?)),
        })
    }

    /// The chat engine, or `invalid_option` for an embedding model.
    pub fn chat(&self) -> Result<&Engine, ApiError> {
        match self {
            Self::Chat(engine) => Ok(engine),
            Self::Embedding(worker) => Err(ApiError::from(&EngineError::from(not_a_chat_model(worker.arch())))),
        }
    }

    /// The embedding worker (an embedding model or a reranker), or `not_one`'s `invalid_option`
    /// for a chat model.
    pub fn embedder(&self, not_one: fn(&str) -> EngineError) -> Result<&EmbeddingWorker, ApiError> {
        match self {
            Self::Embedding(worker) => Ok(worker),
            Self::Chat(engine) => Err(ApiError::from(&not_one(engine.arch()))),
        }
    }

    /// `/health`'s fields: the model's kind, where it runs, and its load.
    pub fn health(&self) -> Value {
        match self {
            Self::Chat(engine) => json!({
                "status": "ok",
                "model_type": "chat",
                "backend": engine.backend(),
                "slots": engine.slots(),
                "pending_requests": engine.pending(),
            }),
            Self::Embedding(worker) => json!({
                "status": "ok",
                "model_type": worker.kind(),
                // An encoder loaded for a GPU runs its layers there; a decoder embedding model
                // runs on the CPU backend.
                "backend": worker.backend(),
                "slots": 1,
                "pending_requests": worker.pending(),
            }),
        }
    }

    /// Stops admitting requests; running generations stop at their next step, queued requests
    /// are refused.
    pub fn abort_all(&self) {
        match self {
            Self::Chat(engine) => engine.abort_all(),
            Self::Embedding(worker) => worker.abort_all(),
        }
    }

    /// Joins the model's thread, dropping the model, when this is its last holder (a stream
    /// still being dropped may hold another; its thread then ends when that one goes).
    pub fn join(self) {
        match self {
            Self::Chat(engine) => {
                if let Ok(engine) = Arc::try_unwrap(engine) {
                    engine.join();
                }
            }
            Self::Embedding(worker) => {
                if let Ok(worker) = Arc::try_unwrap(worker) {
                    worker.join();
                }
            }
        }
    }
}
