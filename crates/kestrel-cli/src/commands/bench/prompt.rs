//! `kestrel bench prompt`: the suite's prompts as text, for engines that take text rather than
//! token ids (the browser package and wllama in www/bench). Needs only the tokenizer.

use std::path::PathBuf;

use clap::Args;
use kestrel_tokenizer::Tokenizer;
use serde::Serialize;

use super::workload;
use crate::commands::inspect::read_header;
use crate::commands::CliResult;

#[derive(Args)]
pub struct PromptArgs {
    /// The GGUF file whose tokenizer decodes the ids (default: the default model).
    #[arg(long, short)]
    model: Option<PathBuf>,
    /// Prompt lengths, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "128", value_parser = clap::value_parser!(u32).range(1..))]
    prompt_tokens: Vec<u32>,
    /// `bench_prompt.ids` of this JSON file, repeated to each length.
    #[arg(long, default_value = workload::DEFAULT_PROMPTS)]
    prompts: PathBuf,
}

#[derive(Serialize)]
struct PromptText {
    prompt_tokens: usize,
    /// Whether the text encodes back to exactly the prompt's ids with this tokenizer.
    round_trips: bool,
    text: String,
}

/// Prints a JSON list of `{prompt_tokens, round_trips, text}`.
pub fn run(args: &PromptArgs) -> CliResult {
    let header = read_header(&crate::model_path::resolve(args.model.clone()))?;
    let tokenizer = Tokenizer::from_gguf(&header.metadata)?;
    let bench_ids = workload::read_bench_ids(&args.prompts, tokenizer.vocab_size())?;
    let mut out = Vec::with_capacity(args.prompt_tokens.len());
    for &n in &args.prompt_tokens {
        let ids = workload::prompt_ids(&bench_ids, n as usize);
        let text = tokenizer.decode(&ids)?;
        let round_trips = tokenizer.encode(&text, true)? == ids;
        out.push(PromptText { prompt_tokens: ids.len(), round_trips, text });
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
