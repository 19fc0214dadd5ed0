//! `kestrel bench batch`: batched decode on either backend. Aggregate decode throughput of B
//! sequences stepped together (B = 1, 2, 4, 8 by default) and its ratio to one sequence's, and
//! the running sequences' inter-token latency while a long prompt is admitted: in chunks of
//! `--prefill-chunk` tokens (as `kestrel serve` admits it), and in one piece for comparison.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use kestrel_engine::generation::{SequenceEvent, SequenceId};
use kestrel_engine::{GenerateOptions, Generator};
use serde::Serialize;

use super::stats::{Percentiles, Spread};
use super::{backend_label, workload, BenchResult};
use crate::commands::load::{load_synthetic, load_with_slots, CacheArgs};
use crate::commands::CliResult;

#[derive(Args)]
pub struct BatchArgs {
    /// The GGUF file (default: the default model).
    #[arg(long, short, conflicts_with = "synthetic")]
    model: Option<PathBuf>,
    /// Instead of a file, a model made in memory with random weights in the real layout of a
    /// model size (as `kestrel bench model --synthetic`): 135m, 1b or 8b.
    #[arg(long, value_parser = ["135m", "1b", "8b"])]
    synthetic: Option<String>,
    /// Sequences decoded together, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8", value_parser = clap::value_parser!(u32).range(1..=16))]
    batch_sizes: Vec<u32>,
    /// Each sequence's prompt length.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    prompt_tokens: u32,
    /// Decode steps timed after every prompt is in.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    decode_tokens: u32,
    /// Rounds, each of which runs every batch size once in turn; medians and ranges are
    /// reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeats: u32,
    /// The prompt admitted while the other sequences decode (0: skip that part).
    #[arg(long, default_value_t = 512)]
    long_prompt: u32,
    /// Prompt tokens a step runs at most while the long prompt is admitted (kestrel serve's
    /// --prefill-chunk).
    #[arg(long, default_value_t = kestrel_server::ServerConfig::default().prefill_chunk as u32, value_parser = clap::value_parser!(u32).range(1..))]
    prefill_chunk: u32,
    /// The prompts' token ids: `bench_prompt.ids` of this JSON file.
    #[arg(long, default_value = workload::DEFAULT_PROMPTS)]
    prompts: PathBuf,
    #[command(flatten)]
    cache: CacheArgs,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct BatchRow {
    batch: usize,
    /// Tokens per second of all the sequences together.
    decode_tok_s: Spread,
    /// `decode_tok_s` over batch 1's in the same round (batch sizes past 1, when batch 1 ran):
    /// the median of the rounds' ratios.
    ratio_to_batch_1: Option<f64>,
    /// The rounds' ratios to batch 1.
    ratio_spread: Option<Spread>,
}

#[derive(Debug, Serialize)]
struct Admission {
    /// Sequences decoding while the long prompt comes in.
    running: usize,
    long_prompt_tokens: usize,
    prefill_chunk: usize,
    /// The running sequences' time between tokens, milliseconds: before the long prompt, while
    /// it is admitted in chunks, and while it is admitted in one step.
    before: Option<Percentiles>,
    chunked: Option<Percentiles>,
    unchunked: Option<Percentiles>,
    /// From the long prompt's arrival to its first token, chunked and in one step.
    ttft_chunked_ms: f64,
    ttft_unchunked_ms: f64,
}

#[derive(Debug, Serialize)]
struct BatchReport {
    engine: &'static str,
    version: &'static str,
    /// "cpu" or "gpu", and what runs it: the SIMD kernels and threads, or the GPU adapter.
    backend: &'static str,
    device: String,
    simd: &'static str,
    threads: usize,
    prompt_tokens: usize,
    decode_tokens: usize,
    /// Rounds: each runs every batch size once, in turn.
    repeats: usize,
    rows: Vec<BatchRow>,
    admission: Option<Admission>,
    wall_s: f64,
}

pub fn run(args: &BatchArgs) -> CliResult {
    let started = Instant::now();
    let sizes: Vec<usize> = args.batch_sizes.iter().map(|&b| b as usize).collect();
    let max_batch = sizes.iter().copied().max().unwrap_or(1);
    let model = match &args.synthetic {
        Some(name) => {
            let shape = kestrel_model::synthetic::synthetic_shape(name).ok_or_else(|| format!("unknown synthetic shape {name}"))?;
            load_synthetic(&shape, &args.cache, max_batch)?.model
        }
        None => load_with_slots(&crate::model_path::resolve(args.model.clone()), &args.cache, false, max_batch)?.model,
    };
    let bench_ids = workload::read_bench_ids(&args.prompts, model.config().vocab)?;
    let mut generator = Generator::new(model);
    let (prompt_tokens, decode_tokens) = (args.prompt_tokens as usize, args.decode_tokens as usize);
    // Sequence i's prompt starts i tokens into the text: different prompts, the same length.
    let prompt = |i: usize, n: usize| workload::prompt_ids(&bench_ids[i % bench_ids.len()..], n);
    let decode_options = GenerateOptions { max_tokens: decode_tokens + 1, ignore_eos: true, ..GenerateOptions::greedy() };

    // One untimed round: the pool's threads and the caches' first pages.
    decode_rate(&mut generator, &(0..max_batch).map(|i| prompt(i, prompt_tokens)).collect::<Vec<_>>(), &decode_options)?;
    // Rounds of every batch size in turn: a machine whose speed drifts (a shared host's
    // arithmetic rate moves by half within minutes here) slows each size alike, and each
    // round's ratio to batch 1 compares runs made seconds apart.
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    for round in 0..args.repeats {
        for (&batch, rates) in sizes.iter().zip(&mut rates) {
            let prompts: Vec<Vec<u32>> = (0..batch).map(|i| prompt(i, prompt_tokens)).collect();
            let rate = decode_rate(&mut generator, &prompts, &decode_options)?;
            eprintln!("round {}, batch {batch}: {rate:.1} tok/s", round + 1);
            rates.push(rate);
        }
    }
    let one = sizes.iter().position(|&b| b == 1).map(|i| &rates[i]);
    let mut rows: Vec<BatchRow> = Vec::new();
    for (&batch, rates) in sizes.iter().zip(&rates) {
        let decode_tok_s = Spread::of(rates).ok_or("no repeats")?;
        let ratios: Vec<f64> =
            one.filter(|_| batch != 1).map(|one| rates.iter().zip(one).map(|(r, o)| r / o).collect()).unwrap_or_default();
        let ratio_spread = Spread::of(&ratios);
        rows.push(BatchRow { batch, decode_tok_s, ratio_to_batch_1: ratio_spread.map(|s| s.median), ratio_spread });
    }

    let admission = if args.long_prompt > 0 && max_batch > 1 {
        let long = prompt(max_batch, args.long_prompt as usize);
        let running = max_batch - 1;
        let prompts: Vec<Vec<u32>> = (0..running).map(|i| prompt(i, prompt_tokens)).collect();
        let chunk = args.prefill_chunk as usize;
        let (before, chunked, ttft_chunked) = admit_long(&mut generator, &prompts, &long, chunk)?;
        let (_, unchunked, ttft_unchunked) = admit_long(&mut generator, &prompts, &long, long.len())?;
        Some(Admission {
            running,
            long_prompt_tokens: long.len(),
            prefill_chunk: chunk,
            before: Percentiles::of(&before),
            chunked: Percentiles::of(&chunked),
            unchunked: Percentiles::of(&unchunked),
            ttft_chunked_ms: ttft_chunked,
            ttft_unchunked_ms: ttft_unchunked,
        })
    } else {
        None
    };

    let model = generator.model();
    let device = backend_label(model);
    let report = BatchReport {
        engine: "kestrel",
        version: env!("CARGO_PKG_VERSION"),
        backend: model.backend().as_str(),
        device,
        simd: kestrel_cpu::simd_name(),
        threads: kestrel_cpu::threads(),
        prompt_tokens,
        decode_tokens,
        repeats: args.repeats as usize,
        rows,
        admission,
        wall_s: started.elapsed().as_secs_f64(),
    };
    println!("{}", markdown(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Decodes `prompts` together after prefilling them all in one step: generated tokens per
/// second of the decode steps, all sequences together.
fn decode_rate(generator: &mut Generator, prompts: &[Vec<u32>], options: &GenerateOptions) -> BenchResult<f64> {
    generator.reset();
    for p in prompts {
        generator.add_sequence(p, options)?;
    }
    let total: usize = prompts.iter().map(Vec::len).sum();
    check(pollster::block_on(generator.step(total)).events)?;
    let start = Instant::now();
    let mut tokens = 0;
    while generator.running_sequences() > 0 {
        tokens += check(pollster::block_on(generator.step(total)).events)?;
    }
    Ok(tokens as f64 / start.elapsed().as_secs_f64())
}

/// `prompts` decode; after 8 steps `long` arrives and enters `chunk` tokens a step. Returns the
/// step times (ms) before it arrived and until its first token, and its time to first token.
fn admit_long(generator: &mut Generator, prompts: &[Vec<u32>], long: &[u32], chunk: usize) -> BenchResult<(Vec<f64>, Vec<f64>, f64)> {
    generator.reset();
    let steps_per_prompt = long.len().div_ceil(chunk);
    let options = GenerateOptions { max_tokens: 16 + 2 * steps_per_prompt, ignore_eos: true, ..GenerateOptions::greedy() };
    for p in prompts {
        generator.add_sequence(p, &options)?;
    }
    let total: usize = prompts.iter().map(Vec::len).sum();
    check(pollster::block_on(generator.step(total)).events)?;
    let mut before = Vec::new();
    for _ in 0..8 {
        let start = Instant::now();
        check(pollster::block_on(generator.step(chunk)).events)?;
        before.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let arrived = Instant::now();
    let id = generator.add_sequence(long, &GenerateOptions { max_tokens: 1, ..GenerateOptions::greedy() })?;
    let mut during = Vec::new();
    let ttft = loop {
        let start = Instant::now();
        let step = pollster::block_on(generator.step(chunk));
        during.push(start.elapsed().as_secs_f64() * 1e3);
        let first = step.events.iter().any(|(seq, e)| *seq == id && matches!(e, SequenceEvent::Token(_)));
        check(step.events)?;
        if first {
            break arrived.elapsed().as_secs_f64() * 1e3;
        }
    };
    while generator.running_sequences() > 0 {
        check(pollster::block_on(generator.step(chunk)).events)?;
    }
    Ok((before, during, ttft))
}

/// The generated tokens among `events`, or the first sequence's error.
fn check(events: Vec<(SequenceId, SequenceEvent)>) -> BenchResult<usize> {
    let mut tokens = 0;
    for (_, event) in events {
        match event {
            SequenceEvent::Token(t) => tokens += usize::from(t.id.is_some()),
            SequenceEvent::Done(Err(e)) => return Err(e.into()),
            SequenceEvent::Done(Ok(_)) => {}
        }
    }
    Ok(tokens)
}

fn markdown(r: &BatchReport) -> String {
    let mut out = format!(
        "Batched decode, {}: {}-token prompts, {} decode steps, {} rounds of every batch size in turn\n\n| batch | decode tok/s (all sequences) | range | x batch 1 in the same round (median, range) |\n|--:|--:|--:|--:|\n",
        r.device, r.prompt_tokens, r.decode_tokens, r.repeats
    );
    for row in &r.rows {
        let s = row.decode_tok_s;
        let ratio = row.ratio_spread.map_or_else(|| "-".into(), |x| format!("{:.2}x ({:.2}-{:.2})", x.median, x.min, x.max));
        out += &format!("| {} | {:.1} | {:.1}-{:.1} | {ratio} |\n", row.batch, s.median, s.min, s.max);
    }
    if let Some(a) = &r.admission {
        let p = |x: &Option<Percentiles>| x.map_or_else(|| "-".into(), |p| format!("{:.0} / {:.0}", p.p50, p.p99));
        out += &format!(
            "\nA {}-token prompt admitted while {} sequences decode: their inter-token latency P50 / P99 (ms)\n\n| | ITL P50 / P99 ms | long prompt TTFT ms |\n|---|--:|--:|\n| before | {} | |\n| chunks of {} | {} | {:.0} |\n| one step | {} | {:.0} |\n",
            a.long_prompt_tokens,
            a.running,
            p(&a.before),
            a.prefill_chunk,
            p(&a.chunked),
            a.ttft_chunked_ms,
            p(&a.unchunked),
            a.ttft_unchunked_ms
        );
    }
    out
}
