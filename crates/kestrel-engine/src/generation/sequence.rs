//! One request's sequence in the generation loop: its prompt and KV slot, its sampling state,
//! what its tokens became so far (`TokenOutput`), and its end. Every way a step samples a token
//! (the device, the host, steps run ahead) gives it to `take_token`.

use std::time::Duration;

use kestrel_model::{Model, ModelError, SubmitReport};
use kestrel_ops::params::SamplingParams;
use kestrel_tokenizer::Tokenizer;
use web_time::Instant;

use super::constraint::TokenMatcher;
use super::logprobs::top_logprobs;
use super::options::GenerateOptions;
use super::output::{Accepted, TokenOutput};
use super::penalties::PenaltyPolicy;
use super::result::{FinishReason, Generation, TokenEvent};
use super::speculation::SequenceDraft;
use super::timings::Timings;

/// A sequence added by `Generator::add_sequence`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceId(pub(super) u64);

impl SequenceId {
    /// Its number: sequences of a generator are numbered 0, 1, 2, ... as they are added.
    pub fn number(self) -> u64 {
        self.0
    }
}

/// What a step did to a sequence, in order: tokens (and the flush of held-back text), then one
/// `Done` when it ended.
#[derive(Debug)]
pub enum SequenceEvent {
    Token(TokenEvent),
    Done(Result<Generation, ModelError>),
}

/// One step's outcome.
#[derive(Debug, Default)]
pub struct BatchStep {
    /// Sequences the step ran.
    pub sequences: usize,
    /// Of them, the ones that decoded a token (the others ran a prompt chunk).
    pub decoding: usize,
    /// Token rows the model ran.
    pub rows: usize,
    pub events: Vec<(SequenceId, SequenceEvent)>,
}

pub(super) struct Sequence {
    pub id: SequenceId,
    pub slot: usize,
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub sampling: SamplingParams,
    /// Prompt tokens whose KV rows were already in the slot.
    pub reused: usize,
    /// Tokens of the prompt and then the generated ones whose KV rows are in the slot.
    pub pos: usize,
    /// The sampled token the next step runs (once the prompt is in).
    pub next: Option<u32>,
    /// Tokens sampled so far: the next one's draw number.
    pub draws: u32,
    /// The prompt and the generated tokens (the penalties' window).
    pub history: Vec<u32>,
    pub output: TokenOutput,
    /// The output's constraint, when it has one.
    pub matcher: Option<TokenMatcher>,
    /// Decode steps submitted ahead (`run_ahead.rs`) whose tokens are not read yet: the first
    /// runs `next` at `pos`, each later one the token its predecessor sampled on the device.
    pub in_flight: u32,
    /// Whether the model's own sampler holds this sequence's options (set by its first step
    /// alone; no other sequence runs alone until it ends).
    pub owns_sampler: bool,
    pub start: Instant,
    pub first_token: Option<Instant>,
    /// Time blocked reading its decode steps' tokens, where it ran alone.
    pub host_wait: Duration,
    /// What its prompt's paced submissions measured, where it prefilled alone.
    pub pieces: Option<SubmitReport>,
    /// Its speculative decoding's state, where the engine speculates and the request lets it.
    pub draft: Option<SequenceDraft>,
}

impl Sequence {
    pub fn penalties(&self) -> PenaltyPolicy<'_> {
        PenaltyPolicy::new(&self.options)
    }

    /// Whether its next decode steps need nothing from the host between them: no penalties
    /// (they depend on the tokens so far), no logits read (logprobs), no constraint. Only then
    /// can they run ahead, each fed the token the previous one sampled on the device.
    pub fn can_run_ahead(&self) -> bool {
        !self.penalties().is_active() && self.options.logprobs == 0 && self.matcher.is_none()
    }

    /// Adds the paced submissions of a step that ran a chunk of its prompt.
    pub fn add_pieces(&mut self, report: Option<SubmitReport>) {
        let Some(r) = report else { return };
        let sum = self.pieces.unwrap_or_default();
        self.pieces = Some(SubmitReport { pieces: sum.pieces + r.pieces, longest: sum.longest.max(r.longest) });
    }

    /// Takes its next sampled token (with the logits it was sampled from, where read): checks it
    /// against the constraint, streams what it completes into `events`, and says why the
    /// sequence ends if it does. `max_ctx` is the model's context.
    pub fn take_token(
        &mut self,
        token: u32,
        logits: Option<&[f32]>,
        tokenizer: &Tokenizer,
        max_ctx: usize,
        events: &mut Vec<(SequenceId, SequenceEvent)>,
    ) -> Result<Option<FinishReason>, ModelError> {
        self.draws += 1;
        self.first_token.get_or_insert_with(Instant::now);
        // The constraint's end token ends the output unseen, as a model's end token does.
        let complete = match &mut self.matcher {
            Some(m) if m.is_end(token) => return Ok(Some(FinishReason::Stop)),
            Some(m) => m.accept(token)?,
            None => false,
        };
        let logprobs = match (self.options.logprobs, logits) {
            (0, _) => None,
            (n, Some(logits)) => Some(top_logprobs(logits, token, n, tokenizer)),
            (_, None) => return Err(kestrel_gpu::GpuError::Readback("a step returned no logits for logprobs".into()).into()),
        };
        match self.output.accept(tokenizer, &self.options, token, logprobs)? {
            Accepted::End => return Ok(Some(FinishReason::Stop)),
            Accepted::Token { event, stopped } => {
                events.push((self.id, SequenceEvent::Token(event)));
                if stopped || complete {
                    return Ok(Some(FinishReason::Stop));
                }
            }
        }
        self.history.push(token);
        // The token needs a position of its own to be run.
        if self.output.generated.len() >= self.options.max_tokens || self.pos + 1 > max_ctx {
            return Ok(Some(FinishReason::Length));
        }
        self.next = Some(token);
        Ok(None)
    }

    /// Its end: the text it held back, and its generation. Its slot keeps the tokens whose rows
    /// it wrote, for the next sequence's prefix.
    pub fn end(mut self, reason: FinishReason, model: &mut Model) -> (Option<TokenEvent>, Generation) {
        let flush = self.output.flush();
        model.set_slot_tokens(self.slot, self.prompt.iter().chain(&self.output.generated).take(self.pos).copied().collect());
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let decode_tokens = self.output.generated.len().saturating_sub(1);
        let timings = Timings::measured(self.prompt.len(), self.reused, first - self.start, decode_tokens, now - first, self.host_wait)
            .with_pieces(self.pieces);
        let finish_reason = self.output.finish_reason(reason);
        let TokenOutput { generated, text, logprobs, tool_calls, .. } = self.output;
        let speculative = self.draft.map(|d| d.stats);
        (
            flush,
            Generation { prompt_tokens: self.prompt, tokens: generated, text, finish_reason, timings, logprobs, tool_calls, speculative },
        )
    }
}
