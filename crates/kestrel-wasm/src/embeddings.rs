//! Embedding models and rerankers in the browser package: `embeddings.create` on an engine that
//! loaded an embedding model (`embed`, through the engine core's OpenAI layer
//! `kestrel_engine::embeddings`) and `rerank` on one that loaded a reranker (`rerank`, through
//! `kestrel_engine::rerank`), the same requests' checks for a remote engine before they are sent
//! (`checkEmbeddingRequest`, `checkRerankRequest`), and what `info` says of such a model.

use kestrel_engine::embeddings::{not_an_embedding_model, EmbeddingRequest};
use kestrel_engine::rerank::{not_a_reranker, RerankRequest};
use kestrel_engine::EngineError;
use kestrel_model::Embedder;
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use crate::{engine_error, js_error, to_js, Engine};

/// Why an embedding model reports the CPU backend on an engine that holds a GPU device: the GPU
/// encoder is native only (its pass waits for its readback, and `embed` is synchronous), so in
/// the page the loader builds it on the CPU kernels whatever the engine.
pub(crate) const ON_CPU: &str = "embedding models and rerankers run on the CPU backend (the GPU encoder is native only)";

/// Parses `body` (the JSON of `embeddings.create`'s argument without `signal`).
fn parse(body: &str) -> Result<EmbeddingRequest, JsValue> {
    parse_with(body, "embeddings", EmbeddingRequest::parse)
}

/// Parses `body` (the JSON of `rerank`'s argument without `signal`).
fn parse_rerank(body: &str) -> Result<RerankRequest, JsValue> {
    parse_with(body, "rerank", RerankRequest::parse)
}

/// Parses `body` with the engine core's `parse`. The package only speaks of `invalid_option` for
/// a request it was given: the core's `invalid_json` (a body that is not an object) becomes that.
fn parse_with<T>(body: &str, what: &str, parse: fn(Value) -> Result<T, EngineError>) -> Result<T, JsValue> {
    let value: Value = serde_json::from_str(body).map_err(|e| js_error("invalid_option", &format!("invalid {what} request: {e}")))?;
    parse(value).map_err(|e| package_error(&e))
}

fn package_error(e: &EngineError) -> JsValue {
    if e.code == "invalid_json" {
        return js_error("invalid_option", &e.message);
    }
    engine_error(e)
}

/// The `model` section of `info` for an embedding model.
pub(crate) fn model_info(embedder: &Embedder) -> Value {
    let c = embedder.config();
    json!({
        "name": c.name,
        "arch": c.arch,
        "dimensions": embedder.dimensions(),
        "context_length": embedder.context_length(),
        "pooling": c.pooling.as_str(),
        "weight_bytes": embedder.weight_bytes(),
        "n_layers": c.n_layers,
        "hidden": c.hidden,
        "n_heads": c.n_heads,
        "vocab": c.vocab,
        "train_context": c.train_context,
    })
}

#[wasm_bindgen]
impl Engine {
    /// Embeds the inputs of `body` (the JSON of `embeddings.create`'s argument, without `signal`)
    /// and returns OpenAI's answer. Runs to its end once started (the CPU kernels take no abort).
    /// A chat model, a malformed request or a bad input is `invalid_option`; an input longer than
    /// the model's context without `truncate` is `context_overflow`.
    pub fn embed(&self, body: &str) -> Result<JsValue, JsValue> {
        self.with_embedder(not_an_embedding_model, |embedder| {
            let request = parse(body)?;
            let embeddings = request.run(embedder).map_err(|e| package_error(&e))?;
            Ok(to_js(&request.response(&embedder.config().name, &embeddings)))
        })
    }

    /// Scores the documents of `body` (the JSON of `rerank`'s argument, without `signal`) against
    /// its query and returns the rerank answer (`{model, object: "list", results, usage}`, best
    /// first). Runs to its end once started, as `embed`. A chat model, an embedding model, a
    /// malformed request or a bad field is `invalid_option`; a pair longer than the model's
    /// context is `context_overflow`.
    pub fn rerank(&self, body: &str) -> Result<JsValue, JsValue> {
        self.with_embedder(not_a_reranker, |reranker| {
            let request = parse_rerank(body)?;
            let ranking = request.run(reranker).map_err(|e| package_error(&e))?;
            Ok(to_js(&request.response(&reranker.config().name, &ranking)))
        })
    }
}

impl Engine {
    /// Runs `f` on the loaded embedding model or reranker; a chat model is `not_one`'s error.
    fn with_embedder(
        &self,
        not_one: fn(&str) -> EngineError,
        f: impl FnOnce(&Embedder) -> Result<JsValue, JsValue>,
    ) -> Result<JsValue, JsValue> {
        let s = &self.state;
        let embedder = s.embedder.borrow();
        let Some(embedder) = embedder.as_ref() else {
            let info = s.model_info.borrow();
            return Err(match info.as_ref().and_then(|i| i["arch"].as_str()) {
                Some(arch) => engine_error(&not_one(arch)),
                None => js_error("no_model", "no model is loaded"),
            });
        };
        f(embedder)
    }
}

/// Checks an embeddings request as a local engine would before any work (a remote engine's, before
/// it is sent): throws the same `invalid_option` errors.
#[wasm_bindgen(js_name = checkEmbeddingRequest)]
pub fn check_embedding_request(body: &str) -> Result<(), JsValue> {
    crate::install_panic_hook();
    parse(body).map(|_| ())
}

/// Checks a rerank request as a local engine would before any work (a remote engine's, before it
/// is sent): throws the same `invalid_option` errors.
#[wasm_bindgen(js_name = checkRerankRequest)]
pub fn check_rerank_request(body: &str) -> Result<(), JsValue> {
    crate::install_panic_hook();
    parse_rerank(body).map(|_| ())
}
