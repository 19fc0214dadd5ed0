//! The whole model on the CPU in plain f32: the graph of `cpu_forward` over the kernels' CPU
//! references, every weight dequantized. Slow and simple on purpose: the tests check the GPU
//! forward pass's logits, and the CPU backend's, against it.

use kestrel_cpu::KvRows;
use kestrel_gguf::{GgmlType, GgufHeader};
use kestrel_ops::params::{AttentionShape, KvType, Scores};
use kestrel_ops::reference::{attention, matmul};

use crate::config::ModelConfig;
use crate::cpu_forward::{CpuForward, CpuKernels, CpuTensors};
use crate::error::{bad_model, ModelError};
use crate::tensors::assign_roles;

/// The f32 reference kernels.
pub struct Reference;

/// A dequantized `rows` x `cols` matrix.
pub struct Dense {
    values: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl CpuKernels for Reference {
    type Matrix = Dense;

    fn matrix(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Dense, ModelError> {
        Ok(Dense { values: matmul::dequantize_weights(ty, bytes, rows, cols)?, rows, cols })
    }

    fn apply(m: &Dense, x: &[f32]) -> Vec<f32> {
        matmul::matmul(x, x.len() / m.cols, &m.values, m.rows, m.cols)
    }

    fn row(m: &Dense, r: usize) -> Vec<f32> {
        m.values.chunks_exact(m.cols).nth(r).map_or_else(|| vec![0.0; m.cols], <[f32]>::to_vec)
    }

    fn split_rows(mut m: Dense, at: usize) -> Result<(Dense, Dense), ModelError> {
        if at > m.rows {
            return Err(bad_model(format!("cannot split {} rows at {at}", m.rows)));
        }
        let tail = m.values.split_off(at * m.cols);
        Ok((Dense { values: m.values, rows: at, cols: m.cols }, Dense { values: tail, rows: m.rows - at, cols: m.cols }))
    }

    fn bytes(m: &Dense) -> usize {
        4 * m.values.len()
    }

    /// The reference keeps f32 values (rounded to f16 for an f16 cache), as its attention reads them.
    const F16_BITS: bool = false;

    fn attention(shape: &AttentionShape, q: &[f32], cache: KvRows<'_>, pos: usize, scores: &Scores) -> Vec<f32> {
        match cache {
            KvRows::F32 { k, v } => attention::attention(shape, q, k, v, pos, scores),
            KvRows::F16 { k, v } => {
                let widen = |h: &[u16]| h.iter().map(|&b| half::f16::from_bits(b).to_f32()).collect::<Vec<f32>>();
                attention::attention(shape, q, &widen(k), &widen(v), pos, scores)
            }
        }
    }
}

pub type ReferenceModel = CpuForward<Reference>;

impl ReferenceModel {
    /// Dequantizes every weight of a parsed file (`tensors[i]` = bytes of `header.tensors[i]`),
    /// for a KV cache of `max_ctx` positions holding `kv` values.
    pub fn new(header: &GgufHeader, tensors: &[Vec<u8>], max_ctx: usize, kv: KvType) -> Result<Self, ModelError> {
        Self::with_config(ModelConfig::from_header(header)?, header, tensors, max_ctx, kv)
    }

    /// The same with a config other than the file's: the tests turn one architectural feature
    /// off (a norm, YaRN, the layers without RoPE) to show that llama.cpp's output depends on it.
    pub fn with_config(
        config: ModelConfig,
        header: &GgufHeader,
        tensors: &[Vec<u8>],
        max_ctx: usize,
        kv: KvType,
    ) -> Result<Self, ModelError> {
        let roles = assign_roles(header, &config)?;
        let mut parts = CpuTensors::default();
        for ((info, role), bytes) in header.tensors.iter().zip(&roles).zip(tensors) {
            if let Some(e) = role {
                parts.add::<Reference>(e.role, info.ggml_type, bytes, e.rows, e.cols)?;
            }
        }
        CpuForward::from_tensors(config, parts, max_ctx, kv)
    }
}
