//! Batched generation: several requests' sequences stepped together, each in its own KV slot.
//! A step runs every decoding sequence's next token and, within a token budget, the next
//! chunk of the prompts still prefilling, as one pass of the model (each weight read once for
//! all of their rows), then samples each sequence with its own options and seed. The caller
//! (the server's scheduler) adds sequences between steps, aborts them, and gets each one's
//! tokens and end as events.
//!
//! A sequence gives the tokens it would give alone: every row of a CPU step is computed on its
//! own and sampled on the host as the CPU backend samples; a GPU step runs prompt chunks with
//! the prefill kernels and decodes with the decode kernels, and samples each sequence on the
//! device with its slot's own sampler, as generation alone does (`graph::batch`). Either way it
//! samples with the draw numbers `Model::generate` uses, and its tokens go through the same
//! `TokenOutput`.

use std::time::Duration;

use web_time::Instant;

use kestrel_gpu::kernels::matvec::MAX_MATVEC_COLUMNS;
use kestrel_gpu::GpuError;
use kestrel_ops::params::SamplingParams;

use crate::constraint::TokenMatcher;
use crate::cpu_forward::SequenceStep;
use crate::graph::{BatchSample, BatchSequence, Graph};
use crate::host_sampling::HostSampler;
use crate::model::{common_prefix, reusable_tokens, sampling_params, top_logprobs, Backend};
use crate::output::{Accepted, TokenOutput};
use crate::pacing::SubmitPacer;
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
    /// The output's constraint, when it has one: its tokens are chosen on the host.
    matcher: Option<TokenMatcher>,
    start: Instant,
    first_token: Option<Instant>,
}

/// The most KV slots a model takes: a batched step's products hold every sequence's sums in
/// registers (`MAX_MATVEC_COLUMNS`), and each slot is a whole context of keys and values.
pub const MAX_SLOTS: usize = MAX_MATVEC_COLUMNS as usize;

/// What a step gives a sequence that samples: its logits, which the host samples (the CPU
/// backend), or the token its slot's sampler drew on the device (and the logits when it wants
/// logprobs).
enum Sampled {
    Logits(Vec<f32>),
    Device(BatchSample),
}

/// A batched step on the GPU: each sampling sequence's penalties for its tokens so far, then the
/// step (`Graph::run_batch`), with each sequence's draw number.
async fn run_on_gpu(
    graph: &Graph,
    steps: &[SequenceStep<'_>],
    sequences: &[&Sequence],
    pacer: Option<&mut SubmitPacer>,
) -> Result<Vec<Option<Sampled>>, ModelError> {
    let mut batch = Vec::with_capacity(steps.len());
    for (step, seq) in steps.iter().zip(sequences) {
        if step.logits {
            let policy = PenaltyPolicy::new(&seq.options);
            graph.set_slot_penalties(seq.slot, &policy.penalties, &policy.entries(&seq.history))?;
        }
        batch.push(BatchSequence {
            slot: step.slot,
            pos: step.pos,
            tokens: step.tokens,
            decoding: seq.next.is_some(),
            sample: step.logits.then_some(seq.draws),
            logits: seq.options.logprobs > 0 || seq.matcher.is_some(),
        });
    }
    Ok(graph.run_batch(&batch, pacer).await?.into_iter().map(|s| s.map(Sampled::Device)).collect())
}

impl Model {
    /// KV slots: sequences that can run at once.
    pub fn slots(&self) -> usize {
        self.cached.len()
    }

    /// Keeps `n` KV slots (1 to `MAX_SLOTS`): the CPU backend allocates them; the GPU backend
    /// has the slots it was loaded with (`LoadOptions::slots`) and uses the first `n`. Fails
    /// while sequences run.
    pub fn set_slots(&mut self, n: usize) -> Result<(), ModelError> {
        let invalid = |reason: String| Err(ModelError::InvalidOption { name: "slots", reason });
        if !(1..=MAX_SLOTS).contains(&n) {
            return invalid(format!("{n}: 1 to {MAX_SLOTS}"));
        }
        if !self.sequences.is_empty() {
            return invalid("cannot change while sequences run".into());
        }
        match &mut self.backend {
            Backend::Cpu(c) => c.forward.set_slots(n)?,
            Backend::Gpu(g) if n > g.slots => {
                return invalid(format!("{n}: the model was loaded with {} (the load option slots)", g.slots));
            }
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
        options.validate(self.config().vocab)?;
        self.check_prompt(prompt)?;
        let sampling = sampling_params(options);
        let matcher = self.constraint_matcher(options)?;
        let busy = |slot: usize| self.sequences.iter().any(|s| s.slot == slot);
        let slot = (0..self.slots())
            .filter(|&slot| !busy(slot))
            .max_by_key(|&slot| common_prefix(&self.cached[slot], prompt))
            .ok_or_else(|| ModelError::InvalidOption { name: "slots", reason: format!("all {} are in use", self.slots()) })?;
        if let Backend::Gpu(g) = &self.backend {
            g.set_slot_sampling(slot, &sampling)?;
        }
        let reused = reusable_tokens(&self.cached[slot], prompt);
        // The slot's rows past `reused` are about to change; until the sequence ends, it holds them.
        self.cached[slot].clear();
        let id = SequenceId(self.next_sequence);
        self.next_sequence += 1;
        self.sequences.push(Sequence {
            id,
            slot,
            prompt: prompt.to_vec(),
            options: options.clone(),
            sampling,
            reused,
            pos: reused,
            next: None,
            draws: 0,
            history: prompt.to_vec(),
            output: TokenOutput::new(options, self.tool_syntax(), prompt),
            matcher,
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
    pub async fn step_sequences(&mut self, prefill_tokens: usize) -> BatchStep {
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
            Backend::Cpu(c) => c.run_batch(&steps).map(|rows| rows.into_iter().map(|l| l.map(Sampled::Logits)).collect()),
            Backend::Gpu(g) => {
                let sequences: Vec<&Sequence> = plan.iter().map(|(i, ..)| &self.sequences[*i]).collect();
                run_on_gpu(g, &steps, &sequences, self.pacer.as_mut()).await
            }
        };
        let sampled = match result {
            Ok(sampled) => sampled,
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
        for ((i, tokens, _), sampled) in plan.iter().zip(sampled) {
            let seq = &mut self.sequences[*i];
            seq.pos += tokens.len();
            let Some(sampled) = sampled else { continue };
            match self.sample_into(*i, sampled, &mut step.events) {
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

    /// Takes sequence i's next token (sampled on the device, or here from its step's logits with
    /// its penalties, seed and draw number) and feeds it to its output: the token's event, and
    /// why the sequence ends if it does.
    fn sample_into(
        &mut self,
        i: usize,
        sampled: Sampled,
        events: &mut Vec<(SequenceId, SequenceEvent)>,
    ) -> Result<Option<FinishReason>, ModelError> {
        let max_ctx = self.context_length();
        let seq = &mut self.sequences[i];
        let host = HostSampler { options: &seq.options, sampling: &seq.sampling, history: &seq.history, draw: seq.draws };
        let (token, logits) = match (sampled, &mut seq.matcher) {
            (Sampled::Logits(logits), matcher) => (host.sample(&logits, matcher.as_mut())?, Some(logits)),
            // A constrained sequence's token is chosen here, from its logits.
            (Sampled::Device(BatchSample { logits: Some(logits), .. }), Some(matcher)) => {
                (host.sample(&logits, Some(matcher))?, Some(logits))
            }
            (Sampled::Device(BatchSample { logits: None, .. }), Some(_)) => {
                return Err(GpuError::Readback("a batched step returned no logits for a constrained sequence".into()).into())
            }
            (Sampled::Device(BatchSample { token, logits }), None) => (token, logits),
        };
        seq.draws += 1;
        seq.first_token.get_or_insert_with(Instant::now);
        // The constraint's end token ends the output unseen, as a model's end token does.
        let complete = match &mut seq.matcher {
            Some(m) if m.is_end(token) => return Ok(Some(FinishReason::Stop)),
            Some(m) => m.accept(token)?,
            None => false,
        };
        let logprobs = match (seq.options.logprobs, &logits) {
            (0, _) => None,
            (n, Some(logits)) => Some(top_logprobs(logits, token, n, &self.tokenizer)),
            (_, None) => return Err(GpuError::Readback("a batched step returned no logits for logprobs".into()).into()),
        };
        match seq.output.accept(&self.tokenizer, &seq.options, token, logprobs)? {
            Accepted::End => return Ok(Some(FinishReason::Stop)),
            Accepted::Token { event, stopped } => {
                events.push((seq.id, SequenceEvent::Token(event)));
                if stopped || complete {
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
        let finish_reason = seq.output.finish_reason(reason);
        let TokenOutput { generated, text, logprobs, tool_calls, .. } = seq.output;
        (flush, Generation { prompt_tokens: seq.prompt, tokens: generated, text, finish_reason, timings, logprobs, tool_calls })
    }
}
