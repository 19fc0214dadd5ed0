//! Device creation and model loading shared by the commands that run a model, with a progress
//! bar on stderr.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

use kestrel_gpu::{Gpu, GpuOptions};
use kestrel_model::{LoadOptions, LoadProgress, Model};

use super::coded;

pub struct Loaded {
    pub model: Model,
    pub load_ms: f64,
}

pub fn load(path: &Path, context: Option<usize>, quiet: bool) -> Result<Loaded, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let gpu = Gpu::new_blocking(&GpuOptions::default()).map_err(|e| coded(e.into()))?;
    let total = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len();
    let options = LoadOptions { context_length: context, ..LoadOptions::default() };
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
pub fn load_synthetic(
    shape: &kestrel_model::synthetic::SyntheticShape,
    context: Option<usize>,
) -> Result<Loaded, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let gpu = Gpu::new_blocking(&GpuOptions::default()).map_err(|e| coded(e.into()))?;
    let options = LoadOptions { context_length: context, ..LoadOptions::default() };
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
