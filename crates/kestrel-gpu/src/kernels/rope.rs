//! RoPE applied to the fused QKV output, writing Q to its own buffer and K/V straight into the
//! layer's KV cache (`shaders/rope.wgsl`). The math is `reference::rope`'s.

use std::f64::consts::TAU;
use std::sync::Arc;

use kestrel_ops::params::{KvType, RopeConfig, RopeMode};

use super::attention::{kv_defines, KvCache};
use super::{Bindings, TokenDispatch};
use crate::{DType, Defines, Gpu, GpuError, StepRows, StepUniform, Tensor};

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

/// What one layer's RoPE reads and writes: `qkv` (f32 `[max_tokens, (n_heads + 2 * n_kv_heads) *
/// head_dim]`, per token `[q heads | k heads | v heads]`), `q_out` (f32 `[max_tokens, n_heads *
/// head_dim]`) and the layer's cache. Without a `config` (a layer without RoPE) Q and K are
/// copied unrotated.
pub struct RopeOperands<'a> {
    pub config: Option<&'a RopeConfig>,
    pub qkv: &'a Tensor,
    pub q_out: &'a Tensor,
    pub cache: &'a KvCache,
}

impl RopeKernel {
    /// Compiles RoPE for a cache of `kv` values.
    pub async fn new(gpu: &Gpu, kv: KvType) -> Result<Self, GpuError> {
        let mut defines = Defines::new();
        kv_defines(&mut defines, kv);
        Ok(Self { pipeline: gpu.pipelines.get("rope", "main", &defines).await?, kv })
    }

    /// Binds RoPE of the step's tokens: token `t` is at the position `rows_of` gives it, in its
    /// slot; its rotated K and plain V land in that slot's cache at that position (tokens at or
    /// past `max_ctx` are skipped: the caller checks the context length).
    pub fn bind(&self, gpu: &Gpu, step: &StepUniform, rows_of: &StepRows, p: &RopeOperands) -> Result<TokenDispatch, GpuError> {
        let RopeOperands { config, qkv, q_out, cache } = *p;
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
        let turns = gpu.storage_buffer_init("rope.turns", bytemuck::cast_slice(&turns))?;
        let bindings = Bindings::new(gpu, "rope").step(step).uniform(&params).tensor(qkv).buffer(&turns).tensor(q_out);
        let bindings = bindings.tensor(&cache.k).tensor(&cache.v).tensor(&rows_of.tensor);
        // One thread per two rotated or copied pairs.
        let quads_per_token = (qkv_width / 4) as u32;
        Ok(bindings.dispatch_per_token(&self.pipeline, quads_per_token, WORKGROUP))
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
