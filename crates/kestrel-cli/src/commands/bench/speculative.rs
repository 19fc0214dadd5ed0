//! `kestrel bench model --lookup | --draft-model FILE`: speculative decoding against plain
//! decoding in one run, on chat prompts by workload (`DEFAULT_PROMPTS`): greedy, the same
//! prompt plain and speculative alternately (which goes first alternates too), the cache reset
//! before each. It reports the decode rates and their ratio per pair, the tokens per verifying
//! step and the share of drafted tokens kept, and whether every speculative generation gave
//! plain decoding's tokens.

use std::path::Path;

use kestrel_engine::{GenerateOptions, Generation, Generator, Prompt};
use kestrel_model::ChatMessage;
use serde::{Deserialize, Serialize};

use super::stats::Spread;
use super::BenchResult;
use crate::commands::coded;

/// The workloads' chat prompts: `{"workloads": {"edit": [...], "code": [...], "prose": [...]}}`.
pub const DEFAULT_PROMPTS: &str = "bench/data/speculative-prompts.json";

#[derive(Deserialize)]
struct PromptsFile {
    workloads: std::collections::BTreeMap<String, Vec<String>>,
}

/// One workload's figures.
#[derive(Debug, Serialize)]
pub struct SpeculativeResult {
    pub workload: String,
    pub prompts: usize,
    pub max_tokens: usize,
    pub plain_decode_tok_s: Option<Spread>,
    pub speculative_decode_tok_s: Option<Spread>,
    /// Speculative over plain decode rate, per alternating pair.
    pub speedup: Option<Spread>,
    /// Tokens per target step that verified a draft, over every speculative run.
    pub tokens_per_step: f64,
    /// Drafted tokens kept over drafted tokens.
    pub acceptance: f64,
    /// Whether every speculative run's tokens were the plain run's.
    pub same_tokens: bool,
}

/// Runs each workload of `prompts` (a file as `DEFAULT_PROMPTS`) on `generator`, which
/// speculates (`Generator::set_speculation`), `repeats` pairs per prompt.
pub fn run(generator: &mut Generator, prompts: &Path, max_tokens: usize, repeats: usize) -> BenchResult<Vec<SpeculativeResult>> {
    let text = std::fs::read_to_string(prompts).map_err(|e| format!("{}: {e}", prompts.display()))?;
    let file: PromptsFile = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", prompts.display()))?;
    let greedy = GenerateOptions { max_tokens, ..GenerateOptions::greedy() };
    let plain = GenerateOptions { speculative: false, ..greedy.clone() };
    let mut results = Vec::new();
    for (workload, texts) in &file.workloads {
        let (mut plain_rates, mut spec_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut stats = kestrel_engine::generation::speculation::SpeculativeStats::default();
        let mut same_tokens = true;
        for (p, text) in texts.iter().enumerate() {
            let messages = [ChatMessage::new("user", text.as_str())];
            let ids = generator.encode(&Prompt::Chat(&messages)).map_err(coded)?;
            for r in 0..repeats {
                let spec_first = (p + r) % 2 == 1;
                let (a, b) = if spec_first { (&greedy, &plain) } else { (&plain, &greedy) };
                let first = generate(generator, &ids, a)?;
                let second = generate(generator, &ids, b)?;
                let (spec, plain) = if spec_first { (first, second) } else { (second, first) };
                same_tokens &= spec.tokens == plain.tokens;
                stats.add(&spec.speculative.unwrap_or_default());
                let (s, q) = (spec.timings.decode_tok_s, plain.timings.decode_tok_s);
                if s > 0.0 && q > 0.0 {
                    spec_rates.push(s);
                    plain_rates.push(q);
                    ratios.push(s / q);
                }
                eprintln!(
                    "{workload} prompt {p} pair {r}: plain {q:.2} tok/s, speculative {s:.2} tok/s ({:.2}x), {} tokens",
                    s / q,
                    spec.tokens.len()
                );
            }
        }
        results.push(SpeculativeResult {
            workload: workload.clone(),
            prompts: texts.len(),
            max_tokens,
            plain_decode_tok_s: Spread::of(&plain_rates),
            speculative_decode_tok_s: Spread::of(&spec_rates),
            speedup: Spread::of(&ratios),
            tokens_per_step: stats.tokens_per_step(),
            acceptance: if stats.drafted > 0 { stats.accepted as f64 / stats.drafted as f64 } else { 0.0 },
            same_tokens,
        });
    }
    Ok(results)
}

fn generate(generator: &mut Generator, ids: &[u32], options: &GenerateOptions) -> BenchResult<Generation> {
    generator.reset();
    Ok(pollster::block_on(generator.generate(ids, options, &mut |_| true)).map_err(coded)?)
}

/// The results as a markdown table.
pub fn markdown(results: &[SpeculativeResult]) -> String {
    let mut out = String::from(
        "| workload | prompts | plain decode tok/s | speculative tok/s | speed-up | tokens / verifying step | drafts kept | same tokens |\n|---|--:|--:|--:|--:|--:|--:|---|\n",
    );
    let med = |s: Option<Spread>, digits: usize| {
        s.map_or("-".to_string(), |s| format!("{:.*} ({:.*}–{:.*})", digits, s.median, digits, s.min, digits, s.max))
    };
    for r in results {
        out += &format!(
            "| {} | {} | {} | {} | {} | {:.2} | {:.0}% | {} |\n",
            r.workload,
            r.prompts,
            med(r.plain_decode_tok_s, 1),
            med(r.speculative_decode_tok_s, 1),
            med(r.speedup, 2),
            r.tokens_per_step,
            100.0 * r.acceptance,
            if r.same_tokens { "yes" } else { "no" }
        );
    }
    out
}
