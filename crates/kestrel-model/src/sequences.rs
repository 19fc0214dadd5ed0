//! Batched generation: several requests' sequences stepped together, each in its own KV slot.
//! A step runs every decoding sequence's next token and, within a token budget, the next
//! chunk of the prompts still prefilling, as one pass of the model (each weight read once for
//! all of their rows), then samples each sequence with its own options and seed. The caller
//! (the server's scheduler) adds sequences between steps, aborts them, and gets each one's
//! tokens and end as events.
//!
//! A sequence gives the tokens it would give alone: every row of a CPU step is computed on its
//! own, it samples with the draw numbers `Model::generate` uses, and its tokens go through the
//! same `TokenOutput`. Only the CPU backend batches.

use std::time::Duration;

use web_time::Instant;

use kestrel_gpu::params::SamplingParams;
use kestrel_gpu::reference::sample;

use crate::cpu_forward::SequenceStep;
use crate::model::{common_prefix, sampling_params, top_logprobs, Backend};
use crate::output::{Accepted, TokenOutput};
use crate::penalties::PenaltyPolicy;
use crate::{FinishReason, GenerateOptions, Generation, Model, ModelError, Timings, TokenEvent};

/// A sequence added by `Model::add_sequence`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceId(u64);

impl SequenceId {
    /// Its number: sequences of a model are numbered 0, 1, 2, ... as they are added.
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

pub(crate) struct Sequence {
    id: SequenceId,
    slot: usize,
    prompt: Vec<u32>,
    options: GenerateOptions,
    sampling: SamplingParams,
    /// Prompt tokens whose KV rows were already in the slot.
    reused: usize,
    /// Tokens of the prompt and then the generated ones whose KV rows are in the slot.
    pos: usize,
    /// The sampled token the next step runs (once the prompt is in).
    next: Option<u32>,
    /// Tokens sampled so far: the next one's draw number.
    draws: u32,
    /// The prompt and the generated tokens (the penalties' window).
    history: Vec<u32>,
    output: TokenOutput,
    start: Instant,
    first_token: Option<Instant>,
}

impl Model {
    /// KV slots: sequences that can run at once.
    pub fn slots(&self) -> usize {
        self.cached.len()
    }

    /// Keeps `n` KV slots. Only the CPU backend batches; the GPU backend has one slot. Fails while
    /// sequences run.
    pub fn set_slots(&mut self, n: usize) -> Result<(), ModelError> {
        let invalid = |reason: String| Err(ModelError::InvalidOption { name: "slots", reason });
        if n == 0 {
            return invalid("must be at least 1".into());
        }
        if !self.sequences.is_empty() {
            return invalid("cannot change while sequences run".into());
        }
        match &mut self.backend {
            Backend::Cpu(c) => c.forward.set_slots(n),
            Backend::Gpu(_) if n > 1 => return invalid(format!("{n}: batched generation runs on the CPU backend only")),
            Backend::Gpu(_) => {}
        }
        self.cached.resize_with(n, Vec::new);
        Ok(())
    }

    /// Sequences added and not yet ended.
    pub fn running_sequences(&self) -> usize {
        self.sequences.len()
    }

    /// The running sequences, oldest first.
    pub fn sequence_ids(&self) -> Vec<SequenceId> {
        self.sequences.iter().map(|s| s.id).collect()
    }

    /// Tokens whose keys and values the slots hold: each running sequence's so far, and each
    /// free slot's cached prefix.
    pub fn kv_cache_tokens(&self) -> usize {
        let free: usize = (0..self.slots()).filter(|&s| self.sequences.iter().all(|q| q.slot != s)).map(|s| self.cached[s].len()).sum();
        free + self.sequences.iter().map(|q| q.pos).sum::<usize>()
    }

    /// Slots no running sequence holds.
    pub fn free_slots(&self) -> usize {
        self.slots() - self.sequences.len()
    }

    /// Errors unless no batched sequence runs (single-sequence generation uses slot 0).
    pub(crate) fn check_no_sequences(&self) -> Result<(), ModelError> {
        match self.sequences.len() {
            0 => Ok(()),
            n => Err(ModelError::InvalidOption { name: "generate", reason: format!("{n} batched sequences are running") }),
        }
    }

    /// Adds a sequence generating from `prompt`, in the free slot whose cached tokens share the
    /// longest prefix with it (those KV rows are reused). It starts at the next step. Bad options
    /// or prompts fail here, as `generate` fails them; so does a model without a free slot.
    pub fn add_sequence(&mut self, prompt: &[u32], options: &GenerateOptions) -> Result<SequenceId, ModelError> {
        if !matches!(self.backend, Backend::Cpu(_)) {
            return Err(ModelError::InvalidOption { name: "slots", reason: "batched generation runs on the CPU backend only".into() });
        }
        options.validate(self.config().vocab)?;
        self.check_prompt(prompt)?;
        let busy = |slot: usize| self.sequences.iter().any(|s| s.slot == slot);
        let slot = (0..self.slots())
            .filter(|&slot| !busy(slot))
            .max_by_key(|&slot| common_prefix(&self.cached[slot], prompt))
            .ok_or_else(|| ModelError::InvalidOption { name: "slots", reason: format!("all {} are in use", self.slots()) })?;
        // Keep the longest cached prefix, but always run the last prompt token for its logits.
        let reused = common_prefix(&self.cached[slot], prompt).min(prompt.len() - 1);
        // The slot's rows past `reused` are about to change; until the sequence ends, it holds them.
        self.cached[slot].clear();
        let id = SequenceId(self.next_sequence);
        self.next_sequence += 1;
        self.sequences.push(Sequence {
            id,
            slot,
            prompt: prompt.to_vec(),
            options: options.clone(),
            sampling: sampling_params(options),
            reused,
            pos: reused,
            next: None,
            draws: 0,
            history: prompt.to_vec(),
            output: TokenOutput::new(options),
            start: Instant::now(),
            first_token: None,
        });
        Ok(id)
    }

    /// Ends sequence `id` now (finish reason "abort"), freeing its slot: its generation so far,
    /// or None if no such sequence runs.
    pub fn abort_sequence(&mut self, id: SequenceId) -> Option<Generation> {
        let i = self.sequences.iter().position(|s| s.id == id)?;
        let seq = self.sequences.remove(i);
        Some(self.end_sequence(seq, FinishReason::Abort).1)
    }

    /// Runs one batched step: every decoding sequence's token, and prompt chunks of at most
    /// `prefill_tokens` tokens in all (oldest sequence first; at least one token when any
    /// prompt waits), so that a long prompt delays the others' next tokens by a bounded amount.
    pub fn step_sequences(&mut self, prefill_tokens: usize) -> BatchStep {
        let mut budget = prefill_tokens.max(1);
        // (sequence index, input tokens, whether the step samples)
        let mut plan: Vec<(usize, Vec<u32>, bool)> = Vec::new();
        for (i, seq) in self.sequences.iter().enumerate() {
            match seq.next {
                Some(token) => plan.push((i, vec![token], true)),
                None if budget > 0 => {
                    let n = budget.min(seq.prompt.len() - seq.pos);
                    budget -= n;
                    let end = seq.pos + n;
                    plan.push((i, seq.prompt[seq.pos..end].to_vec(), end == seq.prompt.len()));
                }
                None => {}
            }
        }
        let mut step = BatchStep {
            sequences: plan.len(),
            decoding: plan.iter().filter(|(i, ..)| self.sequences[*i].next.is_some()).count(),
            rows: plan.iter().map(|(_, tokens, _)| tokens.len()).sum(),
            events: Vec::new(),
        };
        if plan.is_empty() {
            return step;
        }
        let steps: Vec<SequenceStep<'_>> = plan
            .iter()
            .map(|(i, tokens, logits)| {
                let seq = &self.sequences[*i];
                SequenceStep { slot: seq.slot, pos: seq.pos, tokens, logits: *logits }
            })
            .collect();
        let result = match &mut self.backend {
            Backend::Cpu(c) => c.run_batch(&steps),
            Backend::Gpu(_) => {
                Err(ModelError::InvalidOption { name: "slots", reason: "batched generation runs on the CPU backend only".into() })
            }
        };
        let logits = match result {
            Ok(logits) => logits,
            Err(e) => {
                // Every sequence of the step fails with it; their slots may hold partial rows.
                let (code, message) = (e.code(), e.to_string());
                let mut failed: Vec<usize> = plan.iter().map(|(i, ..)| *i).collect();
                failed.sort_unstable();
                for i in failed.into_iter().rev() {
                    let seq = self.sequences.remove(i);
                    self.cached[seq.slot].clear();
                    step.events.push((seq.id, SequenceEvent::Done(Err(ModelError::InBatch { code, message: message.clone() }))));
                }
                return step;
            }
        };
        let mut ended = Vec::new();
        for ((i, tokens, _), logits) in plan.iter().zip(logits) {
            let seq = &mut self.sequences[*i];
            seq.pos += tokens.len();
            let Some(logits) = logits else { continue };
            match self.sample_into(*i, &logits, &mut step.events) {
                Ok(None) => {}
                Ok(Some(reason)) => ended.push((*i, Ok(reason))),
                Err(e) => ended.push((*i, Err(e))),
            }
        }
        // Remove from the back so that the indices stay valid.
        ended.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, outcome) in ended {
            let seq = self.sequences.remove(i);
            let id = seq.id;
            match outcome {
                Ok(reason) => {
                    let (flush, generation) = self.end_sequence(seq, reason);
                    step.events.extend(flush.map(|e| (id, SequenceEvent::Token(e))));
                    step.events.push((id, SequenceEvent::Done(Ok(generation))));
                }
                Err(e) => {
                    self.cached[seq.slot].clear();
                    step.events.push((id, SequenceEvent::Done(Err(e))));
                }
            }
        }
        step
    }

    /// Samples sequence i's next token from its step's logits (its penalties applied, its seed
    /// and draw number) and feeds it to its output: the token's event, and why the sequence
    /// ends if it does.
    fn sample_into(
        &mut self,
        i: usize,
        logits: &[f32],
        events: &mut Vec<(SequenceId, SequenceEvent)>,
    ) -> Result<Option<FinishReason>, ModelError> {
        let max_ctx = self.context_length();
        let seq = &mut self.sequences[i];
        let policy = PenaltyPolicy::new(&seq.options);
        let token = if policy.is_active() {
            sample::sample(&sample::apply_penalties(logits, &policy.entries(&seq.history), &policy.penalties), &seq.sampling, seq.draws)
        } else {
            sample::sample(logits, &seq.sampling, seq.draws)
        };
        seq.draws += 1;
        seq.first_token.get_or_insert_with(Instant::now);
        let logprobs = (seq.options.logprobs > 0).then(|| top_logprobs(logits, token, seq.options.logprobs));
        match seq.output.accept(&self.tokenizer, &seq.options, token, logprobs)? {
            Accepted::End => return Ok(Some(FinishReason::Stop)),
            Accepted::Token { event, stopped } => {
                events.push((seq.id, SequenceEvent::Token(event)));
                if stopped {
                    return Ok(Some(FinishReason::Stop));
                }
            }
        }
        seq.history.push(token);
        // As `generate`: the token needs a position of its own to be run.
        if seq.output.generated.len() >= seq.options.max_tokens || seq.pos + 1 > max_ctx {
            return Ok(Some(FinishReason::Length));
        }
        seq.next = Some(token);
        Ok(None)
    }

    /// A sequence's end: the text it held back, and its generation. Its slot keeps the tokens
    /// whose rows it wrote, for the next sequence's prefix.
    fn end_sequence(&mut self, mut seq: Sequence, reason: FinishReason) -> (Option<TokenEvent>, Generation) {
        let flush = seq.output.flush();
        self.cached[seq.slot] = seq.prompt.iter().chain(&seq.output.generated).take(seq.pos).copied().collect();
        let now = Instant::now();
        let first = seq.first_token.unwrap_or(now);
        let decode_tokens = seq.output.generated.len().saturating_sub(1);
        let timings = Timings::measured(seq.prompt.len(), seq.reused, first - seq.start, decode_tokens, now - first, Duration::ZERO);
        let TokenOutput { generated, text, logprobs, .. } = seq.output;
        (flush, Generation { prompt_tokens: seq.prompt, tokens: generated, text, finish_reason: reason, timings, logprobs })
    }
}
