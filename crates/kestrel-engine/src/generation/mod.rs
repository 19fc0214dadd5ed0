//! A request's life, from its options to its last token: the options and their validation
//! (`options`), its prompt (`prompt`), the generation loop over every running sequence
//! (`generator`, with the policies of a sequence alone in `run_ahead`), and what each sequence
//! does with its tokens: sampling on the host (`host_sampling`, `penalties`), the constraint
//! matcher (`constraint`), tool-call parsing (`tools`), stop strings (`stop`), streamed text
//! (`output`), log-probabilities (`logprobs`), timings and the finished generation (`result`).
//! Speculative decoding (`speculation`) drafts tokens that a step of the same loop verifies.
//! The network it drives is `kestrel-model`'s.

mod constraint;
mod generator;
mod host_sampling;
mod logprobs;
pub mod options;
mod output;
mod penalties;
mod prompt;
mod result;
mod run_ahead;
mod sequence;
pub mod speculation;
mod speculative_step;
pub mod stop;
mod timings;
mod tools;

use kestrel_ops::params::SamplingParams;

pub use constraint::{JsonSchemaFormat, OutputConstraint, ResponseFormat, TokenGrammar, TokenMatcher};
pub use generator::{reusable_prefix, Generator, DEFAULT_DECODE_RUN_AHEAD};
pub use logprobs::StepLogprobs;
pub use options::GenerateOptions;
pub use prompt::Prompt;
pub use result::{FinishReason, Generation, TokenEvent};
pub use sequence::{BatchStep, SequenceEvent, SequenceId};
pub use timings::Timings;
pub use tools::{FunctionCall, FunctionKind, FunctionTool, NamedTool, Tool, ToolCall, ToolChoice, ToolMode, ToolName, ToolSyntax};

/// The sampler's parameters for `options`: its seed, or the clock's.
fn sampling_params(options: &GenerateOptions) -> SamplingParams {
    let seed = options.seed.unwrap_or_else(clock_seed);
    SamplingParams {
        temperature: options.temperature,
        top_k: options.top_k,
        top_p: options.top_p,
        min_p: options.min_p,
        seed: (seed ^ (seed >> 32)) as u32,
    }
}

fn clock_seed() -> u64 {
    web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}
