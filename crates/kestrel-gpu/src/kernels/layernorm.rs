//! LayerNorm with weight and bias over the rows of an activation tensor
//! (`shaders/layernorm.wgsl`): BERT's embedding and post-sublayer norms.

use std::sync::Arc;

use super::{Bindings, TokenDispatch};
use crate::{Defines, Gpu, GpuError, StepUniform, Tensor};

kestrel_ops::gpu_struct! {
    /// The LayerNorm kernel's uniform (`Params` in `shaders/layernorm.wgsl`).
    pub(crate) struct LayerNormParams as Params {
        n: u32,
        eps: f32,
    }
}

/// `out[t] = (x[t] - mean) / sqrt(var + eps) * weight + bias`, one workgroup per row.
pub struct LayerNormKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
}

/// What a LayerNorm reads and writes: `x` (f32 `[rows, n]`), `weight` and `bias` (f32, `n`
/// values each), `out` (x's shape, another buffer).
pub struct LayerNormOperands<'a> {
    pub x: &'a Tensor,
    pub weight: &'a Tensor,
    pub bias: &'a Tensor,
    pub out: &'a Tensor,
    pub eps: f32,
}

impl LayerNormKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: gpu.pipelines.get("layernorm", "main", &Defines::new()).await? })
    }

    /// Binds a norm of the step's first `n_tokens` rows.
    pub fn bind(&self, gpu: &Gpu, step: &StepUniform, p: &LayerNormOperands) -> Result<TokenDispatch, GpuError> {
        let n = super::check_row_norm("layernorm", p.x, &[("weight", p.weight), ("bias", p.bias)], p.out, p.eps)?;
        let params = LayerNormParams { n: n as u32, eps: p.eps };
        let bindings =
            Bindings::new(gpu, "layernorm").step(step).uniform(&params).tensor(p.x).tensor(p.weight).tensor(p.bias).tensor(p.out);
        Ok(bindings.dispatch_per_token(&self.pipeline, 1, 1))
    }
}
