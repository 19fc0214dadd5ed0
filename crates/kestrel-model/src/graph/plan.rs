//! A step as data: the labelled lists of prepared kernels a forward step records, built once at
//! load. `Graph::submit_step` records one list after another, and the profiler
//! (`graph::profile`) times the same lists grouped by label, so the two cannot drift apart.

use std::sync::Arc;

use kestrel_gpu::{Recorder, StepOp, StepParams};

/// The family label of copies: they end a compute pass, so per-pass timing skips them.
pub const COPY: &str = "copy";

/// One part of a step and the kernel family it is reported under.
#[derive(Clone)]
pub struct PlannedOp {
    pub family: &'static str,
    pub op: Arc<dyn StepOp>,
}

/// Every part of a step, in the order it runs. The decode, prefill and batch lists share the
/// kernels that serve all (norms, RoPE: the same bound dispatch) and differ in the products and
/// the attention: matvecs and split-KV attention for one token, tiled matmuls and tiled
/// attention for a chunk, matvecs over several tokens and split-KV attention per sequence for a
/// batch of sequences.
#[derive(Default)]
pub struct StepPlan {
    /// The embedding gather and every layer, for a one-token step.
    pub decode: Vec<PlannedOp>,
    /// The same for a chunk of tokens.
    pub prefill: Vec<PlannedOp>,
    /// Where each layer's part of `prefill` begins (the embedding goes with the first layer):
    /// a chunk submitted in pieces is cut there.
    pub layer_starts: Vec<usize>,
    /// The final norm, the last token's row and the LM head: the logits.
    pub logits: Vec<PlannedOp>,
    /// The final norm alone, over every row of a chunk: what a decoder embedding model pools.
    pub output_norm: Vec<PlannedOp>,
    /// Logit bias and penalties, then the draw.
    pub sample: Vec<PlannedOp>,
    /// Decode steps of several sequences, one token each, one list per batch size
    /// (`batch_columns`): the embedding, every layer, the final norm and every token's LM head.
    pub batches: Vec<BatchPlan>,
    /// After a chunk's `prefill`: the final norm and the LM head over every row of up to
    /// `columns` (`verify_columns`), a speculative draft's verification.
    pub verify: Vec<BatchPlan>,
}

/// A decode step of up to `columns` sequences (its products compute that many tokens).
pub struct BatchPlan {
    pub columns: usize,
    pub ops: Vec<PlannedOp>,
}

impl BatchPlan {
    /// Appends `op`, a kernel bound for this batch's tokens.
    pub fn push(&mut self, family: &'static str, op: impl StepOp + 'static) {
        self.ops.push(PlannedOp { family, op: Arc::new(op) });
    }
}

impl StepPlan {
    /// A plan whose batches run up to each of `columns` tokens.
    pub fn with_batches(columns: &[usize]) -> Self {
        Self { batches: columns.iter().map(|&columns| BatchPlan { columns, ops: Vec::new() }).collect(), ..Self::default() }
    }

    /// Marks the start of the next layer's part of the prefill list.
    pub fn begin_layer(&mut self) {
        self.layer_starts.push(if self.layer_starts.is_empty() { 0 } else { self.prefill.len() });
    }

    /// The prefill list's part from layer `first` up to (not including) layer `end`; the last
    /// layer's part runs to the end of the list.
    pub fn prefill_part(&self, first: usize, end: usize) -> &[PlannedOp] {
        let at = |layer: usize| self.layer_starts.get(layer).copied().unwrap_or(self.prefill.len());
        self.prefill.get(at(first)..at(end)).unwrap_or(&[])
    }

    /// Appends `op` to the decode, the prefill and every batch list.
    pub fn all(&mut self, family: &'static str, op: impl StepOp + 'static) {
        let op: Arc<dyn StepOp> = Arc::new(op);
        self.decode.push(PlannedOp { family, op: op.clone() });
        self.prefill.push(PlannedOp { family, op: op.clone() });
        self.every_batch(family, op);
    }

    /// Appends the one-token and the chunk variant of a part.
    pub fn split(&mut self, family: &'static str, decode: impl StepOp + 'static, prefill: impl StepOp + 'static) {
        self.decode.push(PlannedOp { family, op: Arc::new(decode) });
        self.prefill.push(PlannedOp { family, op: Arc::new(prefill) });
    }

    /// Appends `op` to every batch list.
    pub fn every_batch(&mut self, family: &'static str, op: Arc<dyn StepOp>) {
        for batch in &mut self.batches {
            batch.ops.push(PlannedOp { family, op: op.clone() });
        }
    }

    /// The batch list for `n` sequences: the one with the fewest columns that holds them.
    pub fn batch_for(&self, n: usize) -> Option<&BatchPlan> {
        self.batches.iter().filter(|b| b.columns >= n).min_by_key(|b| b.columns)
    }

    /// The verification list for a chunk of `n` rows: the one with the fewest columns that holds them.
    pub fn verify_for(&self, n: usize) -> Option<&BatchPlan> {
        self.verify.iter().filter(|b| b.columns >= n).min_by_key(|b| b.columns)
    }
}

/// The batch sizes a model with `slots` slots builds plans for: powers of two from 2, then
/// `slots` (a step of n sequences runs the smallest that holds n, computing at most twice the
/// tokens it needs in its products).
pub fn batch_columns(slots: usize) -> Vec<usize> {
    let mut columns: Vec<usize> = std::iter::successors(Some(2usize), |c| Some(c * 2)).take_while(|&c| c < slots).collect();
    if slots > 1 {
        columns.push(slots);
    }
    columns
}

/// The row counts a graph whose chunks hold `max_chunk` tokens builds verification lists for:
/// 2, 4, 8 and 16 (the LM head's product computes that many rows), those a chunk holds.
pub fn verify_columns(max_chunk: usize) -> Vec<usize> {
    let most = max_chunk.min(MAX_VERIFY_ROWS);
    std::iter::successors(Some(2usize), |c| Some(c * 2)).take_while(|&c| c <= most).collect()
}

/// Most rows of a verification on the GPU: the batched LM head's columns.
pub const MAX_VERIFY_ROWS: usize = kestrel_gpu::kernels::matvec::MAX_MATVEC_COLUMNS as usize;

/// Records every part of `ops` for `step`.
pub fn record(rec: &mut Recorder, ops: &[PlannedOp], step: &StepParams) {
    ops.iter().for_each(|p| p.op.record(rec, step));
}

/// Copies the last token's row of a `[tokens][row]` activation to a one-row buffer: the LM head
/// runs on the last token only.
pub struct LastRowCopy {
    pub src: kestrel_gpu::wgpu::Buffer,
    pub dst: kestrel_gpu::wgpu::Buffer,
    pub row_bytes: u64,
}

impl StepOp for LastRowCopy {
    fn record(&self, rec: &mut Recorder, step: &StepParams) {
        let last = u64::from(step.n_tokens.max(1) - 1);
        rec.copy(&self.src, last * self.row_bytes, &self.dst, 0, self.row_bytes);
    }
}
