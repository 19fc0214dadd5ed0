//! Tiled matrix-matrix products for prefill: `y = x·Wᵀ` for a chunk of tokens, the token count
//! read from the step uniform so one bind serves every chunk length up to `max_tokens`.

use std::sync::Arc;

use kestrel_gguf::GgmlType;
use kestrel_ops::params::GateActivation;

use super::weights::{add_gate_defines, weight_defines, Epilogue, WeightParams};
use super::{Bindings, GateUpOperands, Operands};
use crate::preprocess::Defines;
use crate::{Dispatch, Gpu, GpuError, Recorder, StepOp, StepParams, StepUniform};

/// Tokens per workgroup tile (shaders/matmul.wgsl `BM`).
const TILE_TOKENS: u32 = 64;
/// Output features per workgroup tile (`BN`): narrower for SwiGLU, which stages two weight tiles.
const TILE_FEATURES: u32 = 64;
const TILE_FEATURES_SWIGLU: u32 = 32;

/// The weight type's defines, and SHARE_X where the device's subgroups have at least the 8 lanes
/// of a token group (shaders/matmul.wgsl).
fn matmul_defines(gpu: &Gpu, kernel: &str, ty: GgmlType) -> Result<Defines, GpuError> {
    let mut defines = weight_defines(kernel, ty)?;
    let share_x = gpu.features.subgroups && gpu.features.subgroup_min_size >= 8;
    defines.insert("SHARE_X".into(), if share_x { "1" } else { "0" }.into());
    Ok(defines)
}

/// A bound matmul whose grid depends on the step's token count.
pub struct MatmulDispatch {
    pub dispatch: Dispatch,
    feature_tiles: u32,
    max_tokens: u32,
}

impl MatmulDispatch {
    /// The grid for a chunk of `n_tokens` (clamped to the `max_tokens` the buffers were bound
    /// for; the shader clamps the step's count the same way): token tiles in x, feature tiles in
    /// y (shaders/matmul.wgsl says why). 0 tokens records nothing.
    pub fn workgroups(&self, n_tokens: u32) -> [u32; 3] {
        [n_tokens.min(self.max_tokens).div_ceil(TILE_TOKENS), self.feature_tiles, 1]
    }
}

impl StepOp for MatmulDispatch {
    /// The product for the step's chunk of `n_tokens`.
    fn record(&self, rec: &mut Recorder, step: &StepParams) {
        self.dispatch.record_with(rec, self.workgroups(step.n_tokens));
    }
}

/// `y[m][n] = Σ_k x[m][k]·W[n][k]` (+ `bias[n]`, + old `y[m][n]` per the epilogue) for the
/// step's `n_tokens` rows m.
///
/// Layout: x is f32 row-major `[max_tokens][K]`, y f32 `[max_tokens][N]` (both may be larger),
/// bias f32 `[N]`. Binds the step uniform (only `n_tokens` is read).
pub struct MatmulKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    ty: GgmlType,
    epilogue: Epilogue,
}

impl MatmulKernel {
    pub async fn new(gpu: &Gpu, ty: GgmlType, epilogue: Epilogue) -> Result<Self, GpuError> {
        let mut defines = matmul_defines(gpu, "matmul", ty)?;
        epilogue.add_defines(&mut defines);
        Ok(Self { pipeline: gpu.pipelines.get("matmul", "main", &defines).await?, ty, epilogue })
    }

    /// Binds the product of [`Operands`] whose x and y hold `max_tokens` rows; each step computes
    /// its first `n_tokens`.
    pub fn bind(&self, gpu: &Gpu, p: &Operands, step: &StepUniform, max_tokens: u32) -> Result<MatmulDispatch, GpuError> {
        let kernel = "matmul";
        let params = p.check(kernel, self.ty, self.epilogue, max_tokens)?;
        let bindings = Bindings::new(gpu, kernel).uniform(&params).step(step).tensor(p.x).tensor(p.y).buffer(&p.w.buffer).optional(p.bias);
        bind_tiled(gpu, kernel, bindings, &self.pipeline, &params, TILE_FEATURES)
    }
}

/// The fused gate/up projection of a SwiGLU FFN for a chunk of tokens:
/// `out[m][n] = silu(x[m]·Wg[n]) * (x[m]·Wu[n])` ([`GateUpOperands`]).
pub struct SwigluMatmulKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    ty: GgmlType,
}

impl SwigluMatmulKernel {
    pub async fn new(gpu: &Gpu, ty: GgmlType, act: GateActivation) -> Result<Self, GpuError> {
        let mut defines = matmul_defines(gpu, "swiglu matmul", ty)?;
        add_gate_defines(&mut defines, act);
        Ok(Self { pipeline: gpu.pipelines.get("matmul", "main", &defines).await?, ty })
    }

    /// Binds the product of [`GateUpOperands`] whose x and out hold `max_tokens` rows.
    pub fn bind(&self, gpu: &Gpu, p: &GateUpOperands, step: &StepUniform, max_tokens: u32) -> Result<MatmulDispatch, GpuError> {
        let kernel = "swiglu matmul";
        let params = p.check(kernel, self.ty, max_tokens)?;
        let bindings =
            Bindings::new(gpu, kernel).uniform(&params).step(step).tensor(p.x).tensor(p.out).buffer(&p.gate.buffer).buffer(&p.up.buffer);
        bind_tiled(gpu, kernel, bindings, &self.pipeline, &params, TILE_FEATURES_SWIGLU)
    }
}

/// The dispatch of a tiled product: token tiles in x (trimmed to the step's at record time),
/// `tile_features` output features per workgroup in y.
fn bind_tiled(
    gpu: &Gpu,
    kernel: &str,
    bindings: Bindings,
    pipeline: &Arc<wgpu::ComputePipeline>,
    params: &WeightParams,
    tile_features: u32,
) -> Result<MatmulDispatch, GpuError> {
    let feature_tiles = params.rows().div_ceil(tile_features);
    let max_per_dim = gpu.limits.max_compute_workgroups_per_dimension;
    if feature_tiles > max_per_dim {
        return Err(GpuError::InvalidArgs(format!(
            "{kernel}: {} output features need {feature_tiles} workgroups, the device allows {max_per_dim} (shard it)",
            params.rows()
        )));
    }
    let max_tokens = params.max_tokens();
    let dispatch = bindings.dispatch(pipeline, [max_tokens.div_ceil(TILE_TOKENS), feature_tiles, 1]);
    Ok(MatmulDispatch { dispatch, feature_tiles, max_tokens })
}
