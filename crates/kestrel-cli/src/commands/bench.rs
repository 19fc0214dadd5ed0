//! `kestrel bench model`: a model end to end (see `bench/model.rs`).
//!
//! `kestrel bench batch`: batched decode on the CPU backend (see `bench/batch.rs`).
//!
//! `kestrel bench constrained`: a JSON Schema's cost to decode (see `bench/constrained.rs`).
//!
//! `kestrel bench embed`: an embedding model's sentences per second (see `bench/embed.rs`).
//!
//! `kestrel bench kernels`: every kernel at the default model's shapes and at a 1B-class model's,
//! timed on the GPU, with its effective bandwidth (the bytes a call must move over its time) as
//! a fraction of a plain copy kernel's bandwidth measured on the same adapter in the same run,
//! and for the matrix products their arithmetic rate as a fraction of an FMA-bound kernel's.

mod batch;
mod cases;
mod constrained;
mod embed;
mod model;
mod prompt;
mod report;
mod shapes;
mod speculative;
mod stats;
mod step_profile;
mod suite;
mod timing;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use kestrel_gpu::{Gpu, GpuOptions, MatvecVariant};

use self::report::{Adapter, Report, TABLE_HEADER};
use self::shapes::BENCH_SHAPES;
use self::suite::Suite;
use self::timing::{Timer, TimingSettings};
use super::CliResult;

/// Errors end the run with their message.
type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Where a loaded model runs, as the reports say it: the GPU adapter, or the CPU backend's SIMD
/// kernels and threads.
fn backend_label(model: &kestrel_model::Model) -> String {
    device_label(model.gpu())
}

/// "GPU backend (its adapter)" or "CPU backend (its SIMD, its threads)".
fn device_label(gpu: Option<&Gpu>) -> String {
    match gpu {
        Some(gpu) => format!("GPU backend ({})", gpu.info.adapter_name),
        None => format!("CPU backend ({}, {} threads)", kestrel_cpu::simd_name(), kestrel_cpu::threads()),
    }
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Time each kernel at the default model's and a 1B model's shapes, in GB/s and as a
    /// fraction of a copy kernel's bandwidth.
    Kernels(KernelsArgs),
    /// A model end to end: load, prefill, decode (repeated; medians, spread, inter-token
    /// latency), GPU memory, the bandwidth roofline and a decode step by kernel family.
    Model(model::ModelArgs),
    /// Batched decode (`--backend cpu` or `gpu`): tokens per second of 1, 2, 4, 8 sequences
    /// together, and the others' inter-token latency while a long prompt is admitted.
    Batch(batch::BatchArgs),
    /// Decode under a JSON Schema against free decode of as many tokens, and the mask's time
    /// per token (p50, p90, p99).
    Constrained(constrained::ConstrainedArgs),
    /// An embedding model's sentences per second (the CPU backend by default), for many short
    /// inputs.
    Embed(embed::EmbedBenchArgs),
    /// The suite's prompts as text (JSON), for engines that take text (www/bench).
    Prompt(prompt::PromptArgs),
}

#[derive(Args)]
struct KernelsArgs {
    /// A shorter run: 40 ms and 3 timed batches per kernel (default: 150 ms and 5).
    #[arg(long)]
    quick: bool,
    /// Calls per timed batch, instead of sizing batches to the time budget.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    iters: Option<u32>,
    /// Timed batches per kernel; the median is reported.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    reps: Option<u32>,
    /// Time budget of the timed batches of one kernel, in milliseconds.
    #[arg(long)]
    target_ms: Option<u64>,
    /// Only the cases whose "model kernel type shape" contains every word (any case), e.g.
    /// "1b matvec q4_1". The copy kernel always runs.
    #[arg(long)]
    filter: Option<String>,
    /// Time with the host clock even when the device has timestamp queries.
    #[arg(long)]
    wall_clock: bool,
    /// Skip a matrix product whose time per call, predicted from the last one timed with the
    /// same kernel and weight type, exceeds this many milliseconds (0: no cap). Keeps a run on a
    /// slow device (lavapipe) short; real GPUs stay far below it.
    #[arg(long, default_value_t = 1000)]
    max_call_ms: u64,
    /// Size of the copy kernel's buffers in MiB (capped at the binding limit).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    copy_mib: u64,
    /// The decode matvec's variant instead of the adapter's choice: threads per row (1, 2, 4)
    /// and rows per thread (1-8), as "SLICES,ROWS", e.g. "4,2".
    #[arg(long, value_parser = parse_matvec_variant)]
    matvec: Option<MatvecVariant>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl KernelsArgs {
    fn settings(&self) -> TimingSettings {
        let (target_ms, reps) = if self.quick { (40, 3) } else { (150, 5) };
        TimingSettings {
            target: Duration::from_millis(self.target_ms.unwrap_or(target_ms)),
            reps: self.reps.unwrap_or(reps),
            calls: self.iters,
        }
    }
}

pub fn run(args: BenchArgs) -> CliResult {
    match args.command {
        BenchCommand::Kernels(args) => kernels(&args),
        BenchCommand::Model(args) => model::run(&args),
        BenchCommand::Batch(args) => batch::run(&args),
        BenchCommand::Constrained(args) => constrained::run(&args),
        BenchCommand::Embed(args) => embed::run(&args),
        BenchCommand::Prompt(args) => prompt::run(&args),
    }
}

fn kernels(args: &KernelsArgs) -> CliResult {
    let started = Instant::now();
    let gpu = Gpu::new_blocking(&GpuOptions { matvec: args.matvec, ..GpuOptions::default() })?;
    let timer = Timer::new(&gpu, args.settings(), args.wall_clock);
    let adapter = Adapter::new(&gpu.info);
    eprintln!("{}\n", adapter.markdown(timer.method()));

    let max_call_ms = (args.max_call_ms > 0).then_some(args.max_call_ms);
    let mut suite = Suite::new(&gpu, &timer, args.filter.as_deref(), max_call_ms);
    let copy_gb_per_s = suite.copy(copy_bytes(&gpu, args.copy_mib))?;
    let fma_gflop_per_s = suite.fma()?;
    for model in &BENCH_SHAPES {
        suite.model(model)?;
    }
    let rows = suite.into_rows();

    println!("{}\n\n{TABLE_HEADER}", adapter.markdown(timer.method()));
    rows.iter().for_each(|row| println!("{}", row.markdown()));
    eprintln!("\n{} rows in {:.1} s", rows.len(), started.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        Report { adapter, timing: timer.method(), copy_gb_per_s, fma_gflop_per_s, rows }.write_json(path)?;
    }
    Ok(())
}

fn parse_matvec_variant(s: &str) -> Result<MatvecVariant, String> {
    let parts: Vec<u32> = s.split(',').map(|p| p.trim().parse::<u32>().map_err(|e| format!("{p:?}: {e}"))).collect::<Result<_, _>>()?;
    match parts[..] {
        [slices, rows_per_thread] => Ok(MatvecVariant { slices, rows_per_thread }),
        _ => Err(format!("expected SLICES,ROWS, got {s:?}")),
    }
}

/// `mib` MiB, at most the binding limit, in whole 16-byte units (the copy kernel's grain).
pub(super) fn copy_bytes(gpu: &Gpu, mib: u64) -> u64 {
    mib.saturating_mul(1 << 20).min(gpu.max_binding_size()) / 16 * 16
}
