//! A weight matrix for the CPU kernels: quantized formats as integers with a scale (and an
//! offset) per 16 weights, F16 and F32 as f32. `apply` is `y = x·Wᵀ` for rows of x.

use kestrel_gguf::quant::{int_groups, INT_GROUP};
use kestrel_gguf::GgmlType;

use crate::activations::{ActFormat, QuantizedRows};
use crate::dot::{f32_dot, int_dot, IntRow};
use crate::error::CpuError;
use crate::parallel::for_row_chunks;

pub struct Matrix {
    rows: usize,
    cols: usize,
    weights: Weights,
}

enum Weights {
    Int { q: Vec<i8>, scale: Vec<f32>, min: Option<Vec<f32>>, act: ActFormat },
    F32(Vec<f32>),
}

impl Matrix {
    /// A `rows` x `cols` matrix stored as GGUF bytes of type `ty`: the quantized types the GPU
    /// runs (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), F16 and F32.
    pub fn from_ggml(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self, CpuError> {
        let n = rows.checked_mul(cols).ok_or_else(|| CpuError::Shape { rows, cols, reason: "too many elements".into() })?;
        let weights = match ty {
            GgmlType::F32 | GgmlType::F16 => {
                let mut values = vec![0.0; n];
                kestrel_gguf::quant::dequantize(ty, bytes, &mut values)?;
                Weights::F32(values)
            }
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K => {
                if !cols.is_multiple_of(ty.block_size() as usize) {
                    return Err(CpuError::Shape { rows, cols, reason: format!("rows are not whole {ty} blocks") });
                }
                let g = int_groups(ty, bytes, n)?;
                let act = if ty.block_size() as usize == crate::ACT_BLOCK { ActFormat::Q8_0 } else { ActFormat::Q8K };
                Weights::Int { q: g.q, scale: g.scale, min: g.min, act }
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

    /// Bytes the weights take in memory.
    pub fn bytes(&self) -> usize {
        match &self.weights {
            Weights::Int { q, scale, min, .. } => q.len() + 4 * (scale.len() + min.as_ref().map_or(0, Vec::len)),
            Weights::F32(v) => 4 * v.len(),
        }
    }

    /// Row `r`'s f32 values (the embedding gather), exactly as ggml dequantizes them.
    pub fn row(&self, r: usize) -> Vec<f32> {
        let c = self.cols;
        match &self.weights {
            Weights::F32(v) => v[r * c..][..c].to_vec(),
            Weights::Int { q, scale, min, .. } => {
                let g = |e: usize| (r * c + e) / INT_GROUP;
                (0..c)
                    .map(|e| {
                        let scaled = f32::from(q[r * c + e]) * scale[g(e)];
                        min.as_ref().map_or(scaled, |m| scaled + m[g(e)])
                    })
                    .collect()
            }
        }
    }

    /// The rows before `at` and the rows from it (a file's fused Q|K|V or gate|up matrix).
    pub fn split_rows(self, at: usize) -> Result<(Matrix, Matrix), CpuError> {
        let (rows, cols) = (self.rows, self.cols);
        if at > rows {
            return Err(CpuError::Shape { rows, cols, reason: format!("no row {at} to split at") });
        }
        let split = |w: Weights| match w {
            Weights::F32(mut v) => {
                let tail = v.split_off(at * cols);
                (Weights::F32(v), Weights::F32(tail))
            }
            Weights::Int { mut q, mut scale, min, act } => {
                let (q_tail, s_tail) = (q.split_off(at * cols), scale.split_off(at * cols / INT_GROUP));
                let (min, m_tail) = match min {
                    Some(mut m) => {
                        let tail = m.split_off(at * cols / INT_GROUP);
                        (Some(m), Some(tail))
                    }
                    None => (None, None),
                };
                (Weights::Int { q, scale, min, act }, Weights::Int { q: q_tail, scale: s_tail, min: m_tail, act })
            }
        };
        let (head, tail) = split(self.weights);
        Ok((Matrix { rows: at, cols, weights: head }, Matrix { rows: rows - at, cols, weights: tail }))
    }

    /// `y[t][r] = Σ_k x[t][k]·W[r][k]` for the `x.len() / cols` rows of x. Each weight row is
    /// read once for all rows of x; quantized matrices first quantize x to 8 bits per 32 as
    /// llama.cpp does.
    ///
    /// Panics if `x` is not whole rows of `cols` (a shape bug of the caller).
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let (rows, cols) = (self.rows, self.cols);
        assert!(cols > 0 && x.len().is_multiple_of(cols), "apply: {} values are not rows of {cols}", x.len());
        let n = x.len() / cols;
        // Row-major by weight row first, so each task writes one contiguous run.
        let mut by_row = vec![0f32; rows * n];
        match &self.weights {
            Weights::F32(w) => for_row_chunks(&mut by_row, n, |first, out| {
                for (i, ys) in out.chunks_exact_mut(n).enumerate() {
                    let w_row = &w[(first + i) * cols..][..cols];
                    for (t, y) in ys.iter_mut().enumerate() {
                        *y = f32_dot(w_row, &x[t * cols..][..cols]);
                    }
                }
            }),
            Weights::Int { q, scale, min, act } => {
                let xq = QuantizedRows::new(x, *act);
                let groups = cols / INT_GROUP;
                for_row_chunks(&mut by_row, n, |first, out| {
                    for (i, ys) in out.chunks_exact_mut(n).enumerate() {
                        let r = first + i;
                        let w_row = IntRow {
                            q: &q[r * cols..][..cols],
                            scale: &scale[r * groups..][..groups],
                            min: min.as_ref().map(|m| &m[r * groups..][..groups]),
                        };
                        for (t, y) in ys.iter_mut().enumerate() {
                            *y = int_dot(w_row, xq.row(t, cols));
                        }
                    }
                });
            }
        }
        if n == 1 {
            return by_row;
        }
        let mut y = vec![0f32; n * rows];
        for (r, ys) in by_row.chunks_exact(n).enumerate() {
            for (t, &v) in ys.iter().enumerate() {
                y[t * rows + r] = v;
            }
        }
        y
    }
}
