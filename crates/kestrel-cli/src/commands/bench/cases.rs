//! One benchmark case per kernel: its buffers filled with random values, the kernel bound to
//! them once, and a closure recording one call. Each builder states the bytes a call must move
//! at the least: every input read once, every output written once (scratch buffers and re-reads
//! a kernel chooses to make are its own cost, which is what the GB/s figure exposes).

use kestrel_gguf::GgmlType;
use kestrel_gpu::kernels::attention::{AttentionKernel, AttentionOperands, KvCache};
use kestrel_gpu::kernels::embedding::EmbeddingKernel;
use kestrel_gpu::kernels::matmul::{MatmulKernel, SwigluMatmulKernel};
use kestrel_gpu::kernels::matvec::{MatvecKernel, SwigluMatvecKernel};
use kestrel_gpu::kernels::rmsnorm::RmsNormKernel;
use kestrel_gpu::kernels::rope::{RopeKernel, RopeOperands};
use kestrel_gpu::kernels::sample::SampleKernel;
use kestrel_gpu::kernels::Epilogue;
use kestrel_gpu::kernels::{CopyKernel, FmaKernel, FmaParams, GateUpOperands, Operands};
use kestrel_gpu::{DType, Gpu, GpuError, Recorder, StepOp, StepParams, StepRows, StepUniform, Tensor, WeightTensor};
use kestrel_model::synthetic::SyntheticShape;
use kestrel_ops::params::{AttentionShape, GateActivation, KvType, RopeConfig, RopeMode, SamplingParams, Scores};
use pollster::block_on;

use super::shapes::{matrix_bytes, Matrix, Product};

/// A kernel bound and ready to time. Bind groups keep their buffers alive, so the recording
/// closure needs to own nothing but the dispatches.
pub struct Prepared {
    /// Bytes one call moves at the least (see each builder).
    pub bytes: u64,
    pub record: Box<dyn Fn(&mut Recorder)>,
}

/// Attention positions the benchmark's KV caches hold.
const MAX_CTX: usize = 2048;
const F32: u64 = 4;

/// `dst = src` over `bytes` bytes. Bytes: `2 * size` (read + write).
pub fn copy(gpu: &Gpu, bytes: u64) -> Result<Prepared, GpuError> {
    let len = (bytes / F32) as usize;
    let src = Tensor::zeros(gpu, "bench.copy.src", &[len], DType::F32)?;
    let dst = Tensor::zeros(gpu, "bench.copy.dst", &[len], DType::F32)?;
    let dispatch = block_on(CopyKernel::new(gpu))?.bind(gpu, &src, &dst)?;
    Ok(Prepared { bytes: 2 * src.byte_size(), record: Box::new(move |rec| dispatch.record(rec)) })
}

/// The FMA yardstick: `threads` threads of `FmaParams::iterations` rounds of multiply-adds.
/// Returns the case (no bytes: it touches memory once per thread) and its operations per call.
pub fn fma(gpu: &Gpu, threads: usize) -> Result<(Prepared, u64), GpuError> {
    let params = FmaParams { iterations: 128, scale: 0.999, shift: 0.01 };
    let out = Tensor::zeros(gpu, "bench.fma", &[threads], DType::F32)?;
    let dispatch = block_on(FmaKernel::new(gpu))?.bind(gpu, &out, params)?;
    let flops = params.flops_per_thread() * threads as u64;
    Ok((Prepared { bytes: out.byte_size(), record: Box::new(move |rec| dispatch.record(rec)) }, flops))
}

/// Fails with the error allocating `matrix` in `ty` would give when it exceeds the binding
/// limit, without spending any work on it.
pub fn check_fits(gpu: &Gpu, matrix: &Matrix, ty: GgmlType) -> Result<(), GpuError> {
    let needed = matrix_bytes(ty, matrix.rows, matrix.cols)
        .ok_or_else(|| GpuError::InvalidArgs(format!("{}: {} columns are not whole {} blocks", matrix.name, matrix.cols, ty.name())))?;
    let limit = gpu.max_binding_size();
    if needed > limit {
        return Err(GpuError::Limit { what: matrix.name.to_string(), needed, limit });
    }
    Ok(())
}

/// The weights of `matrix` in `ty` (two matrices, gate and up, for SwiGLU), from random values.
pub fn weights(gpu: &Gpu, matrix: &Matrix, ty: GgmlType) -> Result<Vec<WeightTensor>, GpuError> {
    check_fits(gpu, matrix, ty)?;
    let count = if matrix.product == Product::Swiglu { 2 } else { 1 };
    let values = random_values(matrix.rows * matrix.cols);
    (0..count).map(|_| WeightTensor::from_f32(gpu, matrix.name, ty, matrix.rows, matrix.cols, &values)).collect()
}

/// `tokens` tokens through the matrix as a decode step runs them: one token, or a batched step's
/// (each weight read once for all of them). Bytes: weights + x (tokens x K f32) + y (tokens x N
/// f32, twice when accumulating into it).
pub fn matvec(gpu: &Gpu, matrix: &Matrix, weights: &[WeightTensor], tokens: u32) -> Result<Prepared, GpuError> {
    let (w, ty) = (&weights[0], weights[0].ty);
    let m = tokens as usize;
    let x = random_tensor(gpu, "bench.x", &[m, matrix.cols])?;
    let y = Tensor::zeros(gpu, "bench.y", &[m, matrix.rows], DType::F32)?;
    let dispatch = match matrix.product {
        Product::Swiglu => block_on(SwigluMatvecKernel::batched(gpu, ty, GateActivation::Silu, tokens))?
            .bind(gpu, &GateUpOperands { gate: w, up: &weights[1], x: &x, out: &y })?,
        Product::Plain | Product::Accumulate => {
            block_on(MatvecKernel::batched(gpu, ty, epilogue(matrix.product), tokens))?.bind(gpu, &Operands::whole(w, &x, &y, None))?
        }
    };
    let bytes = weight_bytes(weights) + product_activation_bytes(matrix, m);
    Ok(Prepared { bytes, record: Box::new(move |rec| dispatch.record(rec)) })
}

/// `tokens` tokens through the matrix (prefill). Bytes: weights + x (M x K f32) + y (M x N f32,
/// twice when accumulating).
pub fn matmul(gpu: &Gpu, matrix: &Matrix, weights: &[WeightTensor], tokens: u32) -> Result<Prepared, GpuError> {
    let (w, ty) = (&weights[0], weights[0].ty);
    let m = tokens as usize;
    let x = random_tensor(gpu, "bench.x", &[m, matrix.cols])?;
    let y = Tensor::zeros(gpu, "bench.y", &[m, matrix.rows], DType::F32)?;
    let params = StepParams::new(tokens, 0, 0);
    let step = step_uniform(gpu, params);
    let dispatch = match matrix.product {
        Product::Swiglu => block_on(SwigluMatmulKernel::new(gpu, ty, GateActivation::Silu))?.bind(
            gpu,
            &GateUpOperands { gate: w, up: &weights[1], x: &x, out: &y },
            &step,
            tokens,
        )?,
        Product::Plain | Product::Accumulate => {
            block_on(MatmulKernel::new(gpu, ty, epilogue(matrix.product)))?.bind(gpu, &Operands::whole(w, &x, &y, None), &step, tokens)?
        }
    };
    let bytes = weight_bytes(weights) + product_activation_bytes(matrix, m);
    Ok(Prepared { bytes, record: Box::new(move |rec| dispatch.record(rec, &params)) })
}

/// Rows of a `vocab` x `hidden` table for `tokens` random ids. Bytes: ids + the gathered rows
/// in `ty` + the f32 output.
pub fn embedding(gpu: &Gpu, model: &SyntheticShape, ty: GgmlType, tokens: u32) -> Result<Prepared, GpuError> {
    let table_matrix = Matrix { name: "token_embd", rows: model.vocab, cols: model.hidden, product: Product::Plain };
    let table = weights(gpu, &table_matrix, ty)?.remove(0);
    let t = tokens as usize;
    let vocab = model.vocab as u32;
    let ids: Vec<u32> = random_values(t).iter().map(|v| ((v.abs() * vocab as f32) as u32).min(vocab - 1)).collect();
    let ids = Tensor::from_u32(gpu, "bench.ids", &[t], &ids)?;
    let out = Tensor::zeros(gpu, "bench.embedding", &[t, model.hidden], DType::F32)?;
    let params = StepParams::new(tokens, 0, 0);
    let step = step_uniform(gpu, params);
    let dispatch = block_on(EmbeddingKernel::new(gpu, ty, 1.0))?.bind(gpu, &table, &ids, &out, &step, tokens)?;
    let row_bytes = table.byte_size() / model.vocab as u64;
    let bytes = t as u64 * (F32 + row_bytes + model.hidden as u64 * F32);
    Ok(Prepared { bytes, record: Box::new(move |rec| dispatch.record(rec, &params)) })
}

/// RMSNorm of `tokens` rows of `hidden`. Bytes: x + weight + out.
pub fn rmsnorm(gpu: &Gpu, model: &SyntheticShape, tokens: u32) -> Result<Prepared, GpuError> {
    let shape = [tokens as usize, model.hidden];
    let x = random_tensor(gpu, "bench.x", &shape)?;
    let weight = random_tensor(gpu, "bench.norm", &[model.hidden])?;
    let out = Tensor::zeros(gpu, "bench.normed", &shape, DType::F32)?;
    let params = StepParams::new(tokens, 0, 0);
    let step = step_uniform(gpu, params);
    let dispatch = block_on(RmsNormKernel::new(gpu))?.bind(gpu, &step, &x, &weight, &out, 1e-5)?;
    let bytes = (2 * x.len() + model.hidden) as u64 * F32;
    Ok(Prepared { bytes, record: Box::new(move |rec| dispatch.record(rec, &params)) })
}

/// RoPE of `tokens` fused QKV rows ending at position `MAX_CTX`, Q to its buffer and K, V into
/// the (default, f16) cache. Bytes: the QKV rows read + Q and the cache's K and V written + the
/// angle table.
pub fn rope(gpu: &Gpu, model: &SyntheticShape, tokens: u32) -> Result<Prepared, GpuError> {
    let t = tokens as usize;
    let qkv = random_tensor(gpu, "bench.qkv", &[t, model.qkv_width()])?;
    let q = Tensor::zeros(gpu, "bench.q", &[t, model.q_width()], DType::F32)?;
    let cache = KvCache::new(gpu, "bench.cache", attention_shape(model, MAX_CTX), KvType::default(), 1)?;
    let params = StepParams::new(tokens, (MAX_CTX - t) as u32, 0);
    let step = step_uniform(gpu, params);
    let rows = step_rows(gpu, params)?;
    let config = RopeConfig::new(RopeMode::Norm, 10_000.0);
    let rotated = RopeOperands { config: Some(&config), qkv: &qkv, q_out: &q, cache: &cache };
    let dispatch = block_on(RopeKernel::new(gpu, cache.kv))?.bind(gpu, &step, &rows, &rotated)?;
    let angle_table = (model.head_dim() / 2) as u64 * 8;
    let bytes = qkv.byte_size() + q.byte_size() + kv_bytes(model, tokens) + angle_table;
    Ok(Prepared { bytes, record: Box::new(move |rec| dispatch.record(rec, &params)) })
}

/// Decode attention of one query over `kv_len` cached positions. Bytes: q + K and V of the
/// `kv_len` positions + out (the partials scratch is not counted).
pub fn attention_decode(gpu: &Gpu, model: &SyntheticShape, kv_len: u32) -> Result<Prepared, GpuError> {
    let cache = random_cache(gpu, model, kv_len as usize)?;
    let q = random_tensor(gpu, "bench.q", &[1, model.q_width()])?;
    let out = Tensor::zeros(gpu, "bench.attn", &[1, model.q_width()], DType::F32)?;
    let params = StepParams::new(1, kv_len - 1, 0);
    let rows = step_rows(gpu, params)?;
    let kernel = block_on(AttentionKernel::new(gpu, model.head_dim(), cache.kv))?;
    let scores = attention_scores(model);
    let dispatch = kernel.bind_decode(gpu, &AttentionOperands { q: &q, cache: &cache, out: &out, scores: &scores, rows: &rows }, 1)?;
    let bytes = 2 * q.byte_size() + kv_bytes(model, kv_len);
    Ok(Prepared { bytes, record: Box::new(move |rec| dispatch.record(rec, &params)) })
}

/// Causal prefill attention of `tokens` queries at positions `0..tokens`. Bytes: q + K and V
/// of those positions + out.
pub fn attention_prefill(gpu: &Gpu, model: &SyntheticShape, tokens: u32) -> Result<Prepared, GpuError> {
    let t = tokens as usize;
    let cache = random_cache(gpu, model, t)?;
    let q = random_tensor(gpu, "bench.q", &[t, model.q_width()])?;
    let out = Tensor::zeros(gpu, "bench.attn", &[t, model.q_width()], DType::F32)?;
    let params = StepParams::new(tokens, 0, 0);
    let step = step_uniform(gpu, params);
    let rows = step_rows(gpu, params)?;
    let kernel = block_on(AttentionKernel::new(gpu, model.head_dim(), cache.kv))?;
    let scores = attention_scores(model);
    let dispatch = kernel.bind_prefill(gpu, &step, &AttentionOperands { q: &q, cache: &cache, out: &out, scores: &scores, rows: &rows })?;
    let bytes = 2 * q.byte_size() + kv_bytes(model, tokens);
    Ok(Prepared { bytes, record: Box::new(move |rec| dispatch.record(rec, &params)) })
}

/// Token selection over `vocab` random logits with `params` (greedy: the argmax kernels).
/// Bytes: the logits read once + the 8-byte result (the sampler makes about 20 passes over
/// the logits when top-k and top-p are on; on a GPU they stay in L2).
pub fn sample(gpu: &Gpu, model: &SyntheticShape, params: &SamplingParams) -> Result<Prepared, GpuError> {
    let logits = random_tensor(gpu, "bench.logits", &[model.vocab])?;
    let out = Tensor::zeros(gpu, "bench.token", &[2], DType::U32)?;
    let step_params = StepParams::new(1, 0, 1);
    let step = step_uniform(gpu, step_params);
    let binding = block_on(SampleKernel::new(gpu))?.bind(gpu, &logits, &step, &out)?;
    binding.set_params(gpu, params)?;
    let bytes = logits.byte_size() + out.byte_size();
    Ok(Prepared { bytes, record: Box::new(move |rec| binding.record(rec, &step_params)) })
}

fn epilogue(product: Product) -> Epilogue {
    if product == Product::Accumulate {
        Epilogue::ACCUMULATE
    } else {
        Epilogue::NONE
    }
}

fn weight_bytes(weights: &[WeightTensor]) -> u64 {
    weights.iter().map(WeightTensor::byte_size).sum()
}

/// f32 activations of a matrix product over `tokens` tokens: x read, y written (and read first
/// when accumulating).
fn product_activation_bytes(matrix: &Matrix, tokens: usize) -> u64 {
    let y_passes = if matrix.product == Product::Accumulate { 2 } else { 1 };
    (tokens * (matrix.cols + y_passes * matrix.rows)) as u64 * F32
}

fn attention_shape(model: &SyntheticShape, max_ctx: usize) -> AttentionShape {
    AttentionShape { n_heads: model.n_heads, n_kv_heads: model.n_kv_heads, head_dim: model.head_dim(), max_ctx }
}

fn attention_scores(model: &SyntheticShape) -> Scores {
    Scores::scaled(1.0 / (model.head_dim() as f32).sqrt())
}

/// K and V of `positions` positions, f32.
/// K and V of `positions` positions in the default cache's value type.
fn kv_bytes(model: &SyntheticShape, positions: u32) -> u64 {
    2 * (model.n_kv_heads * model.head_dim() * KvType::default().bytes()) as u64 * u64::from(positions)
}

/// A KV cache (the default type, f16) of exactly `max_ctx` positions filled with random keys
/// and values.
fn random_cache(gpu: &Gpu, model: &SyntheticShape, max_ctx: usize) -> Result<KvCache, GpuError> {
    let cache = KvCache::new(gpu, "bench.cache", attention_shape(model, max_ctx), KvType::default(), 1)?;
    let values = random_values(cache.shape.cache_len());
    gpu.write(&cache.k.buffer, 0, &cache.kv.encode(&values));
    gpu.write(&cache.v.buffer, 0, &cache.kv.encode(&values));
    Ok(cache)
}

/// The step's tokens at their positions in slot 0.
fn step_rows(gpu: &Gpu, params: StepParams) -> Result<StepRows, GpuError> {
    let rows = StepRows::new(gpu, params.n_tokens as usize)?;
    rows.write_run(gpu, 0, params.pos, params.n_tokens)?;
    Ok(rows)
}

fn step_uniform(gpu: &Gpu, params: StepParams) -> StepUniform {
    let step = StepUniform::new(gpu);
    step.write(gpu, &params);
    step
}

fn random_tensor(gpu: &Gpu, label: &str, shape: &[usize]) -> Result<Tensor, GpuError> {
    Tensor::from_f32(gpu, label, shape, &random_values(shape.iter().product()))
}

/// `len` values uniform in [-1, 1) from a fixed seed (splitmix64): the data does not change
/// the speed of these kernels, only the sampler's, and a fixed seed keeps runs comparable.
fn random_values(len: usize) -> Vec<f32> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            // The top 24 bits are exact in an f32.
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}
