//! A weight matrix for the CPU kernels: quantized formats as integer levels (two a byte for the
//! formats of at most 4 bits) with a scale and an offset per 32 weights (per 16 for Q6_K), F16
//! and F32 as f32. `apply` is `y = x·Wᵀ` for rows of x.

use kestrel_gguf::quant::{int_groups, IntGroups, INT_GROUP};
use kestrel_gguf::GgmlType;

use crate::activations::{ActFormat, QuantizedRows};
use crate::dot::{f32_dot, int_products, IntRows, Levels, Scales};
use crate::error::CpuError;
use crate::parallel::for_row_chunks;
use crate::ACT_BLOCK;

pub struct Matrix {
    rows: usize,
    cols: usize,
    weights: Weights,
}

enum Weights {
    Int(IntWeights),
    F32(Vec<f32>),
}

/// `w = scale[g] · (level - bias) + min[g]` for the weights of group g, rows one after another.
struct IntWeights {
    levels: LevelStore,
    /// Weights per scale: 32, or 16 where the format's groups of 16 differ (Q6_K).
    group: usize,
    scale: ScaleStore,
    /// The products' offsets: the format's min minus `bias · scale` (None: all zero).
    offset: Option<ScaleStore>,
    /// What the stored levels exceed the format's by: 8 for Q4_0, whose signed levels are kept
    /// as unsigned nibbles (0 otherwise).
    bias: i8,
    act: ActFormat,
}

/// Scales or offsets: f16 where every value of the matrix is exactly one (`dot::Scales`),
/// natively.
enum ScaleStore {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl ScaleStore {
    fn new(values: Vec<f32>, f16: bool) -> Self {
        if f16 {
            ScaleStore::F16(values.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect())
        } else {
            ScaleStore::F32(values)
        }
    }

    /// Whether every value is exactly an f16.
    fn fits_f16(values: &[f32]) -> bool {
        values.iter().all(|&v| half::f16::from_f32(v).to_f32().to_bits() == v.to_bits())
    }

    fn get(&self, i: usize) -> f32 {
        match self {
            ScaleStore::F32(v) => v[i],
            ScaleStore::F16(h) => half::f16::from_bits(h[i]).to_f32(),
        }
    }

    fn view(&self) -> Scales<'_> {
        match self {
            ScaleStore::F32(v) => Scales::F32(v),
            ScaleStore::F16(h) => Scales::F16(h),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            ScaleStore::F32(v) => 4 * v.len(),
            ScaleStore::F16(h) => 2 * h.len(),
        }
    }

    fn split_off(&mut self, at: usize) -> Self {
        match self {
            ScaleStore::F32(v) => ScaleStore::F32(v.split_off(at)),
            ScaleStore::F16(h) => ScaleStore::F16(h.split_off(at)),
        }
    }
}

/// Formats of at most 4 bits keep two levels a byte, half the memory a decode step streams.
enum LevelStore {
    /// Block of 32: byte j holds weight j in the low nibble and j + 16 in the high one.
    Nibbles(Vec<u8>),
    Bytes(Vec<i8>),
}

impl IntWeights {
    fn new(ty: GgmlType, g: IntGroups) -> Self {
        let group = if ty == GgmlType::Q6_K { INT_GROUP } else { ACT_BLOCK };
        // Every format but Q6_K has one scale and min per 32 (its two groups of 16 agree).
        let per_group = |v: Vec<f32>| if group == INT_GROUP { v } else { v.into_iter().step_by(ACT_BLOCK / INT_GROUP).collect() };
        let scale = per_group(g.scale);
        let min = g.min.map(per_group);
        let bias: i8 = if ty == GgmlType::Q4_0 { 8 } else { 0 };
        let offset: Option<Vec<f32>> = match (min, bias) {
            (min, 0) => min,
            (_, b) => Some(scale.iter().map(|s| -f32::from(b) * s).collect()),
        };
        // Not in wasm: without F16C, converting a row's scales for each dot product costs more
        // than the bytes save (decode in Chromium went from 27 to 20 tok/s).
        let f16 = cfg!(not(target_arch = "wasm32")) && ScaleStore::fits_f16(&scale) && offset.as_deref().is_none_or(ScaleStore::fits_f16);
        let (scale, offset) = (ScaleStore::new(scale, f16), offset.map(|o| ScaleStore::new(o, f16)));
        let levels = if matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K) {
            let mut packed = Vec::with_capacity(g.q.len() / 2);
            for block in g.q.chunks_exact(ACT_BLOCK) {
                let (lo, hi) = block.split_at(ACT_BLOCK / 2);
                packed.extend(lo.iter().zip(hi).map(|(&a, &b)| (a + bias) as u8 & 0x0F | ((b + bias) as u8) << 4));
            }
            LevelStore::Nibbles(packed)
        } else {
            LevelStore::Bytes(g.q)
        };
        let act = if ty.block_size() as usize == ACT_BLOCK { ActFormat::Q8_0 } else { ActFormat::Q8K };
        Self { levels, group, scale, offset, bias, act }
    }

    fn bytes(&self) -> usize {
        let levels = match &self.levels {
            LevelStore::Nibbles(n) => n.len(),
            LevelStore::Bytes(q) => q.len(),
        };
        levels + self.scale.bytes() + self.offset.as_ref().map_or(0, ScaleStore::bytes)
    }

    /// The format's level of weight `i` (counted over the whole matrix).
    fn level(&self, i: usize) -> i8 {
        match &self.levels {
            LevelStore::Nibbles(n) => {
                let byte = n[i / ACT_BLOCK * (ACT_BLOCK / 2) + i % (ACT_BLOCK / 2)];
                (if i % ACT_BLOCK < ACT_BLOCK / 2 { byte & 0x0F } else { byte >> 4 }) as i8 - self.bias
            }
            LevelStore::Bytes(q) => q[i],
        }
    }

    /// Row `r`'s weights, as ggml's dequantizer computes them.
    fn row(&self, r: usize, cols: usize) -> Vec<f32> {
        (r * cols..(r + 1) * cols)
            .map(|i| {
                let g = i / self.group;
                let scaled = f32::from(self.level(i)) * self.scale.get(g);
                match (&self.offset, self.bias) {
                    (Some(offset), 0) => scaled + offset.get(g),
                    _ => scaled,
                }
            })
            .collect()
    }

    /// Rows `first..first + count` for the dot products.
    fn rows_view(&self, first: usize, count: usize, cols: usize) -> IntRows<'_> {
        let groups = cols / self.group;
        let levels = match &self.levels {
            LevelStore::Nibbles(n) => Levels::Nibbles(&n[first * cols / 2..][..count * cols / 2]),
            LevelStore::Bytes(q) => Levels::Bytes(&q[first * cols..][..count * cols]),
        };
        let (start, len) = (first * groups, count * groups);
        let (scale, offset) = (self.scale.view().part(start, len), self.offset.as_ref().map(|o| o.view().part(start, len)));
        IntRows { levels, group: self.group, scale, offset, cols }
    }

    /// The rows before `at` (of `cols` weights) and the rows from it.
    fn split_rows(self, at: usize, cols: usize) -> (Self, Self) {
        let Self { levels, group, mut scale, offset, bias, act } = self;
        let (levels, levels_tail) = match levels {
            LevelStore::Nibbles(mut n) => {
                let tail = n.split_off(at * cols / 2);
                (LevelStore::Nibbles(n), LevelStore::Nibbles(tail))
            }
            LevelStore::Bytes(mut q) => {
                let tail = q.split_off(at * cols);
                (LevelStore::Bytes(q), LevelStore::Bytes(tail))
            }
        };
        let scale_tail = scale.split_off(at * cols / group);
        let (offset, offset_tail) = match offset {
            Some(mut o) => {
                let tail = o.split_off(at * cols / group);
                (Some(o), Some(tail))
            }
            None => (None, None),
        };
        (
            Self { levels, group, scale, offset, bias, act },
            Self { levels: levels_tail, group, scale: scale_tail, offset: offset_tail, bias, act },
        )
    }
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
                Weights::Int(IntWeights::new(ty, int_groups(ty, bytes, n)?))
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
        let (head, tail) = match self.weights {
            Weights::F32(mut v) => {
                let tail = v.split_off(at * cols);
                (Weights::F32(v), Weights::F32(tail))
            }
            Weights::Int(w) => {
                let (head, tail) = w.split_rows(at, cols);
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
            Weights::Int(w) => {
                let at = match quantized.iter().position(|(format, _)| *format == w.act) {
                    Some(at) => at,
                    None => {
                        quantized.push((w.act, QuantizedRows::new(x, w.act)));
                        quantized.len() - 1
                    }
                };
                let xq = &quantized[at].1;
                for_row_chunks(&mut by_row, n, |first, out| int_products(w.rows_view(first, out.len() / n, cols), xq, out));
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
