//! RoPE applied to the fused QKV output, writing Q to its own buffer and K/V straight into the
//! layer's KV cache (`shaders/rope.wgsl`). The math is `reference::rope`'s.

use std::f64::consts::TAU;
use std::sync::Arc;

use kestrel_ops::params::{KvType, RopeConfig, RopeMode};

use super::attention::{kv_defines, KvCache};
use crate::{grid, DType, Defines, Dispatch, Gpu, GpuError, Recorder, StepOp, StepParams, StepRows, StepUniform, Tensor};

const WORKGROUP: u32 = 256;

kestrel_ops::gpu_struct! {
    /// The RoPE kernel's uniform (`Params` in `shaders/rope.wgsl`).
    pub(crate) struct RopeParams as Params {
        n_heads: u32,
        n_kv_heads: u32,
        head_dim: u32,
        max_ctx: u32,
        /// 0: pairs (2i, 2i + 1) as ggml's NORM mode; 1: pairs (i, i + head_dim / 2) as NEOX.
        neox: u32,
        /// 0: Q and K are copied unrotated (a layer without RoPE).
        rotate: u32,
        mscale: f32,
    }
}

pub struct RopeKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    kv: KvType,
}

/// A RoPE bound to one layer's buffers; processes tokens `0..n_tokens` when recorded.
pub struct RopeDispatch {
    dispatch: Dispatch,
    /// Threads per token: one per two pairs of values.
    quads_per_token: u32,
    max_per_dim: u32,
}

impl RopeKernel {
    /// Compiles RoPE for a cache of `kv` values.
    pub async fn new(gpu: &Gpu, kv: KvType) -> Result<Self, GpuError> {
        let mut defines = Defines::new();
        kv_defines(&mut defines, kv);
        Ok(Self { pipeline: gpu.pipelines.get("rope", "main", &defines).await?, kv })
    }

    /// Binds `qkv` (f32 `[max_tokens, (n_heads + 2 * n_kv_heads) * head_dim]`, per token
    /// `[q heads | k heads | v heads]`), `q_out` (f32 `[max_tokens, n_heads * head_dim]`) and the
    /// layer's cache. Token `t` of a step is at the position `rows` gives it, in its slot; its
    /// rotated K and plain V land in that slot's cache at that position (tokens at or past
    /// `max_ctx` are skipped: the caller checks the context length). Without a `config` (a layer
    /// without RoPE) Q and K are copied unrotated.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        gpu: &Gpu,
        step: &StepUniform,
        rows_of: &StepRows,
        config: Option<&RopeConfig>,
        qkv: &Tensor,
        q_out: &Tensor,
        cache: &KvCache,
    ) -> Result<RopeDispatch, GpuError> {
        let shape = cache.shape;
        let invalid = |why: String| Err(GpuError::InvalidArgs(format!("rope: {why}")));
        let hd = shape.head_dim;
        // Each thread takes two neighbouring pairs (and writes whole f16 words).
        if hd == 0 || !hd.is_multiple_of(4) {
            return invalid(format!("head_dim {hd} must be a multiple of 4"));
        }
        if cache.kv != self.kv {
            return invalid(format!("a {} cache but the kernel writes {}", cache.kv.name(), self.kv.name()));
        }
        if qkv.dtype != DType::F32 || q_out.dtype != DType::F32 {
            return invalid("qkv and q_out must be f32".into());
        }
        let qkv_width = (shape.n_heads + 2 * shape.n_kv_heads) * hd;
        let rows = qkv.len() / qkv_width;
        if qkv.shape.last() != Some(&qkv_width) {
            return invalid(format!("qkv shape {:?} must end in {qkv_width}", qkv.shape));
        }
        if q_out.shape.last() != Some(&shape.q_width()) || q_out.len() / shape.q_width() != rows {
            return invalid(format!("q_out shape {:?} must be [{rows}, {}]", q_out.shape, shape.q_width()));
        }
        rows_of.check("rope", rows)?;
        let turns = match config {
            Some(config) => turns_per_position(config, hd)?,
            None => vec![[0, 0]; hd / 2],
        };
        let params = RopeParams {
            n_heads: shape.n_heads as u32,
            n_kv_heads: shape.n_kv_heads as u32,
            head_dim: hd as u32,
            max_ctx: shape.max_ctx as u32,
            neox: u32::from(config.is_some_and(|c| c.mode == RopeMode::Neox)),
            rotate: u32::from(config.is_some()),
            mscale: config.map_or(1.0, |c| c.mscale),
        };
        let params = gpu.uniform_buffer("rope.params", bytemuck::bytes_of(&params));
        let turns = gpu.storage_buffer_init("rope.turns", bytemuck::cast_slice(&turns))?;
        let quads_per_token = (qkv_width / 4) as u32;
        let max_per_dim = gpu.limits.max_compute_workgroups_per_dimension;
        let dispatch = Dispatch::new(
            gpu,
            "rope",
            self.pipeline.clone(),
            &[
                step.buffer.as_entire_binding(),
                params.as_entire_binding(),
                qkv.buffer.as_entire_binding(),
                turns.as_entire_binding(),
                q_out.buffer.as_entire_binding(),
                cache.k.buffer.as_entire_binding(),
                cache.v.buffer.as_entire_binding(),
                rows_of.tensor.buffer.as_entire_binding(),
            ],
            grid((rows as u32 * quads_per_token).div_ceil(WORKGROUP), max_per_dim),
        );
        Ok(RopeDispatch { dispatch, quads_per_token, max_per_dim })
    }
}

impl RopeDispatch {
    /// The grid for `n_tokens` tokens (one thread per two rotated or copied pairs).
    pub fn workgroups(&self, n_tokens: u32) -> [u32; 3] {
        grid((n_tokens * self.quads_per_token).div_ceil(WORKGROUP), self.max_per_dim)
    }
}

impl StepOp for RopeDispatch {
    /// RoPE of the step's `n_tokens` tokens.
    fn record(&self, rec: &mut Recorder, step: &StepParams) {
        self.dispatch.record_with(rec, self.workgroups(step.n_tokens));
    }
}

/// Each pair's angle per position as a fraction of a turn in 64-bit fixed point, `[lo, hi]`
/// words: the shader multiplies it by the integer position, which wraps exactly modulo a turn.
fn turns_per_position(config: &RopeConfig, head_dim: usize) -> Result<Vec<[u32; 2]>, GpuError> {
    let invalid = |why: String| Err(GpuError::InvalidArgs(format!("rope: {why}")));
    let positive = |v: f32| v.is_finite() && v > 0.0;
    if !positive(config.base) || !positive(config.freq_scale) || !positive(config.mscale) {
        return invalid(format!(
            "base {}, freq_scale {} and mscale {} must be finite and > 0",
            config.base, config.freq_scale, config.mscale
        ));
    }
    if let Some(factors) = &config.freq_factors {
        if factors.len() != head_dim / 2 {
            return invalid(format!("{} freq factors, head_dim {head_dim} needs {}", factors.len(), head_dim / 2));
        }
        if let Some(bad) = factors.iter().find(|&&f| !positive(f)) {
            return invalid(format!("freq factor {bad} must be finite and > 0"));
        }
    }
    Ok((0..head_dim / 2)
        .map(|i| {
            let turn = (config.inv_freq(head_dim, i) / TAU).fract();
            // `turn` is in [0, 1), so the scaled value fits a u64 (the cast saturates anyway).
            let fixed = (turn * 2f64.powi(64)) as u64;
            [fixed as u32, (fixed >> 32) as u32]
        })
        .collect())
}
