//! Token selection on the GPU (`shaders/sample.wgsl`) and the logit processing that precedes it
//! (`shaders/penalties.wgsl`, and a constrained output's token mask, `shaders/token_mask.wgsl`).
//! Only the chosen token id (and its probability) is read back.
//!
//! The chain follows llama.cpp's common sampler defaults: logit bias -> penalties -> top-k ->
//! top-p -> min-p -> temperature -> draw. Tokens tied with a top-k / top-p threshold are all
//! kept (llama.cpp keeps an implementation-defined subset of them). Greedy (temperature <= 0)
//! takes the first maximum, as llama.cpp's greedy sampler does.
//!
//! Cost: greedy is two dispatches (1024 logits per workgroup, then one combining workgroup).
//! Sampling is one 256-thread workgroup making full passes over the logits: 1 (max), 8 per
//! enabled top-k / top-p search (16-way narrowing of the 32-bit f32 order), 1 for the top-p mass,
//! and the draw (one pass, then a few tiny ones). The logits of one row stay in L2 on real GPUs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kestrel_ops::params::{Penalties, PenaltyEntry, SamplingParams};

use super::Bindings;
use crate::{DType, Defines, Dispatch, Gpu, GpuError, Recorder, StepOp, StepParams, StepUniform, Tensor};

/// Logits reduced per `argmax_partials` workgroup (`CHUNK` in shaders/sample.wgsl).
const ARGMAX_CHUNK: u32 = 1024;
/// Words per argmax partial record: max, index, sum of exp.
const PARTIAL_WORDS: u64 = 3;
/// `@workgroup_size` of shaders/penalties.wgsl.
const PENALTY_WORKGROUP: u32 = 64;
/// `@workgroup_size` of shaders/token_mask.wgsl.
const MASK_WORKGROUP: u32 = 256;

kestrel_ops::gpu_struct! {
    /// The sampler's uniform (`Params` in shaders/sample.wgsl).
    #[derive(Debug, Default)]
    pub(crate) struct SampleUniform as Params {
        /// Elements of src: the vocabulary, or the number of partial records for argmax_final.
        n: u32,
        top_k: u32,
        temperature: f32,
        top_p: f32,
        min_p: f32,
        seed: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

impl SampleUniform {
    fn new(n: u32, p: &SamplingParams) -> Self {
        Self { n, top_k: p.top_k, temperature: p.temperature, top_p: p.top_p, min_p: p.min_p, seed: p.seed, _pad0: 0, _pad1: 0 }
    }
}

/// Argmax and seeded sampling over one row of logits.
pub struct SampleKernel {
    argmax_partials: Arc<wgpu::ComputePipeline>,
    argmax_final: Arc<wgpu::ComputePipeline>,
    sample: Arc<wgpu::ComputePipeline>,
}

impl SampleKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        let defines = Defines::new();
        Ok(Self {
            argmax_partials: gpu.pipelines.get("sample", "argmax_partials", &defines).await?,
            argmax_final: gpu.pipelines.get("sample", "argmax_final", &defines).await?,
            sample: gpu.pipelines.get("sample", "sample", &defines).await?,
        })
    }

    /// Binds sampling of `logits` (f32, one row: every element is a vocabulary entry) into
    /// `out` (u32, at least 2 elements: `out[0]` = token id, `out[1]` = f32 bits of its
    /// probability). The per-step random value mixes in `step`'s `draw`. Starts greedy; call
    /// [`SampleBinding::set_params`] to change.
    pub fn bind(&self, gpu: &Gpu, logits: &Tensor, step: &StepUniform, out: &Tensor) -> Result<SampleBinding, GpuError> {
        if logits.dtype != DType::F32 || logits.is_empty() {
            return Err(GpuError::InvalidArgs(format!(
                "sample: logits must be a non-empty f32 tensor, got {:?} {:?}",
                logits.dtype, logits.shape
            )));
        }
        if out.dtype != DType::U32 || out.len() < 2 {
            return Err(GpuError::InvalidArgs(format!(
                "sample: out must be a u32 tensor of at least 2 elements, got {:?} {:?}",
                out.dtype, out.shape
            )));
        }
        let n_vocab =
            u32::try_from(logits.len()).map_err(|_| GpuError::InvalidArgs(format!("sample: vocabulary of {} entries", logits.len())))?;
        let n_partials = n_vocab.div_ceil(ARGMAX_CHUNK);
        let partials = gpu.storage_buffer("sample.partials", u64::from(n_partials) * PARTIAL_WORDS * 4)?;

        let greedy = SampleUniform::new(n_vocab, &SamplingParams::greedy());
        let argmax_partials = Bindings::new(gpu, "sample.argmax_partials").uniform(&greedy).tensor(logits).buffer(&partials);
        let argmax_partials = argmax_partials.dispatch_grid(&self.argmax_partials, n_partials);
        let final_params = SampleUniform { n: n_partials, ..greedy };
        let argmax_final = Bindings::new(gpu, "sample.argmax_final").uniform(&final_params).buffer(&partials).tensor(out);
        let argmax_final = argmax_final.dispatch(&self.argmax_final, [1, 1, 1]);
        // The sampler's own uniform, which `set_params` rewrites.
        let params = gpu.uniform_buffer("sample.params", bytemuck::bytes_of(&greedy));
        let sample = Bindings::new(gpu, "sample.sample").buffer(&params).tensor(logits).tensor(out).step(step);
        let sample = sample.dispatch(&self.sample, [1, 1, 1]);
        Ok(SampleBinding { argmax_partials, argmax_final, sample, params, n_vocab, greedy: AtomicBool::new(true) })
    }
}

/// A bound sampler: two dispatches (multi-workgroup partials + combine) when greedy, one
/// single-workgroup dispatch otherwise.
pub struct SampleBinding {
    argmax_partials: Dispatch,
    argmax_final: Dispatch,
    sample: Dispatch,
    params: wgpu::Buffer,
    n_vocab: u32,
    /// Set between submits by `set_params` (so the binding can be shared with a step's plan).
    greedy: AtomicBool,
}

impl SampleBinding {
    /// Writes a request's options (queued: effective from the next submit).
    pub fn set_params(&self, gpu: &Gpu, params: &SamplingParams) -> Result<(), GpuError> {
        params.validate().map_err(GpuError::InvalidArgs)?;
        gpu.write(&self.params, 0, bytemuck::bytes_of(&SampleUniform::new(self.n_vocab, params)));
        self.greedy.store(params.is_greedy(), Ordering::Relaxed);
        Ok(())
    }
}

impl StepOp for SampleBinding {
    /// The draw; its random value mixes the step's `draw` number into the request's seed.
    fn record(&self, rec: &mut Recorder, _step: &StepParams) {
        if self.greedy.load(Ordering::Relaxed) {
            self.argmax_partials.record(rec);
            self.argmax_final.record(rec);
        } else {
            self.sample.record(rec);
        }
    }
}

kestrel_ops::gpu_struct! {
    /// The logit processing's uniform (`Params` in shaders/penalties.wgsl).
    #[derive(Debug, Default)]
    pub(crate) struct PenaltyUniform as Params {
        n_vocab: u32,
        n_entries: u32,
        repeat: f32,
        frequency: f32,
        presence: f32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

/// Logit bias and repetition penalties, applied in place to the logits before sampling.
pub struct PenaltyKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl PenaltyKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: gpu.pipelines.get("penalties", "main", &Defines::new()).await? })
    }

    /// Binds processing of `logits` (f32, one row) with room for `capacity` entries (the window
    /// length plus the longest bias list). Starts with no entries (a no-op).
    pub fn bind(&self, gpu: &Gpu, logits: &Tensor, capacity: u32) -> Result<PenaltyBinding, GpuError> {
        if logits.dtype != DType::F32 || logits.is_empty() {
            return Err(GpuError::InvalidArgs(format!(
                "penalties: logits must be a non-empty f32 tensor, got {:?} {:?}",
                logits.dtype, logits.shape
            )));
        }
        let n_vocab =
            u32::try_from(logits.len()).map_err(|_| GpuError::InvalidArgs(format!("penalties: vocabulary of {} entries", logits.len())))?;
        let capacity = capacity.max(1);
        if capacity.div_ceil(PENALTY_WORKGROUP) > gpu.limits.max_compute_workgroups_per_dimension {
            return Err(GpuError::InvalidArgs(format!("penalties: capacity {capacity} is too large")));
        }
        let entry_size = std::mem::size_of::<PenaltyEntry>() as u64;
        let entries = gpu.storage_buffer("penalties.entries", u64::from(capacity) * entry_size)?;
        let uniform = PenaltyUniform { n_vocab, repeat: 1.0, ..Default::default() };
        let params = gpu.uniform_buffer("penalties.params", bytemuck::bytes_of(&uniform));
        let bindings = Bindings::new(gpu, "penalties").buffer(&params).buffer(&entries).tensor(logits);
        let dispatch = bindings.dispatch(&self.pipeline, [capacity.div_ceil(PENALTY_WORKGROUP), 1, 1]);
        Ok(PenaltyBinding { dispatch, params, entries, n_vocab, capacity })
    }
}

pub struct PenaltyBinding {
    dispatch: Dispatch,
    params: wgpu::Buffer,
    entries: wgpu::Buffer,
    n_vocab: u32,
    capacity: u32,
}

impl PenaltyBinding {
    /// Queues the penalties and the entries (at most one per token) for the next submit.
    pub fn write(&self, gpu: &Gpu, penalties: &Penalties, entries: &[PenaltyEntry]) -> Result<(), GpuError> {
        if entries.len() > self.capacity as usize {
            return Err(GpuError::InvalidArgs(format!("penalties: {} entries, the binding holds {}", entries.len(), self.capacity)));
        }
        if !(penalties.repeat > 0.0 && penalties.repeat.is_finite()) {
            return Err(GpuError::InvalidArgs(format!("penalties: repeat penalty must be > 0, got {}", penalties.repeat)));
        }
        let uniform = PenaltyUniform {
            n_vocab: self.n_vocab,
            n_entries: entries.len() as u32,
            repeat: penalties.repeat,
            frequency: penalties.frequency,
            presence: penalties.presence,
            ..Default::default()
        };
        gpu.write(&self.entries, 0, bytemuck::cast_slice(entries));
        gpu.write(&self.params, 0, bytemuck::bytes_of(&uniform));
        Ok(())
    }
}

impl StepOp for PenaltyBinding {
    fn record(&self, rec: &mut Recorder, _step: &StepParams) {
        self.dispatch.record(rec);
    }
}

kestrel_ops::gpu_struct! {
    /// The token mask's uniform (`Params` in shaders/token_mask.wgsl).
    #[derive(Debug, Default)]
    pub(crate) struct TokenMaskUniform as Params {
        n_vocab: u32,
        /// The logit of a token the mask does not allow: -inf.
        banned: f32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// A constrained output's token mask, applied in place to the logits between the penalties and
/// the sampler.
pub struct TokenMaskKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl TokenMaskKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: gpu.pipelines.get("token_mask", "main", &Defines::new()).await? })
    }

    /// Binds masking of `logits` (f32, one row). Starts off: a step records it only while a mask
    /// is set.
    pub fn bind(&self, gpu: &Gpu, logits: &Tensor) -> Result<TokenMaskBinding, GpuError> {
        if logits.dtype != DType::F32 || logits.is_empty() {
            return Err(GpuError::InvalidArgs(format!(
                "token mask: logits must be a non-empty f32 tensor, got {:?} {:?}",
                logits.dtype, logits.shape
            )));
        }
        let n_vocab = u32::try_from(logits.len())
            .map_err(|_| GpuError::InvalidArgs(format!("token mask: vocabulary of {} entries", logits.len())))?;
        let groups = n_vocab.div_ceil(MASK_WORKGROUP);
        if groups > gpu.limits.max_compute_workgroups_per_dimension {
            return Err(GpuError::InvalidArgs(format!("token mask: a vocabulary of {n_vocab} is too large")));
        }
        let words = n_vocab.div_ceil(32);
        let mask = gpu.storage_buffer("token_mask.mask", u64::from(words) * 4)?;
        let uniform = TokenMaskUniform { n_vocab, banned: f32::NEG_INFINITY, ..Default::default() };
        let params = gpu.uniform_buffer("token_mask.params", bytemuck::bytes_of(&uniform));
        let dispatch =
            Bindings::new(gpu, "token_mask").buffer(&params).buffer(&mask).tensor(logits).dispatch(&self.pipeline, [groups, 1, 1]);
        Ok(TokenMaskBinding { dispatch, mask, words: words as usize, active: AtomicBool::new(false) })
    }
}

pub struct TokenMaskBinding {
    dispatch: Dispatch,
    mask: wgpu::Buffer,
    words: usize,
    /// Whether the next submits mask (set between submits, as `SampleBinding`'s greedy flag).
    active: AtomicBool,
}

impl TokenMaskBinding {
    /// Words of a mask: one bit per vocabulary entry.
    pub fn words(&self) -> usize {
        self.words
    }

    /// Queues `mask` (`words()` words, bit `id % 32` of word `id / 32` set for an allowed token)
    /// for the next submits, or turns masking off (None).
    pub fn set(&self, gpu: &Gpu, mask: Option<&[u32]>) -> Result<(), GpuError> {
        if let Some(words) = mask {
            if words.len() != self.words {
                return Err(GpuError::InvalidArgs(format!("token mask: {} words, the vocabulary needs {}", words.len(), self.words)));
            }
            gpu.write(&self.mask, 0, bytemuck::cast_slice(words));
        }
        self.active.store(mask.is_some(), Ordering::Relaxed);
        Ok(())
    }
}

impl StepOp for TokenMaskBinding {
    fn record(&self, rec: &mut Recorder, _step: &StepParams) {
        if self.active.load(Ordering::Relaxed) {
            self.dispatch.record(rec);
        }
    }
}
