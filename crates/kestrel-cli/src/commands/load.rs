//! Device creation and model loading shared by the commands that run a model, with a progress
//! bar on stderr.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

use kestrel_gpu::params::KvType;
use kestrel_gpu::{Gpu, GpuOptions};
use kestrel_model::{LoadOptions, LoadProgress, Model};

use super::coded;

/// The KV cache's length and value type, as every command that loads a model takes them.
#[derive(clap::Args, Debug, Clone)]
pub struct CacheArgs {
    /// KV cache length (default: the model's context, at most 4096).
    #[arg(long)]
    pub context: Option<usize>,
    /// How the KV cache stores keys and values: f16 (half the memory and half the attention's
    /// reads; llama.cpp's default) or f32.
    #[arg(long, default_value = "f16", value_parser = parse_kv_type)]
    pub kv_cache: KvType,
}

impl CacheArgs {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions { context_length: self.context, kv_cache: self.kv_cache, ..LoadOptions::default() }
    }
}

fn parse_kv_type(name: &str) -> Result<KvType, String> {
    KvType::from_name(name).ok_or_else(|| format!("{name:?} is not f16 or f32"))
}

pub struct Loaded {
    pub model: Model,
    pub load_ms: f64,
}

pub fn load(path: &Path, cache: &CacheArgs, quiet: bool) -> Result<Loaded, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let gpu = Gpu::new_blocking(&GpuOptions::default()).map_err(|e| coded(e.into()))?;
    let total = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len();
    let options = cache.load_options();
    let show_bar = !quiet && std::io::stderr().is_terminal();
    let mut bar = |p: &LoadProgress| {
        if show_bar {
            draw_bar(p.bytes_received, total);
        }
    };
    let model = pollster::block_on(kestrel_model::load_file(&gpu, path, options, &mut bar)).map_err(coded)?;
    if !quiet {
        eprintln!(
            "\rloaded {} ({}, {} layers) on {} in {:.2} s",
            path.display(),
            model.config().name,
            model.config().n_layers,
            gpu.info.adapter_name,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(Loaded { model, load_ms: start.elapsed().as_secs_f64() * 1e3 })
}

/// A model of `shape` made in memory with random weights (`kestrel_model::synthetic`).
pub fn load_synthetic(shape: &kestrel_model::synthetic::SyntheticShape, cache: &CacheArgs) -> Result<Loaded, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let gpu = Gpu::new_blocking(&GpuOptions::default()).map_err(|e| coded(e.into()))?;
    let options = cache.load_options();
    let model = pollster::block_on(kestrel_model::synthetic::load_synthetic(&gpu, shape, 1, options)).map_err(coded)?;
    eprintln!(
        "made and loaded synthetic {} ({} layers) on {} in {:.2} s",
        shape.name,
        model.config().n_layers,
        gpu.info.adapter_name,
        start.elapsed().as_secs_f64()
    );
    Ok(Loaded { model, load_ms: start.elapsed().as_secs_f64() * 1e3 })
}

fn draw_bar(done: u64, total: u64) {
    const WIDTH: u64 = 30;
    let filled = (done.min(total) * WIDTH).checked_div(total).unwrap_or(WIDTH);
    let bar: String = (0..WIDTH).map(|i| if i < filled { '#' } else { '.' }).collect();
    eprint!("\rloading [{bar}] {:>4.0}/{:.0} MiB", done as f64 / 1048576.0, total as f64 / 1048576.0);
    let _ = std::io::stderr().flush();
}
