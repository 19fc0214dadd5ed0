//! Matrix-vector products for decode: `y = W x` with quantized weights, for the one token of a
//! sequence's decode step or the B tokens of a batch of sequences (`columns`), each weight read
//! once for all of them.

use std::sync::Arc;

use kestrel_gguf::GgmlType;
use kestrel_ops::params::GateActivation;

use super::weights::{add_gate_defines, weight_defines, Epilogue, WeightParams};
use super::{Bindings, GateUpOperands, Operands, OutputColumns};
use crate::{Defines, Dispatch, Gpu, GpuError, RowShards, Tensor};

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

/// Checks that x's rows are whole vec4s when the kernel reads more than one of them.
fn check_vec4_rows(kernel: &str, params: &WeightParams, columns: u32) -> Result<(), GpuError> {
    if columns > 1 && !params.cols().is_multiple_of(4) {
        return Err(GpuError::InvalidArgs(format!("{kernel}: rows of {} values are not whole vec4s for {columns} tokens", params.cols())));
    }
    Ok(())
}

/// `y[b][n] = Σ_k W[n][k]·x[b][k]` (+ `bias[n]`, + old `y[b][n]` per the epilogue) for each of
/// `columns` tokens b.
///
/// [`Operands`]: x holds `columns` rows of K values, y token b's outputs at `b * out.stride +
/// out.offset`.
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

    pub fn bind(&self, gpu: &Gpu, p: &Operands) -> Result<Dispatch, GpuError> {
        let kernel = "matvec";
        let params = p.check(kernel, self.ty, self.epilogue, self.columns)?;
        check_vec4_rows(kernel, &params, self.columns)?;
        let bindings = Bindings::new(gpu, kernel).uniform(&params).tensor(p.x).tensor(p.y).buffer(&p.w.buffer).optional(p.bias);
        Ok(bindings.dispatch_grid(&self.pipeline, matvec_groups(&params, self.rows_per_thread)))
    }

    /// `bind` for a matrix split into row shards (a vocabulary-sized LM head): one dispatch per
    /// shard, each writing its rows' outputs to their place in `y`; record them all.
    pub fn bind_shards(&self, gpu: &Gpu, w: &RowShards, x: &Tensor, y: &Tensor) -> Result<Vec<Dispatch>, GpuError> {
        let total_rows = u32::try_from(w.rows).map_err(|_| GpuError::InvalidArgs(format!("matvec: {} rows", w.rows)))?;
        w.shards
            .iter()
            .map(|s| {
                let out = OutputColumns { offset: s.first_row as u32, stride: total_rows };
                self.bind(gpu, &Operands { out, ..Operands::whole(&s.weight, x, y, None) })
            })
            .collect()
    }
}

/// The fused gate/up projection of a gated FFN (SwiGLU, or GeGLU) for each of `columns` tokens:
/// `out[b][n] = act(Wg[n]·x[b]) * (Wu[n]·x[b])` (`params::GateActivation`, [`GateUpOperands`]).
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

    pub fn bind(&self, gpu: &Gpu, p: &GateUpOperands) -> Result<Dispatch, GpuError> {
        let kernel = "swiglu matvec";
        let params = p.check(kernel, self.ty, self.columns)?;
        check_vec4_rows(kernel, &params, self.columns)?;
        let bindings = Bindings::new(gpu, kernel).uniform(&params).tensor(p.x).tensor(p.out).buffer(&p.gate.buffer).buffer(&p.up.buffer);
        Ok(bindings.dispatch_grid(&self.pipeline, matvec_groups(&params, self.rows_per_thread)))
    }
}
