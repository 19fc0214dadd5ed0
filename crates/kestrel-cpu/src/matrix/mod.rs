//! A weight matrix for the CPU kernels: quantized formats as integer levels (two a byte for the
//! formats of at most 4 bits, 6 bits for Q6_K where its rows are interleaved) with a scale and an
//! offset per 32 weights (per 16 for Q6_K), F16 and F32 as f32. `apply` is `y = x·Wᵀ` for rows
//! of x.
//!
//! A matrix's quantized weights are `IntWeights` (`int_weights`), converted from the GGUF blocks
//! a run of rows at a time over the pool (`convert`).

mod convert;
mod int_weights;

use kestrel_gguf::GgmlType;

use crate::activations::{ActFormat, QuantizedRows};
use crate::alloc::{split_off, with_capacity};
use crate::dot::f32_products;
use crate::error::CpuError;
use crate::parallel::for_row_chunks_token_major;
use int_weights::{super_blocks_factor, IntLayout, IntWeights};

pub struct Matrix {
    rows: usize,
    cols: usize,
    weights: Weights,
}

enum Weights {
    Int(IntWeights),
    F32(Vec<f32>),
}

/// The quantized types kept as integer levels with scales (the ones the GPU runs).
const INT_TYPES: [GgmlType; 8] =
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

impl Matrix {
    /// A `rows` x `cols` matrix stored as GGUF bytes of type `ty`: the quantized types the GPU
    /// runs (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), F16 and F32.
    /// Its buffers are allocated fallibly: no room is `CpuError::OutOfMemory`.
    pub fn from_ggml(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self, CpuError> {
        let n = rows.checked_mul(cols).ok_or_else(|| CpuError::Shape { rows, cols, reason: "too many elements".into() })?;
        let what = || format!("a {rows} x {cols} {ty} matrix");
        let weights = match ty {
            GgmlType::F32 | GgmlType::F16 => {
                let mut values = with_capacity(n, &what)?;
                values.resize(n, 0.0);
                kestrel_gguf::quant::dequantize(ty, bytes, &mut values)?;
                Weights::F32(values)
            }
            ty if INT_TYPES.contains(&ty) => {
                if !cols.is_multiple_of(ty.block_size() as usize) {
                    return Err(CpuError::Shape { rows, cols, reason: format!("rows are not whole {ty} blocks") });
                }
                // Checked whole here: the conversion decodes the bytes a run of blocks at a time.
                if ty.row_bytes(n as u64) != Some(bytes.len() as u64) {
                    return Err(CpuError::Shape { rows, cols, reason: format!("{} bytes are not its {ty} data", bytes.len()) });
                }
                Weights::Int(IntWeights::from_ggml(ty, bytes, rows, cols, &what)?)
            }
            _ => return Err(CpuError::UnsupportedType { ty }),
        };
        Ok(Self { rows, cols, weights })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The bytes `from_ggml` stores `rows` x `cols` weights of `ty` in (None: a type it does not
    /// run, or more weights than a u64 counts), with
    /// the levels and scales as `native` code on this machine keeps them (`IntLayout`; the
    /// K-quants' scales factored, the others' in f16 when every scale and offset of the matrix is
    /// exactly an f16) or as wasm does (f32 scales).
    pub fn stored_bytes(ty: GgmlType, rows: u64, cols: u64, native: bool) -> Option<u64> {
        let n = rows.checked_mul(cols)?;
        match ty {
            GgmlType::F32 | GgmlType::F16 => n.checked_mul(4),
            ty if INT_TYPES.contains(&ty) => {
                let layout = IntLayout::of(ty, rows, native);
                let levels = layout.level_bytes(usize::try_from(n).ok()?) as u64;
                let scale_arrays = if layout.offset { 2 } else { 1 };
                let groups = n / layout.group as u64;
                let super_blocks = n / ty.block_size();
                let scale_bytes = match (native, super_blocks_factor(ty)) {
                    // A byte per group, an f32 unit per super-block.
                    (true, true) => groups + 4 * super_blocks,
                    (true, false) => 2 * groups,
                    (false, _) => 4 * groups,
                };
                Some(levels + scale_bytes * scale_arrays)
            }
            _ => None,
        }
    }

    /// Bytes the weights take in memory.
    pub fn bytes(&self) -> usize {
        match &self.weights {
            Weights::Int(w) => w.bytes(),
            Weights::F32(v) => 4 * v.len(),
        }
    }

    /// Row `r`'s f32 values (the embedding gather), exactly as ggml dequantizes them.
    pub fn row(&self, r: usize) -> Vec<f32> {
        let c = self.cols;
        match &self.weights {
            Weights::F32(v) => v[r * c..][..c].to_vec(),
            Weights::Int(w) => w.row(r, c),
        }
    }

    /// The rows before `at` and the rows from it (a file's fused Q|K|V or gate|up matrix).
    pub fn split_rows(self, at: usize) -> Result<(Matrix, Matrix), CpuError> {
        let (rows, cols) = (self.rows, self.cols);
        if at > rows {
            return Err(CpuError::Shape { rows, cols, reason: format!("no row {at} to split at") });
        }
        let what = || format!("rows {at}.. of a {rows} x {cols} matrix");
        let (head, tail) = match self.weights {
            Weights::F32(mut v) => {
                let tail = split_off(&mut v, at * cols, &what)?;
                (Weights::F32(v), Weights::F32(tail))
            }
            Weights::Int(w) => {
                let (head, tail) = w.split_rows(rows, at, cols, &what)?;
                (Weights::Int(head), Weights::Int(tail))
            }
        };
        Ok((Matrix { rows: at, cols, weights: head }, Matrix { rows: rows - at, cols, weights: tail }))
    }

    /// `y[t][r] = Σ_k x[t][k]·W[r][k]` for the `x.len() / cols` rows of x. Each weight row is
    /// read once for all rows of x; quantized matrices first quantize x to 8 bits per 32 as
    /// llama.cpp does.
    ///
    /// Panics if `x` is not whole rows of `cols` (a shape bug of the caller).
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        self.apply_quantizing(x, &mut Vec::new())
    }

    /// `apply` of each matrix to the same `x` (a layer's Q, K and V; its gate and up), which is
    /// quantized once per activation format they take rather than once per matrix.
    ///
    /// Panics as `apply` does.
    pub fn apply_each(matrices: &[&Matrix], x: &[f32]) -> Vec<Vec<f32>> {
        let mut quantized = Vec::new();
        matrices.iter().map(|m| m.apply_quantizing(x, &mut quantized)).collect()
    }

    /// `apply`, taking x's quantized rows from `quantized` or adding them there.
    fn apply_quantizing(&self, x: &[f32], quantized: &mut Vec<(ActFormat, QuantizedRows)>) -> Vec<f32> {
        let (rows, cols) = (self.rows, self.cols);
        assert!(cols > 0 && x.len().is_multiple_of(cols), "apply: {} values are not rows of {cols}", x.len());
        let n = x.len() / cols;
        let mut y = vec![0f32; n * rows];
        match &self.weights {
            Weights::F32(w) => for_row_chunks_token_major(&mut y, rows, n, 1, |first, out| {
                let task_rows = out.len() / n;
                f32_products(&w[first * cols..][..task_rows * cols], x, cols, out);
            }),
            Weights::Int(w) => {
                let at = match quantized.iter().position(|(format, _)| *format == w.act) {
                    Some(at) => at,
                    None => {
                        quantized.push((w.act, QuantizedRows::new(x, w.act)));
                        quantized.len() - 1
                    }
                };
                let xq = &quantized[at].1;
                for_row_chunks_token_major(&mut y, rows, n, w.rows_per_task(), |first, out| w.products(first, xq, out, n, cols));
            }
        }
        y
    }
}
