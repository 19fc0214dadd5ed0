//! Causal grouped-query attention over a layer's KV cache (`shaders/attention.wgsl`): a
//! flash-decoding pair of kernels for the single query of a decode step, and a tiled kernel for
//! prefill chunks. Both follow `reference::attention`.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use crate::params::{AttentionShape, KvType, Scores};
use crate::{DType, Defines, Dispatch, Gpu, GpuError, Recorder, StepOp, StepParams, StepRows, StepUniform, Tensor};

/// KV positions per decode workgroup (`CHUNK` in the shader).
const DECODE_CHUNK: u32 = 256;
/// The head dimensions the attention kernels are built for: multiples of the prefill tile's 32
/// columns whose tiles fit WebGPU's 16 KiB of workgroup memory (Phi-3's 96, Gemma's 256).
pub const HEAD_DIMS: [usize; 5] = [32, 64, 96, 128, 256];

/// The prefill tile for a head size: (queries, keys) per block (`BQ`, `BK` in the shader). The
/// query tile, the padded key/value block and the scores take 4 * (BQ * HD + BK * (HD + 1) +
/// BQ * BK) bytes: 12.9 KiB at 128 with (8, 16); 256 needs (4, 8) for 12.2 KiB.
fn prefill_tile(head_dim: usize) -> (u32, u32) {
    if head_dim > 128 {
        (4, 8)
    } else {
        (8, 16)
    }
}

/// Mirrors `Params` in `shaders/attention.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    max_ctx: u32,
    max_chunks: u32,
    scale: f32,
    // 0: no soft cap.
    softcap: f32,
    // 0: no sliding window.
    window: u32,
}

/// One layer's KV cache: K and V in separate buffers, each `[slots][n_kv_heads][max_ctx][head_dim]`
/// values (position `p` of kv head `h` in slot `s` at `((s * n_kv_heads + h) * max_ctx + p) *
/// head_dim`): f32, or f16 packed two per u32 word, the first in the low half (`kv`). Each
/// sequence generating at once has a slot. RoPE writes it, attention reads it.
pub struct KvCache {
    pub k: Tensor,
    pub v: Tensor,
    pub shape: AttentionShape,
    pub kv: KvType,
    pub slots: usize,
}

impl KvCache {
    /// A zeroed cache of `slots` sequences; fails if a buffer would exceed the device's binding
    /// limit.
    pub fn new(gpu: &Gpu, label: &str, shape: AttentionShape, kv: KvType, slots: usize) -> Result<Self, GpuError> {
        let AttentionShape { n_heads, n_kv_heads, head_dim, max_ctx } = shape;
        // Whole f16 words per row, and whole pairs of pairs for RoPE's threads.
        if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) || head_dim == 0 || !head_dim.is_multiple_of(4) || max_ctx == 0 {
            return Err(GpuError::InvalidArgs(format!("kv cache {label}: invalid shape {shape:?}")));
        }
        if slots == 0 {
            return Err(GpuError::InvalidArgs(format!("kv cache {label}: no slots")));
        }
        let (dims, dtype) = match kv {
            KvType::F32 => ([slots * n_kv_heads, max_ctx, head_dim], DType::F32),
            KvType::F16 => ([slots * n_kv_heads, max_ctx, head_dim / 2], DType::U32),
        };
        let k = Tensor::zeros(gpu, &format!("{label}.k"), &dims, dtype)?;
        let v = Tensor::zeros(gpu, &format!("{label}.v"), &dims, dtype)?;
        Ok(Self { k, v, shape, kv, slots })
    }

    /// Bytes of one position's row of one kv head, in K or in V.
    pub fn row_bytes(&self) -> usize {
        self.shape.head_dim * self.kv.bytes()
    }

    /// Byte offset in K (or V) of position `pos` of kv head `head` in `slot`.
    pub fn row_offset(&self, slot: usize, head: usize, pos: usize) -> u64 {
        (((slot * self.shape.n_kv_heads + head) * self.shape.max_ctx + pos) * self.row_bytes()) as u64
    }
}

/// The shader define that selects the cache's value type.
pub(crate) fn kv_defines(defines: &mut Defines, kv: KvType) {
    if kv == KvType::F16 {
        defines.insert("KV_F16".into(), "1".into());
    }
}

/// The attention kernels specialized for one head size.
pub struct AttentionKernel {
    head_dim: usize,
    kv: KvType,
    prefill_queries: u32,
    decode_partial: Arc<wgpu::ComputePipeline>,
    decode_combine: Arc<wgpu::ComputePipeline>,
    prefill: Arc<wgpu::ComputePipeline>,
}

/// Decode attention bound to one layer: partial softmax per (KV chunk, head, query), then a
/// combine per (head, query).
pub struct DecodeAttention {
    partial: Dispatch,
    combine: Dispatch,
    n_heads: u32,
    /// The sliding window, in positions.
    window: Option<u32>,
}

/// Prefill attention bound to one layer: one workgroup per (tile of queries, head).
pub struct PrefillAttention {
    dispatch: Dispatch,
    n_heads: u32,
    queries_per_tile: u32,
}

impl AttentionKernel {
    /// Compiles the kernels for `head_dim` (one of `HEAD_DIMS`) over a cache of `kv` values.
    pub async fn new(gpu: &Gpu, head_dim: usize, kv: KvType) -> Result<Self, GpuError> {
        if !HEAD_DIMS.contains(&head_dim) {
            return Err(GpuError::InvalidArgs(format!("attention: head_dim {head_dim} is not one of {HEAD_DIMS:?}")));
        }
        let (bq, bk) = prefill_tile(head_dim);
        let pipeline = |kind: &str, entry: &'static str| {
            let mut defines = Defines::new();
            defines.insert("HD".into(), head_dim.to_string());
            defines.insert("BQ".into(), bq.to_string());
            defines.insert("BK".into(), bk.to_string());
            defines.insert(kind.into(), "1".into());
            kv_defines(&mut defines, kv);
            async move { gpu.pipelines.get("attention", entry, &defines).await }
        };
        Ok(Self {
            head_dim,
            kv,
            prefill_queries: bq,
            decode_partial: pipeline("DECODE_PARTIAL", "decode_partial").await?,
            decode_combine: pipeline("DECODE_COMBINE", "decode_combine").await?,
            prefill: pipeline("PREFILL", "prefill").await?,
        })
    }

    /// Binds the decode kernels for up to `queries` sequences, one query each: row `t` of `q`
    /// (f32 `[rows, n_heads * head_dim]`, for `t < step.n_tokens`) attends to positions
    /// `0..=pos` of slot `slot`, `(slot, pos)` being row `t` of `rows`; the result goes to row `t`
    /// of `out` (same shape as `q`). Allocates the partials scratch for `max_ctx` positions of
    /// each query.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_decode(
        &self,
        gpu: &Gpu,
        rows: &StepRows,
        q: &Tensor,
        cache: &KvCache,
        out: &Tensor,
        scores: &Scores,
        queries: usize,
    ) -> Result<DecodeAttention, GpuError> {
        let params = self.params(q, cache, out, scores)?;
        if queries == 0 || q.len() / cache.shape.q_width() < queries {
            return Err(GpuError::InvalidArgs(format!("attention: {queries} decode queries in q of shape {:?}", q.shape)));
        }
        rows.check("attention", queries)?;
        let window = (params.window > 0).then_some(params.window);
        let partials_len = queries * params.n_heads as usize * params.max_chunks as usize * (2 + self.head_dim);
        let partials = Tensor::zeros(gpu, "attention.partials", &[partials_len], DType::F32)?;
        let params = gpu.uniform_buffer("attention.params", bytemuck::bytes_of(&params));
        let n_heads = cache.shape.n_heads as u32;
        let partial = Dispatch::new(
            gpu,
            "attention.decode_partial",
            self.decode_partial.clone(),
            &[
                params.as_entire_binding(),
                q.buffer.as_entire_binding(),
                cache.k.buffer.as_entire_binding(),
                cache.v.buffer.as_entire_binding(),
                partials.buffer.as_entire_binding(),
                rows.tensor.buffer.as_entire_binding(),
            ],
            [1, n_heads, 1],
        );
        let combine = Dispatch::new(
            gpu,
            "attention.decode_combine",
            self.decode_combine.clone(),
            &[
                params.as_entire_binding(),
                partials.buffer.as_entire_binding(),
                out.buffer.as_entire_binding(),
                rows.tensor.buffer.as_entire_binding(),
            ],
            [n_heads, 1, 1],
        );
        Ok(DecodeAttention { partial, combine, n_heads, window })
    }

    /// Binds the prefill kernel: the step's queries are one sequence's consecutive positions,
    /// query row `t` of `q` (f32 `[rows, n_heads * head_dim]`, for `t < step.n_tokens`) at
    /// position `pos + t` of slot `slot`, `(slot, pos)` being row 0 of `rows`; it attends to that
    /// slot's positions `0..=pos + t` (earlier chunks' keys included); results go to the same rows
    /// of `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_prefill(
        &self,
        gpu: &Gpu,
        step: &StepUniform,
        rows_of: &StepRows,
        q: &Tensor,
        cache: &KvCache,
        out: &Tensor,
        scores: &Scores,
    ) -> Result<PrefillAttention, GpuError> {
        let params = self.params(q, cache, out, scores)?;
        let params = gpu.uniform_buffer("attention.params", bytemuck::bytes_of(&params));
        let n_heads = cache.shape.n_heads as u32;
        let rows = (q.len() / cache.shape.q_width()) as u32;
        rows_of.check("attention", 1)?;
        let dispatch = Dispatch::new(
            gpu,
            "attention.prefill",
            self.prefill.clone(),
            &[
                step.buffer.as_entire_binding(),
                params.as_entire_binding(),
                q.buffer.as_entire_binding(),
                cache.k.buffer.as_entire_binding(),
                cache.v.buffer.as_entire_binding(),
                out.buffer.as_entire_binding(),
                rows_of.tensor.buffer.as_entire_binding(),
            ],
            [rows.div_ceil(self.prefill_queries), n_heads, 1],
        );
        Ok(PrefillAttention { dispatch, n_heads, queries_per_tile: self.prefill_queries })
    }

    fn params(&self, q: &Tensor, cache: &KvCache, out: &Tensor, scores: &Scores) -> Result<Params, GpuError> {
        let shape = cache.shape;
        let invalid = |why: String| Err(GpuError::InvalidArgs(format!("attention: {why}")));
        if shape.head_dim != self.head_dim {
            return invalid(format!("cache head_dim {} but kernel built for {}", shape.head_dim, self.head_dim));
        }
        if cache.kv != self.kv {
            return invalid(format!("a {} cache but the kernel reads {}", cache.kv.name(), self.kv.name()));
        }
        if q.dtype != DType::F32 || out.dtype != DType::F32 {
            return invalid("q and out must be f32".into());
        }
        if q.shape.last() != Some(&shape.q_width()) || q.is_empty() {
            return invalid(format!("q shape {:?} must be [rows, {}]", q.shape, shape.q_width()));
        }
        if out.shape != q.shape {
            return invalid(format!("out shape {:?} differs from q shape {:?}", out.shape, q.shape));
        }
        let Scores { scale, softcap, window } = *scores;
        if !scale.is_finite() || softcap.is_some_and(|c| !(c.is_finite() && c > 0.0)) || window == Some(0) {
            return invalid(format!("scores {scores:?}: a finite scale, a finite positive cap and a window of 1 or more"));
        }
        Ok(Params {
            n_heads: shape.n_heads as u32,
            n_kv_heads: shape.n_kv_heads as u32,
            max_ctx: shape.max_ctx as u32,
            max_chunks: (shape.max_ctx as u32).div_ceil(DECODE_CHUNK),
            scale,
            softcap: softcap.unwrap_or(0.0),
            window: window.map_or(0, |w| w.min(u32::MAX as usize) as u32),
        })
    }
}

impl DecodeAttention {
    /// The grid of the partial kernel for `queries` queries whose caches hold at most `kv_len`
    /// valid positions (the last query's position + 1): chunks per query enough for any of them.
    /// With a sliding window a query sees at most `window` keys, which touch at most
    /// `window / CHUNK + 1` chunks from the one holding its first (shaders/attention.wgsl
    /// `first_decode_chunk`); the chunks a query does not need leave at once.
    pub fn workgroups(&self, kv_len: u32, queries: u32) -> [u32; 3] {
        let all = kv_len.div_ceil(DECODE_CHUNK);
        let chunks = self.window.map_or(all, |w| all.min(w.div_ceil(DECODE_CHUNK) + 1));
        [chunks, self.n_heads, queries]
    }
}

impl StepOp for DecodeAttention {
    /// The partial kernel over the step's `n_tokens` queries (one per sequence) and their cached
    /// positions, up to `kv_len`, then the combine.
    fn record(&self, rec: &mut Recorder, step: &StepParams) {
        self.partial.record_with(rec, self.workgroups(step.kv_len, step.n_tokens));
        self.combine.record_with(rec, [self.n_heads, step.n_tokens, 1]);
    }
}

impl PrefillAttention {
    /// The grid for `n_tokens` queries.
    pub fn workgroups(&self, n_tokens: u32) -> [u32; 3] {
        [n_tokens.div_ceil(self.queries_per_tile), self.n_heads, 1]
    }
}

impl StepOp for PrefillAttention {
    /// Attention of the step's `n_tokens` queries.
    fn record(&self, rec: &mut Recorder, step: &StepParams) {
        self.dispatch.record_with(rec, self.workgroups(step.n_tokens));
    }
}
