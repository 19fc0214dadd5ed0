//! Device creation and model loading shared by the commands that run a model, with a progress
//! bar on stderr.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

use kestrel_engine::{choose_backend, BackendPreference, EngineOptions, EngineSettings, Placement, Platform};
use kestrel_gpu::{Gpu, GpuOptions};
use kestrel_model::{Embedder, LoadOptions, LoadProgress, LoadedModel, Model};

use super::{coded, engine_coded};

/// Where the model runs, and the KV cache's length and value type, as every command that loads
/// a model takes them.
#[derive(clap::Args, Debug, Clone)]
pub struct CacheArgs {
    /// Where the model runs: gpu, cpu (SIMD kernels on every core), or auto: the GPU unless
    /// there is none or it is a software rasterizer (lavapipe, llvmpipe, SwiftShader, WARP),
    /// which the CPU path outruns.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// KV cache length (default: the model's context, at most 4096).
    #[arg(long)]
    pub context: Option<usize>,
    /// How the KV cache stores keys and values: f16 (half the memory and half the attention's
    /// reads; llama.cpp's default) or f32.
    #[arg(long, default_value = "f16")]
    pub kv_cache: String,
    /// Prompt tokens per prefill pass, where a command sets it (`kestrel bench model --chunk`);
    /// otherwise the loader's default.
    #[arg(skip)]
    pub max_chunk: Option<usize>,
}

impl CacheArgs {
    /// The engine's settings from these flags and a command's `slots` and `prefill_chunk`
    /// (None: the default), checked where the browser's `createEngine` options are checked
    /// (`EngineOptions::settings`): the same bounds and the same `invalid_option` messages.
    pub fn settings(&self, slots: usize, prefill_chunk: Option<usize>) -> Result<EngineSettings, String> {
        let options = EngineOptions {
            context_length: self.context.map(|n| n as f64),
            kv_cache: Some(self.kv_cache.clone()),
            slots: Some(slots as f64),
            prefill_chunk: prefill_chunk.map(|n| n as f64),
            ..EngineOptions::default()
        };
        options.settings().map_err(|e| engine_coded(&e))
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Gpu,
    Cpu,
}

/// Where a model will run, and why there.
enum Device {
    Gpu(Box<Gpu>),
    Cpu(String),
}

/// The load options of `settings` on `device` (the GPU allocates its KV slots at load, the CPU
/// backend when `Model::set_slots` asks after it), with a command's own prefill chunk.
fn load_options(device: &Device, cache: &CacheArgs, settings: &EngineSettings) -> LoadOptions {
    let options = settings.load_options(matches!(device, Device::Gpu(_)));
    LoadOptions { max_chunk: cache.max_chunk.unwrap_or(options.max_chunk), ..options }
}

fn device(choice: BackendChoice) -> Result<Device, Box<dyn std::error::Error>> {
    let preference = match choice {
        BackendChoice::Auto => BackendPreference::Auto,
        BackendChoice::Gpu => BackendPreference::Gpu,
        BackendChoice::Cpu => BackendPreference::Cpu,
    };
    let platform = Platform { api: "GPU", missing_api: None, cpu_asked: "--backend cpu" };
    let placement = pollster::block_on(choose_backend(preference, &GpuOptions::default(), &platform)).map_err(coded)?;
    Ok(match placement {
        Placement::Gpu(gpu) => Device::Gpu(gpu),
        Placement::Cpu { reason } => {
            Device::Cpu(format!("CPU ({}, {} threads): {reason}", kestrel_cpu::simd_name(), kestrel_cpu::threads()))
        }
    })
}

/// The bytes of the model at `path`: its file's, or a split model's shards' together.
pub fn model_bytes(path: &Path) -> Result<u64, String> {
    kestrel_gguf::model_files(path).iter().map(|f| std::fs::metadata(f).map(|m| m.len()).map_err(|e| format!("{}: {e}", f.display()))).sum()
}

pub struct Loaded {
    pub model: Model,
    pub load_ms: f64,
    /// On the GPU, the most its allocator held at once while the model loaded (sampled as each
    /// tensor arrived and at the end), where the backend reports its allocations.
    pub gpu_peak_bytes: Option<u64>,
}

pub fn load(path: &Path, cache: &CacheArgs, quiet: bool) -> Result<Loaded, Box<dyn std::error::Error>> {
    load_with_slots(path, cache, quiet, 1)
}

/// `load` with `slots` sequences generating at once: KV slots allocated at load on the GPU, set
/// after it on the CPU (`Model::set_slots`).
pub fn load_with_slots(path: &Path, cache: &CacheArgs, quiet: bool, slots: usize) -> Result<Loaded, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let settings = cache.settings(slots, None)?;
    let device = device(cache.backend)?;
    let total = model_bytes(path)?;
    let options = load_options(&device, cache, &settings);
    let show_bar = !quiet && std::io::stderr().is_terminal();
    let mut gpu_peak_bytes: Option<u64> = None;
    let (model, on) = match device {
        Device::Gpu(gpu) => {
            let mut progress = |p: &LoadProgress| {
                if show_bar {
                    draw_bar(p.bytes_received, total);
                }
                if let Some(bytes) = gpu.allocated_bytes() {
                    gpu_peak_bytes = Some(gpu_peak_bytes.unwrap_or(0).max(bytes));
                }
            };
            let model = pollster::block_on(kestrel_model::load_file(&gpu, path, options, &mut progress));
            if let Some(bytes) = gpu.allocated_bytes() {
                gpu_peak_bytes = Some(gpu_peak_bytes.unwrap_or(0).max(bytes));
            }
            (model, gpu.info.adapter_name.clone())
        }
        Device::Cpu(why) => {
            let mut bar = |p: &LoadProgress| {
                if show_bar {
                    draw_bar(p.bytes_received, total);
                }
            };
            (pollster::block_on(kestrel_model::load_file_cpu(path, options, &mut bar)), why)
        }
    };
    let mut model = model.map_err(coded)?;
    model.set_slots(settings.slots).map_err(coded)?;
    if !quiet {
        eprintln!(
            "\rloaded {} ({}, {} layers) on {on} in {:.2} s",
            path.display(),
            model.config().name,
            model.config().n_layers,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(Loaded { model, load_ms: start.elapsed().as_secs_f64() * 1e3, gpu_peak_bytes })
}

/// The architecture the header of the model at `path` names (`general.architecture`), read
/// before loading, so that an embedding model never opens a GPU device it would not use.
pub fn architecture(path: &Path) -> Result<Option<String>, Box<dyn std::error::Error>> {
    let header = kestrel_gguf::read_model_header(path)?;
    Ok(header.metadata.get_str("general.architecture")?.map(str::to_owned))
}

/// Whether `arch` is an embedding model's (an encoder's) architecture.
pub fn is_embedding(arch: Option<&str>) -> bool {
    arch.and_then(kestrel_model::encoder::EncoderArch::from_name).is_some()
}

/// The model at `path`, of either kind: an encoder where `cache.backend` places it
/// (`load_embedder`), a chat model as `load_with_slots` loads it.
pub fn load_any(path: &Path, cache: &CacheArgs, quiet: bool, slots: usize) -> Result<LoadedModel, Box<dyn std::error::Error>> {
    if is_embedding(architecture(path)?.as_deref()) {
        return Ok(LoadedModel::Embedding(Box::new(load_embedder(path, cache.backend, quiet)?)));
    }
    Ok(LoadedModel::Chat(Box::new(load_with_slots(path, cache, quiet, slots)?.model)))
}

/// The embedding model at `path` (an encoder, or a decoder with a pooling type), its layers on
/// `backend`; a chat model is `invalid_option`.
pub fn load_embedder(path: &Path, backend: BackendChoice, quiet: bool) -> Result<Embedder, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let device = device(backend)?;
    let total = model_bytes(path)?;
    let show_bar = !quiet && std::io::stderr().is_terminal();
    let mut bar = |p: &LoadProgress| {
        if show_bar {
            draw_bar(p.bytes_received, total);
        }
    };
    let loaded = match &device {
        Device::Gpu(gpu) => pollster::block_on(kestrel_model::load_file_any(gpu, path, LoadOptions::default(), &mut bar)),
        Device::Cpu(_) => pollster::block_on(kestrel_model::load_file_cpu_any(path, LoadOptions::default(), &mut bar)),
    }
    .map_err(coded)?;
    let embedder = match loaded {
        LoadedModel::Embedding(embedder) => *embedder,
        LoadedModel::Chat(model) => {
            let arch = format!("{:?}", model.config().arch).to_lowercase();
            let e = kestrel_engine::embeddings::not_an_embedding_model(&arch);
            return Err(super::engine_coded(&e).into());
        }
    };
    if !quiet {
        let config = embedder.config();
        eprintln!(
            "\rloaded {} ({}, {} layers, {} dimensions) on {} in {:.2} s",
            path.display(),
            config.name,
            config.n_layers,
            embedder.dimensions(),
            match (&device, embedder.backend()) {
                (Device::Gpu(gpu), "gpu") => gpu.info.adapter_name.clone(),
                _ => format!("CPU ({}, {} threads)", kestrel_cpu::simd_name(), kestrel_cpu::threads()),
            },
            start.elapsed().as_secs_f64()
        );
    }
    Ok(embedder)
}

/// A model of `shape` made in memory with random weights (`kestrel_model::synthetic`).
pub fn load_synthetic(
    shape: &kestrel_model::synthetic::SyntheticShape,
    cache: &CacheArgs,
    slots: usize,
) -> Result<Loaded, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let settings = cache.settings(slots, None)?;
    let device = device(cache.backend)?;
    let options = load_options(&device, cache, &settings);
    let (loader, on) = match device {
        Device::Gpu(gpu) => (kestrel_model::ModelLoader::new(&gpu, options), gpu.info.adapter_name.clone()),
        Device::Cpu(why) => (kestrel_model::ModelLoader::new_cpu(options), why),
    };
    let mut model = pollster::block_on(kestrel_model::synthetic::load_synthetic(loader, shape, 1)).map_err(coded)?;
    model.set_slots(settings.slots).map_err(coded)?;
    eprintln!(
        "made and loaded synthetic {} ({} layers) on {on} in {:.2} s",
        shape.name,
        model.config().n_layers,
        start.elapsed().as_secs_f64()
    );
    // Made in memory, not streamed: no samples during the load.
    Ok(Loaded { model, load_ms: start.elapsed().as_secs_f64() * 1e3, gpu_peak_bytes: None })
}

fn draw_bar(done: u64, total: u64) {
    const WIDTH: u64 = 30;
    let filled = (done.min(total) * WIDTH).checked_div(total).unwrap_or(WIDTH);
    let bar: String = (0..WIDTH).map(|i| if i < filled { '#' } else { '.' }).collect();
    eprint!("\rloading [{bar}] {:>4.0}/{:.0} MiB", done as f64 / 1048576.0, total as f64 / 1048576.0);
    let _ = std::io::stderr().flush();
}
