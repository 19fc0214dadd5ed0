//! Tiled matrix-matrix products for prefill: `y = x·Wᵀ` for a chunk of tokens, the token count
//! read from the step uniform so one bind serves every chunk length up to `max_tokens`.

use std::sync::Arc;

use kestrel_gguf::GgmlType;
use kestrel_ops::params::GateActivation;

use super::weights::{
    add_gate_defines, check_bias, check_distinct, check_same_layout, check_tensor, check_weight_type, weight_defines, Epilogue,
    OutputColumns, WeightParams,
};
use crate::preprocess::Defines;
use crate::{DType, Dispatch, Gpu, GpuError, Recorder, StepOp, StepParams, StepUniform, Tensor, WeightTensor};

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

    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        gpu: &Gpu,
        w: &WeightTensor,
        x: &Tensor,
        y: &Tensor,
        bias: Option<&Tensor>,
        step: &StepUniform,
        max_tokens: u32,
    ) -> Result<MatmulDispatch, GpuError> {
        self.bind_columns(gpu, w, x, y, OutputColumns::whole(w.rows as u32), bias, step, max_tokens)
    }

    /// `bind`, writing token m's N outputs to `y[m * out.stride + out.offset ..]`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_columns(
        &self,
        gpu: &Gpu,
        w: &WeightTensor,
        x: &Tensor,
        y: &Tensor,
        out: OutputColumns,
        bias: Option<&Tensor>,
        step: &StepUniform,
        max_tokens: u32,
    ) -> Result<MatmulDispatch, GpuError> {
        let kernel = "matmul";
        check_weight_type(kernel, self.ty, w)?;
        let params = WeightParams::new(kernel, w, max_tokens)?.with_output(out);
        check_activations(kernel, &params, x, y, out, max_tokens)?;
        let uniform = params.uniform(gpu, "matmul.params");
        let mut resources = vec![
            uniform.as_entire_binding(),
            step.buffer.as_entire_binding(),
            x.buffer.as_entire_binding(),
            y.buffer.as_entire_binding(),
            w.buffer.as_entire_binding(),
        ];
        if let Some(b) = check_bias(kernel, self.epilogue, bias, params.rows(), y)? {
            resources.push(b.buffer.as_entire_binding());
        }
        bind_tiled(gpu, kernel, &self.pipeline, &resources, &params, TILE_FEATURES)
    }
}

/// The fused gate/up projection of a SwiGLU FFN for a chunk of tokens:
/// `out[m][n] = silu(x[m]·Wg[n]) * (x[m]·Wu[n])`, `Wg`, `Wu` of the same type and shape (N x K);
/// x f32 `[max_tokens][K]`, out f32 `[max_tokens][N]`.
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

    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        gpu: &Gpu,
        gate: &WeightTensor,
        up: &WeightTensor,
        x: &Tensor,
        out: &Tensor,
        step: &StepUniform,
        max_tokens: u32,
    ) -> Result<MatmulDispatch, GpuError> {
        let kernel = "swiglu matmul";
        check_weight_type(kernel, self.ty, gate)?;
        check_same_layout(kernel, gate, up)?;
        let params = WeightParams::new(kernel, gate, max_tokens)?;
        check_activations(kernel, &params, x, out, OutputColumns::whole(params.rows()), max_tokens)?;
        let uniform = params.uniform(gpu, "swiglu_matmul.params");
        let resources = [
            uniform.as_entire_binding(),
            step.buffer.as_entire_binding(),
            x.buffer.as_entire_binding(),
            out.buffer.as_entire_binding(),
            gate.buffer.as_entire_binding(),
            up.buffer.as_entire_binding(),
        ];
        bind_tiled(gpu, kernel, &self.pipeline, &resources, &params, TILE_FEATURES_SWIGLU)
    }
}

/// Checks that x holds `max_tokens` rows of K and y `max_tokens` rows of `out`, in distinct
/// buffers.
fn check_activations(
    kernel: &str,
    params: &WeightParams,
    x: &Tensor,
    y: &Tensor,
    out: OutputColumns,
    max_tokens: u32,
) -> Result<(), GpuError> {
    if max_tokens == 0 {
        return Err(GpuError::InvalidArgs(format!("{kernel}: max_tokens must be at least 1")));
    }
    let x_len = u64::from(max_tokens) * u64::from(params.cols());
    let y_len = out.needed_len(kernel, params.rows(), max_tokens)?;
    if x_len.max(y_len) > u64::from(u32::MAX) {
        return Err(GpuError::InvalidArgs(format!("{kernel}: {max_tokens} tokens are too many for 32-bit indexing")));
    }
    check_tensor(kernel, "x", x, DType::F32, x_len)?;
    check_tensor(kernel, "y", y, DType::F32, y_len)?;
    check_distinct(kernel, &[("x", &x.buffer), ("y", &y.buffer)])
}

fn bind_tiled(
    gpu: &Gpu,
    kernel: &str,
    pipeline: &Arc<wgpu::ComputePipeline>,
    resources: &[wgpu::BindingResource<'_>],
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
    let dispatch = Dispatch::new(gpu, kernel, pipeline.clone(), resources, [max_tokens.div_ceil(TILE_TOKENS), feature_tiles, 1]);
    Ok(MatmulDispatch { dispatch, feature_tiles, max_tokens })
}
