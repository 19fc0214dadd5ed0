//! The remote engine's answers (`createEngine`'s `remote`), built by the same OpenAI layer as a
//! local engine's: the worker checks the request as a local engine would before it is sent,
//! then feeds the server's streamed pieces and its end through a `RemoteAnswer`, so local and
//! remote engines answer in exactly the same shapes.

use kestrel_engine::openai::{Answer, ResponseMeta};
use kestrel_engine::{Generation, TokenEvent};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use crate::requests::{done_events, now_s, parse, token_events};
use crate::{js_error, to_js};

#[wasm_bindgen]
pub struct RemoteAnswer {
    id: u64,
    answer: Answer,
}

#[wasm_bindgen]
impl RemoteAnswer {
    /// The answer of request `id` to `endpoint` ('chat' or 'completions') with `body` (its JSON,
    /// as `submit` takes it) from the server's `model`. Throws the local engines' error for a
    /// request they would refuse before any work.
    #[wasm_bindgen(constructor)]
    pub fn new(id: f64, endpoint: &str, body: &str, model: &str) -> Result<RemoteAnswer, JsValue> {
        crate::install_panic_hook();
        let (endpoint, api) = parse(endpoint, body)?;
        let id = id as u64;
        let meta = ResponseMeta::new(endpoint, id, now_s(), model);
        Ok(RemoteAnswer { id, answer: Answer::new(meta, api.stream, api.include_usage) })
    }

    /// The events of a piece of text the server streamed (`token_id` where it said), with the
    /// log-probabilities its chunk carried (`logprobs`: their JSON, in OpenAI's shape).
    pub fn token(&mut self, text: String, token_id: Option<u32>, logprobs: Option<String>) -> JsValue {
        let token = TokenEvent { id: token_id, text, logprobs: None };
        let relayed = logprobs.and_then(|json| serde_json::from_str::<Value>(&json).ok()).filter(|v| !v.is_null());
        let chunks = match relayed {
            Some(logprobs) => self.answer.on_relayed_token(&token, logprobs),
            None => self.answer.on_token(&token),
        };
        to_js(&Value::Array(token_events(self.id, chunks)))
    }

    /// The events of the end: `generation` is the JSON of what the stream gave (the local
    /// engine's result shape). `completion_tokens`: the server's count, for a server that lists
    /// no token ids (only kestrel serve does).
    pub fn done(&mut self, generation: &str, completion_tokens: Option<u32>) -> Result<JsValue, JsValue> {
        let generation: Generation = serde_json::from_str(generation)
            .map_err(|e| js_error("remote_error", &format!("the remote server's answer is incomplete: {e}")))?;
        let mut events = done_events(self.id, &mut self.answer, &Ok(generation.clone()));
        if let (Some(count), true) = (completion_tokens, generation.tokens.is_empty()) {
            for event in events.iter_mut().filter_map(Value::as_object_mut) {
                for usage in event.values_mut().filter_map(|body| body.get_mut("usage")) {
                    usage["completion_tokens"] = json!(count);
                    usage["total_tokens"] = json!(generation.prompt_tokens.len() + count as usize);
                }
            }
        }
        Ok(to_js(&Value::Array(events)))
    }
}
