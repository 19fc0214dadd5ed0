//! wasm-bindgen exports of the Kestrel engine, driven by the browser package's worker
//! (`www/worker.js`): create the device, stream a GGUF file in, then the engine core's requests
//! (`requests`: submit OpenAI-shaped requests, step the scheduler, abort), embeddings of an
//! embedding model (`embeddings`), the remote engine's answers built the same way (`remote`), the
//! KV prefix kept across page loads (`prefix`), speculative decoding and its draft model
//! (`speculative`), and the header probe and sha256 check (`probe`).
//!
//! Every error that reaches JavaScript is an `Error` whose `code` property is stable
//! ([`ModelError::code`] plus `no_webgpu`, `no_model`, `busy`, `invalid_option`, `gpu`) and whose
//! message is the precise one. Methods take `&self` and hand back promises over shared state, so
//! `abort()` can be called while a step is awaiting the GPU.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use js_sys::Promise;
use kestrel_engine::openai::Answer;
use kestrel_engine::{
    choose_backend, Aborts, EngineError, EngineOptions, EngineSettings, Placement, Platform, Request, RequestId, Scheduler,
};
use kestrel_gpu::kernels::matvec::{wide_unit_rows, WIDE_UNIT_TYPES};
use kestrel_gpu::Gpu;
use kestrel_model::{Embedder, LoadProgress, LoadedModel, ModelError, ModelLoader};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

mod embeddings;
mod prefix;
mod probe;
mod remote;
mod requests;
mod speculative;
#[cfg(feature = "test-hooks")]
mod test_hooks;

pub use probe::{HeaderProbe, Sha256Hasher};
pub use speculative::DraftLoad;

/// A JavaScript `Error` with a stable `code` property.
fn js_error(code: &str, message: &str) -> JsValue {
    let error = js_sys::Error::new(message);
    let _ = js_sys::Reflect::set(&error, &JsValue::from_str("code"), &JsValue::from_str(code));
    error.into()
}

fn model_error(e: &ModelError) -> JsValue {
    js_error(e.code(), &e.to_string())
}

fn engine_error(e: &EngineError) -> JsValue {
    js_error(e.code, &e.message)
}

fn to_js(value: &Value) -> JsValue {
    js_sys::JSON::parse(&value.to_string()).unwrap_or(JsValue::NULL)
}

thread_local! {
    /// The worker's function that hears each panic's message (`reportPanicsTo`).
    static PANIC_REPORTER: RefCell<Option<js_sys::Function>> = const { RefCell::new(None) };
}

/// Reports panics (bugs: every input-dependent failure is a `Result`) to the console with their
/// message and location, instead of a bare "unreachable executed", and to the worker's reporter.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let message = format!("kestrel panicked (a bug, please report it): {info}");
            web_sys::console::error_1(&JsValue::from_str(&message));
            // try_borrow: a panic inside `reportPanicsTo` itself finds the reporter borrowed.
            PANIC_REPORTER.with(|reporter| {
                if let Ok(Some(report)) = reporter.try_borrow().as_deref() {
                    let _ = report.call1(&JsValue::NULL, &JsValue::from_str(&message));
                }
            });
        }));
    });
}

/// Has `report(message)` called with each panic's message and location before the panic aborts
/// (wasm is built with panic=abort: the instance traps with a bare `RuntimeError: unreachable`),
/// so that the worker can say why the engine crashed.
#[wasm_bindgen(js_name = reportPanicsTo)]
pub fn report_panics_to(report: js_sys::Function) {
    install_panic_hook();
    PANIC_REPORTER.with(|reporter| *reporter.borrow_mut() = Some(report));
}

struct State {
    /// None: the CPU backend runs the model (see `cpu_reason`).
    gpu: RefCell<Option<Gpu>>,
    /// Why the engine runs on the CPU, when it does.
    cpu_reason: RefCell<Option<String>>,
    loader: RefCell<Option<ModelLoader>>,
    /// The loaded embedding model; then there is no scheduler (an encoder generates nothing).
    /// Each call holds it too, so that an `unload()` during one frees it when the call ends.
    embedder: RefCell<Option<Rc<Embedder>>>,
    /// Embedding and rerank calls under way (`embeddings::Encoding`).
    encoding: Cell<usize>,
    /// The loaded chat model in the engine core's scheduler; taken out while a step runs.
    scheduler: RefCell<Option<Scheduler>>,
    /// The scheduler's aborts, reachable while a step runs.
    aborts: RefCell<Option<Aborts>>,
    /// Requests submitted while a step ran, for the scheduler at the next step.
    inbox: RefCell<Vec<(RequestId, Request)>>,
    /// How each submitted request's answer is written, until it ends.
    answers: RefCell<HashMap<RequestId, Answer>>,
    /// Requests submitted so far: the next one's id.
    serial: Cell<u64>,
    model_info: RefCell<Option<Value>>,
    /// `info.speculative`: how the engine speculates, or why not; null without the option.
    speculative: RefCell<Value>,
    /// `create`'s options, for every model this engine loads.
    settings: EngineSettings,
    /// A step or a prefix save holds the scheduler.
    busy: Cell<bool>,
    /// `unload()` was called while busy: drop the model when the step ends.
    unload_pending: Cell<bool>,
}

impl State {
    fn new(settings: EngineSettings, gpu: Option<Gpu>, cpu_reason: Option<String>) -> Self {
        Self {
            gpu: RefCell::new(gpu),
            cpu_reason: RefCell::new(cpu_reason),
            loader: RefCell::default(),
            embedder: RefCell::default(),
            encoding: Cell::default(),
            scheduler: RefCell::default(),
            aborts: RefCell::default(),
            inbox: RefCell::default(),
            answers: RefCell::default(),
            serial: Cell::default(),
            model_info: RefCell::default(),
            speculative: RefCell::default(),
            settings,
            busy: Cell::default(),
            unload_pending: Cell::default(),
        }
    }

    fn check_idle(&self, what: &str) -> Result<(), JsValue> {
        let working = self.scheduler.borrow().as_ref().is_some_and(|s| !s.is_idle()) || !self.inbox.borrow().is_empty();
        if self.busy.get() || working {
            return Err(js_error("busy", &format!("cannot {what} while a generation is running")));
        }
        if self.encoding.get() > 0 {
            return Err(js_error("busy", &format!("cannot {what} while an embedding or rerank call is running")));
        }
        Ok(())
    }

    /// Takes the scheduler out for an async use that must not overlap another (a step, a save).
    fn take_scheduler(&self) -> Result<Scheduler, JsValue> {
        let scheduler = self.scheduler.borrow_mut().take().ok_or_else(|| js_error("no_model", "no model is loaded"))?;
        self.busy.set(true);
        Ok(scheduler)
    }

    /// Ends `take_scheduler`'s use: keeps the scheduler, or drops it if `unload()` came meanwhile.
    fn put_back(&self, scheduler: Scheduler) {
        self.busy.set(false);
        if self.unload_pending.replace(false) {
            drop(scheduler);
        } else {
            *self.scheduler.borrow_mut() = Some(scheduler);
        }
    }

    fn drop_model(&self) {
        self.scheduler.borrow_mut().take();
        self.embedder.borrow_mut().take();
        self.aborts.borrow_mut().take();
        self.model_info.borrow_mut().take();
        self.speculative.replace(Value::Null);
        self.inbox.borrow_mut().clear();
        self.answers.borrow_mut().clear();
    }

    async fn finish_load(&self) -> Result<JsValue, JsValue> {
        let loader = self.loader.borrow_mut().take().ok_or_else(|| js_error("bad_model", "bad model file: no bytes were loaded"))?;
        let model = match loader.finish_any().await.map_err(|e| model_error(&e))? {
            LoadedModel::Chat(model) => *model,
            LoadedModel::Embedding(embedder) => {
                *self.model_info.borrow_mut() = Some(embeddings::model_info(&embedder));
                *self.speculative.borrow_mut() = speculative::not_generating(self.settings.speculative);
                *self.embedder.borrow_mut() = Some(Rc::new(*embedder));
                return Ok(self.info());
            }
        };
        let mut scheduler = self.settings.scheduler(model).map_err(|e| model_error(&e))?;
        let speculation = speculative::start(&mut scheduler, self.settings.speculative).map_err(|e| model_error(&e))?;
        let model = scheduler.model();
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
            "prefill_chunk": scheduler.prefill_chunk(),
            // Whether requests run as one batch of sequences, stepped between messages.
            "batched": scheduler.is_batched(),
            // The CPU backend submits nothing to a device.
            "submit_budget_ms": model.submit_budget().map(|b| b.as_secs_f64() * 1e3),
        });
        *self.model_info.borrow_mut() = Some(info);
        *self.speculative.borrow_mut() = speculation;
        *self.aborts.borrow_mut() = Some(scheduler.aborts());
        *self.scheduler.borrow_mut() = Some(scheduler);
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
                    // The types whose rows keep more live across a block get fewer rows a thread.
                    "matvec_wide_unit_rows": wide_unit_rows(i.kernels.matvec.rows_per_thread),
                    "matvec_wide_unit_types": WIDE_UNIT_TYPES.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
                },
            })
        });
        let embedder = self.embedder.borrow();
        let encoder_kind = embedder.as_ref().map(|e| e.kind());
        // An embedding model the GPU does not run (`Embedder::gpu_declined`) is on the CPU
        // kernels even in an engine that holds a GPU device.
        let declined = embedder.as_ref().and_then(|e| e.gpu_declined()).map(|why| format!("this model runs on the CPU backend: {why}"));
        let (gpu, cpu_reason) = match (declined, self.cpu_reason.borrow().clone()) {
            (_, Some(reason)) => (gpu, Some(reason)),
            (Some(why), None) => (None, Some(why)),
            (None, None) => (gpu, None),
        };
        let backend = if gpu.is_some() { "webgpu" } else { "cpu" };
        // One thread: a wasm worker has no shared-memory threads without a nightly toolchain.
        let cpu = cpu_reason.as_ref().map(|_| json!({ "simd": kestrel_cpu::simd_name(), "threads": 1 }));
        // "embedding" or "reranker" for an encoder (`Embedder::kind`), else "chat" once loaded.
        let kind = match (encoder_kind, self.model_info.borrow().is_some()) {
            (Some(kind), _) => json!(kind),
            (None, true) => json!("chat"),
            (None, false) => Value::Null,
        };
        to_js(&json!({
            "kind": kind,
            "backend": backend,
            "backend_reason": cpu_reason,
            "cpu": cpu,
            "gpu": gpu,
            "model": *self.model_info.borrow(),
            "speculative": *self.speculative.borrow(),
            "version": env!("CARGO_PKG_VERSION"),
        }))
    }
}

/// Feeds `bytes` to a load (`what` names a load that has ended); an error abandons it.
fn push_chunk(loader: &mut Option<ModelLoader>, bytes: &[u8], what: &str) -> Result<JsValue, JsValue> {
    let l = loader.as_mut().ok_or_else(|| js_error("bad_model", what))?;
    match l.push(bytes) {
        Ok(()) => Ok(progress_js(&l.progress())),
        Err(e) => {
            *loader = None;
            Err(model_error(&e))
        }
    }
}

/// Ends the current shard of a load's split model; an error abandons it.
fn next_shard(loader: &mut Option<ModelLoader>) -> Result<(), JsValue> {
    let l = loader.as_mut().ok_or_else(|| js_error("bad_model", "the next shard of a load that has not started"))?;
    l.next_shard().map_err(|e| {
        *loader = None;
        model_error(&e)
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

/// The engine: one GPU device (or the CPU backend) and at most one loaded model.
#[wasm_bindgen]
pub struct Engine {
    state: Rc<State>,
}

#[wasm_bindgen]
impl Engine {
    /// Creates the engine from `options` (JSON: `kestrel_engine::EngineOptions`, the
    /// `createEngine` options of the engine itself) on its `backend`: 'webgpu' (the GPU device
    /// from the global scope's `navigator.gpu`, a worker's or a page's; fails with code
    /// `no_webgpu` where there is none or no adapter), 'cpu' (`kestrel-cpu`'s kernels in wasm
    /// SIMD), or 'auto', the default: the GPU unless there is none or its adapter is a software
    /// rasterizer (SwiftShader, llvmpipe, WARP), which the CPU path outruns
    /// (`kestrel_engine::choose_backend`, as natively). A bad or unknown option is
    /// `invalid_option`.
    pub async fn create(options: String) -> Result<Engine, JsValue> {
        install_panic_hook();
        let settings = EngineOptions::parse(&options).and_then(|o| o.settings()).map_err(|e| engine_error(&e))?;
        let navigator = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("navigator")).unwrap_or(JsValue::UNDEFINED);
        let has_gpu = !navigator.is_undefined()
            && js_sys::Reflect::get(&navigator, &JsValue::from_str("gpu")).is_ok_and(|g| !g.is_undefined() && !g.is_null());
        let platform = Platform {
            api: "WebGPU",
            missing_api: (!has_gpu).then_some("WebGPU is not available here (navigator.gpu is missing)"),
            cpu_asked: &settings.cpu_asked,
        };
        let (gpu, cpu_reason) = match choose_backend(settings.preference, &settings.gpu, &platform).await.map_err(|e| model_error(&e))? {
            Placement::Gpu(gpu) => (Some(*gpu), None),
            Placement::Cpu { reason } => (None, Some(reason)),
        };
        Ok(Engine { state: Rc::new(State::new(settings, gpu, cpu_reason)) })
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
            let gpu = s.gpu.borrow();
            let options = s.settings.load_options(gpu.is_some());
            *loader = Some(match gpu.as_ref() {
                Some(gpu) => ModelLoader::new(gpu, options),
                None => ModelLoader::new_cpu(options),
            });
        }
        push_chunk(&mut loader, bytes, "the load has ended")
    }

    /// Ends the current shard of a split model, which must be complete: the chunks fed next are
    /// the next shard's, from its start. After an error the load is abandoned.
    #[wasm_bindgen(js_name = loadNextShard)]
    pub fn load_next_shard(&self) -> Result<(), JsValue> {
        next_shard(&mut self.state.loader.borrow_mut())
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

    /// Forgets the KV cache prefix: the next request prefills from position 0.
    pub fn reset(&self) -> Result<(), JsValue> {
        self.state.check_idle("reset")?;
        if let Some(model) = self.state.scheduler.borrow_mut().as_mut().and_then(Scheduler::model_mut) {
            model.reset();
        }
        Ok(())
    }

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
        let gpu = self.state.gpu.borrow();
        gpu.as_ref().ok_or_else(|| js_error("no_webgpu", "the engine has no GPU device"))?.device.destroy();
        Ok(())
    }

    /// Drops the model and any load in progress, freeing their GPU memory. The requests in
    /// flight get no more events (the worker ends them); a running step is aborted and the model
    /// dropped when it ends.
    pub fn unload(&self) {
        let s = &self.state;
        s.loader.borrow_mut().take();
        if s.busy.get() {
            if let Some(aborts) = s.aborts.borrow().as_ref() {
                aborts.abort_all();
            }
            s.unload_pending.set(true);
        }
        s.drop_model();
    }
}
