//! `kestrel bench embed`: an embedding model's throughput, in sentences per second, on the CPU
//! backend or (`--backend gpu`, an encoder's layers) on the GPU: `--inputs` inputs of exactly
//! `--tokens` tokens each (`[CLS]` and `[SEP]` included, cut from a passage's tokens at staggered
//! offsets so no two are alike), embedded in one call (packed into passes), repeated.
//! `--write-inputs` saves the token ids, so that a peer embeds the very same inputs
//! (tools/llama-cpp/embed.mjs `--bench`).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use kestrel_model::{EmbedInput, EmbedOptions};
use serde::Serialize;

use super::stats::Spread;
use super::{device_label, BenchResult};
use crate::commands::load::{load_embedder, BackendChoice};
use crate::commands::CliResult;

/// The passage the inputs are cut from: ordinary English, so the tokens are a model's usual ones.
const PASSAGE: &str = "Embeddings turn sentences into vectors, so that texts with similar meanings end up close \
    together. A search engine embeds every passage once, stores the vectors, and at query time embeds the question \
    and ranks the passages by cosine similarity. Small encoder models such as MiniLM do this in a few milliseconds \
    per sentence on an ordinary laptop, which makes private search inside a web page practical: nothing leaves the \
    user's machine, and the index is rebuilt whenever the documents change.";

#[derive(Args)]
pub struct EmbedBenchArgs {
    /// The embedding model (GGUF: bert, nomic-bert).
    #[arg(long, short)]
    model: PathBuf,
    /// Where the model's layers run: cpu (the default: the peer the bench compares is
    /// llama.cpp's CPU backend), gpu, or auto.
    #[arg(long, value_enum, default_value_t = BackendChoice::Cpu)]
    backend: BackendChoice,
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=2048))]
    inputs: u32,
    /// Tokens per input, `[CLS]` and `[SEP]` included.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(3..=512))]
    tokens: u32,
    /// Timed calls after an untimed one; the median and range are reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeats: u32,
    /// Write the inputs' token ids (a JSON array of arrays) to this file.
    #[arg(long)]
    write_inputs: Option<PathBuf>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct EmbedReport {
    engine: &'static str,
    version: &'static str,
    device: String,
    model: String,
    inputs: usize,
    tokens_per_input: usize,
    sentences_per_s: Spread,
    load_s: f64,
}

pub fn run(args: &EmbedBenchArgs) -> CliResult {
    let started = Instant::now();
    let embedder = load_embedder(&args.model, args.backend, true)?;
    let load_s = started.elapsed().as_secs_f64();
    let inputs = inputs(&embedder, args.inputs as usize, args.tokens as usize)?;
    if let Some(path) = &args.write_inputs {
        std::fs::write(path, serde_json::to_string(&inputs)?)?;
    }
    let batch: Vec<EmbedInput<'_>> = inputs.iter().map(|t| EmbedInput::Tokens(t)).collect();
    let options = EmbedOptions::default();
    // Untimed: the pool's threads and the first pages of the activations.
    pollster::block_on(embedder.embed(&batch, &options))?;
    let mut rates = Vec::new();
    for _ in 0..args.repeats {
        let start = Instant::now();
        pollster::block_on(embedder.embed(&batch, &options))?;
        rates.push(inputs.len() as f64 / start.elapsed().as_secs_f64());
    }
    let report = EmbedReport {
        engine: "kestrel",
        version: env!("CARGO_PKG_VERSION"),
        device: device_label(embedder.gpu()),
        model: args.model.display().to_string(),
        inputs: inputs.len(),
        tokens_per_input: args.tokens as usize,
        sentences_per_s: Spread::of(&rates).ok_or("no timed rounds")?,
        load_s,
    };
    let s = &report.sentences_per_s;
    println!(
        "{} inputs of {} tokens on the {}: {:.1} sentences/s (median; {:.1}-{:.1}), load {:.2} s",
        report.inputs, report.tokens_per_input, report.device, s.median, s.min, s.max, load_s
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

/// `n` inputs of `len` tokens: `[CLS]`, `len - 2` of the passage's tokens from a staggered offset
/// (wrapping around), `[SEP]` — the ids the model's tokenizer gives a text with its specials.
fn inputs(embedder: &kestrel_model::Embedder, n: usize, len: usize) -> BenchResult<Vec<Vec<u32>>> {
    let with_specials = embedder.tokenizer().encode_with(PASSAGE, true, false)?;
    let (Some(&first), Some(&last)) = (with_specials.first(), with_specials.last()) else { return Err("the passage has no tokens".into()) };
    let body = with_specials.get(1..with_specials.len() - 1).filter(|b| !b.is_empty()).ok_or("the passage has no tokens")?;
    Ok((0..n)
        .map(|i| {
            std::iter::once(first).chain(body.iter().cycle().skip(i * 7).take(len - 2).copied()).chain(std::iter::once(last)).collect()
        })
        .collect())
}
