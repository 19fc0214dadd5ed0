//! RMSNorm over the rows of an activation tensor, and over the heads of a fused QKV row in
//! place (Qwen3's per-head Q/K norm) (`shaders/rmsnorm.wgsl`).

use std::sync::Arc;

use super::{Bindings, TokenDispatch};
use crate::{DType, Defines, Gpu, GpuError, StepUniform, Tensor};

kestrel_ops::gpu_struct! {
    /// The RMSNorm kernels' uniform (`Params` in `shaders/rmsnorm.wgsl`).
    pub(crate) struct RmsNormParams as Params {
        n: u32,
        eps: f32,
        rows_per_token: u32,
        /// Values from one token's first row to the next token's.
        token_stride: u32,
        /// Where a token's first row starts.
        offset: u32,
    }
}

/// `out[t][i] = x[t][i] / sqrt(mean(x[t]^2) + eps) * weight[i]`, one workgroup per row.
pub struct RmsNormKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
}

/// The per-head RMSNorm, in place: `heads` consecutive heads of `head_dim` values, starting at
/// value `offset` of every token's row, each normalized with the same `head_dim` weights.
pub struct HeadNormKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
}

/// Which heads of a row a `HeadNormKernel` normalizes.
#[derive(Clone, Copy, Debug)]
pub struct HeadSpan {
    pub offset: usize,
    pub heads: usize,
    pub head_dim: usize,
}

/// The pipeline of shaders/rmsnorm.wgsl, plain or as its `variant` (ACCUMULATE, IN_PLACE).
async fn pipeline(gpu: &Gpu, variant: Option<&str>) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
    let defines: Defines = variant.map(|v| (v.to_string(), "1".to_string())).into_iter().collect();
    gpu.pipelines.get("rmsnorm", "main", &defines).await
}

impl RmsNormKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: pipeline(gpu, None).await? })
    }

    /// The same norm added into `out` instead of stored (`out += norm(x) * weight`): Gemma's
    /// post-attention and post-FFN norms, added into the hidden state.
    pub async fn accumulating(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: pipeline(gpu, Some("ACCUMULATE")).await? })
    }

    /// Binds `x` (f32, `[rows, n]`: the last dimension is normalized), `weight` (f32, `n` values)
    /// and `out` (same shape as `x`, a different buffer). The row count of a step is
    /// `step.n_tokens`, read by the kernel; the grid is chosen at record time.
    pub fn bind(
        &self,
        gpu: &Gpu,
        step: &StepUniform,
        x: &Tensor,
        weight: &Tensor,
        out: &Tensor,
        eps: f32,
    ) -> Result<TokenDispatch, GpuError> {
        let n = super::check_row_norm("rmsnorm", x, &[("weight", weight)], out, eps)?;
        let params = RmsNormParams { n: n as u32, eps, rows_per_token: 1, token_stride: n as u32, offset: 0 };
        let bindings = Bindings::new(gpu, "rmsnorm").step(step).uniform(&params).tensor(x).tensor(weight).tensor(out);
        Ok(bindings.dispatch_per_token(&self.pipeline, 1, 1))
    }
}

impl HeadNormKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: pipeline(gpu, Some("IN_PLACE")).await? })
    }

    /// Binds `x` (f32 `[rows, width]`), normalizing `span` of each token's row in place with
    /// `weight` (f32, `span.head_dim` values). Tokens `0..step.n_tokens` are normalized.
    pub fn bind(
        &self,
        gpu: &Gpu,
        step: &StepUniform,
        x: &Tensor,
        weight: &Tensor,
        span: HeadSpan,
        eps: f32,
    ) -> Result<TokenDispatch, GpuError> {
        let width = x.shape.last().copied().unwrap_or(0);
        let invalid = |why: String| Err(GpuError::InvalidArgs(format!("head rmsnorm: {why}")));
        if [x.dtype, weight.dtype] != [DType::F32; 2] {
            return invalid("x and weight must be f32".into());
        }
        let HeadSpan { offset, heads, head_dim } = span;
        if head_dim == 0 || heads == 0 || width == 0 || offset + heads * head_dim > width {
            return invalid(format!("{heads} heads of {head_dim} at {offset} do not fit rows of {width}"));
        }
        if weight.len() != head_dim {
            return invalid(format!("weight has {} values, heads have {head_dim}", weight.len()));
        }
        super::check_eps("rmsnorm", eps)?;
        let params =
            RmsNormParams { n: head_dim as u32, eps, rows_per_token: heads as u32, token_stride: width as u32, offset: offset as u32 };
        let bindings = Bindings::new(gpu, "head_rmsnorm").step(step).uniform(&params).tensor(x).tensor(weight);
        // One workgroup per head.
        Ok(bindings.dispatch_per_token(&self.pipeline, heads as u32, 1))
    }
}
