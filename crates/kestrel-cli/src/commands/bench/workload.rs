//! The end-to-end workload of `kestrel bench model`: a prompt of N tokens prefilled from an
//! empty KV cache, then M greedy decode steps with end-of-generation ignored, repeated; with the
//! host time of every token as it is streamed (inter-token latency).

use std::path::Path;
use std::time::Instant;

use kestrel_engine::{GenerateOptions, Generator};
use serde::Serialize;

use super::stats::{Percentiles, Spread};
use super::BenchResult;

/// Where the suite's prompt comes from: `bench_prompt.ids` of this file, the ids llama.cpp gives
/// a fixed English text for the default model, fed to every engine (tools/llama-cpp/bench.mjs
/// reads the same ids).
pub const DEFAULT_PROMPTS: &str = "tests/data/reference/greedy.json";

/// The suite's prompt of exactly `tokens` ids: the file's `bench_prompt.ids` repeated
/// cyclically and cut (`ids[i] = bench_ids[i % len]`), as the native peer builds it.
pub fn prompt_ids(bench_ids: &[u32], tokens: usize) -> Vec<u32> {
    bench_ids.iter().copied().cycle().take(tokens).collect()
}

/// `bench_prompt.ids` of a prompts file (see [`DEFAULT_PROMPTS`]), checked against `vocab`.
pub fn read_bench_ids(path: &Path, vocab: usize) -> BenchResult<Vec<u32>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let ids: Vec<u32> = json
        .pointer("/bench_prompt/ids")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .ok_or_else(|| format!("{}: no bench_prompt.ids (a list of token ids)", path.display()))?;
    match ids.iter().find(|&&id| id as usize >= vocab) {
        _ if ids.is_empty() => Err(format!("{}: bench_prompt.ids is empty", path.display()).into()),
        Some(bad) => Err(format!("{}: token id {bad} is outside the vocabulary of {vocab}", path.display()).into()),
        None => Ok(ids),
    }
}

/// One prompt length's figures over the repeats.
#[derive(Debug, Serialize)]
pub struct WorkloadResult {
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    pub repeats: usize,
    /// Request start to the first generated token (the whole prefill plus its sampling).
    pub ttft_ms: Option<Spread>,
    pub prefill_tok_s: Option<Spread>,
    /// Decode steps after the first token over their time.
    pub decode_tok_s: Option<Spread>,
    /// Host time between consecutive streamed tokens, pooled over the repeats.
    pub itl_ms: Option<Percentiles>,
    /// With a submission budget (`--submit-budget-ms`): a prompt's GPU submissions and the
    /// longest one over the repeats, from its submit to its end.
    pub prefill_submissions: Option<usize>,
    pub longest_submission_ms: Option<f64>,
}

/// One generation's measurements.
struct RunSample {
    ttft_ms: f64,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    itl_ms: Vec<f64>,
    prefill_submissions: Option<usize>,
    longest_submission_ms: Option<f64>,
}

/// Runs `prompt` then `decode_tokens` decode steps `repeats` times, each from an empty cache.
pub fn run(generator: &mut Generator, prompt: &[u32], decode_tokens: usize, repeats: usize) -> BenchResult<WorkloadResult> {
    let mut samples = Vec::with_capacity(repeats);
    for repeat in 0..repeats {
        let sample = generate(generator, prompt, decode_tokens)?;
        eprintln!(
            "  prompt {} tok, repeat {}/{repeats}: TTFT {:.0} ms, prefill {:.1} tok/s, decode {:.2} tok/s",
            prompt.len(),
            repeat + 1,
            sample.ttft_ms,
            sample.prefill_tok_s,
            sample.decode_tok_s
        );
        samples.push(sample);
    }
    let figure = |f: fn(&RunSample) -> f64| Spread::of(&samples.iter().map(f).collect::<Vec<_>>());
    let itl: Vec<f64> = samples.iter().flat_map(|s| s.itl_ms.iter().copied()).collect();
    Ok(WorkloadResult {
        prompt_tokens: prompt.len(),
        decode_tokens,
        repeats,
        ttft_ms: figure(|s| s.ttft_ms),
        prefill_tok_s: figure(|s| s.prefill_tok_s),
        decode_tok_s: figure(|s| s.decode_tok_s),
        itl_ms: Percentiles::of(&itl),
        prefill_submissions: samples.iter().filter_map(|s| s.prefill_submissions).max(),
        longest_submission_ms: samples.iter().filter_map(|s| s.longest_submission_ms).reduce(f64::max),
    })
}

/// A short untimed generation, so that the first timed one pays no first-use costs (driver
/// allocations, lazily created queues).
pub fn warm_up(generator: &mut Generator, prompt: &[u32]) -> BenchResult<()> {
    generate(generator, &prompt[..prompt.len().min(8)], 2).map(|_| ())
}

/// One greedy generation of `decode_tokens` steps after the first token, from an empty cache.
fn generate(generator: &mut Generator, prompt: &[u32], decode_tokens: usize) -> BenchResult<RunSample> {
    let options = GenerateOptions { max_tokens: decode_tokens + 1, temperature: 0.0, ignore_eos: true, ..GenerateOptions::default() };
    generator.reset();
    let mut token_times = Vec::with_capacity(decode_tokens + 1);
    let generation = pollster::block_on(generator.generate(prompt, &options, &mut |event| {
        if event.id.is_some() {
            token_times.push(Instant::now());
        }
        true
    }))?;
    let itl_ms = token_times.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3).collect();
    let t = generation.timings;
    if t.decode_tokens != decode_tokens {
        return Err(format!("asked for {decode_tokens} decode steps, the model ran {}", t.decode_tokens).into());
    }
    Ok(RunSample {
        ttft_ms: t.ttft_ms,
        prefill_tok_s: t.prefill_tok_s,
        decode_tok_s: t.decode_tok_s,
        itl_ms,
        prefill_submissions: t.prefill_submissions,
        longest_submission_ms: t.longest_prefill_submission_ms,
    })
}
