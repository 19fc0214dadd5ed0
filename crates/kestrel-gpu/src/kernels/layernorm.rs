//! LayerNorm with weight and bias over the rows of an activation tensor
//! (`shaders/layernorm.wgsl`): BERT's embedding and post-sublayer norms.

use std::sync::Arc;

use crate::{grid, Defines, Dispatch, Gpu, GpuError, Recorder, StepOp, StepParams, StepUniform, Tensor};

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

/// A LayerNorm bound to its buffers; normalizes rows `0..n_tokens` of the step when recorded.
pub struct LayerNormDispatch {
    dispatch: Dispatch,
    max_per_dim: u32,
}

impl LayerNormKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: gpu.pipelines.get("layernorm", "main", &Defines::new()).await? })
    }

    /// Binds `x` (f32 `[rows, n]`), `weight` and `bias` (f32, `n` values each) and `out` (x's
    /// shape, another buffer).
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        gpu: &Gpu,
        step: &StepUniform,
        x: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        out: &Tensor,
        eps: f32,
    ) -> Result<LayerNormDispatch, GpuError> {
        let n = super::check_row_norm("layernorm", x, &[("weight", weight), ("bias", bias)], out, eps)?;
        let params = LayerNormParams { n: n as u32, eps };
        let uniform = gpu.uniform_buffer("layernorm.params", bytemuck::bytes_of(&params));
        let resources = [
            step.buffer.as_entire_binding(),
            uniform.as_entire_binding(),
            x.buffer.as_entire_binding(),
            weight.buffer.as_entire_binding(),
            bias.buffer.as_entire_binding(),
            out.buffer.as_entire_binding(),
        ];
        let max_per_dim = gpu.limits.max_compute_workgroups_per_dimension;
        let rows = (x.len() / n) as u32;
        let dispatch = Dispatch::new(gpu, "layernorm", self.pipeline.clone(), &resources, grid(rows, max_per_dim));
        Ok(LayerNormDispatch { dispatch, max_per_dim })
    }
}

impl StepOp for LayerNormDispatch {
    /// One workgroup per row of the step's `n_tokens`.
    fn record(&self, rec: &mut Recorder, step: &StepParams) {
        self.dispatch.record_with(rec, grid(step.n_tokens, self.max_per_dim));
    }
}
