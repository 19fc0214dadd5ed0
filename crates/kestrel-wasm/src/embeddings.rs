//! Embedding models and rerankers in the browser package: `embeddings.create` on an engine that
//! loaded an embedding model (`embed`, through the engine core's OpenAI layer
//! `kestrel_engine::embeddings`) and `rerank` on one that loaded a reranker (`rerank`, through
//! `kestrel_engine::rerank`), the same requests' checks for a remote engine before they are sent
//! (`checkEmbeddingRequest`, `checkRerankRequest`), and what `info` says of such a model.

use kestrel_engine::embeddings::{not_an_embedding_model, EmbeddingRequest};
use kestrel_engine::rerank::{not_a_reranker, RerankRequest};
use kestrel_engine::EngineError;
use std::rc::Rc;

use js_sys::Promise;
use kestrel_model::Embedder;
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::{engine_error, js_error, to_js, Engine, State};

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
    /// and resolves to OpenAI's answer. Runs to its end once started: the CPU kernels take no
    /// abort, and a GPU pass is one submission. A chat model, a malformed request or a bad input
    /// is `invalid_option`; an input longer than the model's context without `truncate` is
    /// `context_overflow`.
    pub fn embed(&self, body: String) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            let embedder = state.embedder_for(not_an_embedding_model)?;
            let request = parse(&body)?;
            let _running = Encoding::start(&state);
            let embeddings = request.run(&embedder).await.map_err(|e| package_error(&e))?;
            Ok(to_js(&request.response(&embedder.config().name, &embeddings)))
        })
    }

    /// Scores the documents of `body` (the JSON of `rerank`'s argument, without `signal`) against
    /// its query and resolves to the rerank answer (`{model, object: "list", results, usage}`,
    /// best first). Runs to its end once started, as `embed`. A chat model, an embedding model, a
    /// malformed request or a bad field is `invalid_option`; a pair longer than the model's
    /// context is `context_overflow`.
    pub fn rerank(&self, body: String) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            let reranker = state.embedder_for(not_a_reranker)?;
            let request = parse_rerank(&body)?;
            let _running = Encoding::start(&state);
            let ranking = request.run(&reranker).await.map_err(|e| package_error(&e))?;
            Ok(to_js(&request.response(&reranker.config().name, &ranking)))
        })
    }
}

impl State {
    /// The loaded embedding model or reranker, held for one call (an `unload()` meanwhile drops
    /// the engine's hold; the call's ends with it); a chat model is `not_one`'s error.
    fn embedder_for(&self, not_one: fn(&str) -> EngineError) -> Result<Rc<Embedder>, JsValue> {
        if let Some(embedder) = self.embedder.borrow().as_ref() {
            return Ok(embedder.clone());
        }
        let info = self.model_info.borrow();
        Err(match info.as_ref().and_then(|i| i["arch"].as_str()) {
            Some(arch) => engine_error(&not_one(arch)),
            None => js_error("no_model", "no model is loaded"),
        })
    }
}

/// An embedding or rerank call under way: a load waits for it to end (`State::check_idle`), as it
/// waits for a generation. Calls may overlap (a shared engine's tabs): each counts.
struct Encoding(Rc<State>);

impl Encoding {
    fn start(state: &Rc<State>) -> Self {
        state.encoding.set(state.encoding.get() + 1);
        Self(state.clone())
    }
}

impl Drop for Encoding {
    fn drop(&mut self) {
        self.0.encoding.set(self.0.encoding.get().saturating_sub(1));
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
