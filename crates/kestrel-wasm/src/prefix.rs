//! The KV prefix kept across page loads (`persistPrefix` in the browser package): the worker
//! saves the cached prefix after a request, and before the next one starts (`promptTokens` of
//! the submitted request) restores the saved prefix that shares the most tokens with its prompt
//! (`kestrel_model::prefix_snapshot`).

use js_sys::{Promise, Uint32Array, Uint8Array};
use kestrel_model::prefix_snapshot::{self, Peek};
use serde_json::json;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::{js_error, model_error, to_js, Engine};

#[wasm_bindgen]
impl Engine {
    /// The token ids the KV cache holds, from position 0.
    #[wasm_bindgen(js_name = cachedTokenIds)]
    pub fn cached_token_ids(&self) -> Uint32Array {
        let scheduler = self.state.scheduler.borrow();
        Uint32Array::from(scheduler.as_ref().map_or(&[][..], |s| s.model().cached_token_ids()))
    }

    /// Resolves to a snapshot of the cached prefix's KV rows tagged with `model_key` (the model
    /// file's sha256): the longest prefix whose snapshot takes at most `max_bytes` (checked
    /// before anything is read back), or undefined when no token fits or none is cached.
    #[wasm_bindgen(js_name = savePrefix)]
    pub fn save_prefix(&self, model_key: String, max_bytes: f64) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            state.check_idle("save the KV prefix")?;
            let scheduler = state.take_scheduler()?;
            // A float from JavaScript: negative or NaN saves nothing, huge saturates.
            let saved = scheduler.model().save_prefix(&model_key, max_bytes as u64).await;
            state.put_back(scheduler);
            Ok(saved.map_err(|e| model_error(&e))?.map_or(JsValue::UNDEFINED, |bytes| Uint8Array::from(&bytes[..]).into()))
        })
    }

    /// Restores the first `keep` tokens of a snapshot `savePrefix` made from the same model file,
    /// replacing the cached prefix; returns the tokens restored. A corrupt snapshot is
    /// `bad_snapshot`, one of another file or setup `snapshot_mismatch`; either leaves the cache
    /// as it was. Requests may be waiting, none running.
    #[wasm_bindgen(js_name = restorePrefix)]
    pub fn restore_prefix(&self, model_key: &str, bytes: &[u8], keep: u32) -> Result<u32, JsValue> {
        let busy = || js_error("busy", "cannot restore a KV prefix while a generation is running");
        if self.state.busy.get() {
            return Err(busy());
        }
        let mut scheduler = self.state.scheduler.borrow_mut();
        let scheduler = scheduler.as_mut().ok_or_else(|| js_error("no_model", "no model is loaded"))?;
        let model = scheduler.model_mut().ok_or_else(busy)?;
        let restored = model.restore_prefix(model_key, bytes, keep as usize).map_err(|e| model_error(&e))?;
        Ok(restored as u32)
    }
}

/// Of a prefix of `shared` tokens that the KV cache (or a snapshot) holds of a `prompt_length`-token
/// prompt, the tokens a request keeps: all but the last prompt token, which always runs.
#[wasm_bindgen(js_name = reusableTokens)]
pub fn reusable_tokens(shared: u32, prompt_length: u32) -> u32 {
    kestrel_engine::generation::reusable_prefix(shared as usize, prompt_length as usize) as u32
}

/// The model key and tokens at the start of a snapshot, `{key, tokens}`, or `{need}`: the number
/// of leading bytes it takes to tell them. A file that is not a snapshot is `bad_snapshot`.
#[wasm_bindgen(js_name = peekPrefixSnapshot)]
pub fn peek_prefix_snapshot(bytes: &[u8]) -> Result<JsValue, JsValue> {
    Ok(match prefix_snapshot::peek(bytes).map_err(|e| model_error(&e))? {
        Peek::Tokens { key, tokens } => to_js(&json!({ "key": key, "tokens": tokens })),
        Peek::NeedBytes(need) => to_js(&json!({ "need": need })),
    })
}
