//! `kestrel bench model`: a GGUF model end to end on this adapter: cold load, prefill of N-token
//! prompts, M decode steps, repeated (median and spread), inter-token latency, GPU memory, the
//! memory-bandwidth roofline and where a decode step's time goes; with --lookup or
//! --draft-model, speculative decoding against plain (`speculative.rs`). One JSON object for the
//! suite (bench/run.mjs), a short Markdown summary on stdout.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use kestrel_engine::Generator;
use kestrel_gpu::Gpu;
use kestrel_model::Model;
use serde::Serialize;

use super::cases;
use super::report::Adapter;
use super::speculative::{self, SpeculativeResult};
use super::step_profile::{self, Roofline, StepProfile};
use super::timing::{Timer, TimingSettings};
use super::workload::{self, WorkloadResult};
use super::{copy_bytes, BenchResult};
use crate::commands::load::CacheArgs;
use crate::commands::load::{load, load_synthetic, model_bytes};
use crate::commands::speculative::SpeculativeArgs;
use crate::commands::CliResult;

#[derive(Args)]
pub struct ModelArgs {
    /// The GGUF file (default: the default model).
    #[arg(long, short, conflicts_with = "synthetic")]
    model: Option<PathBuf>,
    /// Instead of a file, a model made in memory with random weights in the real layout and
    /// types of a model size: 135m (SmolLM2, Q4_1), 1b (Llama 3.2) or 8b (Llama 3.1), Q4_K
    /// matrices and a Q6_K embedding (kestrel_model::synthetic).
    #[arg(long, value_parser = ["135m", "1b", "8b"])]
    synthetic: Option<String>,
    /// With --synthetic: write that model to this GGUF file and exit, so that other engines
    /// (llama.cpp, wllama, the browser) run the same file; `kestrel quantize` makes it any other
    /// weight type.
    #[arg(long, requires = "synthetic")]
    write: Option<PathBuf>,
    /// Prompt lengths to prefill, comma-separated (each from an empty KV cache).
    #[arg(long, value_delimiter = ',', default_value = "128", value_parser = clap::value_parser!(u32).range(1..))]
    prompt_tokens: Vec<u32>,
    /// The prompt's token ids: `bench_prompt.ids` of this JSON file, repeated to each length.
    #[arg(long, default_value = workload::DEFAULT_PROMPTS)]
    prompts: PathBuf,
    /// Decode steps after the first generated token.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    decode_tokens: u32,
    /// Times each prompt length is run; medians and ranges are reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeats: u32,
    /// Size of the copy kernel's buffers in MiB (the roofline's bandwidth; on the CPU backend,
    /// of the two buffers a copy on its threads runs between, at least 256).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    copy_mib: u64,
    /// Skip the per-kernel-family profile of a decode step.
    #[arg(long)]
    no_profile: bool,
    /// Time kernel families with the host clock even when the device has timestamp queries.
    #[arg(long)]
    wall_clock: bool,
    #[command(flatten)]
    cache: CacheArgs,
    /// Bound a prompt's GPU submissions to about this many ms each (its chunks go in pieces of
    /// whole layers, as the browser engine runs them so the page keeps drawing), to measure what
    /// that costs (0: none); the results then give the longest submission.
    #[arg(long)]
    submit_budget_ms: Option<f64>,
    /// Prompt tokens per prefill pass (default: the loader's), to compare chunk sizes.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    chunk: Option<u32>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// With --lookup or --draft-model: after the plain workloads, greedy generations of the chat
    /// prompts in this file (by workload), plain and speculative alternately.
    #[arg(long, default_value = speculative::DEFAULT_PROMPTS)]
    speculative_prompts: PathBuf,
    /// With --lookup or --draft-model: most tokens of each of those generations.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    speculative_tokens: u32,
    #[command(flatten)]
    speculative: SpeculativeArgs,
}

#[derive(Debug, Serialize)]
struct ModelInfo {
    path: String,
    name: String,
    arch: String,
    n_layers: usize,
    file_bytes: u64,
    weight_bytes: u64,
    weight_bytes_per_token: u64,
}

/// GPU memory the model holds.
#[derive(Debug, Serialize)]
struct GpuMemory {
    /// What wgpu's allocator reports as live allocations (`None`: the backend gives no report).
    allocator_allocated_bytes: Option<u64>,
    /// Memory blocks the allocator reserved, used or not.
    allocator_reserved_bytes: Option<u64>,
    weight_bytes: u64,
    /// Keys and values for every layer at the context length, in the cache's value type.
    kv_cache_bytes: u64,
    /// The most the allocator held at once: sampled as each tensor of the file arrived, at the
    /// load's end and after the workloads (None for a synthetic model, or without a report).
    peak_allocated_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
struct ModelReport {
    engine: &'static str,
    version: &'static str,
    /// "gpu" or "cpu": the GPU-only parts below are absent on the CPU backend.
    backend: &'static str,
    /// The CPU backend's instruction set and threads.
    cpu: Option<CpuInfo>,
    adapter: Option<Adapter>,
    model: ModelInfo,
    context_length: usize,
    /// Device creation, reading the file, repacking and uploading the weights, compiling every
    /// pipeline (the file may be in the OS page cache from an earlier run).
    load_ms: f64,
    /// The file's bytes over `load_ms` (None for a synthetic model, made in memory).
    load_gb_per_s: Option<f64>,
    gpu_memory: Option<GpuMemory>,
    copy_gb_per_s: Option<f64>,
    workloads: Vec<WorkloadResult>,
    roofline: Option<Roofline>,
    decode_step: Option<StepProfile>,
    /// Speculative decoding against plain, by workload (with --lookup or --draft-model).
    speculative: Option<Vec<SpeculativeResult>>,
    /// The process's peak resident memory at the end (Linux's VmHWM; None elsewhere): weights,
    /// KV cache, and the mapped file's pages while they were resident.
    peak_rss_bytes: Option<u64>,
    wall_s: f64,
}

#[derive(Debug, Serialize)]
struct CpuInfo {
    simd: &'static str,
    threads: usize,
    weight_bytes: u64,
    kv_cache_bytes: u64,
}

/// Writes the synthetic model `shape` (seed 1, as the bench loads it) to the GGUF file `out`.
fn write_synthetic(shape: &kestrel_model::synthetic::SyntheticShape, out: &std::path::Path) -> CliResult {
    use std::io::Write;
    let started = Instant::now();
    let file = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut file = std::io::BufWriter::new(file);
    let mut written = 0u64;
    shape.generate(1, &mut |chunk| {
        written += chunk.len() as u64;
        file.write_all(chunk).map_err(|e| kestrel_model::ModelError::BadModel(format!("writing {}: {e}", out.display())))
    })?;
    file.flush().map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!(
        "wrote synthetic {} to {}: {:.1} MB in {:.1} s",
        shape.name,
        out.display(),
        written as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn run(args: &ModelArgs) -> CliResult {
    let started = Instant::now();
    let speculative_options = args.speculative.options()?;
    let submit_budget = args.submit_budget_ms.map(kestrel_model::submit_budget_from_ms).transpose()?.flatten();
    let cache = CacheArgs { max_chunk: args.chunk.map(|c| c as usize), ..args.cache.clone() };
    let (path, file_bytes, mut loaded) = match &args.synthetic {
        Some(name) => {
            let shape = kestrel_model::synthetic::synthetic_shape(name).ok_or_else(|| format!("unknown synthetic shape {name}"))?;
            if let Some(out) = &args.write {
                return write_synthetic(&shape, out);
            }
            let loaded = load_synthetic(&shape, &cache, 1)?;
            (PathBuf::from(format!("synthetic:{name}")), 0, loaded)
        }
        None => {
            let path = crate::model_path::resolve(args.model.clone());
            let file_bytes = model_bytes(&path)?;
            let loaded = load(&path, &cache, false)?;
            (path, file_bytes, loaded)
        }
    };
    let mut model = loaded.model;
    model.set_submit_budget(submit_budget)?;
    let gpu = model.gpu().cloned();
    let info = model_info(&model, &path, file_bytes);
    let (adapter, gpu_memory, cpu) = match &gpu {
        Some(gpu) => (Some(Adapter::new(&gpu.info)), Some(gpu_memory(gpu, &model)), None),
        None => {
            let cpu = CpuInfo {
                simd: kestrel_cpu::simd_name(),
                threads: kestrel_cpu::threads(),
                weight_bytes: model.weight_bytes(),
                kv_cache_bytes: model.kv_cache_bytes(),
            };
            (None, None, Some(cpu))
        }
    };

    let decode_tokens = args.decode_tokens as usize;
    let bench_ids = workload::read_bench_ids(&args.prompts, model.config().vocab)?;
    let mut prompts = Vec::with_capacity(args.prompt_tokens.len());
    for &n in &args.prompt_tokens {
        let n = n as usize;
        if n + decode_tokens + 1 > model.context_length() {
            return Err(format!("{n} prompt + {decode_tokens} decode tokens exceed the context of {}", model.context_length()).into());
        }
        prompts.push(workload::prompt_ids(&bench_ids, n));
    }
    let Some(first_prompt) = prompts.first() else {
        return Err("give at least one --prompt-tokens length".into());
    };
    let mut generator = Generator::new(model);
    workload::warm_up(&mut generator, first_prompt)?;
    let mut workloads = Vec::with_capacity(prompts.len());
    for prompt in &prompts {
        workloads.push(workload::run(&mut generator, prompt, decode_tokens, args.repeats as usize)?);
    }
    let speculative = match speculative_options {
        Some(options) => {
            args.speculative.apply(Some(options), &mut generator, &cache, false)?;
            let results =
                speculative::run(&mut generator, &args.speculative_prompts, args.speculative_tokens as usize, args.repeats as usize)?;
            // The draft model's memory is not the model's (read below).
            generator.clear_speculation();
            Some(results)
        }
        None => None,
    };
    let mut model = generator.into_model();

    // Read before the copy rate is measured: its buffers (on the CPU backend two of at least
    // 256 MiB; on a software GPU in host memory too) are not the model's.
    let peak_rss_bytes = peak_rss_bytes();
    let gpu_memory = gpu_memory.map(|mut m| {
        let now = gpu.as_ref().and_then(Gpu::allocated_bytes);
        m.peak_allocated_bytes = loaded.gpu_peak_bytes.take().map(|peak| now.map_or(peak, |now| peak.max(now)));
        m
    });
    let copy_gb_per_s = match (&gpu, &cpu) {
        (Some(gpu), _) => {
            let copy = copy_bandwidth(gpu, args.copy_mib, args.wall_clock)?;
            eprintln!("copy kernel: {copy:.2} GB/s");
            Some(copy)
        }
        (None, Some(cpu)) => {
            // The memory's copy rate with the backend's threads: a decode step's roofline. At
            // least 256 MiB, past any CPU cache.
            let copy = kestrel_cpu::copy_bandwidth((args.copy_mib.max(256) as usize) << 20);
            eprintln!("copy on {} threads: {copy:.2} GB/s", cpu.threads);
            Some(copy)
        }
        (None, None) => None,
    };
    let roofline = workloads
        .first()
        .and_then(|w| w.decode_tok_s)
        .zip(copy_gb_per_s)
        .map(|(tok_s, copy)| Roofline::new(model.weight_bytes_per_token(), copy, tok_s.median));
    let decode_step = if let (false, Some(gpu)) = (args.no_profile, &gpu) {
        // Mid-way through the first workload's decode: a representative KV length.
        let pos = first_prompt.len() + decode_tokens / 2;
        let timer = Timer::new(gpu, step_profile::family_settings(), args.wall_clock);
        eprintln!("decode step at position {pos}, by kernel family ({}):", timer.method());
        Some(step_profile::profile(&mut model, &timer, pos, first_prompt[0])?)
    } else {
        None
    };

    let report = ModelReport {
        engine: "kestrel",
        version: env!("CARGO_PKG_VERSION"),
        backend: model.backend().as_str(),
        cpu,
        adapter,
        model: info,
        context_length: model.context_length(),
        load_ms: loaded.load_ms,
        load_gb_per_s: (file_bytes > 0 && loaded.load_ms > 0.0).then(|| file_bytes as f64 / (loaded.load_ms * 1e6)),
        gpu_memory,
        copy_gb_per_s,
        workloads,
        roofline,
        decode_step,
        speculative,
        peak_rss_bytes,
        wall_s: started.elapsed().as_secs_f64(),
    };
    println!("{}", markdown(&report));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// This process's peak resident set size (`VmHWM` of /proc/self/status, in kB), where the
/// system reports it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// The copy kernel's bandwidth over `mib` MiB: all its repetitions, as `bench kernels` does.
fn copy_bandwidth(gpu: &Gpu, mib: u64, wall_clock: bool) -> BenchResult<f64> {
    let timer = Timer::new(gpu, TimingSettings { target: std::time::Duration::from_millis(300), reps: 5, calls: None }, wall_clock);
    let prepared = cases::copy(gpu, copy_bytes(gpu, mib))?;
    let time = timer.measure_all_reps(&*prepared.record)?;
    Ok(super::report::gb_per_s(prepared.bytes, &time))
}

fn gpu_memory(gpu: &Gpu, model: &Model) -> GpuMemory {
    let report = gpu.device.generate_allocator_report();
    GpuMemory {
        allocator_allocated_bytes: report.as_ref().map(|r| r.total_allocated_bytes),
        allocator_reserved_bytes: report.as_ref().map(|r| r.total_reserved_bytes),
        weight_bytes: model.weight_bytes(),
        kv_cache_bytes: model.kv_cache_bytes(),
        peak_allocated_bytes: None,
    }
}

fn model_info(model: &Model, path: &std::path::Path, file_bytes: u64) -> ModelInfo {
    let c = model.config();
    ModelInfo {
        path: path.display().to_string(),
        name: c.name.clone(),
        arch: format!("{:?}", c.arch).to_lowercase(),
        n_layers: c.n_layers,
        file_bytes,
        weight_bytes: model.weight_bytes(),
        weight_bytes_per_token: model.weight_bytes_per_token(),
    }
}

/// A short human summary (the suite's combined table comes from bench/report.mjs).
fn markdown(r: &ModelReport) -> String {
    let load = match r.load_gb_per_s {
        Some(rate) => format!("load {:.0} ms ({rate:.2} GB/s of file)", r.load_ms),
        None => format!("load {:.0} ms", r.load_ms),
    };
    let mut out = match (&r.adapter, &r.cpu, r.copy_gb_per_s) {
        (Some(adapter), _, Some(copy)) => format!("{}\n\n{load}, copy {copy:.2} GB/s\n\n", adapter.markdown("-")),
        (_, Some(cpu), _) => format!("CPU backend ({}, {} threads)\n\n{load}\n\n", cpu.simd, cpu.threads),
        _ => format!("{load}\n\n"),
    };
    out += "| prompt | decode | TTFT ms | prefill tok/s | decode tok/s | ITL p50 / p90 / p99 ms |\n|--:|--:|--:|--:|--:|--:|\n";
    for w in &r.workloads {
        let med = |s: Option<super::stats::Spread>| s.map_or("-".to_string(), |s| format!("{:.1} ({:.1}–{:.1})", s.median, s.min, s.max));
        let itl = w.itl_ms.map_or("-".to_string(), |p| format!("{:.1} / {:.1} / {:.1}", p.p50, p.p90, p.p99));
        out += &format!(
            "| {} | {} | {} | {} | {} | {itl} |\n",
            w.prompt_tokens,
            w.decode_tokens,
            med(w.ttft_ms),
            med(w.prefill_tok_s),
            med(w.decode_tok_s)
        );
    }
    if let Some(roof) = &r.roofline {
        out += &format!(
            "\ndecode runs at {:.1}% of this device's memory-bandwidth limit ({:.1} MB of weights per token at {:.2} GB/s: {:.2} ms limit, {:.2} ms achieved)\n",
            100.0 * roof.fraction_of_limit,
            roof.weight_bytes_per_token as f64 / 1e6,
            roof.copy_gb_per_s,
            roof.limit_ms_per_token,
            roof.achieved_ms_per_token
        );
    }
    if let Some(GpuMemory { peak_allocated_bytes: Some(peak), weight_bytes, kv_cache_bytes, .. }) = &r.gpu_memory {
        let held = weight_bytes + kv_cache_bytes;
        out += &format!(
            "\nGPU memory peak {:.1} MB: weights {:.1} MB + KV cache {:.1} MB + {:.1}%\n",
            *peak as f64 / 1e6,
            *weight_bytes as f64 / 1e6,
            *kv_cache_bytes as f64 / 1e6,
            100.0 * (*peak as f64 / held as f64 - 1.0)
        );
    }
    if let Some(step) = &r.decode_step {
        out += &format!("\ndecode step at position {} ({}): host encode+submit {:.2} ms, host step {:.1} ms\n\n| kernel family | GPU ms | share |\n|---|--:|--:|\n", step.pos, step.timing, step.host_encode_submit_ms, step.host_step_ms);
        for f in &step.families {
            out += &format!("| {} | {:.3} | {:.1}% |\n", f.family, f.gpu_ms, 100.0 * f.share);
        }
        out += &format!("| sum | {:.3} | |\n", step.families_sum_gpu_ms);
    }
    if let Some(results) = &r.speculative {
        out += &format!("\nspeculative decoding against plain (greedy, alternating):\n\n{}", speculative::markdown(results));
    }
    out
}
