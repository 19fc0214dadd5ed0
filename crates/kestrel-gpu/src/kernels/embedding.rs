//! Embedding gather: the rows of a (quantized) token embedding table for the step's token ids,
//! dequantized on the GPU.

use std::sync::Arc;

use kestrel_gguf::GgmlType;

use super::weights::{check_distinct, check_tensor, check_weight_type, weight_defines, WeightParams};
use super::Bindings;
use crate::{grid, DType, Dispatch, Gpu, GpuError, Recorder, RowShards, StepOp, StepParams, StepUniform, Tensor, WeightTensor};

/// `out[t][:] = table[ids[t]][:]` for the step's `n_tokens` ids; an id >= rows gives zeros.
///
/// Layout: table rows = vocabulary, cols = hidden size; ids u32 `[max_tokens]`, out f32
/// `[max_tokens][cols]` (both may be larger). Binds the step uniform (only `n_tokens` is read).
pub struct EmbeddingKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    ty: GgmlType,
}

/// A bound gather whose grid (one workgroup per token) depends on the step's token count.
pub struct EmbeddingDispatch {
    pub dispatch: Dispatch,
    max_tokens: u32,
    max_per_dim: u32,
}

impl EmbeddingDispatch {
    /// The grid for `n_tokens` ids (clamped to `max_tokens`, as the shader clamps the step's).
    pub fn workgroups(&self, n_tokens: u32) -> [u32; 3] {
        match n_tokens.min(self.max_tokens) {
            0 => [0, 1, 1],
            n => grid(n, self.max_per_dim),
        }
    }
}

impl StepOp for EmbeddingDispatch {
    /// The gather of the step's `n_tokens` ids.
    fn record(&self, rec: &mut Recorder, step: &StepParams) {
        self.dispatch.record_with(rec, self.workgroups(step.n_tokens));
    }
}

impl EmbeddingKernel {
    /// A gather whose rows are multiplied by `scale` (Gemma's sqrt(hidden); 1 elsewhere).
    pub async fn new(gpu: &Gpu, ty: GgmlType, scale: f32) -> Result<Self, GpuError> {
        let mut defines = weight_defines("embedding", ty)?;
        defines.insert("SCALE".into(), super::float_define("embedding", "scale", scale)?);
        Ok(Self { pipeline: gpu.pipelines.get("embedding", "main", &defines).await?, ty })
    }

    pub fn bind(
        &self,
        gpu: &Gpu,
        table: &WeightTensor,
        ids: &Tensor,
        out: &Tensor,
        step: &StepUniform,
        max_tokens: u32,
    ) -> Result<EmbeddingDispatch, GpuError> {
        self.bind_params(gpu, WeightParams::new("embedding", table, max_tokens)?, table, ids, out, step)
    }

    /// The gather from a table split into row shards: one dispatch per shard, each writing the
    /// ids in its rows; record them all.
    pub fn bind_shards(
        &self,
        gpu: &Gpu,
        table: &RowShards,
        ids: &Tensor,
        out: &Tensor,
        step: &StepUniform,
        max_tokens: u32,
    ) -> Result<Vec<EmbeddingDispatch>, GpuError> {
        let total_rows = u32::try_from(table.rows).map_err(|_| GpuError::InvalidArgs(format!("embedding: {} rows", table.rows)))?;
        table
            .shards
            .iter()
            .map(|s| {
                let params = WeightParams::new("embedding", &s.weight, max_tokens)?.for_shard(s.first_row as u32, total_rows);
                self.bind_params(gpu, params, &s.weight, ids, out, step)
            })
            .collect()
    }

    /// The gather from `table` described by `params`, for `params.max_tokens()` ids.
    fn bind_params(
        &self,
        gpu: &Gpu,
        params: WeightParams,
        table: &WeightTensor,
        ids: &Tensor,
        out: &Tensor,
        step: &StepUniform,
    ) -> Result<EmbeddingDispatch, GpuError> {
        let kernel = "embedding";
        check_weight_type(kernel, self.ty, table)?;
        let max_tokens = params.max_tokens();
        if max_tokens == 0 {
            return Err(GpuError::InvalidArgs(format!("{kernel}: max_tokens must be at least 1")));
        }
        let out_len = u64::from(max_tokens) * u64::from(params.cols());
        if out_len > u64::from(u32::MAX) {
            return Err(GpuError::InvalidArgs(format!("{kernel}: {max_tokens} tokens are too many for 32-bit indexing")));
        }
        check_tensor(kernel, "ids", ids, DType::U32, max_tokens.into())?;
        check_tensor(kernel, "out", out, DType::F32, out_len)?;
        check_distinct(kernel, &[("ids", &ids.buffer), ("out", &out.buffer)])?;
        let bindings = Bindings::new(gpu, kernel).uniform(&params).step(step).tensor(ids).tensor(out).buffer(&table.buffer);
        let dispatch = bindings.dispatch_grid(&self.pipeline, max_tokens);
        Ok(EmbeddingDispatch { dispatch, max_tokens, max_per_dim: gpu.limits.max_compute_workgroups_per_dimension })
    }
}
