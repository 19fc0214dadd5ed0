//! `kestrel serve`: a local OpenAI-compatible HTTP server (axum on tokio) over one loaded model.
//! `POST /v1/chat/completions` and `POST /v1/completions` (streamed as server-sent events or
//! whole) for a chat model, `POST /v1/embeddings` for an embedding model, `POST /v1/rerank` for a
//! reranker, `GET /v1/models`,
//! `GET /health`, `GET /metrics` (Prometheus). Requests share the
//! CLI's and the npm package's options, defaults and error codes, and their scheduler and OpenAI
//! layer (`kestrel_engine`);
//! errors are OpenAI-shaped JSON. One engine thread generates, on the CPU backend for up to
//! one request per KV slot at once (continuous batching); requests beyond the slots wait in a
//! bounded queue, and past the queue get 429 with `Retry-After`. An embedding model or a
//! reranker runs on an embedding thread of its own, one request at a time behind the same kind
//! of queue.

mod cache;
mod embedder;
mod embeddings;
mod engine;
mod error;
mod metrics;
mod rerank;
mod routes;
mod served;
mod state;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kestrel_engine::generation::speculation::SpeculativeOptions;
use kestrel_model::{LoadedModel, Model};
use tokio::net::TcpListener;

pub use error::ApiError;
pub use routes::CACHE_HEADER;

pub struct ServerConfig {
    /// The id `/v1/models` lists (requests may name any model: there is one).
    pub model_name: String,
    /// With a key, every request but `/health` needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Requests that may wait for a free slot; more get 429.
    pub queue: usize,
    /// Prompt tokens a batched step runs at most, over all prompts being admitted: what a new
    /// prompt may add to the running requests' time between tokens.
    pub prefill_chunk: usize,
    /// The exact-response cache's bound (0 turns it off).
    pub response_cache_bytes: usize,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// After a shutdown signal, how long running requests may take to finish before they are
    /// aborted.
    pub shutdown_grace: Duration,
    /// Web page origins allowed to call the API from a browser (CORS); `*` allows any. Empty:
    /// no CORS headers, so pages of other origins cannot read the answers.
    pub cors_origins: Vec<String>,
    /// Speculative decoding for chat models (`Generator::set_speculation`), with its draft
    /// model where it has one: None decodes one token per step.
    pub speculative: Option<SpeculativeOptions>,
    pub draft_model: Option<Model>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            model_name: "kestrel".into(),
            api_key: None,
            queue: 16,
            prefill_chunk: kestrel_engine::DEFAULT_PREFILL_CHUNK,
            response_cache_bytes: 8 << 20,
            max_body_bytes: 4 << 20,
            shutdown_grace: Duration::from_secs(10),
            cors_origins: Vec::new(),
            speculative: None,
            draft_model: None,
        }
    }
}

/// Serves `model`: a chat model (as many requests at once as it has KV slots:
/// `Model::set_slots`) or an embedding model (one request at a time), on `listener` until
/// `shutdown` completes; then stops accepting, lets running requests finish within the grace
/// period (aborting them after it), refuses queued ones, and drops the model.
pub async fn serve(
    model: LoadedModel,
    config: ServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let metrics = Arc::new(metrics::Metrics::new(served::Served::slots_of(&model)));
    let speculation = config.speculative.map(|options| (options, config.draft_model));
    let served = served::Served::start(model, config.queue, config.prefill_chunk, speculation, metrics.clone())?;
    let cache = cache::ResponseCache::new(config.response_cache_bytes);
    let state = Arc::new(state::AppState::new(served.clone(), metrics, cache, config.api_key, config.model_name));
    let app = routes::router(state.clone(), config.max_body_bytes, &config.cors_origins)?;
    let grace = config.shutdown_grace;
    let draining = {
        let state = state.clone();
        async move {
            shutdown.await;
            state.draining.store(true, std::sync::atomic::Ordering::Relaxed);
            let served = state.served.clone();
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                served.abort_all();
            });
        }
    };
    axum::serve(listener, app).with_graceful_shutdown(draining).await?;
    served.abort_all();
    drop(state);
    tokio::task::spawn_blocking(move || served.join()).await.map_err(std::io::Error::other)?;
    Ok(())
}

/// Completes on Ctrl-C (SIGINT) or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
