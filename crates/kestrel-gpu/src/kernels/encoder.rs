//! The kernels only an encoder (BERT, nomic-bert) needs: GELU in place
//! (`shaders/gelu.wgsl`), NeoX RoPE with positions restarting per packed input
//! (`shaders/encoder_rope.wgsl`) and bidirectional attention within each input
//! (`shaders/encoder_attention.wgsl`). Packed inputs are described per token by `spans`: a u32
//! pair `[start, end)`, the tokens of the input it belongs to.

use std::sync::Arc;

use kestrel_ops::params::{RopeConfig, RopeMode};

use super::{Bindings, TokenDispatch};
use crate::{DType, Defines, Gpu, GpuError, StepUniform, Tensor};

kestrel_ops::gpu_struct! {
    /// The GELU kernel's uniform (`Params` in `shaders/gelu.wgsl`).
    pub(crate) struct GeluParams as Params {
        /// Values per token row.
        n: u32,
    }
}

kestrel_ops::gpu_struct! {
    /// The encoder RoPE's uniform (`Params` in `shaders/encoder_rope.wgsl`).
    pub(crate) struct EncoderRopeParams as Params {
        n_heads: u32,
        head_dim: u32,
        /// Values per token row of the fused QKV.
        stride: u32,
        /// Where K's heads start in a row.
        k_offset: u32,
    }
}

kestrel_ops::gpu_struct! {
    /// The encoder attention's uniform (`Params` in `shaders/encoder_attention.wgsl`).
    pub(crate) struct EncoderAttentionParams as Params {
        n_heads: u32,
        stride: u32,
        k_offset: u32,
        v_offset: u32,
        scale: f32,
    }
}

/// Threads per workgroup of the elementwise kernels.
const WG: u32 = 256;

fn check_f32(kernel: &str, what: &str, t: &Tensor, len: usize) -> Result<(), GpuError> {
    if t.dtype != DType::F32 || t.len() < len {
        return Err(GpuError::InvalidArgs(format!(
            "{kernel}: {what} must be f32 of at least {len} values, is {:?} {:?}",
            t.dtype, t.shape
        )));
    }
    Ok(())
}

fn check_spans(kernel: &str, spans: &Tensor, max_tokens: usize) -> Result<(), GpuError> {
    if spans.dtype != DType::U32 || spans.len() < 2 * max_tokens {
        return Err(GpuError::InvalidArgs(format!("{kernel}: spans must be u32 pairs for {max_tokens} tokens, is {:?}", spans.shape)));
    }
    Ok(())
}

/// Where Q, K and V sit in each token's fused row: `n_heads` heads of `head_dim` each, Q at 0,
/// K at `k_offset`, V at `v_offset`, rows of `stride` values.
#[derive(Clone, Copy, Debug)]
pub struct QkvLayout {
    pub n_heads: usize,
    pub head_dim: usize,
    pub stride: usize,
    pub k_offset: usize,
    pub v_offset: usize,
}

impl QkvLayout {
    /// The `[q | k | v]` row of `n_heads` heads of `head_dim`.
    pub fn fused(n_heads: usize, head_dim: usize) -> Self {
        let h = n_heads * head_dim;
        Self { n_heads, head_dim, stride: 3 * h, k_offset: h, v_offset: 2 * h }
    }
}

/// The fused QKV rows of packed inputs, what the encoder's RoPE and attention read: `qkv` (f32
/// `[max_tokens, layout.stride]`) and `spans` (u32 `[max_tokens, 2]`, each token's input).
pub struct PackedQkv<'a> {
    pub qkv: &'a Tensor,
    pub layout: QkvLayout,
    pub spans: &'a Tensor,
    pub max_tokens: usize,
}

impl PackedQkv<'_> {
    /// That the layout fits its rows, `qkv` holds `max_tokens` of them, and `spans` a span of
    /// each token.
    fn check(&self, kernel: &str) -> Result<(), GpuError> {
        let QkvLayout { n_heads, head_dim, stride, k_offset, v_offset } = self.layout;
        let h = n_heads * head_dim;
        if h == 0 || k_offset + h > stride || v_offset + h > stride {
            return Err(GpuError::InvalidArgs(format!("{kernel}: {:?} does not fit its rows", self.layout)));
        }
        check_f32(kernel, "qkv", self.qkv, self.max_tokens * stride)?;
        check_spans(kernel, self.spans, self.max_tokens)
    }
}

/// ggml's tanh GELU in place over `[tokens, n]` rows.
pub struct GeluKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl GeluKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        let defines = Defines::from([("GELU".to_string(), "1".to_string())]);
        Ok(Self { pipeline: gpu.pipelines.get("gelu", "main", &defines).await? })
    }

    /// Binds `x` (f32 `[max_tokens, n]`); the step's first `n_tokens` rows are transformed.
    pub fn bind(&self, gpu: &Gpu, step: &StepUniform, x: &Tensor) -> Result<TokenDispatch, GpuError> {
        let n = x.shape.last().copied().unwrap_or(0);
        check_f32("gelu", "x", x, 1)?;
        if n == 0 {
            return Err(GpuError::InvalidArgs(format!("gelu: x has shape {:?}", x.shape)));
        }
        let bindings = Bindings::new(gpu, "gelu").step(step).uniform(&GeluParams { n: n as u32 }).tensor(x);
        // One thread per value: n / WG workgroups per token, rounded up over the whole step by
        // the shader's bound check (a token's last workgroup may spill into the next token).
        Ok(bindings.dispatch_per_token(&self.pipeline, (n as u32).div_ceil(WG), 1))
    }
}

/// The (cos, sin) of every pair at every position an encoder's RoPE uses, computed in f64 as
/// `kestrel_ops::reference::rope` does and scaled by `mscale`: `[positions][head_dim / 2]`.
pub fn rope_table(config: &RopeConfig, head_dim: usize, positions: usize) -> Result<Vec<f32>, GpuError> {
    if config.mode != RopeMode::Neox || head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(GpuError::InvalidArgs(format!("encoder rope: NeoX pairs of an even head_dim, got {:?} {head_dim}", config.mode)));
    }
    let half = head_dim / 2;
    let mut table = Vec::with_capacity(positions * head_dim);
    for p in 0..positions {
        for i in 0..half {
            let theta = p as f64 * config.inv_freq(head_dim, i);
            table.extend([theta.cos() as f32 * config.mscale, theta.sin() as f32 * config.mscale]);
        }
    }
    Ok(table)
}

/// NeoX RoPE in place on Q and K of fused QKV rows, each token at its position in its input.
pub struct EncoderRopeKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl EncoderRopeKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: gpu.pipelines.get("encoder_rope", "main", &Defines::new()).await? })
    }

    /// Binds the rows' RoPE with `table` (`rope_table` for at least the longest input's positions).
    pub fn bind(&self, gpu: &Gpu, step: &StepUniform, rows: &PackedQkv, table: &Tensor) -> Result<TokenDispatch, GpuError> {
        let kernel = "encoder rope";
        rows.check(kernel)?;
        let layout = rows.layout;
        if !layout.head_dim.is_multiple_of(2) {
            return Err(GpuError::InvalidArgs(format!("{kernel}: odd head_dim {}", layout.head_dim)));
        }
        check_f32(kernel, "table", table, layout.head_dim)?;
        let params = EncoderRopeParams {
            n_heads: layout.n_heads as u32,
            head_dim: layout.head_dim as u32,
            stride: layout.stride as u32,
            k_offset: layout.k_offset as u32,
        };
        let bindings = Bindings::new(gpu, kernel).step(step).uniform(&params).tensor(rows.qkv).tensor(table).tensor(rows.spans);
        // One thread per pair of Q's and K's heads: n_heads * head_dim threads per token. A
        // token's last workgroup may run into the next token's pairs: the shader indexes by the
        // thread's global number, so per_token only has to cover all of them.
        let per_token = ((layout.n_heads * layout.head_dim) as u32).div_ceil(WG);
        Ok(bindings.dispatch_per_token(&self.pipeline, per_token, 1))
    }
}

/// Softmax attention of each token over the keys of its own input (no causal mask).
pub struct EncoderAttentionKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    head_dim: usize,
}

impl EncoderAttentionKernel {
    /// The largest head it takes: a head's query is held in workgroup memory, and each of the
    /// 64 threads keeps up to 4 of its output values.
    pub const MAX_HEAD_DIM: usize = 256;

    /// For heads of `head_dim` values (1 to `MAX_HEAD_DIM`).
    pub async fn new(gpu: &Gpu, head_dim: usize) -> Result<Self, GpuError> {
        if !(1..=Self::MAX_HEAD_DIM).contains(&head_dim) {
            return Err(GpuError::InvalidArgs(format!("encoder attention: head_dim {head_dim} is not 1 to 256")));
        }
        let defines = Defines::from([("HD".to_string(), head_dim.to_string())]);
        Ok(Self { pipeline: gpu.pipelines.get("encoder_attention", "main", &defines).await?, head_dim })
    }

    /// Binds the rows' attention into `out` (f32 `[max_tokens, n_heads * head_dim]`); scores are
    /// `q·k * scale`.
    pub fn bind(&self, gpu: &Gpu, step: &StepUniform, rows: &PackedQkv, out: &Tensor, scale: f32) -> Result<TokenDispatch, GpuError> {
        let kernel = "encoder attention";
        rows.check(kernel)?;
        let layout = rows.layout;
        if layout.head_dim != self.head_dim {
            return Err(GpuError::InvalidArgs(format!("{kernel}: built for head_dim {}, given {}", self.head_dim, layout.head_dim)));
        }
        check_f32(kernel, "out", out, rows.max_tokens * layout.n_heads * layout.head_dim)?;
        if rows.qkv.buffer == out.buffer {
            return Err(GpuError::InvalidArgs(format!("{kernel}: qkv and out are the same buffer")));
        }
        let params = EncoderAttentionParams {
            n_heads: layout.n_heads as u32,
            stride: layout.stride as u32,
            k_offset: layout.k_offset as u32,
            v_offset: layout.v_offset as u32,
            scale,
        };
        let bindings = Bindings::new(gpu, kernel).step(step).uniform(&params).tensor(rows.qkv).tensor(rows.spans).tensor(out);
        // One workgroup per (token, head).
        Ok(bindings.dispatch_per_token(&self.pipeline, layout.n_heads as u32, 1))
    }
}

/// The spans of packed inputs of `lengths` tokens: each token's `[start, end)`.
pub fn token_spans(lengths: &[usize]) -> Vec<[u32; 2]> {
    let mut spans = Vec::with_capacity(lengths.iter().sum());
    let mut start = 0;
    for &n in lengths {
        spans.extend(std::iter::repeat_n([start as u32, (start + n) as u32], n));
        start += n;
    }
    spans
}
