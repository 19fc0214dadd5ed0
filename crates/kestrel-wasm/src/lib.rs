//! wasm-bindgen exports of the Kestrel engine, driven by the browser package's worker
//! (`www/worker.js`): create the device, stream a GGUF file in, generate with a per-token
//! callback, abort, reset, unload; save and restore the KV prefix (`prefix`); on the CPU backend
//! with several slots, batched sequences the worker steps (`addSequence`, `stepSequences`).
//!
//! Every error that reaches JavaScript is an `Error` whose `code` property is stable
//! ([`ModelError::code`] plus `no_webgpu`, `no_model`, `busy`, `invalid_option`, `gpu`) and whose
//! message is the precise one. Methods take `&self` and hand back promises over shared state, so
//! `abort()` can be called while `generate()` is awaiting the GPU.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use js_sys::{Function, Promise};
use kestrel_gguf::GgufStreamReader;
use kestrel_gpu::params::KvType;
use kestrel_gpu::{Gpu, GpuOptions};
use kestrel_model::estimate::{DeviceLimits, Estimate, MemoryLimit};
use kestrel_model::{
    submit_budget_from_ms, LoadOptions, LoadProgress, Model, ModelError, ModelLoader, Request, SequenceEvent, SequenceId, TokenEvent,
    MAX_SLOTS,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

mod prefix;

/// A JavaScript `Error` with a stable `code` property.
fn js_error(code: &str, message: &str) -> JsValue {
    let error = js_sys::Error::new(message);
    let _ = js_sys::Reflect::set(&error, &JsValue::from_str("code"), &JsValue::from_str(code));
    error.into()
}

fn model_error(e: &ModelError) -> JsValue {
    js_error(e.code(), &e.to_string())
}

fn to_js(value: &Value) -> JsValue {
    js_sys::JSON::parse(&value.to_string()).unwrap_or(JsValue::NULL)
}

/// Reports panics (bugs: every input-dependent failure is a `Result`) to the console with their
/// message and location, instead of a bare "unreachable executed".
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            web_sys::console::error_1(&JsValue::from_str(&format!("kestrel panicked (a bug, please report it): {info}")));
        }));
    });
}

#[derive(Default)]
struct State {
    /// None: the CPU backend runs the model (see `cpu_reason`).
    gpu: RefCell<Option<Gpu>>,
    /// Why the engine runs on the CPU, when it does.
    cpu_reason: RefCell<Option<String>>,
    loader: RefCell<Option<ModelLoader>>,
    /// Taken out while a generation runs.
    model: RefCell<Option<Model>>,
    model_info: RefCell<Option<Value>>,
    load_options: RefCell<LoadOptions>,
    /// KV slots a model gets (`create`'s `slots`).
    slots: Cell<usize>,
    /// The GPU submission budget a model gets (`create`'s `submit_budget_ms`).
    submit_budget: Cell<Option<Duration>>,
    busy: Cell<bool>,
    abort: Cell<bool>,
    /// `unload()` was called during a generation: drop the model when it ends.
    unload_pending: Cell<bool>,
}

impl State {
    fn gpu(&self) -> Result<Gpu, JsValue> {
        self.gpu.borrow().clone().ok_or_else(|| js_error("no_webgpu", "the engine has no GPU device"))
    }

    fn check_idle(&self, what: &str) -> Result<(), JsValue> {
        let sequences = self.model.borrow().as_ref().map_or(0, Model::running_sequences);
        if self.busy.get() || sequences > 0 {
            return Err(js_error("busy", &format!("cannot {what} while a generation is running")));
        }
        Ok(())
    }

    /// The loaded model, for a use that does not await (the batched sequences' calls).
    fn with_model<T>(&self, f: impl FnOnce(&mut Model) -> Result<T, JsValue>) -> Result<T, JsValue> {
        if self.busy.get() {
            return Err(js_error("busy", "cannot run batched sequences while a generation is running"));
        }
        match self.model.borrow_mut().as_mut() {
            Some(model) => f(model),
            None => Err(js_error("no_model", "no model is loaded")),
        }
    }

    fn drop_model(&self) {
        self.model.borrow_mut().take();
        self.model_info.borrow_mut().take();
    }

    async fn finish_load(&self) -> Result<JsValue, JsValue> {
        let loader = self.loader.borrow_mut().take().ok_or_else(|| js_error("bad_model", "bad model file: no bytes were loaded"))?;
        let mut model = loader.finish().await.map_err(|e| model_error(&e))?;
        // The GPU backend allocated its slots at load (`LoadOptions::slots`); the CPU's grow here.
        model.set_slots(self.slots.get()).map_err(|e| model_error(&e))?;
        model.set_submit_budget(self.submit_budget.get()).map_err(|e| model_error(&e))?;
        let c = model.config();
        let info = json!({
            "name": c.name,
            "arch": format!("{:?}", c.arch).to_lowercase(),
            "n_layers": c.n_layers,
            "hidden": c.hidden,
            "ffn": c.ffn,
            "n_heads": c.n_heads,
            "n_kv_heads": c.n_kv_heads,
            "head_dim": c.head_dim,
            "vocab": c.vocab,
            "train_context": c.train_context,
            "context_length": model.context_length(),
            "tied_embeddings": c.tied_embeddings,
            "weight_bytes": model.weight_bytes(),
            "weight_bytes_per_token": model.weight_bytes_per_token(),
            "chat_template": model.tokenizer().chat_template().is_some(),
            "slots": model.slots(),
            // The CPU backend submits nothing to a device.
            "submit_budget_ms": model.submit_budget().map(|b| b.as_secs_f64() * 1e3),
        });
        *self.model_info.borrow_mut() = Some(info);
        *self.model.borrow_mut() = Some(model);
        Ok(self.info())
    }

    fn info(&self) -> JsValue {
        let gpu = self.gpu.borrow().as_ref().map(|g| {
            let i = &g.info;
            json!({
                "adapter": i.adapter_name,
                "backend": i.backend,
                "driver": i.driver,
                "features": {
                    "shader_f16": i.features.shader_f16,
                    "subgroups": i.features.subgroups,
                    "timestamps": i.features.timestamps,
                    "subgroup_min_size": i.features.subgroup_min_size,
                    "subgroup_max_size": i.features.subgroup_max_size,
                },
                "limits": {
                    "max_storage_buffer_binding_size": i.max_storage_buffer_binding_size,
                    "max_buffer_size": i.max_buffer_size,
                    "max_compute_workgroup_storage_size": i.max_compute_workgroup_storage_size,
                    "max_compute_invocations_per_workgroup": i.max_compute_invocations_per_workgroup,
                    "max_compute_workgroups_per_dimension": i.max_compute_workgroups_per_dimension,
                    "max_storage_buffers_per_shader_stage": i.max_storage_buffers_per_shader_stage,
                },
                // The kernel variants chosen for this adapter (a software one gets the CPU-shaped
                // matvec: one thread per row, more rows per thread).
                "software": i.software,
                "kernels": {
                    "matvec_slices": i.kernels.matvec.slices,
                    "matvec_rows_per_thread": i.kernels.matvec.rows_per_thread,
                },
            })
        });
        let backend = if gpu.is_some() { "webgpu" } else { "cpu" };
        // One thread: a wasm worker has no shared-memory threads without a nightly toolchain.
        let cpu = self.cpu_reason.borrow().as_ref().map(|_| json!({ "simd": kestrel_cpu::simd_name(), "threads": 1 }));
        to_js(&json!({
            "backend": backend,
            "backend_reason": *self.cpu_reason.borrow(),
            "cpu": cpu,
            "gpu": gpu,
            "model": *self.model_info.borrow(),
            "version": env!("CARGO_PKG_VERSION"),
        }))
    }

    async fn generate(&self, request: &str, on_token: &Function) -> Result<JsValue, JsValue> {
        self.check_idle("generate")?;
        let request = Request::parse(request).map_err(|e| model_error(&e))?;
        let mut model = self.take_model()?;
        self.abort.set(false);
        let result = self.run(&mut model, &request, on_token).await;
        self.put_back(model);
        result
    }

    /// Takes the model out for an async use that must not overlap another (generate, save).
    fn take_model(&self) -> Result<Model, JsValue> {
        let model = self.model.borrow_mut().take().ok_or_else(|| js_error("no_model", "no model is loaded"))?;
        self.busy.set(true);
        Ok(model)
    }

    /// Ends `take_model`'s use: keeps the model, or drops it if `unload()` came meanwhile.
    fn put_back(&self, model: Model) {
        self.busy.set(false);
        if self.unload_pending.replace(false) {
            drop(model);
            self.model_info.borrow_mut().take();
        } else {
            *self.model.borrow_mut() = Some(model);
        }
    }

    /// The prompt token ids of a request, its options checked as `generate` checks them.
    fn prompt_tokens(model: &Model, request: &Request) -> Result<Vec<u32>, JsValue> {
        let prompt = request.prompt().map_err(|e| model_error(&e))?;
        // Every option and request limit, before the prompt is encoded.
        request.options.validate(model.config().vocab).map_err(|e| model_error(&e))?;
        model.encode(&prompt).map_err(|e| model_error(&e))
    }

    async fn run(&self, model: &mut Model, request: &Request, on_token: &Function) -> Result<JsValue, JsValue> {
        let options = &request.options;
        let tokens = Self::prompt_tokens(model, request)?;
        let mut thrown: Option<JsValue> = None;
        let abort = &self.abort;
        // Every token of the result reaches `on_token`, even one generated after an abort: the
        // stream then carries exactly the result's tokens and text.
        let mut callback = |event: &TokenEvent| -> bool {
            if thrown.is_some() {
                return false;
            }
            let id = event.id.map_or(JsValue::UNDEFINED, JsValue::from);
            match on_token.call2(&JsValue::NULL, &JsValue::from_str(&event.text), &id) {
                Ok(more) => more != JsValue::FALSE && !abort.get(),
                Err(e) => {
                    thrown = Some(e);
                    false
                }
            }
        };
        let generation = model.generate(&tokens, options, &mut callback).await;
        if let Some(e) = thrown {
            return Err(e);
        }
        let g = generation.map_err(|e| model_error(&e))?;
        // `{text, prompt_token_ids, token_ids, finish_reason, logprobs, timings}`: Generation's
        // wire form.
        Ok(to_js(&serde_json::to_value(&g).map_err(|e| js_error("internal", &format!("could not encode the result: {e}")))?))
    }
}

/// The `slots` option (absent: 1): an integer from 1 to `MAX_SLOTS`.
fn slots_option(value: &JsValue) -> Result<usize, JsValue> {
    if value.is_undefined() || value.is_null() {
        return Ok(1);
    }
    match value.as_f64() {
        Some(n) if (1.0..=MAX_SLOTS as f64).contains(&n) && n.fract() == 0.0 => Ok(n as usize),
        _ => Err(js_error("invalid_option", &format!("invalid option slots: {value:?} must be an integer from 1 to {MAX_SLOTS}"))),
    }
}

/// The `submit_budget_ms` option (absent or 0: none): a number of milliseconds
/// (`submit_budget_from_ms`).
fn submit_budget_option(value: &JsValue) -> Result<Option<Duration>, JsValue> {
    if value.is_undefined() || value.is_null() {
        return Ok(None);
    }
    let ms =
        value.as_f64().ok_or_else(|| js_error("invalid_option", &format!("invalid option submit_budget_ms: {value:?} is not a number")))?;
    submit_budget_from_ms(ms).map_err(|e| model_error(&e))
}

/// The `kv_cache` option: 'f16' or 'f32' (None: not a string).
fn kv_type(name: Option<&str>) -> Result<KvType, JsValue> {
    name.and_then(KvType::from_name).ok_or_else(|| {
        let got = name.map_or_else(|| "not a string".to_owned(), |n| format!("'{n}'"));
        js_error("invalid_option", &format!("invalid option kv_cache: {got}, expected 'f16' or 'f32'"))
    })
}

fn progress_js(p: &LoadProgress) -> JsValue {
    to_js(&json!({
        "bytes_received": p.bytes_received,
        "tensors_loaded": p.tensors_loaded,
        "tensors_total": p.tensors_total,
        "file_bytes": p.file_bytes,
    }))
}

/// The engine: one GPU device and at most one loaded model.
#[wasm_bindgen]
pub struct Engine {
    state: Rc<State>,
}

#[wasm_bindgen]
impl Engine {
    /// Creates the engine on `options.backend`: 'webgpu' (the GPU device from the global scope's
    /// `navigator.gpu`, a worker's or a page's; fails with code `no_webgpu` where there is none
    /// or no adapter), 'cpu' (`kestrel-cpu`'s kernels in wasm SIMD), or 'auto', the default: the
    /// GPU unless there is none or its adapter is a software rasterizer (SwiftShader, llvmpipe,
    /// WARP), which the CPU path outruns. `backend_reason` (a string) is what `info()` reports
    /// as the reason for 'cpu'. Other `options` (all optional): `{allow_f16, allow_subgroups,
    /// allow_timestamps}` (booleans, default true) to force optional features off,
    /// `context_length` (KV cache tokens; default: the model's training context, at most 4096),
    /// `kv_cache` ('f16', the default, or 'f32'), `slots` (1 to 16, default 1: requests
    /// generated at once as one batch, each with its own KV cache of `context_length` tokens) and
    /// `submit_budget_ms` (above 0 and at most 1000: a prompt chunk goes to the GPU in pieces of
    /// about that much device time each, so the page is drawn between them; 0 or absent: one
    /// submission a chunk).
    pub async fn create(options: JsValue) -> Result<Engine, JsValue> {
        install_panic_hook();
        let string_option = |name: &str| -> Option<String> {
            if !options.is_object() {
                return None;
            }
            js_sys::Reflect::get(&options, &JsValue::from_str(name)).ok().and_then(|v| v.as_string())
        };
        let backend = match js_sys::Reflect::get(&options, &JsValue::from_str("backend")).unwrap_or(JsValue::UNDEFINED) {
            v if v.is_undefined() || v.is_null() => "auto".to_owned(),
            v => match v.as_string() {
                Some(name) if ["webgpu", "cpu", "auto"].contains(&name.as_str()) => name,
                _ => return Err(js_error("invalid_option", &format!("invalid option backend: {v:?}, expected 'webgpu', 'cpu' or 'auto'"))),
            },
        };
        let navigator = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("navigator")).unwrap_or(JsValue::UNDEFINED);
        let has_gpu = !navigator.is_undefined()
            && js_sys::Reflect::get(&navigator, &JsValue::from_str("gpu")).is_ok_and(|g| !g.is_undefined() && !g.is_null());
        if !has_gpu && backend == "webgpu" {
            return Err(js_error("no_webgpu", "WebGPU is not available here (navigator.gpu is missing)"));
        }
        let mut gpu_options = GpuOptions::default();
        if options.is_object() {
            let flag = |name: &str, default: bool| {
                js_sys::Reflect::get(&options, &JsValue::from_str(name)).ok().and_then(|v| v.as_bool()).unwrap_or(default)
            };
            gpu_options.allow_f16 = flag("allow_f16", true);
            gpu_options.allow_subgroups = flag("allow_subgroups", true);
            gpu_options.allow_timestamps = flag("allow_timestamps", true);
        }
        let mut load_options = LoadOptions::default();
        if options.is_object() {
            let context = js_sys::Reflect::get(&options, &JsValue::from_str("context_length")).unwrap_or(JsValue::UNDEFINED);
            if !context.is_undefined() && !context.is_null() {
                match context.as_f64() {
                    Some(n) if n >= 1.0 && n.fract() == 0.0 && n <= 1e9 => load_options.context_length = Some(n as usize),
                    _ => {
                        return Err(js_error(
                            "invalid_option",
                            &format!("invalid option context_length: {context:?} must be a positive integer"),
                        ))
                    }
                }
            }
        }
        let slots = if options.is_object() {
            slots_option(&js_sys::Reflect::get(&options, &JsValue::from_str("slots")).unwrap_or(JsValue::UNDEFINED))?
        } else {
            1
        };
        if options.is_object() {
            let kv = js_sys::Reflect::get(&options, &JsValue::from_str("kv_cache")).unwrap_or(JsValue::UNDEFINED);
            if !kv.is_undefined() && !kv.is_null() {
                load_options.kv_cache = kv_type(kv.as_string().as_deref())?;
            }
        }
        let submit_budget = if options.is_object() {
            submit_budget_option(&js_sys::Reflect::get(&options, &JsValue::from_str("submit_budget_ms")).unwrap_or(JsValue::UNDEFINED))?
        } else {
            None
        };
        let (gpu, cpu_reason) = match backend.as_str() {
            "cpu" => (None, Some(string_option("backend_reason").unwrap_or_else(|| "backend 'cpu' was asked for".into()))),
            "webgpu" => (Some(Gpu::new(&gpu_options).await.map_err(|e| model_error(&ModelError::Gpu(e)))?), None),
            _ if !has_gpu => (None, Some("WebGPU is not available here (navigator.gpu is missing)".into())),
            _ => match Gpu::new(&gpu_options).await {
                Ok(gpu) if gpu.info.software => {
                    // wgpu often has no adapter name on the web.
                    let name = &gpu.info.adapter_name;
                    let reason = if name.is_empty() {
                        "the WebGPU adapter is a software rasterizer".to_owned()
                    } else {
                        format!("the WebGPU adapter ({name}) is a software rasterizer")
                    };
                    gpu.device.destroy();
                    (None, Some(reason))
                }
                Ok(gpu) => (Some(gpu), None),
                Err(e) => (None, Some(format!("no WebGPU device: {e}"))),
            },
        };
        let state = State::default();
        // The GPU backend allocates its slots' KV caches at load.
        if gpu.is_some() {
            load_options.slots = slots;
        }
        *state.gpu.borrow_mut() = gpu;
        *state.cpu_reason.borrow_mut() = cpu_reason;
        *state.load_options.borrow_mut() = load_options;
        state.slots.set(slots);
        state.submit_budget.set(submit_budget);
        Ok(Engine { state: Rc::new(state) })
    }

    /// Feeds the next bytes of a GGUF file. The first chunk starts a new load (dropping any
    /// loaded model first, so its GPU memory is free). Returns the progress:
    /// `{bytes_received, tensors_loaded, tensors_total, file_bytes}`. After an error the load is
    /// abandoned; the next chunk starts a new one.
    #[wasm_bindgen(js_name = loadChunk)]
    pub fn load_chunk(&self, bytes: &[u8]) -> Result<JsValue, JsValue> {
        let s = &self.state;
        s.check_idle("load a model")?;
        let mut loader = s.loader.borrow_mut();
        if loader.is_none() {
            s.drop_model();
            let options = s.load_options.borrow().clone();
            *loader = Some(match s.gpu.borrow().as_ref() {
                Some(gpu) => ModelLoader::new(gpu, options),
                None => ModelLoader::new_cpu(options),
            });
        }
        let l = loader.as_mut().expect("just set");
        match l.push(bytes) {
            Ok(()) => Ok(progress_js(&l.progress())),
            Err(e) => {
                *loader = None;
                Err(model_error(&e))
            }
        }
    }

    /// Abandons a load in progress.
    #[wasm_bindgen(js_name = cancelLoad)]
    pub fn cancel_load(&self) {
        self.state.loader.borrow_mut().take();
    }

    /// Ends the stream (an incomplete file is a `bad_model` error naming the tensor), compiles
    /// the pipelines and makes the model current. Resolves to `info()`.
    #[wasm_bindgen(js_name = finishLoad)]
    pub fn finish_load(&self) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            state.check_idle("load a model")?;
            state.finish_load().await
        })
    }

    /// Generates from a JSON request (`{prompt | messages, max_tokens, temperature, top_p, top_k,
    /// min_p, seed, stop, stop_token_ids, logit_bias, repetition_penalty, frequency_penalty,
    /// presence_penalty, penalty_last_n, ignore_eos, logprobs}`). `on_token(text, id)` is called
    /// for every token (`id` undefined for a final flush of held-back text); returning `false`
    /// stops generation (finish_reason "abort"). Resolves to `{text, prompt_token_ids,
    /// token_ids, finish_reason, logprobs, timings}`.
    pub fn generate(&self, request: String, on_token: Function) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move { state.generate(&request, &on_token).await })
    }

    /// Stops the running generation at the next token (finish_reason "abort").
    pub fn abort(&self) {
        self.state.abort.set(true);
    }

    /// Forgets the KV cache prefix: the next request prefills from position 0.
    pub fn reset(&self) -> Result<(), JsValue> {
        self.state.check_idle("reset")?;
        if let Some(model) = self.state.model.borrow_mut().as_mut() {
            model.reset();
        }
        Ok(())
    }

    /// Drops the model and any load in progress, freeing their GPU memory. A running generation
    /// is aborted and the model dropped when it ends.
    /// Throws the device's fault recorded since the last check, if any: `device_lost` once the
    /// device is gone (the browser reports a loss after the errors it causes).
    #[wasm_bindgen(js_name = checkDevice)]
    pub fn check_device(&self) -> Result<(), JsValue> {
        match self.state.gpu.borrow().as_ref() {
            Some(gpu) => gpu.check_faults().map_err(|e| model_error(&e.into())),
            None => Ok(()),
        }
    }

    /// Where the engine runs models: 'webgpu' or 'cpu'.
    pub fn backend(&self) -> String {
        if self.state.gpu.borrow().is_some() { "webgpu" } else { "cpu" }.into()
    }

    /// Destroys the GPU device, as a driver reset or the browser reclaiming the GPU would lose
    /// it: the test hook of the package's device-loss recovery. The engine is unusable after.
    #[wasm_bindgen(js_name = destroyDevice)]
    pub fn destroy_device(&self) -> Result<(), JsValue> {
        self.state.gpu()?.device.destroy();
        Ok(())
    }

    /// Adds a batched sequence for a JSON request (as `generate` takes it) in a free slot: its
    /// id. Fails as `generate` fails for the request, with `busy` while `generate` runs, and
    /// with `invalid_option` when every slot is taken (`freeSlots`).
    #[wasm_bindgen(js_name = addSequence)]
    pub fn add_sequence(&self, request: String) -> Result<f64, JsValue> {
        let request = Request::parse(&request).map_err(|e| model_error(&e))?;
        self.state.with_model(|model| {
            let tokens = State::prompt_tokens(model, &request)?;
            let id = model.add_sequence(&tokens, &request.options).map_err(|e| model_error(&e))?;
            Ok(sequence_number(id))
        })
    }

    /// Slots no batched sequence holds (0 without a model).
    #[wasm_bindgen(js_name = freeSlots)]
    pub fn free_slots(&self) -> u32 {
        self.state.model.borrow().as_ref().map_or(0, |m| m.free_slots() as u32)
    }

    /// Runs one step of every batched sequence (prompts `prefill_tokens` tokens a step in all).
    /// Resolves to its events in order: `{id, text, token_id}` for a token (`token_id` undefined
    /// for a final flush), `{id, result}` when a sequence ends (`generate`'s result), `{id,
    /// error}` when it fails. The engine is busy until it resolves (add and abort sequences
    /// between steps).
    #[wasm_bindgen(js_name = stepSequences)]
    pub fn step_sequences(&self, prefill_tokens: u32) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            if state.busy.get() {
                return Err(js_error("busy", "cannot run batched sequences while a generation is running"));
            }
            let mut model = state.take_model()?;
            let step = model.step_sequences(prefill_tokens as usize).await;
            state.put_back(model);
            Ok(step_events(step))
        })
    }

    /// Ends batched sequence `id` now (finish_reason "abort"): its result, or undefined if no
    /// such sequence runs.
    #[wasm_bindgen(js_name = abortSequence)]
    pub fn abort_sequence(&self, id: f64) -> JsValue {
        let ended = self.state.model.borrow_mut().as_mut().and_then(|m| {
            let found = m.sequence_ids().into_iter().find(|&s| sequence_number(s) == id)?;
            m.abort_sequence(found)
        });
        ended.and_then(|g| serde_json::to_value(&g).ok()).map_or(JsValue::UNDEFINED, |v| to_js(&v))
    }

    pub fn unload(&self) {
        let s = &self.state;
        s.loader.borrow_mut().take();
        if s.busy.get() {
            s.abort.set(true);
            s.unload_pending.set(true);
        }
        s.drop_model();
    }
}

/// A batched step's events as `stepSequences` returns them.
fn step_events(step: kestrel_model::BatchStep) -> JsValue {
    let events = js_sys::Array::new();
    for (id, event) in step.events {
        let event = match event {
            SequenceEvent::Token(t) => json!({ "id": sequence_number(id), "text": t.text, "token_id": t.id }),
            SequenceEvent::Done(Ok(g)) => json!({ "id": sequence_number(id), "result": g }),
            SequenceEvent::Done(Err(e)) => {
                json!({ "id": sequence_number(id), "error": { "code": e.code(), "message": e.to_string() } })
            }
        };
        events.push(&to_js(&event));
    }
    events.into()
}

/// A sequence's id as JavaScript holds it (exact below 2^53).
fn sequence_number(id: SequenceId) -> f64 {
    id.number() as f64
}

/// SHA-256 of a file fed in chunks as it streams (WebCrypto's digest takes the whole file at
/// once): `createEngine`'s `sha256` check.
#[wasm_bindgen]
#[derive(Default)]
pub struct Sha256Hasher {
    hasher: Sha256,
}

#[wasm_bindgen]
impl Sha256Hasher {
    #[wasm_bindgen(constructor)]
    pub fn new() -> Sha256Hasher {
        Sha256Hasher::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    /// The digest in lowercase hex; the hasher starts over.
    #[wasm_bindgen(js_name = finishHex)]
    pub fn finish_hex(&mut self) -> String {
        self.hasher.finalize_reset().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Checks a generation request (the worker's request body) as a local engine checks it before
/// any work, for a request that goes to a remote server instead: its fields, exactly one of
/// `prompt` and `messages`, and every option's range (all but token ids against a vocabulary,
/// which only the model knows). Throws the local engines' `invalid_option` error.
#[wasm_bindgen(js_name = validateRequest)]
pub fn validate_request(request: &str) -> Result<(), JsValue> {
    install_panic_hook();
    let request = Request::parse(request).map_err(|e| model_error(&e))?;
    request.prompt().map_err(|e| model_error(&e))?;
    request.options.validate_for_any_model().map_err(|e| model_error(&e))
}

/// Reads a GGUF file's header as its first bytes arrive (no GPU needed), then answers whether the
/// model fits: `estimate()` in the browser package, and `createEngine`'s check before a download.
#[wasm_bindgen]
pub struct HeaderProbe {
    reader: GgufStreamReader,
}

impl Default for HeaderProbe {
    fn default() -> Self {
        Self::new()
    }
}

#[wasm_bindgen]
impl HeaderProbe {
    #[wasm_bindgen(constructor)]
    pub fn new() -> HeaderProbe {
        install_panic_hook();
        HeaderProbe { reader: GgufStreamReader::new() }
    }

    /// Feeds the next bytes of the file; true once the whole header has arrived (stop then).
    /// A malformed header is a `bad_model` error.
    pub fn push(&mut self, bytes: &[u8]) -> Result<bool, JsValue> {
        if self.reader.header().is_none() {
            // Tensor data after the header is not wanted: its events are ignored.
            self.reader.push(bytes, &mut |_| Ok(())).map_err(|e| model_error(&e.into()))?;
        }
        Ok(self.reader.header().is_some())
    }

    /// `{name, arch, file_bytes, weight_bytes, context_length, slots, kv_cache_bytes,
    /// activation_bytes, total_bytes, largest_binding: {name, bytes}, unsupported: [{tensor,
    /// type}], cpu: {bytes, weight_bytes, kv_cache_bytes, scratch_bytes, engine_bytes,
    /// memory_limit, fits, code, reason}, memory_limit: {bytes, source}, fits, code, reason}` for
    /// `slots` KV caches (absent: 1) of `context_length` tokens (absent: the load's default) of
    /// `kv_cache` values ('f16' or 'f32'; absent: f16). The GPU verdict is against the adapter
    /// limits given (absent: `fits` is null) and what the GPU can plausibly hold, judged from
    /// `device_memory` (`navigator.deviceMemory`, GiB; absent where the browser has none); the
    /// CPU backend's against 32-bit wasm memory.
    pub fn estimate(
        &self,
        context_length: Option<u32>,
        max_buffer_size: Option<f64>,
        max_binding: Option<f64>,
        kv_cache: Option<String>,
        slots: JsValue,
        device_memory: Option<f64>,
    ) -> Result<JsValue, JsValue> {
        let header = self.reader.header().ok_or_else(|| js_error("bad_model", "the GGUF header has not arrived yet"))?;
        let kv = kv_cache.map_or(Ok(KvType::default()), |name| kv_type(Some(&name)))?;
        let slots = slots_option(&slots)?;
        let estimate = Estimate::from_header(header, context_length.map(|c| c as usize), kv, slots).map_err(|e| model_error(&e))?;
        fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, JsValue> {
            serde_json::to_value(v).map_err(|e| js_error("internal", &e.to_string()))
        }
        let memory = MemoryLimit::gpu(device_memory);
        let mut value = to_value(&estimate)?;
        let verdict = match (max_buffer_size, max_binding) {
            (Some(buffer), Some(binding)) => {
                let limits = DeviceLimits { max_buffer_size: buffer as u64, max_storage_buffer_binding_size: binding as u64 };
                to_value(&estimate.verdict(&limits, &memory))?
            }
            _ => json!({ "fits": null, "code": null, "reason": null }),
        };
        if let (Some(out), Some(verdict)) = (value.as_object_mut(), verdict.as_object()) {
            out.extend(verdict.clone());
            out.insert("memory_limit".into(), to_value(&memory)?);
        }
        Ok(to_js(&value))
    }
}

#[cfg(test)]
mod tests {
    use kestrel_model::GenerateOptions;

    use super::Sha256Hasher;

    #[test]
    fn sha256_of_chunks_is_the_digest_of_the_whole() {
        let mut h = Sha256Hasher::new();
        h.update(b"ab");
        h.update(b"c");
        // FIPS 180-2's test vector for "abc".
        assert_eq!(h.finish_hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    /// The npm package declares (index.d.ts) and passes on (index.js) every generation option
    /// under its wire name. `logprobs` is the package's `logprobs` + `top_logprobs`.
    #[test]
    fn the_package_names_every_option() {
        let dts = include_str!("../../../www/index.d.ts");
        let declared = &dts[dts.find("export interface SamplingOptions").unwrap()..];
        let declared = &declared[..declared.find("\n}").unwrap()];
        let js = include_str!("../../../www/index.js");
        let passed = &js[js.find("const SAMPLING_KEYS = [").unwrap()..];
        let passed = &passed[..passed.find("];").unwrap()];
        let options = serde_json::to_value(GenerateOptions::default()).unwrap();
        for key in options.as_object().unwrap().keys() {
            assert!(declared.contains(&format!("  {key}?: ")), "index.d.ts SamplingOptions lacks {key}");
            if key != "logprobs" {
                assert!(passed.contains(&format!("'{key}'")), "index.js SAMPLING_KEYS lacks {key}");
            }
        }
    }
}
