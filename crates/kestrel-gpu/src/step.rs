//! The per-step uniform shared by every kernel whose work depends on where in the sequence it
//! runs. Written once before each submit; everything else a kernel needs is fixed at bind time.

use crate::{DType, Gpu, GpuError, Recorder, Tensor};

kestrel_ops::gpu_struct! {
    /// The per-step values, shared by every kernel that depends on the position in the
    /// sequence: `struct Step` in WGSL, which a shader gets with `#include "StepParams"` and binds
    /// as `var<uniform> step: Step` at the binding its kernel's Rust side documents.
    #[derive(Debug, Default, PartialEq, Eq)]
    pub struct StepParams as Step {
        /// Tokens processed in this step (1 for decode, the chunk length for prefill).
        pub n_tokens: u32,
        /// Position of the first of those tokens in the sequence.
        pub pos: u32,
        /// Valid KV cache length after this step: `pos + n_tokens`.
        pub kv_len: u32,
        /// Number of this step's random draw: the sampler hashes it with the request's seed, so
        /// successive steps draw different values.
        pub draw: u32,
    }
}

impl StepParams {
    pub fn new(n_tokens: u32, pos: u32, draw: u32) -> Self {
        Self { n_tokens, pos, kv_len: pos + n_tokens, draw }
    }
}

/// The uniform buffer holding [`StepParams`], bound by every kernel that reads them.
pub struct StepUniform {
    pub buffer: wgpu::Buffer,
}

impl StepUniform {
    pub fn new(gpu: &Gpu) -> Self {
        Self { buffer: gpu.uniform_buffer("step", bytemuck::bytes_of(&StepParams::default())) }
    }

    /// Queues the new values; they take effect for the next submit.
    pub fn write(&self, gpu: &Gpu, params: &StepParams) {
        gpu.write(&self.buffer, 0, bytemuck::bytes_of(params));
    }
}

/// A prepared part of a forward step that records itself from that step's parameters: the same
/// values written to the [`StepUniform`] before the submit, so a grid sized by the chunk length
/// or the KV length always agrees with what the shaders read. Kernels with a fixed grid ignore
/// them. A model builds its step as a list of these once, at load.
pub trait StepOp: wgpu::WasmNotSendSync {
    fn record(&self, rec: &mut Recorder, step: &StepParams);
}

/// Where each token of a step belongs: its sequence's KV slot and its position there, as
/// `(slot, position)` u32 pairs (`rows` in shaders/rope.wgsl and shaders/attention.wgsl). A
/// prompt chunk is one slot's consecutive positions; a batched decode step has one token per
/// sequence. Written before each submit, with the step uniform.
pub struct StepRows {
    pub tensor: Tensor,
}

impl StepRows {
    /// Room for `max_tokens` tokens.
    pub fn new(gpu: &Gpu, max_tokens: usize) -> Result<Self, GpuError> {
        Ok(Self { tensor: Tensor::zeros(gpu, "step.rows", &[max_tokens, 2], DType::U32)? })
    }

    /// Tokens it has room for.
    pub fn capacity(&self) -> usize {
        self.tensor.len() / 2
    }

    /// Queues the rows of a step's tokens; they take effect for the next submit.
    pub fn write(&self, gpu: &Gpu, rows: &[[u32; 2]]) -> Result<(), GpuError> {
        if rows.len() > self.capacity() {
            return Err(GpuError::InvalidArgs(format!("{} step rows, room for {}", rows.len(), self.capacity())));
        }
        gpu.write(&self.tensor.buffer, 0, bytemuck::cast_slice(rows));
        Ok(())
    }

    /// Queues `n` consecutive positions from `pos` of one slot (a prompt chunk, or one token).
    pub fn write_run(&self, gpu: &Gpu, slot: u32, pos: u32, n: u32) -> Result<(), GpuError> {
        let rows: Vec<[u32; 2]> = (pos..pos + n).map(|p| [slot, p]).collect();
        self.write(gpu, &rows)
    }

    /// Checks that it holds at least `tokens` rows, for `kernel`.
    pub(crate) fn check(&self, kernel: &str, tokens: usize) -> Result<(), GpuError> {
        if self.tensor.dtype != DType::U32 || self.capacity() < tokens {
            return Err(GpuError::InvalidArgs(format!("{kernel}: step rows for {} tokens, {tokens} needed", self.capacity())));
        }
        Ok(())
    }
}
