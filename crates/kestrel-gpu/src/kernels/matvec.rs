//! Matrix-vector products for decode (one token): `y = W x` with quantized weights.

use std::sync::Arc;

use kestrel_gguf::GgmlType;

use super::weights::{
    add_gate_defines, check_bias, check_distinct, check_same_layout, check_tensor, check_weight_type, weight_defines, Epilogue,
    OutputColumns, WeightParams,
};
use crate::params::GateActivation;
use crate::{grid, DType, Defines, Dispatch, Gpu, GpuError, RowShards, Tensor, WeightTensor};

/// Lanes of each slice of a matvec workgroup (`LANES` in shaders/matvec.wgsl).
const MATVEC_LANES: u32 = 64;

/// Workgroups a matvec over `params`' weights dispatches, each thread computing
/// `rows_per_thread` rows.
fn matvec_groups(params: &WeightParams, rows_per_thread: u32) -> u32 {
    params.rows().div_ceil(MATVEC_LANES * rows_per_thread)
}

/// Rows per thread of a matvec on `gpu`: the device's variant, halved for the fused SwiGLU
/// product, which reads two matrices per row (the same registers for its accumulators and scales).
fn matvec_rows_per_thread(gpu: &Gpu, swiglu: bool) -> u32 {
    let rows = gpu.info.kernels.matvec.rows_per_thread;
    if swiglu {
        (rows / 2).max(1)
    } else {
        rows
    }
}

/// `weight_defines` plus the device's matvec variant: SLICES threads per row (SLICED when more
/// than one, which adds the reduction), ROWS_PER_THREAD rows each.
fn matvec_defines(gpu: &Gpu, kernel: &str, ty: GgmlType, rows_per_thread: u32) -> Result<Defines, GpuError> {
    let mut defines = weight_defines(kernel, ty)?;
    let slices = gpu.info.kernels.matvec.slices;
    defines.insert("SLICES".into(), slices.to_string());
    defines.insert("ROWS_PER_THREAD".into(), rows_per_thread.to_string());
    if slices > 1 {
        defines.insert("SLICED".into(), "1".into());
    }
    Ok(defines)
}

/// `y[n] = Σ_k W[n][k]·x[k]` (+ `bias[n]`, + old `y[n]` per the epilogue) for one token.
///
/// Bindings built by [`MatvecKernel::bind`]: x (f32, >= K values), y (f32, >= N values, may be
/// larger), bias (f32, >= N values, only with `Epilogue::bias`).
pub struct MatvecKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    ty: GgmlType,
    epilogue: Epilogue,
    rows_per_thread: u32,
}

impl MatvecKernel {
    pub async fn new(gpu: &Gpu, ty: GgmlType, epilogue: Epilogue) -> Result<Self, GpuError> {
        Self::build(gpu, ty, epilogue, None).await
    }

    /// The LM head of a model with a final soft cap (Gemma 2: 30): `y = cap * tanh(x·Wᵀ / cap)`.
    pub async fn soft_capped(gpu: &Gpu, ty: GgmlType, cap: f32) -> Result<Self, GpuError> {
        Self::build(gpu, ty, Epilogue::NONE, Some(cap)).await
    }

    async fn build(gpu: &Gpu, ty: GgmlType, epilogue: Epilogue, softcap: Option<f32>) -> Result<Self, GpuError> {
        let rows_per_thread = matvec_rows_per_thread(gpu, false);
        let mut defines = matvec_defines(gpu, "matvec", ty, rows_per_thread)?;
        epilogue.add_defines(&mut defines);
        if let Some(cap) = softcap {
            defines.insert("SOFTCAP".into(), super::float_define("matvec", "soft cap", cap)?);
        }
        Ok(Self { pipeline: gpu.pipelines.get("matvec", "main", &defines).await?, ty, epilogue, rows_per_thread })
    }

    pub fn bind(&self, gpu: &Gpu, w: &WeightTensor, x: &Tensor, y: &Tensor, bias: Option<&Tensor>) -> Result<Dispatch, GpuError> {
        self.bind_columns(gpu, w, x, y, OutputColumns::whole(w.rows as u32), bias)
    }

    /// `bind`, writing the N outputs to `y[out.offset ..]` (`out.stride` is unused: one token).
    pub fn bind_columns(
        &self,
        gpu: &Gpu,
        w: &WeightTensor,
        x: &Tensor,
        y: &Tensor,
        out: OutputColumns,
        bias: Option<&Tensor>,
    ) -> Result<Dispatch, GpuError> {
        let kernel = "matvec";
        check_weight_type(kernel, self.ty, w)?;
        let params = WeightParams::new(kernel, w, 1)?.with_output(out);
        check_tensor(kernel, "x", x, DType::F32, params.cols().into())?;
        check_tensor(kernel, "y", y, DType::F32, out.needed_len(kernel, params.rows(), 1)?)?;
        check_distinct(kernel, &[("x", &x.buffer), ("y", &y.buffer)])?;
        let uniform = params.uniform(gpu, "matvec.params");
        let mut resources =
            vec![uniform.as_entire_binding(), x.buffer.as_entire_binding(), y.buffer.as_entire_binding(), w.buffer.as_entire_binding()];
        if let Some(b) = check_bias(kernel, self.epilogue, bias, params.rows(), y)? {
            resources.push(b.buffer.as_entire_binding());
        }
        let workgroups = grid(matvec_groups(&params, self.rows_per_thread), gpu.limits.max_compute_workgroups_per_dimension);
        Ok(Dispatch::new(gpu, kernel, self.pipeline.clone(), &resources, workgroups))
    }

    /// `bind` for a matrix split into row shards (a vocabulary-sized LM head): one dispatch per
    /// shard, each writing its rows' outputs to their place in `y`; record them all.
    pub fn bind_shards(&self, gpu: &Gpu, w: &RowShards, x: &Tensor, y: &Tensor) -> Result<Vec<Dispatch>, GpuError> {
        let total_rows = u32::try_from(w.rows).map_err(|_| GpuError::InvalidArgs(format!("matvec: {} rows", w.rows)))?;
        w.shards
            .iter()
            .map(|s| {
                let out = OutputColumns { offset: s.first_row as u32, stride: total_rows };
                self.bind_columns(gpu, &s.weight, x, y, out, None)
            })
            .collect()
    }
}

/// The fused gate/up projection of a gated FFN (SwiGLU, or GeGLU) for one token:
/// `out[n] = act(Wg[n]·x) * (Wu[n]·x)` (`params::GateActivation`); `Wg`, `Wu` of the
/// same type and shape (N x K), x f32 (>= K values), out f32 (>= N values).
pub struct SwigluMatvecKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    ty: GgmlType,
    rows_per_thread: u32,
}

impl SwigluMatvecKernel {
    pub async fn new(gpu: &Gpu, ty: GgmlType, act: GateActivation) -> Result<Self, GpuError> {
        let rows_per_thread = matvec_rows_per_thread(gpu, true);
        let mut defines = matvec_defines(gpu, "swiglu matvec", ty, rows_per_thread)?;
        add_gate_defines(&mut defines, act);
        Ok(Self { pipeline: gpu.pipelines.get("matvec", "main", &defines).await?, ty, rows_per_thread })
    }

    pub fn bind(&self, gpu: &Gpu, gate: &WeightTensor, up: &WeightTensor, x: &Tensor, out: &Tensor) -> Result<Dispatch, GpuError> {
        let kernel = "swiglu matvec";
        check_weight_type(kernel, self.ty, gate)?;
        check_same_layout(kernel, gate, up)?;
        let params = WeightParams::new(kernel, gate, 1)?;
        check_tensor(kernel, "x", x, DType::F32, params.cols().into())?;
        check_tensor(kernel, "out", out, DType::F32, params.rows().into())?;
        check_distinct(kernel, &[("x", &x.buffer), ("out", &out.buffer)])?;
        let uniform = params.uniform(gpu, "swiglu_matvec.params");
        let workgroups = grid(matvec_groups(&params, self.rows_per_thread), gpu.limits.max_compute_workgroups_per_dimension);
        Ok(Dispatch::new(
            gpu,
            kernel,
            self.pipeline.clone(),
            &[
                uniform.as_entire_binding(),
                x.buffer.as_entire_binding(),
                out.buffer.as_entire_binding(),
                gate.buffer.as_entire_binding(),
                up.buffer.as_entire_binding(),
            ],
            workgroups,
        ))
    }
}
