//! Causal grouped-query attention over a layer's KV cache (`shaders/attention.wgsl`): a
//! flash-decoding pair of kernels for the single query of a decode step, and a tiled kernel for
//! prefill chunks. Both follow `reference::attention`.

use std::sync::Arc;

use kestrel_ops::params::{AttentionShape, KvType, Scores};

use super::Bindings;
use crate::{DType, Defines, Dispatch, Gpu, GpuError, Recorder, StepOp, StepParams, StepRows, StepUniform, Tensor};

/// KV positions per decode workgroup (`CHUNK` in the shader): each has its partial result in the
/// decode scratch (`bind_decode`), which the will-it-fit estimate counts.
pub const DECODE_CHUNK: u32 = 256;
/// The head dimensions the attention kernels are built for: multiples of the 8 columns a prefill
/// thread sums, whose tiles fit WebGPU's 16 KiB of workgroup memory (Phi-3's 96, Gemma's 256).
pub const HEAD_DIMS: [usize; 5] = [32, 64, 96, 128, 256];

/// WebGPU's guaranteed workgroup memory, which the prefill tile must fit.
const WORKGROUP_BYTES: usize = 16 * 1024;
/// Threads of a prefill workgroup (`WG` in the shader).
const PREFILL_THREADS: usize = 64;

/// The prefill kernel's tile for a head size (the `BQ`, `BK`, `SQ`, `SK` and `PR` defines): a
/// workgroup takes `queries` queries over blocks of `keys` keys; each thread computes
/// `score_queries` x `score_keys` scores of a block and sums `out_queries` queries x 8 output
/// columns. The padded K/V block (f32; an f16 cache's takes half), the padded scores and a factor
/// per query take 4 * (BK * (HD + 4) + BQ * (BK + 1) + BQ) bytes: 12.9 KiB at 64 with (32, 32),
/// 10.5 KiB at 128 with (32, 16), 8.8 KiB at 256 with (16, 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PrefillTile {
    queries: usize,
    keys: usize,
    score_queries: usize,
    score_keys: usize,
    out_queries: usize,
}

impl PrefillTile {
    /// 32 queries (16 for heads over 128 values, so that a thread's sums stay at 64 registers) and
    /// the most keys, up to 32, whose block fits the workgroup memory. The score blocks are as
    /// large as 64 threads allow, up to 4 x 4 (8 vec4 reads for 16 dot products); the output
    /// blocks as small as they allow (more threads busy).
    fn for_head_dim(head_dim: usize) -> Self {
        let queries = if head_dim > 128 { 16 } else { 32 };
        let mut keys = 32;
        while keys > 1 && Self::bytes(head_dim, queries, keys) > WORKGROUP_BYTES {
            keys /= 2;
        }
        let per_thread = (queries * keys).div_ceil(PREFILL_THREADS);
        let score_keys = match per_thread {
            16.. => 4,
            4.. => 2,
            _ => 1,
        };
        let score_queries = (per_thread / score_keys).clamp(1, queries);
        // Each thread sums two vec4 columns: head_dim / 8 column groups.
        let column_groups = head_dim / 8;
        let mut out_queries = 1;
        while (queries / out_queries) * column_groups > PREFILL_THREADS {
            out_queries *= 2;
        }
        Self { queries, keys, score_queries, score_keys, out_queries }
    }

    /// The workgroup memory of a tile (the shader's `kv_tile`, `scores`, `row_factor`).
    fn bytes(head_dim: usize, queries: usize, keys: usize) -> usize {
        4 * (keys * (head_dim + 4) + queries * (keys + 1) + queries)
    }

    fn defines(&self, defines: &mut Defines) {
        for (name, value) in
            [("BQ", self.queries), ("BK", self.keys), ("SQ", self.score_queries), ("SK", self.score_keys), ("PR", self.out_queries)]
        {
            defines.insert(name.into(), value.to_string());
        }
    }
}

kestrel_ops::gpu_struct! {
    /// The attention kernels' uniform (`Params` in `shaders/attention.wgsl`).
    pub(crate) struct AttentionParams as Params {
        n_heads: u32,
        n_kv_heads: u32,
        max_ctx: u32,
        /// Chunks reserved per head in `partials` (max_ctx / CHUNK rounded up).
        max_chunks: u32,
        scale: f32,
        /// 0: no soft cap.
        softcap: f32,
        /// 0: no sliding window.
        window: u32,
    }
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

/// What a layer's attention reads and writes: the query rows `q` (f32 `[rows, n_heads *
/// head_dim]`), the layer's cache, `out` (q's shape), how scores are made, and `rows`, where each
/// query belongs (`StepRows`).
pub struct AttentionOperands<'a> {
    pub q: &'a Tensor,
    pub cache: &'a KvCache,
    pub out: &'a Tensor,
    pub scores: &'a Scores,
    pub rows: &'a StepRows,
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
        let tile = PrefillTile::for_head_dim(head_dim);
        let pipeline = |kind: &str, entry: &'static str| {
            let mut defines = Defines::new();
            defines.insert("HD".into(), head_dim.to_string());
            tile.defines(&mut defines);
            defines.insert(kind.into(), "1".into());
            kv_defines(&mut defines, kv);
            async move { gpu.pipelines.get("attention", entry, &defines).await }
        };
        Ok(Self {
            head_dim,
            kv,
            prefill_queries: tile.queries as u32,
            decode_partial: pipeline("DECODE_PARTIAL", "decode_partial").await?,
            decode_combine: pipeline("DECODE_COMBINE", "decode_combine").await?,
            prefill: pipeline("PREFILL", "prefill").await?,
        })
    }

    /// Binds the decode kernels for up to `queries` sequences, one query each: query row `t`
    /// (for `t < step.n_tokens`) attends to positions `0..=pos` of slot `slot`, `(slot, pos)`
    /// being row `t` of `rows`; the result goes to row `t` of `out`. Allocates the partials
    /// scratch for `max_ctx` positions of each query.
    pub fn bind_decode(&self, gpu: &Gpu, p: &AttentionOperands, queries: usize) -> Result<DecodeAttention, GpuError> {
        let params = self.params(p)?;
        let AttentionOperands { q, cache, out, rows, .. } = *p;
        if queries == 0 || q.len() / cache.shape.q_width() < queries {
            return Err(GpuError::InvalidArgs(format!("attention: {queries} decode queries in q of shape {:?}", q.shape)));
        }
        rows.check("attention", queries)?;
        let window = (params.window > 0).then_some(params.window);
        let partials_len = queries * params.n_heads as usize * params.max_chunks as usize * (2 + self.head_dim);
        let partials = Tensor::zeros(gpu, "attention.partials", &[partials_len], DType::F32)?;
        let params = gpu.uniform_buffer("attention.params", bytemuck::bytes_of(&params));
        let n_heads = cache.shape.n_heads as u32;
        let partial = Bindings::new(gpu, "attention.decode_partial").buffer(&params).tensor(q).tensor(&cache.k).tensor(&cache.v);
        let partial = partial.tensor(&partials).tensor(&rows.tensor).dispatch(&self.decode_partial, [1, n_heads, 1]);
        let combine = Bindings::new(gpu, "attention.decode_combine").buffer(&params).tensor(&partials).tensor(out).tensor(&rows.tensor);
        let combine = combine.dispatch(&self.decode_combine, [n_heads, 1, 1]);
        Ok(DecodeAttention { partial, combine, n_heads, window })
    }

    /// Binds the prefill kernel: the step's queries are one sequence's consecutive positions,
    /// query row `t` (for `t < step.n_tokens`) at position `pos + t` of slot `slot`, `(slot, pos)`
    /// being row 0 of `rows`; it attends to that slot's positions `0..=pos + t` (earlier chunks'
    /// keys included); results go to the same rows of `out`.
    pub fn bind_prefill(&self, gpu: &Gpu, step: &StepUniform, p: &AttentionOperands) -> Result<PrefillAttention, GpuError> {
        let params = self.params(p)?;
        let AttentionOperands { q, cache, out, rows, .. } = *p;
        let n_heads = cache.shape.n_heads as u32;
        let query_rows = (q.len() / cache.shape.q_width()) as u32;
        rows.check("attention", 1)?;
        let bindings = Bindings::new(gpu, "attention.prefill").uniform(&params).tensor(q).tensor(&cache.k).tensor(&cache.v).tensor(out);
        let dispatch =
            bindings.tensor(&rows.tensor).step(step).dispatch(&self.prefill, [query_rows.div_ceil(self.prefill_queries), n_heads, 1]);
        Ok(PrefillAttention { dispatch, n_heads, queries_per_tile: self.prefill_queries })
    }

    fn params(&self, p: &AttentionOperands) -> Result<AttentionParams, GpuError> {
        let AttentionOperands { q, cache, out, scores, .. } = *p;
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
        Ok(AttentionParams {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every head size's tile fits the workgroup memory, keeps its phases within the workgroup's
    /// threads (at least half of them busy summing) and divides evenly into register blocks.
    #[test]
    fn prefill_tiles_fit_the_workgroup() {
        for head_dim in HEAD_DIMS {
            let t = PrefillTile::for_head_dim(head_dim);
            let bytes = PrefillTile::bytes(head_dim, t.queries, t.keys);
            assert!(bytes <= WORKGROUP_BYTES, "{head_dim}: {t:?} takes {bytes} bytes");
            let divides = head_dim.is_multiple_of(8)
                && t.queries.is_multiple_of(t.score_queries)
                && t.keys.is_multiple_of(t.score_keys)
                && t.queries.is_multiple_of(t.out_queries);
            assert!(divides, "{head_dim}: {t:?}");
            let score_threads = (t.queries / t.score_queries) * (t.keys / t.score_keys);
            let out_threads = (t.queries / t.out_queries) * (head_dim / 8);
            assert!(score_threads <= PREFILL_THREADS && out_threads <= PREFILL_THREADS, "{head_dim}: {t:?}");
            assert!(2 * out_threads >= PREFILL_THREADS, "{head_dim}: {t:?}");
            assert!(t.queries <= PREFILL_THREADS, "{head_dim}: one softmax thread per query");
        }
    }
}
