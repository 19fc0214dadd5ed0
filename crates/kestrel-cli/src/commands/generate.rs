use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use kestrel_engine::generation::{JsonSchemaFormat, ResponseFormat};
use kestrel_engine::{GenerateOptions, Generation, Generator, Prompt};
use kestrel_model::{ChatMessage, Model};
use serde_json::json;

use super::load::{load, CacheArgs};
use super::speculative::SpeculativeArgs;
use super::{coded, CliResult};

/// The defaults of the sampling flags: [`GenerateOptions::default`], llama.cpp's.
fn defaults() -> GenerateOptions {
    GenerateOptions::default()
}

#[derive(Args)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, default_value_t = defaults().max_tokens)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = defaults().temperature)]
    pub temperature: f32,
    /// 0 disables top-k.
    #[arg(long, default_value_t = defaults().top_k)]
    pub top_k: u32,
    /// 1 disables top-p.
    #[arg(long, default_value_t = defaults().top_p)]
    pub top_p: f32,
    /// 0 disables min-p.
    #[arg(long, default_value_t = defaults().min_p)]
    pub min_p: f32,
    /// 1 disables the repetition penalty.
    #[arg(long, default_value_t = defaults().repetition_penalty)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = defaults().frequency_penalty)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = defaults().presence_penalty)]
    pub presence_penalty: f32,
    /// How many recent tokens the penalties look at.
    #[arg(long, default_value_t = defaults().penalty_last_n)]
    pub penalty_last_n: usize,
    /// Same seed, same tokens (default: drawn from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when the text contains this (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Do not stop at the model's end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// The output is JSON valid against the JSON Schema in this file.
    #[arg(long, group = "constraint")]
    pub json_schema: Option<PathBuf>,
    /// The output is a JSON object.
    #[arg(long, group = "constraint")]
    pub json_object: bool,
    /// The whole output matches this regular expression (Rust `regex` syntax).
    #[arg(long, group = "constraint")]
    pub regex: Option<String>,
    /// The output follows the Lark grammar (llguidance's syntax) in this file.
    #[arg(long, group = "constraint")]
    pub grammar: Option<PathBuf>,
    #[command(flatten)]
    pub cache: CacheArgs,
}

impl SamplingArgs {
    /// The options the flags give (reading the schema or grammar file they name).
    pub fn options(&self) -> Result<GenerateOptions, String> {
        let read = |path: &PathBuf| std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()));
        let response_format = match (&self.json_schema, self.json_object) {
            (Some(path), _) => {
                let schema: serde_json::Value =
                    serde_json::from_str(&read(path)?).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
                let name = path.file_stem().map_or("schema".into(), |s| s.to_string_lossy().into_owned());
                Some(ResponseFormat::JsonSchema {
                    json_schema: JsonSchemaFormat { name, description: None, schema: Some(schema), strict: Some(true) },
                })
            }
            (None, true) => Some(ResponseFormat::JsonObject),
            (None, false) => None,
        };
        Ok(GenerateOptions {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            penalty_last_n: self.penalty_last_n,
            seed: self.seed,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            response_format,
            regex: self.regex.clone(),
            grammar: self.grammar.as_ref().map(read).transpose()?,
            ..defaults()
        })
    }
}

#[derive(Args)]
pub struct GenerateArgs {
    /// The prompt; sent as a user message through the model's chat template unless --raw.
    pub prompt: Option<String>,
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    /// Feed the prompt as plain text, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// OpenAI-style messages (a JSON array of {role, content}) rendered with the chat template.
    #[arg(long, conflicts_with = "prompt")]
    pub messages: Option<PathBuf>,
    /// Print one JSON object (ids, text, finish reason, timings) instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// With --json: the top-N log-probabilities of each generated step.
    #[arg(long, default_value_t = defaults().logprobs)]
    pub logprobs: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
}

pub fn run(args: GenerateArgs) -> CliResult {
    let messages: Option<Vec<ChatMessage>> = match &args.messages {
        Some(path) => Some(serde_json::from_slice(&std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?)?),
        None => None,
    };
    let text = args.prompt.clone().unwrap_or_default();
    if messages.is_none() && text.is_empty() {
        return Err("give a prompt or --messages FILE".into());
    }
    let speculative = args.speculative.options()?;
    let loaded = load(&crate::model_path::resolve(args.model.clone()), &args.sampling.cache, args.json)?;
    let mut generator = Generator::new(loaded.model);
    args.speculative.apply(speculative, &mut generator, &args.sampling.cache, args.json)?;
    let user = [ChatMessage::new("user", text.as_str())];
    let prompt = match (&messages, args.raw) {
        (Some(m), _) => Prompt::Chat(m),
        (None, true) => Prompt::Text(&text),
        (None, false) => Prompt::Chat(&user),
    };
    let ids = generator.encode(&prompt).map_err(coded)?;
    let mut options = args.sampling.options()?;
    options.logprobs = args.logprobs;
    let stream = !args.json;
    let generation = generate(&mut generator, &ids, &options, stream)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(generator.model(), &generation, loaded.load_ms))?);
    } else {
        println!();
        print_stats(&generation, loaded.load_ms);
    }
    Ok(())
}

/// Runs one generation, streaming text to stdout when `stream`.
pub fn generate(
    generator: &mut Generator,
    ids: &[u32],
    options: &GenerateOptions,
    stream: bool,
) -> Result<Generation, Box<dyn std::error::Error>> {
    let mut stdout = std::io::stdout();
    let generation = pollster::block_on(generator.generate(ids, options, &mut |event| {
        if stream {
            let _ = write!(stdout, "{}", event.text);
            let _ = stdout.flush();
        }
        true
    }))
    .map_err(coded)?;
    Ok(generation)
}

pub fn print_stats(g: &Generation, load_ms: f64) {
    let t = &g.timings;
    eprintln!(
        "load {:.0} ms | TTFT {:.0} ms | prefill {} tok at {:.1} tok/s ({} reused) | decode {} tok at {:.1} tok/s, host waits {:.1} ms/tok | finish: {}",
        load_ms,
        t.ttft_ms,
        t.prefill_tokens,
        t.prefill_tok_s,
        t.reused_tokens,
        t.decode_tokens,
        t.decode_tok_s,
        t.host_wait_ms_per_token,
        g.finish_reason.as_str()
    );
    if let Some(s) = &g.speculative {
        eprintln!("speculative: {} of {} drafted tokens kept, {:.2} tokens per verifying step", s.accepted, s.drafted, s.tokens_per_step());
    }
}

fn to_json(model: &Model, g: &Generation, load_ms: f64) -> serde_json::Value {
    let tok = model.tokenizer();
    let entry = |id: u32, logprob: f32| {
        let piece = tok.piece(id).unwrap_or_default();
        json!({ "token": piece, "token_id": id, "logprob": logprob, "bytes": piece.as_bytes() })
    };
    let logprobs = (!g.logprobs.is_empty()).then(|| {
        json!({ "content": g.logprobs.iter().map(|s| {
            let mut e = entry(s.token, s.logprob);
            e["top_logprobs"] = s.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
            e
        }).collect::<Vec<_>>() })
    });
    let t = &g.timings;
    json!({
        "prompt_token_ids": g.prompt_tokens,
        "token_ids": g.tokens,
        "text": g.text,
        "finish_reason": g.finish_reason.as_str(),
        "logprobs": logprobs,
        "timings": {
            "load_ms": load_ms,
            "ttft_ms": t.ttft_ms,
            "prefill_tokens": t.prefill_tokens,
            "reused_tokens": t.reused_tokens,
            "prefill_tok_s": t.prefill_tok_s,
            "decode_tokens": t.decode_tokens,
            "decode_tok_s": t.decode_tok_s,
            "host_wait_ms_per_token": t.host_wait_ms_per_token,
        },
        "usage": { "prompt_tokens": g.prompt_tokens.len(), "completion_tokens": g.tokens.len() },
        "speculative": g.speculative,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        generate: GenerateArgs,
    }

    /// No flags: exactly the library's defaults (one source of truth).
    #[test]
    fn flag_defaults_are_the_option_defaults() {
        let cli = Cli::try_parse_from(["kestrel", "hi"]).unwrap();
        let mut options = cli.generate.sampling.options().unwrap();
        options.logprobs = cli.generate.logprobs;
        assert_eq!(options, GenerateOptions::default());
        let cli =
            Cli::try_parse_from(["kestrel", "hi", "--temperature", "0", "--stop", "a", "--stop", "b", "--penalty-last-n", "8"]).unwrap();
        let options = cli.generate.sampling.options().unwrap();
        assert_eq!((options.temperature, options.stop, options.penalty_last_n), (0.0, vec!["a".to_string(), "b".to_string()], 8));
    }
}
