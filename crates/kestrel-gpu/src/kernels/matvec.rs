//! Matrix-vector products for decode: `y = W x` with quantized weights, for the one token of a
//! sequence's decode step or the B tokens of a batch of sequences (`columns`), each weight read
//! once for all of them.

use std::sync::Arc;

use kestrel_gguf::GgmlType;
use kestrel_ops::params::GateActivation;

use super::weights::{
    add_gate_defines, check_bias, check_distinct, check_same_layout, check_tensor, check_weight_type, weight_defines, Epilogue,
    OutputColumns, WeightParams,
};
use crate::{grid, DType, Defines, Dispatch, Gpu, GpuError, RowShards, Tensor, WeightTensor};

/// Lanes of each slice of a matvec workgroup (`LANES` in shaders/matvec.wgsl).
const MATVEC_LANES: u32 = 64;

/// Workgroups a matvec over `params`' weights dispatches, each thread computing
/// `rows_per_thread` rows.
fn matvec_groups(params: &WeightParams, rows_per_thread: u32) -> u32 {
    params.rows().div_ceil(MATVEC_LANES * rows_per_thread)
}

/// The most tokens one batched matvec computes (`COLUMNS` in the shader): the accumulators of
/// every token live in registers.
pub const MAX_MATVEC_COLUMNS: u32 = 16;

/// The weight types whose matvec threads compute at most [`WIDE_UNIT_MAX_ROWS`] rows.
///
/// A thread keeps each of its rows' block state live across the block's 4 units: the scale pair
/// for every type, and also the plane words for the types with high bits (Q5_0, Q5_1, Q5_K,
/// Q6_K; Q6_K also a second scale pair), while a dense unit is itself 4 or 8 words (F16, F32).
/// With 8 rows, those no longer fit in the registers: on lavapipe these types ran about 2x
/// slower with 8 rows per thread than with 4, where Q4_0, Q4_1, Q8_0 and Q4_K (no high bits) are
/// fastest with 8 (`kestrel bench kernels --matvec 1,8` against `1,4` at 1B shapes).
pub const WIDE_UNIT_TYPES: [GgmlType; 6] = [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F16, GgmlType::F32];

/// Rows per thread for [`WIDE_UNIT_TYPES`] at most.
pub const WIDE_UNIT_MAX_ROWS: u32 = 4;

/// Rows per thread of a [`WIDE_UNIT_TYPES`] matvec where the adapter's variant gives
/// `rows_per_thread`.
pub fn wide_unit_rows(rows_per_thread: u32) -> u32 {
    rows_per_thread.min(WIDE_UNIT_MAX_ROWS)
}

/// Rows per thread of a matvec over `ty` weights on `gpu` for `columns` tokens: the device's
/// variant, capped for the types with wide units, halved for the fused SwiGLU product, which
/// reads two matrices per row, and divided by the tokens (the same registers for the
/// accumulators and scales).
fn matvec_rows_per_thread(gpu: &Gpu, ty: GgmlType, swiglu: bool, columns: u32) -> u32 {
    let rows = gpu.info.kernels.matvec.rows_per_thread;
    let rows = if WIDE_UNIT_TYPES.contains(&ty) { wide_unit_rows(rows) } else { rows };
    let rows = if swiglu { rows / 2 } else { rows };
    (rows / columns).max(1)
}

/// `weight_defines` plus the device's matvec variant: SLICES threads per row (SLICED when more
/// than one, which adds the reduction), ROWS_PER_THREAD rows each, COLUMNS tokens.
fn matvec_defines(gpu: &Gpu, kernel: &str, ty: GgmlType, rows_per_thread: u32, columns: u32) -> Result<Defines, GpuError> {
    if !(1..=MAX_MATVEC_COLUMNS).contains(&columns) {
        return Err(GpuError::InvalidArgs(format!("{kernel}: {columns} tokens (1 to {MAX_MATVEC_COLUMNS})")));
    }
    let mut defines = weight_defines(kernel, ty)?;
    let slices = gpu.info.kernels.matvec.slices;
    defines.insert("SLICES".into(), slices.to_string());
    defines.insert("ROWS_PER_THREAD".into(), rows_per_thread.to_string());
    defines.insert("COLUMNS".into(), columns.to_string());
    if slices > 1 {
        defines.insert("SLICED".into(), "1".into());
    }
    if columns > 1 {
        defines.insert("BATCHED".into(), "1".into());
    }
    Ok(defines)
}

/// Checks x (`columns` rows of the weights' K values, whole vec4s per row when more than one) and
/// returns the weight parameters.
fn check_input(kernel: &str, w: &WeightTensor, x: &Tensor, columns: u32) -> Result<WeightParams, GpuError> {
    let params = WeightParams::new(kernel, w, columns)?;
    if columns > 1 && !params.cols().is_multiple_of(4) {
        return Err(GpuError::InvalidArgs(format!("{kernel}: rows of {} values are not whole vec4s for {columns} tokens", params.cols())));
    }
    check_tensor(kernel, "x", x, DType::F32, u64::from(params.cols()) * u64::from(columns))?;
    Ok(params)
}

/// `y[b][n] = Σ_k W[n][k]·x[b][k]` (+ `bias[n]`, + old `y[b][n]` per the epilogue) for each of
/// `columns` tokens b.
///
/// Bindings built by [`MatvecKernel::bind`]: x (f32, >= columns * K values), y (f32, token b's
/// outputs at `b * out.stride + out.offset`), bias (f32, >= N values, only with `Epilogue::bias`).
pub struct MatvecKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    ty: GgmlType,
    epilogue: Epilogue,
    rows_per_thread: u32,
    columns: u32,
}

impl MatvecKernel {
    /// The one-token product.
    pub async fn new(gpu: &Gpu, ty: GgmlType, epilogue: Epilogue) -> Result<Self, GpuError> {
        Self::build(gpu, ty, epilogue, None, 1).await
    }

    /// The product over `columns` tokens (1 to `MAX_MATVEC_COLUMNS`).
    pub async fn batched(gpu: &Gpu, ty: GgmlType, epilogue: Epilogue, columns: u32) -> Result<Self, GpuError> {
        Self::build(gpu, ty, epilogue, None, columns).await
    }

    /// The LM head of a model with a final soft cap (Gemma 2: 30): `y = cap * tanh(x·Wᵀ / cap)`.
    pub async fn soft_capped(gpu: &Gpu, ty: GgmlType, cap: f32, columns: u32) -> Result<Self, GpuError> {
        Self::build(gpu, ty, Epilogue::NONE, Some(cap), columns).await
    }

    async fn build(gpu: &Gpu, ty: GgmlType, epilogue: Epilogue, softcap: Option<f32>, columns: u32) -> Result<Self, GpuError> {
        let rows_per_thread = matvec_rows_per_thread(gpu, ty, false, columns);
        let mut defines = matvec_defines(gpu, "matvec", ty, rows_per_thread, columns)?;
        epilogue.add_defines(&mut defines);
        if let Some(cap) = softcap {
            defines.insert("SOFTCAP".into(), super::float_define("matvec", "soft cap", cap)?);
        }
        Ok(Self { pipeline: gpu.pipelines.get("matvec", "main", &defines).await?, ty, epilogue, rows_per_thread, columns })
    }

    pub fn bind(&self, gpu: &Gpu, w: &WeightTensor, x: &Tensor, y: &Tensor, bias: Option<&Tensor>) -> Result<Dispatch, GpuError> {
        self.bind_columns(gpu, w, x, y, OutputColumns::whole(w.rows as u32), bias)
    }

    /// `bind`, writing token b's N outputs to `y[b * out.stride + out.offset ..]`.
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
        let params = check_input(kernel, w, x, self.columns)?.with_output(out);
        check_tensor(kernel, "y", y, DType::F32, out.needed_len(kernel, params.rows(), self.columns)?)?;
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

/// The fused gate/up projection of a gated FFN (SwiGLU, or GeGLU) for each of `columns` tokens:
/// `out[b][n] = act(Wg[n]·x[b]) * (Wu[n]·x[b])` (`params::GateActivation`); `Wg`, `Wu` of the
/// same type and shape (N x K), x f32 (>= columns * K values), out f32 (>= columns * N values).
pub struct SwigluMatvecKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    ty: GgmlType,
    rows_per_thread: u32,
    columns: u32,
}

impl SwigluMatvecKernel {
    /// The one-token product.
    pub async fn new(gpu: &Gpu, ty: GgmlType, act: GateActivation) -> Result<Self, GpuError> {
        Self::batched(gpu, ty, act, 1).await
    }

    /// The product over `columns` tokens (1 to `MAX_MATVEC_COLUMNS`).
    pub async fn batched(gpu: &Gpu, ty: GgmlType, act: GateActivation, columns: u32) -> Result<Self, GpuError> {
        let rows_per_thread = matvec_rows_per_thread(gpu, ty, true, columns);
        let mut defines = matvec_defines(gpu, "swiglu matvec", ty, rows_per_thread, columns)?;
        add_gate_defines(&mut defines, act);
        Ok(Self { pipeline: gpu.pipelines.get("matvec", "main", &defines).await?, ty, rows_per_thread, columns })
    }

    pub fn bind(&self, gpu: &Gpu, gate: &WeightTensor, up: &WeightTensor, x: &Tensor, out: &Tensor) -> Result<Dispatch, GpuError> {
        let kernel = "swiglu matvec";
        check_weight_type(kernel, self.ty, gate)?;
        check_same_layout(kernel, gate, up)?;
        let params = check_input(kernel, gate, x, self.columns)?;
        check_tensor(kernel, "out", out, DType::F32, u64::from(params.rows()) * u64::from(self.columns))?;
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
