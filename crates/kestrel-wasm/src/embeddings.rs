//! Embedding models in the browser package: `embeddings.create` on an engine that loaded one
//! (`embed`, through the engine core's OpenAI layer `kestrel_engine::embeddings`), the same
//! request's checks for a remote engine before it is sent (`checkEmbeddingRequest`), and what
//! `info` says of such a model.

use kestrel_engine::embeddings::{not_an_embedding_model, EmbeddingRequest};
use kestrel_engine::EngineError;
use kestrel_model::Embedder;
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use crate::{engine_error, js_error, to_js, Engine};

/// Why an embedding model reports the CPU backend on an engine that holds a GPU device: there is
/// no encoder graph on the GPU, so the loader builds it on the CPU kernels whatever the engine.
pub(crate) const ON_CPU: &str = "embedding models run on the CPU backend (there is no GPU encoder)";

/// Parses `body` (the JSON of `embeddings.create`'s argument without `signal`). The package only
/// speaks of `invalid_option` for a request it was given: the core's `invalid_json` (a body that
/// is not an object) becomes that.
fn parse(body: &str) -> Result<EmbeddingRequest, JsValue> {
    let value: Value = serde_json::from_str(body).map_err(|e| js_error("invalid_option", &format!("invalid embeddings request: {e}")))?;
    EmbeddingRequest::parse(value).map_err(|e| package_error(&e))
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
        let s = &self.state;
        let embedder = s.embedder.borrow();
        let Some(embedder) = embedder.as_ref() else {
            let info = s.model_info.borrow();
            return Err(match info.as_ref().and_then(|i| i["arch"].as_str()) {
                Some(arch) => engine_error(&not_an_embedding_model(arch)),
                None => js_error("no_model", "no model is loaded"),
            });
        };
        let request = parse(body)?;
        let embeddings = request.run(embedder).map_err(|e| package_error(&e))?;
        Ok(to_js(&request.response(&embedder.config().name, &embeddings)))
    }
}

/// Checks an embeddings request as a local engine would before any work (a remote engine's, before
/// it is sent): throws the same `invalid_option` errors.
#[wasm_bindgen(js_name = checkEmbeddingRequest)]
pub fn check_embedding_request(body: &str) -> Result<(), JsValue> {
    crate::install_panic_hook();
    parse(body).map(|_| ())
}
