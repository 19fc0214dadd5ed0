//! The CPU backend: the graph of `cpu_forward` on `kestrel-cpu`'s quantized kernels, and the
//! steps generation submits to it (prefill chunks and decode steps, each sampled on the CPU by
//! the GPU sampler's own definition, `kestrel_ops::reference::sample`, so a seed draws the same
//! tokens on either backend given the same logits).

use kestrel_gguf::GgmlType;
use kestrel_ops::params::{AttentionShape, KvType, Penalties, PenaltyEntry, SamplingParams, Scores};
use kestrel_ops::reference::sample;

use crate::cpu_forward::{CpuForward, CpuKernels, SequenceStep};
use crate::error::ModelError;
use crate::graph::{StepAt, StepInput, StepOutput, TOKEN_SLOTS};

/// `kestrel-cpu`'s kernels: 8-bit activations times the weights' integers, in SIMD, threaded.
pub struct Quantized;

impl CpuKernels for Quantized {
    type Matrix = kestrel_cpu::Matrix;

    fn matrix(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self::Matrix, ModelError> {
        kestrel_cpu::Matrix::from_ggml(ty, bytes, rows, cols).map_err(|e| match e {
            kestrel_cpu::CpuError::UnsupportedType { ty } => {
                ModelError::UnsupportedQuant { tensor: format!("a {rows} x {cols} matrix"), ty: ty.name().to_string() }
            }
            other => other.into(),
        })
    }

    fn apply(m: &Self::Matrix, x: &[f32]) -> Vec<f32> {
        m.apply(x)
    }

    fn apply_each<const N: usize>(ms: [&Self::Matrix; N], x: &[f32]) -> [Vec<f32>; N] {
        let mut each = kestrel_cpu::Matrix::apply_each(&ms, x).into_iter();
        std::array::from_fn(|_| each.next().unwrap_or_default())
    }

    fn row(m: &Self::Matrix, r: usize) -> Vec<f32> {
        m.row(r)
    }

    fn split_rows(m: Self::Matrix, at: usize) -> Result<(Self::Matrix, Self::Matrix), ModelError> {
        Ok(m.split_rows(at)?)
    }

    fn bytes(m: &Self::Matrix) -> usize {
        m.bytes()
    }

    /// An f16 cache in f16 bits: half the memory, and the attention converts 8 at a time.
    const F16_BITS: bool = true;

    fn attention(shape: &AttentionShape, q: &[f32], cache: kestrel_cpu::KvRows<'_>, pos: usize, scores: &Scores) -> Vec<f32> {
        let attention = kestrel_cpu::Attention {
            n_heads: shape.n_heads,
            n_kv_heads: shape.n_kv_heads,
            head_dim: shape.head_dim,
            max_ctx: shape.max_ctx,
            scale: scores.scale,
            softcap: scores.softcap,
            window: scores.window,
        };
        attention.apply(q, cache, pos)
    }
}

pub type CpuModel = CpuForward<Quantized>;

/// The forward passes on the CPU: what `Graph` does with GPU submissions, done at once.
pub(crate) struct CpuBackend {
    pub forward: CpuModel,
    pub max_chunk: usize,
    kv: KvType,
    sampling: SamplingParams,
    penalties: Penalties,
    entries: Vec<PenaltyEntry>,
    /// The token each readback slot holds, and the last one sampled (a `Sampled` step's input).
    slots: [u32; TOKEN_SLOTS],
    last_sampled: u32,
    /// The last sampling step's logits, before penalties (as the GPU copies them).
    logits: Vec<f32>,
}

impl CpuBackend {
    pub fn new(forward: CpuModel, max_chunk: usize, kv: KvType) -> Self {
        Self {
            forward,
            max_chunk,
            kv,
            sampling: SamplingParams::greedy(),
            penalties: Penalties::default(),
            entries: Vec::new(),
            slots: [0; TOKEN_SLOTS],
            last_sampled: 0,
            logits: Vec::new(),
        }
    }

    pub fn kv_cache(&self) -> KvType {
        self.kv
    }

    pub fn set_sampling(&mut self, params: &SamplingParams) {
        self.sampling = *params;
    }

    pub fn set_penalties(&mut self, penalties: &Penalties, entries: Vec<PenaltyEntry>) {
        self.penalties = *penalties;
        self.entries = entries;
    }

    /// Runs a step now: its tokens where `at` says (overwriting any KV rows there), then, unless
    /// `output` is `None`, the LM head, and unless it is `Logits` (a constrained step, which the
    /// host samples) the sampler, whose token goes to readback slot `at.readback`.
    pub fn submit_step(&mut self, input: StepInput, at: StepAt, output: &StepOutput) -> Result<(), ModelError> {
        let one;
        let tokens: &[u32] = match input {
            StepInput::Tokens(tokens) => tokens,
            StepInput::Decode(token) => {
                one = [token];
                &one
            }
            StepInput::Sampled => {
                one = [self.last_sampled];
                &one
            }
        };
        if tokens.is_empty() || tokens.len() > self.max_chunk {
            return Err(ModelError::InvalidOption {
                name: "step",
                reason: format!("{} tokens (chunk limit {})", tokens.len(), self.max_chunk),
            });
        }
        let step = SequenceStep { slot: at.kv_slot, pos: at.pos, tokens, logits: usize::from(!matches!(output, StepOutput::None)) };
        let Some(logits) = self.run_batch(&[step])?.pop().flatten() else { return Ok(()) };
        if matches!(output, StepOutput::Logits) {
            self.logits = logits;
            return Ok(());
        }
        let token = if self.entries.is_empty() {
            sample::sample(&logits, &self.sampling, at.draw)
        } else {
            sample::sample(&sample::apply_penalties(&logits, &self.entries, &self.penalties), &self.sampling, at.draw)
        };
        self.slots[at.readback % TOKEN_SLOTS] = token;
        self.last_sampled = token;
        self.logits = logits;
        Ok(())
    }

    /// Runs a batched step (`CpuForward::run_batch`) on the pool.
    pub fn run_batch(&mut self, steps: &[SequenceStep<'_>]) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        let forward = &mut self.forward;
        kestrel_cpu::on_pool(|| forward.run_batch(steps))
    }

    pub fn read_token(&self, slot: usize) -> u32 {
        self.slots[slot % TOKEN_SLOTS]
    }

    pub fn read_logits(&self) -> Vec<f32> {
        self.logits.clone()
    }
}
