//! Speculative decoding in the page (`createEngine`'s `speculative` and `draftModel`): prompt
//! lookup starts as the model loads, and a draft model streams in after it (`DraftLoad`), as the
//! model did, onto the CPU backend whichever backend the model runs on: a draft model is a
//! fraction of the model, and on WebGPU its passes then leave the GPU to the verifications.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::Promise;
use kestrel_engine::generation::speculation::SpeculativeOptions;
use kestrel_engine::Scheduler;
use kestrel_model::{LoadOptions, LoadedModel, ModelError, ModelLoader};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::{js_error, model_error, next_shard, push_chunk, Engine, State};

/// `info.speculative` with `options` (the engine's `speculative` option; None: null) for a chat
/// model just loaded into `scheduler`, starting prompt lookup where the options ask for it. A
/// draft model, where the page has one, follows (`loadDraft`).
pub(crate) fn start(scheduler: &mut Scheduler, options: Option<SpeculativeOptions>) -> Result<Value, ModelError> {
    let Some(options) = options else { return Ok(Value::Null) };
    if options.lookup {
        scheduler.set_speculation(options, None)?;
    }
    Ok(info(scheduler))
}

/// `info.speculative` of an embedding model's engine with `options`: off, as nothing generates.
pub(crate) fn not_generating(options: Option<SpeculativeOptions>) -> Value {
    options.map_or(Value::Null, |_| off("the model embeds text; it generates none"))
}

/// `info.speculative` of a chat engine: how it speculates, with its draft model's name.
fn info(scheduler: &Scheduler) -> Value {
    match scheduler.generator().speculation() {
        Some((o, draft)) => json!({
            "enabled": true,
            "lookup": o.lookup,
            "maxDraft": o.draft_max,
            "draftModel": draft.map(|m| m.config().name.clone()),
        }),
        // Without prompt lookup, speculation starts with the draft model.
        None => off("its draft model has not loaded"),
    }
}

fn off(reason: &str) -> Value {
    json!({ "enabled": false, "reason": reason })
}

#[wasm_bindgen]
impl Engine {
    /// Starts the load of the loaded chat model's draft model (createEngine's `draftModel`), on
    /// the CPU backend: its bytes go to the `DraftLoad` as the model's went to `loadChunk`. Fails
    /// with `no_model` before a chat model.
    #[wasm_bindgen(js_name = loadDraft)]
    pub fn load_draft(&self) -> Result<DraftLoad, JsValue> {
        let s = &self.state;
        s.check_idle("load a draft model")?;
        let scheduler = s.scheduler.borrow();
        let model = scheduler.as_ref().ok_or_else(|| js_error("no_model", "a draft model needs a chat model loaded first"))?.model();
        // The draft runs every position the model does, in a KV slot per the model's.
        let options = LoadOptions { context_length: Some(model.context_length()), ..s.settings.load_options(false) };
        Ok(DraftLoad { state: s.clone(), loader: RefCell::new(Some(ModelLoader::new_cpu(options))) })
    }
}

/// A draft model streaming into the engine (`Engine.loadDraft`): `loadChunk`, `loadNextShard`,
/// `cancelLoad` and `finishLoad` as the engine's own for its model.
#[wasm_bindgen]
pub struct DraftLoad {
    state: Rc<State>,
    /// None once finished, cancelled or failed.
    loader: RefCell<Option<ModelLoader>>,
}

#[wasm_bindgen]
impl DraftLoad {
    /// Feeds the next bytes of the draft's GGUF file; returns the progress as `Engine.loadChunk`
    /// does. After an error the load is abandoned.
    #[wasm_bindgen(js_name = loadChunk)]
    pub fn load_chunk(&self, bytes: &[u8]) -> Result<JsValue, JsValue> {
        push_chunk(&mut self.loader.borrow_mut(), bytes, "the draft model's load has ended")
    }

    /// Ends the current shard of a split draft model, as `Engine.loadNextShard`.
    #[wasm_bindgen(js_name = loadNextShard)]
    pub fn load_next_shard(&self) -> Result<(), JsValue> {
        next_shard(&mut self.loader.borrow_mut())
    }

    #[wasm_bindgen(js_name = cancelLoad)]
    pub fn cancel_load(&self) {
        self.loader.borrow_mut().take();
    }

    /// Builds the draft model and makes it the engine's (`Generator::set_speculation` with the
    /// engine's `speculative` option, or a draft model's defaults): one whose vocabulary differs
    /// from the model's fails with the engine's `invalid_option`, naming the first token id that
    /// differs. Resolves to the engine's `info()`.
    #[wasm_bindgen(js_name = finishLoad)]
    pub fn finish_load(&self) -> Promise {
        let state = self.state.clone();
        let loader = self.loader.borrow_mut().take();
        future_to_promise(async move {
            let loader = loader.ok_or_else(|| js_error("bad_model", "bad draft model file: no bytes were loaded"))?;
            let draft = match loader.finish_any().await.map_err(|e| model_error(&e))? {
                LoadedModel::Chat(model) => *model,
                LoadedModel::Embedding(_) => {
                    return Err(js_error(
                        "invalid_option",
                        "invalid option draftModel: it is an embedding model; a draft model generates text",
                    ))
                }
            };
            state.check_idle("load a draft model")?;
            let options = state.settings.speculative.unwrap_or_default();
            let speculation = {
                let mut scheduler = state.scheduler.borrow_mut();
                let scheduler = scheduler.as_mut().ok_or_else(|| js_error("no_model", "the model was unloaded"))?;
                scheduler.set_speculation(options, Some(draft)).map_err(|e| model_error(&e))?;
                info(scheduler)
            };
            *state.speculative.borrow_mut() = speculation;
            Ok(state.info())
        })
    }
}
