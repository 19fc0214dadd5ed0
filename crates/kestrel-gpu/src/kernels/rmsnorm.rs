//! RMSNorm over the rows of an activation tensor (`shaders/rmsnorm.wgsl`).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use crate::{grid, DType, Defines, Dispatch, Gpu, GpuError, Recorder, StepUniform, Tensor};

/// Mirrors `Params` in `shaders/rmsnorm.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    eps: f32,
}

/// `out[t][i] = x[t][i] / sqrt(mean(x[t]^2) + eps) * weight[i]`, one workgroup per row.
pub struct RmsNormKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
}

/// An RMSNorm bound to its buffers; normalizes rows `0..n_tokens` when recorded.
pub struct RmsNormDispatch {
    dispatch: Dispatch,
    max_per_dim: u32,
}

impl RmsNormKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: gpu.pipelines.get("rmsnorm", "main", &Defines::new()).await? })
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
    ) -> Result<RmsNormDispatch, GpuError> {
        let n = x.shape.last().copied().unwrap_or(0);
        let invalid = |why: String| Err(GpuError::InvalidArgs(format!("rmsnorm: {why}")));
        if [x.dtype, weight.dtype, out.dtype] != [DType::F32; 3] {
            return invalid("x, weight and out must be f32".into());
        }
        if n == 0 || x.is_empty() {
            return invalid(format!("x has shape {:?}", x.shape));
        }
        if weight.len() != n {
            return invalid(format!("weight has {} values, rows have {n}", weight.len()));
        }
        if out.shape != x.shape {
            return invalid(format!("out shape {:?} differs from x shape {:?}", out.shape, x.shape));
        }
        if out.buffer == x.buffer {
            return invalid("out must be a different buffer than x".into());
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return invalid(format!("eps {eps} must be finite and >= 0"));
        }
        let params = gpu.uniform_buffer("rmsnorm.params", bytemuck::bytes_of(&Params { n: n as u32, eps }));
        let max_per_dim = gpu.limits.max_compute_workgroups_per_dimension;
        let rows = (x.len() / n) as u32;
        let dispatch = Dispatch::new(
            gpu,
            "rmsnorm",
            self.pipeline.clone(),
            &[
                step.buffer.as_entire_binding(),
                params.as_entire_binding(),
                x.buffer.as_entire_binding(),
                weight.buffer.as_entire_binding(),
                out.buffer.as_entire_binding(),
            ],
            grid(rows, max_per_dim),
        );
        Ok(RmsNormDispatch { dispatch, max_per_dim })
    }
}

impl RmsNormDispatch {
    /// The grid for `n_tokens` rows (one workgroup each).
    pub fn workgroups(&self, n_tokens: u32) -> [u32; 3] {
        grid(n_tokens, self.max_per_dim)
    }

    /// Records the normalization of rows `0..n_tokens` (which must equal `step.n_tokens`).
    pub fn record(&self, rec: &mut Recorder, n_tokens: u32) {
        self.dispatch.record_with(rec, self.workgroups(n_tokens));
    }
}
