//! `kestrel bench constrained`: what a JSON Schema costs a generation. The same chat prompt runs
//! greedy under the schema (to its end) and without it for the same number of tokens,
//! alternating, and the decode rates are compared; then the constrained output is replayed
//! through a fresh matcher to time the mask of every step on its own (the host's work per token,
//! which the GPU path overlaps with the step and the CPU backend adds to it).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use kestrel_engine::generation::{JsonSchemaFormat, ResponseFormat};
use kestrel_engine::{GenerateOptions, Generation, Generator, Prompt};
use kestrel_model::ChatMessage;
use serde::Serialize;
use serde_json::Value;

use super::stats::{Percentiles, Spread};
use super::{backend_label, BenchResult};
use crate::commands::load::{load, CacheArgs};
use crate::commands::CliResult;

/// The schema suite the tests validate against (tests/data/constrained).
const SCHEMAS: &str = "tests/data/constrained/schemas.json";

#[derive(Args)]
pub struct ConstrainedArgs {
    /// The GGUF file (default: the default model).
    #[arg(long, short)]
    model: Option<PathBuf>,
    /// The schema: an `id` of tests/data/constrained/schemas.json (a nested one by default).
    #[arg(long, default_value = "nested_address")]
    schema: String,
    /// Alternating rounds of the constrained and the free run; medians and ranges are reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeats: u32,
    #[command(flatten)]
    cache: CacheArgs,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct ConstrainedReport {
    engine: &'static str,
    version: &'static str,
    backend: &'static str,
    device: String,
    schema: String,
    /// Tokens of the constrained output (the free run generates as many).
    tokens: usize,
    constrained_tok_s: Spread,
    free_tok_s: Spread,
    /// Median constrained over median free decode rate.
    ratio: f64,
    /// The constraint's host time per step (its mask, and taking the token), milliseconds, over
    /// every step of the output.
    mask_ms: Percentiles,
    wall_s: f64,
}

pub fn run(args: &ConstrainedArgs) -> CliResult {
    let started = Instant::now();
    let schema = read_schema(&args.schema)?;
    let mut generator = Generator::new(load(&crate::model_path::resolve(args.model.clone()), &args.cache, true)?.model);
    let messages = [ChatMessage::new("system", "Answer in JSON."), ChatMessage::new("user", schema.ask.as_str())];
    let prompt = generator.encode(&Prompt::Chat(&messages))?;
    let json_schema = JsonSchemaFormat { name: args.schema.clone(), description: None, schema: Some(schema.schema), strict: Some(true) };
    let constrained =
        GenerateOptions { max_tokens: 512, response_format: Some(ResponseFormat::JsonSchema { json_schema }), ..GenerateOptions::greedy() };

    // One untimed round each: the trie, the pool's threads and the caches' first pages.
    let first = generate(&mut generator, &prompt, &constrained)?;
    let free = GenerateOptions { max_tokens: first.tokens.len(), ignore_eos: true, ..GenerateOptions::greedy() };
    generate(&mut generator, &prompt, &free)?;
    let (mut held_rates, mut free_rates) = (Vec::new(), Vec::new());
    for _ in 0..args.repeats {
        let held = generate(&mut generator, &prompt, &constrained)?;
        if held.tokens != first.tokens {
            return Err("the constrained greedy output changed between rounds".into());
        }
        held_rates.push(held.timings.decode_tok_s);
        free_rates.push(generate(&mut generator, &prompt, &free)?.timings.decode_tok_s);
    }
    let mask_ms = replay_masks(&mut generator, &constrained, &first.tokens)?;
    let (constrained_tok_s, free_tok_s) = (Spread::of(&held_rates).ok_or("no rounds")?, Spread::of(&free_rates).ok_or("no rounds")?);
    let model = generator.model();
    let device = backend_label(model);
    let report = ConstrainedReport {
        engine: "kestrel",
        version: env!("CARGO_PKG_VERSION"),
        backend: model.backend().as_str(),
        device,
        schema: args.schema.clone(),
        tokens: first.tokens.len(),
        ratio: constrained_tok_s.median / free_tok_s.median,
        constrained_tok_s,
        free_tok_s,
        mask_ms: Percentiles::of(&mask_ms).ok_or("no mask was computed")?,
        wall_s: started.elapsed().as_secs_f64(),
    };
    println!("{}", markdown(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

struct SuiteSchema {
    ask: String,
    schema: Value,
}

fn read_schema(id: &str) -> BenchResult<SuiteSchema> {
    let suite: Value =
        serde_json::from_slice(&std::fs::read(SCHEMAS).map_err(|e| format!("{SCHEMAS}: {e} (run from the repository root)"))?)?;
    let case = suite["schemas"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["id"] == id)
        .ok_or_else(|| format!("no schema {id:?} in {SCHEMAS}"))?;
    Ok(SuiteSchema { ask: case["ask"].as_str().unwrap_or_default().to_string(), schema: case["schema"].clone() })
}

/// A greedy run from a fresh cache (each round prefills the same way).
fn generate(generator: &mut Generator, prompt: &[u32], options: &GenerateOptions) -> BenchResult<Generation> {
    generator.reset();
    Ok(pollster::block_on(generator.generate(prompt, options, &mut |_| true))?)
}

/// Each step's host time for the constraint, milliseconds: its mask, and taking the chosen
/// token, replaying `tokens` through a fresh matcher.
fn replay_masks(generator: &mut Generator, options: &GenerateOptions, tokens: &[u32]) -> BenchResult<Vec<f64>> {
    let mut matcher = generator.constraint_matcher(options)?.ok_or("the options have no constraint")?;
    let mut times = Vec::with_capacity(tokens.len());
    for &token in tokens {
        let start = Instant::now();
        matcher.prepare()?;
        let done = matcher.accept(token)?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
        if done {
            break;
        }
    }
    Ok(times)
}

fn markdown(r: &ConstrainedReport) -> String {
    let spread = |s: &Spread| format!("{:.1} ({:.1}-{:.1})", s.median, s.min, s.max);
    format!(
        "Constrained decode, {} ({}): schema `{}`, {} tokens greedy, {} rounds\n\n\
         | run | decode tok/s (range) |\n|---|--:|\n| free | {} |\n| constrained | {} |\n\n\
         Constrained / free: {:.2}x. Constraint's host time per token (mask and commit): p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms ({} steps).",
        r.device,
        r.version,
        r.schema,
        r.tokens,
        r.constrained_tok_s.n,
        spread(&r.free_tok_s),
        spread(&r.constrained_tok_s),
        r.ratio,
        r.mask_ms.p50,
        r.mask_ms.p90,
        r.mask_ms.p99,
        r.mask_ms.n,
    )
}
