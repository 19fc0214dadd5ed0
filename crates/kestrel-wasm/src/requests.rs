//! The engine core's requests, as the worker drives them: `submit` an OpenAI-shaped request
//! (`kestrel_engine::openai`, the server's own parsing), `step` the scheduler, `abort`. Every
//! event reaches the worker already in OpenAI's shape: streamed chunks, the whole completion, or
//! the error, so the package decides nothing the core decides.

use js_sys::{Function, Promise, Uint32Array};
use kestrel_engine::openai::{self, Answer, Endpoint, ResponseMeta};
use kestrel_engine::Generation;
use kestrel_engine::{EngineError, Event, RequestId, Scheduler};
use kestrel_model::not_a_chat_model;
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::{engine_error, js_error, model_error, to_js, Engine, State};

/// Parses a request body for `endpoint` ('chat' or 'completions') as `kestrel serve` does, with
/// every check that needs no model.
pub(crate) fn parse(endpoint: &str, body: &str) -> Result<(Endpoint, openai::ApiRequest), JsValue> {
    let endpoint = Endpoint::from_name(endpoint)
        .ok_or_else(|| js_error("invalid_option", &format!("unknown endpoint {endpoint:?}: expected 'chat' or 'completions'")))?;
    let value: Value = serde_json::from_str(body).map_err(|e| js_error("invalid_option", &format!("invalid option request: {e}")))?;
    let api = openai::parse(endpoint, value).map_err(|e| engine_error(&e))?;
    api.request.validate_for_any_model().map_err(|e| engine_error(&e))?;
    Ok((endpoint, api))
}

/// The Unix time in seconds, for `created`.
pub(crate) fn now_s() -> u64 {
    (js_sys::Date::now() / 1e3) as u64
}

/// What the worker hears of a token: `{id, chunk}` for each of the chunks the answer gave it
/// (none for a whole answer).
pub(crate) fn token_events(id: RequestId, chunks: Vec<Value>) -> Vec<Value> {
    chunks.into_iter().map(|chunk| json!({ "id": id, "chunk": chunk })).collect()
}

/// What the worker hears of a request's end: its last chunks, then `{id, done: true, result}`
/// (the whole completion, or null for a stream); or `{id, error: {code, message}}`.
pub(crate) fn done_events(id: RequestId, answer: &mut Answer, result: &Result<Generation, EngineError>) -> Vec<Value> {
    let generation = match result {
        Ok(generation) => generation,
        Err(e) => return vec![json!({ "id": id, "error": { "code": e.code, "message": e.message } })],
    };
    let values = answer.on_done(generation, None);
    if !answer.stream {
        return values.into_iter().map(|result| json!({ "id": id, "done": true, "result": result })).collect();
    }
    let mut out: Vec<Value> = values.into_iter().map(|chunk| json!({ "id": id, "chunk": chunk })).collect();
    out.push(json!({ "id": id, "done": true, "result": null }));
    out
}

impl State {
    /// Hands the submitted requests to the scheduler; one that cannot run ends with its error.
    fn take_inbox(&self, scheduler: &mut Scheduler, on_event: &Function) {
        for (id, request) in self.inbox.borrow_mut().drain(..) {
            if let Err(e) = scheduler.submit(id, &request) {
                self.answers.borrow_mut().remove(&id);
                emit(on_event, &json!({ "id": id, "error": { "code": e.code, "message": e.message } }));
            }
        }
    }
}

fn emit(on_event: &Function, value: &Value) {
    // The worker's handler posts messages and does not throw; were it to, the event is lost but
    // the step goes on for the other requests.
    let _ = on_event.call1(&JsValue::NULL, &to_js(value));
}

#[wasm_bindgen]
impl Engine {
    /// Submits a request (`body`: the JSON of `chat.completions.create`'s or
    /// `completions.create`'s argument, without `signal`) to `endpoint` ('chat' or
    /// 'completions'); returns its id. A request that is malformed, or (between steps) cannot run
    /// on this model (an embedding model runs none: `invalid_option`), throws its error here; one
    /// submitted while a step runs is taken at the next step, which reports such an error as its
    /// event.
    pub fn submit(&self, endpoint: &str, body: &str) -> Result<f64, JsValue> {
        let s = &self.state;
        if let Some(embedder) = s.embedder.borrow().as_ref() {
            return Err(model_error(&not_a_chat_model(embedder.config().arch)));
        }
        let (endpoint, api) = parse(endpoint, body)?;
        let model_name = s.model_info.borrow().as_ref().and_then(|i| i["name"].as_str().map(str::to_owned));
        if model_name.is_none() && !s.busy.get() && s.scheduler.borrow().is_none() {
            return Err(js_error("no_model", "no model is loaded"));
        }
        let id = s.serial.get();
        s.serial.set(id + 1);
        let meta = ResponseMeta::new(endpoint, id, now_s(), model_name.as_deref().unwrap_or("kestrel"));
        match s.scheduler.borrow_mut().as_mut() {
            Some(scheduler) => scheduler.submit(id, &api.request).map_err(|e| engine_error(&e))?,
            None => s.inbox.borrow_mut().push((id, api.request)),
        }
        s.answers.borrow_mut().insert(id, Answer::new(meta, api.stream, api.include_usage));
        Ok(id as f64)
    }

    /// Aborts request `id`: before the next batched step, or at the next token of a request
    /// running alone; one not yet started ends with no token. An id that is not running yet
    /// (an abort sent ahead of its request) is remembered.
    pub fn abort(&self, id: f64) {
        if let Some(aborts) = self.state.aborts.borrow().as_ref() {
            aborts.abort(id as RequestId);
        }
    }

    /// Whether requests are waiting or running: the worker steps while there are.
    #[wasm_bindgen(js_name = hasWork)]
    pub fn has_work(&self) -> bool {
        let s = &self.state;
        s.busy.get() || !s.inbox.borrow().is_empty() || s.scheduler.borrow().as_ref().is_some_and(|q| !q.is_idle())
    }

    /// The prompt token ids of submitted request `id` (to choose a saved KV prefix), while it
    /// waits to start.
    #[wasm_bindgen(js_name = promptTokens)]
    pub fn prompt_tokens(&self, id: f64) -> Result<Uint32Array, JsValue> {
        let scheduler = self.state.scheduler.borrow();
        let tokens = scheduler.as_ref().and_then(|s| s.prompt_tokens(id as RequestId));
        tokens.map(Uint32Array::from).ok_or_else(|| js_error("invalid_option", &format!("no request {id} is waiting")))
    }

    /// Runs one step of the scheduler, calling `on_event` with each event of each request (see
    /// `token_events` and `done_events`). Resolves to whether work remains.
    pub fn step(&self, on_event: Function) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            let mut scheduler = state.take_scheduler()?;
            state.take_inbox(&mut scheduler, &on_event);
            let mut sink = |id: RequestId, event: Event| -> bool {
                let mut answers = state.answers.borrow_mut();
                let Some(answer) = answers.get_mut(&id) else { return true };
                let values = match &event {
                    Event::Started => Vec::new(),
                    Event::Token(token) => token_events(id, answer.on_token(token)),
                    Event::Done(result) => done_events(id, answer, result),
                };
                if matches!(event, Event::Done(_)) {
                    answers.remove(&id);
                }
                drop(answers);
                values.iter().for_each(|v| emit(&on_event, v));
                true
            };
            scheduler.step(&mut sink).await;
            let more = !scheduler.is_idle();
            state.put_back(scheduler);
            Ok(JsValue::from_bool(more || !state.inbox.borrow().is_empty()))
        })
    }
}

#[cfg(test)]
mod tests {
    use kestrel_engine::GenerateOptions;

    /// The npm package declares (index.d.ts) every generation option under its wire name: in
    /// `SamplingOptions`, or in `ChatCompletionRequest` for the chat-only ones (the tools).
    #[test]
    fn the_package_names_every_option() {
        let dts = include_str!("../../../www/index.d.ts");
        let block = |name: &str| {
            let from = &dts[dts.find(&format!("export interface {name}")).unwrap()..];
            &from[..from.find("\n}").unwrap()]
        };
        let declared = [block("SamplingOptions"), block("ChatCompletionRequest")];
        let options = serde_json::to_value(GenerateOptions {
            tools: vec![serde_json::from_value(serde_json::json!({"type": "function", "function": {"name": "f"}})).unwrap()],
            ..GenerateOptions::default()
        })
        .unwrap();
        for key in options.as_object().unwrap().keys() {
            assert!(declared.iter().any(|d| d.contains(&format!("  {key}?: "))), "index.d.ts lacks the option {key}");
        }
    }
}
