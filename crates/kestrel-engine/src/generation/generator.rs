//! The generation loop: every request's sequence, on either backend, stepped by one `step`.
//!
//! A step runs every decoding sequence's next token and, within a token budget, the next chunk
//! of the prompts still prefilling, as one pass of the model (each weight read once for all of
//! their rows: `Model::run_batch`), then samples each sequence with its own options and seed.
//! The caller (the scheduler) adds sequences between steps, aborts them, and gets each one's
//! tokens and end as events. A single request is a sequence like any other.
//!
//! A sequence that runs alone and decodes takes one of two policies instead (`run_ahead.rs`):
//! its decode steps run ahead on the device (sampled there, each fed the previous one's token,
//! several in flight while the host reads the first), or, with a constraint, the host computes
//! its token mask while its step runs and the device samples under it. When another sequence
//! joins, the steps in flight are read first. Either way a sequence samples with the same draw
//! numbers and gets the tokens it would get in a batch: every row of a CPU step is computed on
//! its own and sampled on the host as the CPU backend samples; the GPU runs prompt chunks with
//! the prefill kernels and decodes with the decode kernels, each sequence sampled on the device.

use kestrel_model::{BackendKind, BatchRow, Model, ModelError, RowOutput, TOKEN_SLOTS};
use web_time::Instant;

use super::constraint::{OutputConstraint, TokenGrammar, TokenMatcher};
use super::host_sampling::HostSampler;
use super::options::GenerateOptions;
use super::prompt::{self, Prompt};
use super::result::{FinishReason, Generation, TokenEvent};
use super::sampling_params;
use super::sequence::{BatchStep, Sequence, SequenceEvent, SequenceId};
use super::speculation::{SequenceDraft, StepTime};
use super::speculative_step::Speculation;
use super::tools::ToolSyntax;

/// Decode steps in flight by default on the GPU: the one whose token is being read and two more,
/// so the device has the next step queued while the host reads, streams and checks a token.
pub const DEFAULT_DECODE_RUN_AHEAD: usize = 3;

/// The run-ahead a generator starts with for `backend`: `DEFAULT_DECODE_RUN_AHEAD` on the GPU,
/// one step on the CPU backend. That backend computes a step when it is submitted, so there a step
/// run ahead overlaps nothing: it held each answer's second token back by two steps (about 120 ms on a
/// 1.5B model natively, seconds in the page), and a stop threw two computed steps away.
fn default_run_ahead(backend: BackendKind) -> usize {
    match backend {
        BackendKind::Gpu => DEFAULT_DECODE_RUN_AHEAD,
        BackendKind::Cpu => 1,
    }
}

pub struct Generator {
    pub(super) model: Model,
    /// How the model's template has it write tool calls.
    tool_syntax: ToolSyntax,
    /// The vocabulary's token trie for constrained outputs, built by the first request that has
    /// a constraint.
    grammar: Option<TokenGrammar>,
    /// The running sequences, oldest first.
    pub(super) sequences: Vec<Sequence>,
    next_sequence: u64,
    /// Decode steps a sequence alone keeps in flight (`set_decode_run_ahead`).
    pub(super) run_ahead: usize,
    /// How it speculates (`set_speculation`), where it does.
    pub(super) speculation: Option<Speculation>,
}

impl Generator {
    pub fn new(model: Model) -> Self {
        let tool_syntax = ToolSyntax::of_template(model.tokenizer().chat_template());
        let run_ahead = default_run_ahead(model.backend());
        Self { model, tool_syntax, grammar: None, sequences: Vec::new(), next_sequence: 0, run_ahead, speculation: None }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The model for a change while no sequence runs (a reset, a KV prefix restored, a pass of
    /// its own): None while one runs.
    pub fn model_mut(&mut self) -> Option<&mut Model> {
        self.sequences.is_empty().then_some(&mut self.model)
    }

    pub fn into_model(self) -> Model {
        self.model
    }

    /// How this model's template has it write tool calls.
    pub fn tool_syntax(&self) -> ToolSyntax {
        self.tool_syntax
    }

    /// Decode steps a sequence running alone keeps in flight (1 to `TOKEN_SLOTS`; by default
    /// `DEFAULT_DECODE_RUN_AHEAD` on the GPU, 1 on the CPU backend): 1 submits each step after
    /// reading the previous token. A sequence with penalties, logprobs or a
    /// constraint always runs one step at a time.
    pub fn set_decode_run_ahead(&mut self, steps: usize) -> Result<(), ModelError> {
        if !(1..=TOKEN_SLOTS).contains(&steps) {
            return Err(ModelError::InvalidOption { name: "decode_run_ahead", reason: format!("must be 1 to {TOKEN_SLOTS}, got {steps}") });
        }
        self.run_ahead = steps;
        Ok(())
    }

    /// Decode steps a sequence running alone keeps in flight (`set_decode_run_ahead`).
    pub fn decode_run_ahead(&self) -> usize {
        self.run_ahead
    }

    /// Token ids of a prompt (see `prompt::encode`), with no request's tools.
    pub fn encode(&self, prompt: &Prompt<'_>) -> Result<Vec<u32>, ModelError> {
        prompt::encode(&self.model, self.tool_syntax, prompt, &GenerateOptions::default())
    }

    /// A request's prompt token ids, checked as generation checks them: every option and limit
    /// before the prompt is rendered and encoded, then the prompt against the context.
    pub fn prepare(&self, prompt: &Prompt<'_>, options: &GenerateOptions) -> Result<Vec<u32>, ModelError> {
        options.validate(self.model.config().vocab)?;
        let tokens = prompt::encode(&self.model, self.tool_syntax, prompt, options)?;
        self.model.check_prompt(&tokens)?;
        Ok(tokens)
    }

    /// The matcher of `options`' constraint (its `response_format`, `regex`, `grammar`, or the
    /// grammar of its tool calls), if it has one, compiled: a bad schema, regex or grammar is an
    /// `invalid_option` error naming it. Sequences compile theirs with it as they are added; the
    /// bench replays a constraint with it.
    pub fn constraint_matcher(&mut self, options: &GenerateOptions) -> Result<Option<TokenMatcher>, ModelError> {
        let tool_grammar = options.tool_use().map(|tools| tools.grammar(self.tool_syntax));
        let constraint = match (&tool_grammar, options.constraint()?) {
            (Some(lark), _) => OutputConstraint::ToolCalls(lark),
            (None, Some(constraint)) => constraint,
            (None, None) => return Ok(None),
        };
        let grammar = match &mut self.grammar {
            Some(grammar) => grammar,
            empty => empty.insert(TokenGrammar::new(self.model.tokenizer(), self.model.config().vocab, constraint.field())?),
        };
        grammar.matcher(constraint).map(Some)
    }

    /// Forgets the cached prefixes: the next request prefills from position 0. A running
    /// sequence's slot keeps nothing until the sequence ends, so this never touches one.
    pub fn reset(&mut self) {
        self.model.reset();
        if let Some(draft) = self.speculation.as_mut().and_then(|s| s.draft.as_mut()) {
            draft.reset();
        }
    }

    /// KV slots: sequences that can run at once.
    pub fn slots(&self) -> usize {
        self.model.slots()
    }

    /// Keeps `n` KV slots (1 to `kestrel_model::MAX_SLOTS`, see `Model::set_slots`). Fails while sequences run.
    pub fn set_slots(&mut self, n: usize) -> Result<(), ModelError> {
        if !self.sequences.is_empty() {
            return Err(ModelError::InvalidOption { name: "slots", reason: "cannot change while sequences run".into() });
        }
        if let Some(draft) = self.speculation.as_mut().and_then(|s| s.draft.as_mut()) {
            draft.set_slots(n)?;
        }
        self.model.set_slots(n)
    }

    /// Sequences added and not yet ended.
    pub fn running_sequences(&self) -> usize {
        self.sequences.len()
    }

    /// Tokens whose keys and values the slots hold: each running sequence's so far, and each
    /// free slot's cached prefix.
    pub fn kv_cache_tokens(&self) -> usize {
        let free: usize = (0..self.slots()).filter(|&s| !self.is_busy(s)).map(|s| self.model.slot_tokens(s).len()).sum();
        free + self.sequences.iter().map(|q| q.pos).sum::<usize>()
    }

    /// Slots no running sequence holds.
    pub fn free_slots(&self) -> usize {
        self.slots() - self.sequences.len()
    }

    fn is_busy(&self, slot: usize) -> bool {
        self.sequences.iter().any(|s| s.slot == slot)
    }

    /// Adds a sequence generating from `prompt`, in the free slot whose cached tokens share the
    /// longest prefix with it (those KV rows are reused). It starts at the next step. Bad options
    /// or prompts fail here, before any step; so does a model without a free slot.
    pub fn add_sequence(&mut self, prompt: &[u32], options: &GenerateOptions) -> Result<SequenceId, ModelError> {
        options.validate(self.model.config().vocab)?;
        self.model.check_prompt(prompt)?;
        let sampling = sampling_params(options);
        // Compiled before any step, so that a bad constraint fails as `invalid_option` and leaves
        // the cached prefixes for the next request.
        let matcher = self.constraint_matcher(options)?;
        let slot = (0..self.slots())
            .filter(|&slot| !self.is_busy(slot))
            .max_by_key(|&slot| common_prefix(self.model.slot_tokens(slot), prompt))
            .ok_or_else(|| ModelError::InvalidOption { name: "slots", reason: format!("all {} are in use", self.slots()) })?;
        let policy = super::penalties::PenaltyPolicy::new(options);
        self.model.set_slot_sampler(slot, &sampling, &policy.penalties, &policy.entries(prompt))?;
        let reused = reusable_prefix(common_prefix(self.model.slot_tokens(slot), prompt), prompt.len());
        // The slot's rows past `reused` are about to change; until the sequence ends, it holds them.
        self.model.set_slot_tokens(slot, Vec::new());
        let draft = match &mut self.speculation {
            Some(spec) if options.speculative => {
                let cached = spec.draft.as_mut().map_or(0, |d| d.claim_slot(slot, prompt));
                Some(SequenceDraft::new(spec.options.draft_max, cached))
            }
            _ => None,
        };
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
            output: super::output::TokenOutput::new(options, self.tool_syntax, prompt),
            matcher,
            in_flight: 0,
            owns_sampler: false,
            start: Instant::now(),
            first_token: None,
            host_wait: std::time::Duration::ZERO,
            pieces: None,
            draft,
        });
        Ok(id)
    }

    /// Ends sequence `id` now (finish reason "abort"), freeing its slot: its generation so far,
    /// or None if no such sequence runs. Steps it ran ahead are left to finish; their rows lie
    /// past the tokens its slot keeps.
    pub fn abort_sequence(&mut self, id: SequenceId) -> Option<Generation> {
        self.end_now(id).map(|(_, generation)| generation)
    }

    /// `abort_sequence`, with the text the sequence held back.
    fn end_now(&mut self, id: SequenceId) -> Option<(Option<TokenEvent>, Generation)> {
        let i = self.sequences.iter().position(|s| s.id == id)?;
        let seq = self.sequences.remove(i);
        Some(self.finish(seq, FinishReason::Abort))
    }

    /// A removed sequence's end (`Sequence::end`); the draft model's slot keeps what it holds of
    /// the sequence's tokens, for the next one's prefix.
    fn finish(&mut self, seq: Sequence, reason: FinishReason) -> (Option<TokenEvent>, Generation) {
        let draft_tokens = seq.draft.as_ref().map(|d| seq.history.iter().take(d.draft_pos).copied().collect());
        let slot = seq.slot;
        let ended = seq.end(reason, &mut self.model);
        if let (Some(tokens), Some(draft)) = (draft_tokens, self.speculation.as_mut().and_then(|s| s.draft.as_mut())) {
            draft.release_slot(slot, tokens);
        }
        ended
    }

    /// Generates from `prompt` alone, calling `on_token` for every generated token; generation
    /// stops early (finish reason "abort") when it returns false. The same loop as every request:
    /// one sequence, stepped until it ends.
    pub async fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent) -> bool,
    ) -> Result<Generation, ModelError> {
        if !self.sequences.is_empty() {
            let reason = format!("{} batched sequences are running", self.sequences.len());
            return Err(ModelError::InvalidOption { name: "generate", reason });
        }
        let id = self.add_sequence(prompt, options)?;
        loop {
            let step = self.step(self.model.max_chunk()).await;
            for (_, event) in step.events {
                match event {
                    SequenceEvent::Token(token) => {
                        // Where the step that streamed the token also ended the sequence, its
                        // flush and its end follow among the step's events: nothing to abort.
                        if !on_token(&token) {
                            if let Some((flush, generation)) = self.end_now(id) {
                                if let Some(rest) = flush {
                                    on_token(&rest);
                                }
                                return Ok(generation);
                            }
                        }
                    }
                    SequenceEvent::Done(result) => return result,
                }
            }
        }
    }

    /// Runs one step of every running sequence (see the module's notes). Prompt chunks take at
    /// most `prefill_tokens` tokens in all (oldest sequence first; at least one token when any
    /// prompt waits), so that a long prompt delays the others' next tokens by a bounded amount;
    /// while no sequence decodes, nothing waits on them and they take the backend's largest chunk.
    pub async fn step(&mut self, prefill_tokens: usize) -> BatchStep {
        let mut step = BatchStep::default();
        if let [alone] = self.sequences.as_slice() {
            // A sequence that speculates takes batched steps: its tokens wait on the host's verdicts.
            if alone.next.is_some() && alone.draft.is_none() {
                self.step_alone(&mut step).await;
                return step;
            }
        }
        self.read_in_flight(&mut step.events).await;
        let budget = if self.sequences.iter().any(|s| s.next.is_some()) {
            prefill_tokens.max(1)
        } else {
            prefill_tokens.max(self.model.max_chunk())
        };
        self.step_batch(budget, &mut step).await;
        step
    }

    /// A batched step (`Model::run_batch`) of every sequence: its decoded token, or its next
    /// prompt chunk within `budget` tokens in all.
    pub(super) async fn step_batch(&mut self, mut budget: usize, step: &mut BatchStep) {
        let start = Instant::now();
        let drafts = self.draft_step().await;
        let drafting = start.elapsed();
        // (sequence index, input tokens, whether the step samples)
        let mut plan: Vec<(usize, Vec<u32>, bool)> = Vec::new();
        for (i, seq) in self.sequences.iter().enumerate() {
            match seq.next {
                Some(token) => plan.push((i, std::iter::once(token).chain(drafts[i].tokens.iter().copied()).collect(), true)),
                None if budget > 0 => {
                    let n = budget.min(seq.prompt.len() - seq.pos);
                    budget -= n;
                    let end = seq.pos + n;
                    plan.push((i, seq.prompt[seq.pos..end].to_vec(), end == seq.prompt.len()));
                }
                None => {}
            }
        }
        if let Err((i, e)) = self.prefill_drafts(&plan).await {
            return self.fail(vec![i], &e, &mut step.events);
        }
        step.sequences = plan.len();
        step.decoding = plan.iter().filter(|(i, ..)| self.sequences[*i].next.is_some()).count();
        step.rows = plan.iter().map(|(_, tokens, _)| tokens.len()).sum();
        if plan.is_empty() {
            return;
        }
        let mut rows = Vec::with_capacity(plan.len());
        for (i, tokens, samples) in &plan {
            let seq = &self.sequences[*i];
            if *samples && self.model.samples_on_device() {
                // A sampling row's penalties count the tokens so far.
                let policy = seq.penalties();
                if let Err(e) = self.model.set_slot_penalties(seq.slot, &policy.penalties, &policy.entries(&seq.history)) {
                    return self.fail(plan.iter().map(|(i, ..)| *i).collect(), &e, &mut step.events);
                }
            }
            rows.push(BatchRow {
                slot: seq.slot,
                pos: seq.pos,
                tokens,
                decoding: seq.next.is_some(),
                sample: samples.then_some(seq.draws),
                logits: seq.options.logprobs > 0 || seq.matcher.is_some(),
                verify: !drafts[*i].tokens.is_empty(),
            });
        }
        let outputs = match self.model.run_batch(&rows).await {
            Ok(outputs) => outputs,
            Err(e) => return self.fail(plan.iter().map(|(i, ..)| *i).collect(), &e, &mut step.events),
        };
        drop(rows);
        // A paced prompt's pieces are its own where it was the only one in the step.
        let report = self.model.take_prefill_report();
        let prefilling: Vec<usize> = plan.iter().filter(|(i, ..)| self.sequences[*i].next.is_none()).map(|(i, ..)| *i).collect();
        if let [i] = prefilling.as_slice() {
            self.sequences[*i].add_pieces(report);
        }
        let alone = plan.len() == 1;
        let mut ended = Vec::new();
        for ((i, tokens, _), output) in plan.iter().zip(outputs) {
            let draft = &drafts[*i];
            let decoded = self.sequences[*i].next.is_some();
            let generated = self.sequences[*i].output.generated.len();
            let outcome = match output {
                Some(RowOutput::Logits(rows)) if !draft.tokens.is_empty() => self.take_verified(*i, &rows, draft, &mut step.events),
                Some(output) => {
                    self.sequences[*i].pos += tokens.len();
                    self.sample_into(*i, output, &mut step.events)
                }
                None => {
                    self.sequences[*i].pos += tokens.len();
                    Ok(None)
                }
            };
            let seq = &mut self.sequences[*i];
            if let (true, Some(state)) = (decoded, seq.draft.as_mut()) {
                // Only a step the sequence ran alone measures its own costs.
                match (alone, draft.tokens.is_empty()) {
                    (true, _) => state.record_time(StepTime {
                        total: start.elapsed(),
                        drafting,
                        proposing: draft.proposing,
                        proposals: draft.proposals,
                        drafted: draft.tokens.len(),
                        tokens: seq.output.generated.len() - generated,
                        caught_up: draft.caught_up,
                    }),
                    (false, true) => state.plain_step(),
                    (false, false) => state.verified_in_batch(),
                }
            }
            match outcome {
                Ok(None) => {}
                Ok(Some(reason)) => ended.push((*i, Ok(reason))),
                Err(e) => ended.push((*i, Err(e))),
            }
        }
        self.end_sequences(ended, &mut step.events);
    }

    /// Takes sequence i's next token from its row of a batched step (sampled on the device, or
    /// here from its logits with its penalties, constraint, seed and draw number).
    fn sample_into(
        &mut self,
        i: usize,
        output: RowOutput,
        events: &mut Vec<(SequenceId, SequenceEvent)>,
    ) -> Result<Option<FinishReason>, ModelError> {
        let max_ctx = self.model.context_length();
        let seq = &mut self.sequences[i];
        let host = HostSampler { options: &seq.options, sampling: &seq.sampling, history: &seq.history, draw: seq.draws };
        let (token, logits) = match (output, &mut seq.matcher) {
            (RowOutput::Logits(logits), matcher) => (host.sample(&logits, matcher.as_mut())?, Some(logits)),
            // A constrained sequence's token is chosen here, from its logits.
            (RowOutput::Sampled(sample), Some(matcher)) => {
                let logits = sample.logits.ok_or_else(|| {
                    kestrel_gpu::GpuError::Readback("a batched step returned no logits for a constrained sequence".into())
                })?;
                (host.sample(&logits, Some(matcher))?, Some(logits))
            }
            (RowOutput::Sampled(sample), None) => (sample.token, sample.logits),
        };
        seq.take_token(token, logits.as_deref(), self.model.tokenizer(), max_ctx, events)
    }

    /// Ends the sequences at these indices, each as its outcome says: its last text and its
    /// generation (after a last check for a device fault), or its error.
    pub(super) fn end_sequences(
        &mut self,
        mut ended: Vec<(usize, Result<FinishReason, ModelError>)>,
        events: &mut Vec<(SequenceId, SequenceEvent)>,
    ) {
        // Remove from the back so that the indices stay valid.
        ended.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, outcome) in ended {
            let seq = self.sequences.remove(i);
            let (id, slot) = (seq.id, seq.slot);
            // A fault reported after the last read (the browser delivers them as events) still
            // fails this request rather than the next.
            match outcome.and_then(|reason| self.model.check_faults().map(|()| reason)) {
                Ok(reason) => {
                    let (flush, generation) = self.finish(seq, reason);
                    events.extend(flush.map(|e| (id, SequenceEvent::Token(e))));
                    events.push((id, SequenceEvent::Done(Ok(generation))));
                }
                Err(e) => {
                    // Its steps may have left KV rows unwritten: the next request prefills anew.
                    self.model.set_slot_tokens(slot, Vec::new());
                    if let Some(draft) = self.speculation.as_mut().and_then(|s| s.draft.as_mut()) {
                        draft.release_slot(slot, Vec::new());
                    }
                    events.push((id, SequenceEvent::Done(Err(e))));
                }
            }
        }
    }

    /// Fails the sequences at these indices with the error of the step they shared.
    pub(super) fn fail(&mut self, indices: Vec<usize>, e: &ModelError, events: &mut Vec<(SequenceId, SequenceEvent)>) {
        let (code, message) = (e.code(), e.to_string());
        let ended = indices.into_iter().map(|i| (i, Err(ModelError::InBatch { code, message: message.clone() }))).collect();
        self.end_sequences(ended, events);
    }
}

pub(super) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Of a prefix of `shared` tokens that a cache holds of a `prompt_len`-token prompt, the tokens
/// whose KV rows are kept: all but the last prompt token, which always runs for its logits.
pub fn reusable_prefix(shared: usize, prompt_len: usize) -> usize {
    shared.min(prompt_len.saturating_sub(1))
}
