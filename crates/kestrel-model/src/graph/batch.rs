//! Batched steps: several sequences, each in its own KV slot, run together. Prompt chunks run
//! with the prefill kernels one sequence at a time (as a prompt alone runs them); the decoding
//! sequences' tokens run as one decode step whose products read each weight once for all of
//! them (matvecs over several tokens) and whose attention reads each sequence's own slot. Each
//! sequence's logits then go through its slot's own penalties and sampler on the device, with
//! its options, its seed and its draw number: every sequence gets the token it would get alone.

use kestrel_gpu::kernels::sample::{PenaltyBinding, PenaltyKernel, SampleBinding, SampleKernel};
use kestrel_gpu::{DType, Gpu, GpuError, Recorder, StepOp, StepParams, StepUniform, Tensor};
use kestrel_ops::params::{Penalties, PenaltyEntry, SamplingParams};

use super::{plan, Graph, PENALTY_CAPACITY};
use crate::forward::RowOutput;
use crate::pacing::SubmitPacer;
use crate::ModelError;

/// One sequence's part of a batched step.
#[derive(Clone, Copy, Debug)]
pub struct BatchSequence<'a> {
    /// Its KV slot, and the tokens already there: `tokens` run at positions `pos..`.
    pub slot: usize,
    pub pos: usize,
    pub tokens: &'a [u32],
    /// Whether `tokens` is one generated token (the decode kernels) rather than a prompt chunk
    /// (the prefill kernels).
    pub decoding: bool,
    /// Whether the step samples its next token (a prompt chunk before the last does not), with
    /// this draw number (`StepParams::draw`).
    pub sample: Option<u32>,
    /// Whether to return the logits it sampled from (before penalties: its logprobs).
    pub logits: bool,
    /// Whether every one of its rows' logits comes back for the host (`[row][vocab]`), to check
    /// drafted tokens (speculative decoding): each against the logits of the row before it. The
    /// rows run as a prompt chunk does (`Model::max_verify_rows` at most); nothing samples them.
    pub verify: bool,
}

/// What a batched step gives a sequence that sampled.
#[derive(Debug)]
pub struct BatchSample {
    pub token: u32,
    /// The logits, when asked for.
    pub logits: Option<Vec<f32>>,
}

/// One slot's logits row, penalties and sampler.
pub(super) struct SlotSampler {
    logits: Tensor,
    /// Its draw number (the sampler reads only `draw`).
    step: StepUniform,
    penalties: PenaltyBinding,
    sampler: SampleBinding,
    sampled: Tensor,
}

impl SlotSampler {
    pub(super) fn new(gpu: &Gpu, vocab: usize, penalty: &PenaltyKernel, sample: &SampleKernel) -> Result<Self, GpuError> {
        let logits = Tensor::zeros(gpu, "slot.logits", &[vocab], DType::F32)?;
        let sampled = Tensor::zeros(gpu, "slot.sampled", &[2], DType::U32)?;
        let step = StepUniform::new(gpu);
        let penalties = penalty.bind(gpu, &logits, PENALTY_CAPACITY)?;
        let sampler = sample.bind(gpu, &logits, &step, &sampled)?;
        Ok(Self { logits, step, penalties, sampler, sampled })
    }
}

impl Graph {
    /// Sets the sampling options of the sequence in `slot` (queued for the next submit).
    pub fn set_slot_sampling(&self, slot: usize, params: &SamplingParams) -> Result<(), GpuError> {
        self.slot_sampler(slot)?.sampler.set_params(&self.gpu, params)
    }

    /// Sets the penalties and their entries of the sequence in `slot` (queued for the next submit).
    pub fn set_slot_penalties(&self, slot: usize, penalties: &Penalties, entries: &[PenaltyEntry]) -> Result<(), GpuError> {
        self.slot_sampler(slot)?.penalties.write(&self.gpu, penalties, entries)
    }

    fn slot_sampler(&self, slot: usize) -> Result<&SlotSampler, GpuError> {
        self.slot_samplers.get(slot).ok_or_else(|| GpuError::InvalidArgs(format!("slot {slot} of {}", self.slots)))
    }

    /// Runs one batched step (at most one sequence per slot). Returns, in order, each sequence's
    /// sampled token where it sampled, or every row's logits where it verifies a draft.
    /// With a `pacer`, prompt chunks go to the device in pieces (`Graph::submit_prompt_paced`).
    pub async fn run_batch(
        &self,
        sequences: &[BatchSequence<'_>],
        mut pacer: Option<&mut SubmitPacer>,
    ) -> Result<Vec<Option<RowOutput>>, ModelError> {
        let mut slots: Vec<usize> = sequences.iter().map(|s| s.slot).collect();
        slots.sort_unstable();
        slots.dedup();
        if slots.len() != sequences.len() || slots.last().is_some_and(|&s| s >= self.slots) {
            return Err(GpuError::InvalidArgs(format!("a batch over slots {slots:?} of {}", self.slots)).into());
        }
        // Verifications first, each read before the next (they share `verify_logits`).
        let mut by_slot: Vec<Option<RowOutput>> = (0..self.slots).map(|_| None).collect();
        for s in sequences.iter().filter(|s| s.verify) {
            by_slot[s.slot] = Some(RowOutput::Logits(self.verify_rows(s).await?));
        }
        // Readback rows: the prompt chunks' that sample, in order, then the decodes'.
        let sampling = |s: &&BatchSequence<'_>| s.sample.is_some();
        let chunks: Vec<&BatchSequence<'_>> = sequences.iter().filter(|s| !s.decoding && !s.verify).filter(sampling).collect();
        let decodes: Vec<&BatchSequence<'_>> = sequences.iter().filter(|s| s.decoding && !s.verify).collect();
        if let Some(bad) = decodes.iter().find(|s| s.tokens.len() != 1 || s.sample.is_none()) {
            return Err(
                GpuError::InvalidArgs(format!("a decode of {} tokens that samples: {}", bad.tokens.len(), bad.sample.is_some())).into()
            );
        }
        let mut row = 0;
        for s in sequences.iter().filter(|s| !s.decoding && !s.verify) {
            let sampled_row = s.sample.is_some().then_some(row);
            row += usize::from(s.sample.is_some());
            self.submit_prompt_chunk(s, sampled_row, pacer.as_deref_mut()).await?;
        }
        if !decodes.is_empty() {
            self.submit_decode_batch(&decodes, row)?;
        }
        let rows: Vec<&BatchSequence<'_>> = chunks.into_iter().chain(decodes).collect();
        let tokens = self.read_batch_tokens(rows.len()).await?;
        let logits_rows = rows.iter().rposition(|s| s.logits).map_or(0, |r| r + 1);
        let mut logits = if logits_rows > 0 { self.read_batch_logits(logits_rows).await? } else { Vec::new() }.into_iter();
        for (s, token) in rows.iter().zip(tokens) {
            let row_logits = logits.next().filter(|_| s.logits);
            by_slot[s.slot] = Some(RowOutput::Sampled(BatchSample { token, logits: row_logits }));
        }
        Ok(sequences.iter().map(|s| by_slot[s.slot].take()).collect())
    }

    /// Most rows of a verification: its widest verification list's (0 where a chunk holds one
    /// token, and no list was built).
    pub fn max_verify_rows(&self) -> usize {
        self.plan.verify.last().map_or(0, |v| v.columns)
    }

    /// Runs a verification (`BatchSequence::verify`): its tokens at its position of its slot with
    /// the prefill kernels, as a prompt chunk runs, then the final norm and the LM head over
    /// every row. Returns their logits, `[row][vocab]`.
    async fn verify_rows(&self, s: &BatchSequence<'_>) -> Result<Vec<f32>, GpuError> {
        let n = s.tokens.len();
        let verify = self.plan.verify_for(n).ok_or_else(|| {
            GpuError::InvalidArgs(format!("a verification of {n} rows (at most {})", self.plan.verify.last().map_or(0, |v| v.columns)))
        })?;
        if n == 0 || s.pos + n > self.max_ctx {
            return Err(GpuError::InvalidArgs(format!("a verification of {n} tokens at position {} (context {})", s.pos, self.max_ctx)));
        }
        let gpu = &self.gpu;
        let step = StepParams::new(n as u32, s.pos as u32, 0);
        self.step.write(gpu, &step);
        self.act.rows.write_run(gpu, s.slot as u32, s.pos as u32, n as u32)?;
        gpu.write(&self.act.token_ids.buffer, 0, bytemuck::cast_slice(s.tokens));
        let mut rec = Recorder::new(gpu);
        plan::record(&mut rec, &self.plan.prefill, &step);
        plan::record(&mut rec, &verify.ops, &step);
        let bytes = (n * self.config.vocab * 4) as u64;
        rec.copy(&self.act.verify_logits.buffer, 0, self.verify_readback.buffer(), 0, bytes);
        let submission = rec.submit();
        let read = self.verify_readback.read_after(gpu, bytes, Some(submission)).await;
        gpu.check_faults()?;
        Ok(bytemuck::pod_collect_to_vec(&read?))
    }

    /// Submits one sequence's prompt chunk (or chunks of at most `max_chunk`), with the prefill
    /// kernels as a prompt alone runs (in pieces with a `pacer`, as a prompt alone runs with one);
    /// when it samples, its last token's logits are sampled by its slot's sampler into readback
    /// row `row`.
    async fn submit_prompt_chunk(
        &self,
        s: &BatchSequence<'_>,
        row: Option<usize>,
        mut pacer: Option<&mut SubmitPacer>,
    ) -> Result<(), GpuError> {
        let pieces = s.tokens.chunks(self.max_chunk);
        let last = pieces.len().saturating_sub(1);
        for (k, piece) in pieces.enumerate() {
            let (n, pos) = (piece.len(), s.pos + k * self.max_chunk);
            if n == 0 || pos + n > self.max_ctx {
                return Err(GpuError::InvalidArgs(format!("a chunk of {n} tokens at position {pos} (context {})", self.max_ctx)));
            }
            let gpu = &self.gpu;
            let step = StepParams::new(n as u32, pos as u32, 0);
            self.step.write(gpu, &step);
            self.act.rows.write_run(gpu, s.slot as u32, pos as u32, n as u32)?;
            gpu.write(&self.act.token_ids.buffer, 0, bytemuck::cast_slice(piece));
            let finish = |mut rec: Recorder| -> Result<(), GpuError> {
                if let (true, Some(row), Some(draw)) = (k == last, row, s.sample) {
                    plan::record(&mut rec, &self.plan.logits, &step);
                    self.record_sample(&mut rec, &self.act.logits.buffer, 0, s, draw, row)?;
                }
                rec.submit();
                Ok(())
            };
            match pacer.as_deref_mut() {
                Some(pacer) => self.submit_prefill_paced(&step, pacer, finish).await?,
                None => {
                    let mut rec = Recorder::new(gpu);
                    plan::record(&mut rec, &self.plan.prefill, &step);
                    finish(rec)?;
                }
            }
        }
        Ok(())
    }

    /// Submits one decode step of the decoding sequences, one token each at its position of its
    /// slot, with the decode kernels: the same logits per sequence as a decode step of it alone.
    /// Each is sampled by its slot's sampler into readback rows `first_row..`, in order.
    fn submit_decode_batch(&self, decodes: &[&BatchSequence<'_>], first_row: usize) -> Result<(), GpuError> {
        let n = decodes.len();
        if let Some(bad) = decodes.iter().find(|s| s.pos >= self.max_ctx) {
            return Err(GpuError::InvalidArgs(format!("a decode at position {} (context {})", bad.pos, self.max_ctx)));
        }
        let gpu = &self.gpu;
        let max_pos = decodes.iter().map(|s| s.pos).max().unwrap_or(0) as u32;
        // Grids follow the most advanced sequence; each row's own position is in `rows`.
        let step = StepParams { n_tokens: n as u32, pos: max_pos, kv_len: max_pos + 1, draw: 0 };
        self.step.write(gpu, &step);
        let rows: Vec<[u32; 2]> = decodes.iter().map(|s| [s.slot as u32, s.pos as u32]).collect();
        self.act.rows.write(gpu, &rows)?;
        let tokens: Vec<u32> = decodes.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        gpu.write(&self.act.token_ids.buffer, 0, bytemuck::cast_slice(&tokens));
        let mut rec = Recorder::new(gpu);
        let row_bytes = self.act.logits.byte_size();
        let logits = if n == 1 {
            // One sequence: the decode kernels as generation alone runs them.
            plan::record(&mut rec, &self.plan.decode, &step);
            plan::record(&mut rec, &self.plan.logits, &step);
            &self.act.logits.buffer
        } else {
            let batch = self.plan.batch_for(n).ok_or_else(|| GpuError::InvalidArgs(format!("{n} sequences, {} slots", self.slots)))?;
            plan::record(&mut rec, &batch.ops, &step);
            &self.act.batch_logits.buffer
        };
        for (b, s) in decodes.iter().enumerate() {
            let draw = s.sample.unwrap_or(0);
            self.record_sample(&mut rec, logits, b as u64 * row_bytes, s, draw, first_row + b)?;
        }
        rec.submit();
        Ok(())
    }

    /// Records sampling the logits row at `offset` of `logits` with the sequence's slot's sampler
    /// (draw number `draw`): the row is copied to the slot's logits, and to readback row `row`
    /// when the sequence wants it (before the penalties change it); the token goes to token
    /// readback row `row`.
    fn record_sample(
        &self,
        rec: &mut Recorder,
        logits: &kestrel_gpu::wgpu::Buffer,
        offset: u64,
        s: &BatchSequence<'_>,
        draw: u32,
        row: usize,
    ) -> Result<(), GpuError> {
        let sampler = self.slot_sampler(s.slot)?;
        if row >= self.slots {
            return Err(GpuError::InvalidArgs(format!("readback row {row} of {}", self.slots)));
        }
        let step = StepParams::new(1, 0, draw);
        sampler.step.write(&self.gpu, &step);
        let row_bytes = self.act.logits.byte_size();
        rec.copy(logits, offset, &sampler.logits.buffer, 0, row_bytes);
        if s.logits {
            rec.copy(logits, offset, self.batch_readback.buffer(), row as u64 * row_bytes, row_bytes);
        }
        sampler.penalties.record(rec, &step);
        sampler.sampler.record(rec, &step);
        rec.copy(&sampler.sampled.buffer, 0, self.batch_tokens_readback.buffer(), 8 * row as u64, 8);
        Ok(())
    }

    /// The tokens of the first `rows` readback rows.
    async fn read_batch_tokens(&self, rows: usize) -> Result<Vec<u32>, GpuError> {
        if rows == 0 {
            return Ok(Vec::new());
        }
        let read = self.batch_tokens_readback.read_u32(&self.gpu, 8 * rows as u64).await;
        self.gpu.check_faults()?;
        Ok(read?.chunks_exact(2).map(|pair| pair[0]).collect())
    }

    /// The logits of the first `rows` readback rows.
    async fn read_batch_logits(&self, rows: usize) -> Result<Vec<Vec<f32>>, GpuError> {
        let vocab = self.config.vocab;
        let read = self.batch_readback.read_f32(&self.gpu, (rows * vocab * 4) as u64).await;
        self.gpu.check_faults()?;
        Ok(read?.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }
}
