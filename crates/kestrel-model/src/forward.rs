//! The forward passes over KV slots that the engine's generation loop drives, on either backend:
//!
//! - **A batched step** (`run_batch`): several sequences, each in its own slot, a prompt chunk or
//!   one decoded token each, as one pass of the model that reads each weight once for all of
//!   their rows. A row that samples comes back as its logits (the CPU backend: the host samples)
//!   or as the token its slot's sampler drew on the device (the GPU, with the logits when asked).
//! - **One sequence's decode steps** (`submit_decode`, `read_token`): a step is submitted with
//!   the token the host knows or with the one the previous step sampled on the device, and its
//!   token is read later, so several steps can be in flight while the host reads the first.
//!   Their sampler is the model's own (`set_sampling`), with an optional token mask
//!   (`set_token_mask`, `submit_sample`) for a constrained output.
//!
//! - **A verification** (`BatchRow::verify`): a chunk of a sequence's next token and the tokens
//!   drafted after it, whose every row's logits come back, for speculative decoding.
//!
//! A step never checks what a slot holds: the caller says where its tokens go, and records what
//! the slot holds (`Model::set_slot_tokens`).

use kestrel_ops::params::{Penalties, PenaltyEntry, SamplingParams};

use crate::cpu_forward::SequenceStep;
use crate::graph::{BatchSample, BatchSequence, StepAt, StepInput, StepOutput};
use crate::model::{Backend, Model};
use crate::ModelError;

/// One sequence's part of a batched step (`Model::run_batch`).
pub type BatchRow<'a> = BatchSequence<'a>;

/// What a batched step gives a row that samples.
#[derive(Debug)]
pub enum RowOutput {
    /// Its logits, for the host to sample (the CPU backend): one row, or every row of a
    /// verification (`BatchRow::verify`), `[row][vocab]`.
    Logits(Vec<f32>),
    /// The token its slot's sampler drew on the device, and the logits when asked for.
    Sampled(BatchSample),
}

/// Where a decode step's one token comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeInput {
    /// A token the host has.
    Token(u32),
    /// The token the previous step sampled, left on the device: the host need not have read it.
    Sampled,
}

impl Model {
    /// Most rows of a verification (`BatchRow::verify`), whose logits speculative decoding checks
    /// its drafts against: a chunk on the CPU backend; on the GPU, the most rows a verification
    /// list of its graph holds (the batched LM head's columns, within a chunk).
    pub fn max_verify_rows(&self) -> usize {
        match &self.backend {
            Backend::Cpu(c) => c.max_chunk,
            Backend::Gpu(g) => g.max_verify_rows(),
        }
    }

    /// Whether this backend samples a batched step's rows itself (the GPU), so that their slots'
    /// samplers need their options (`set_slot_sampler`).
    pub fn samples_on_device(&self) -> bool {
        matches!(self.backend, Backend::Gpu(_))
    }

    /// Sets the sampling options and penalties of the sequence in `slot`, for the rows of batched
    /// steps that sample on the device; nothing on the CPU backend, whose rows the host samples.
    pub fn set_slot_sampler(
        &self,
        slot: usize,
        params: &SamplingParams,
        penalties: &Penalties,
        entries: &[PenaltyEntry],
    ) -> Result<(), ModelError> {
        if let Backend::Gpu(g) = &self.backend {
            g.set_slot_sampling(slot, params)?;
            g.set_slot_penalties(slot, penalties, entries)?;
        }
        Ok(())
    }

    /// Sets only the penalties of the sequence in `slot` (its tokens so far changed them).
    pub fn set_slot_penalties(&self, slot: usize, penalties: &Penalties, entries: &[PenaltyEntry]) -> Result<(), ModelError> {
        if let Backend::Gpu(g) = &self.backend {
            g.set_slot_penalties(slot, penalties, entries)?;
        }
        Ok(())
    }

    /// Runs one batched step (at most one row per slot; see the module's notes). Returns, in
    /// order, each row's output where it samples. With a submission budget, prompt chunks go to
    /// the device in pieces (`take_prefill_report` says what they measured).
    pub async fn run_batch(&mut self, rows: &[BatchRow<'_>]) -> Result<Vec<Option<RowOutput>>, ModelError> {
        match &mut self.backend {
            Backend::Cpu(c) => {
                let logits = |r: &BatchRow<'_>| if r.verify { r.tokens.len() } else { usize::from(r.sample.is_some()) };
                let steps: Vec<SequenceStep<'_>> =
                    rows.iter().map(|r| SequenceStep { slot: r.slot, pos: r.pos, tokens: r.tokens, logits: logits(r) }).collect();
                Ok(c.run_batch(&steps)?.into_iter().map(|l| l.map(RowOutput::Logits)).collect())
            }
            Backend::Gpu(g) => g.run_batch(rows, self.pacer.as_mut()).await,
        }
    }

    /// Sets the options and penalties of the model's own sampler, which decode steps
    /// (`submit_decode`) sample with, and lets them draw any token (no mask).
    pub fn set_sampling(&mut self, params: &SamplingParams, penalties: &Penalties, entries: Vec<PenaltyEntry>) -> Result<(), ModelError> {
        self.backend.set_sampling(params)?;
        self.backend.set_penalties(penalties, entries)?;
        self.set_token_mask(None)
    }

    /// Sets only the model's own sampler's penalties.
    pub fn set_penalties(&mut self, penalties: &Penalties, entries: Vec<PenaltyEntry>) -> Result<(), ModelError> {
        self.backend.set_penalties(penalties, entries)
    }

    /// Submits one decode step of the sequence in `slot`: `input` at position `pos`, then, as
    /// `output` says, its logits and its token drawn with draw number `draw`, into readback slot
    /// `draw` (`read_token(draw)`). On the CPU backend the step runs now.
    pub fn submit_decode(&mut self, slot: usize, input: DecodeInput, pos: usize, draw: u32, output: &StepOutput) -> Result<(), ModelError> {
        let input = match input {
            DecodeInput::Token(token) => StepInput::Decode(token),
            DecodeInput::Sampled => StepInput::Sampled,
        };
        self.backend.submit_step(input, StepAt { kv_slot: slot, pos, draw, readback: draw as usize }, output)
    }

    /// The token the step with draw number `draw` sampled (waiting for that step only).
    pub async fn read_token(&self, draw: u32) -> Result<u32, ModelError> {
        self.backend.read_token(draw as usize).await
    }

    /// The logits the last decode step that copied them (`StepOutput::TokenAndLogits`) left.
    pub async fn read_logits(&self) -> Result<Vec<f32>, ModelError> {
        self.backend.read_logits().await
    }

    /// Words of a device token mask (one bit per token), where the device masks its draws: on
    /// the GPU.
    pub fn token_mask_words(&self) -> Option<usize> {
        match &self.backend {
            Backend::Gpu(g) => Some(g.token_mask.words()),
            Backend::Cpu(_) => None,
        }
    }

    /// Sets the tokens the model's own sampler may draw (a constrained output's mask,
    /// `token_mask_words` words), or lets it draw any (None). Nothing on the CPU backend.
    pub fn set_token_mask(&self, mask: Option<&[u32]>) -> Result<(), ModelError> {
        if let Backend::Gpu(g) = &self.backend {
            g.set_token_mask(mask)?;
        }
        Ok(())
    }

    /// Samples the logits a `StepOutput::Logits` decode step left, with draw number `draw`, into
    /// readback slot `draw`: the second half of a constrained step on the GPU, once its mask is
    /// set.
    pub fn submit_sample(&self, draw: u32) -> Result<(), ModelError> {
        self.backend.gpu_graph("a device token mask")?.submit_sample(draw, draw as usize);
        Ok(())
    }

    /// A device fault reported after the last read: it fails the request that was running.
    pub fn check_faults(&self) -> Result<(), ModelError> {
        self.backend.check_faults()
    }
}
