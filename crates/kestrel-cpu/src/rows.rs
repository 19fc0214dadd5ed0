//! Weight and activation rows as the kernels read them: a weight row's levels (4-bit in nibbles,
//! or a byte each) with a scale per group of 16 or 32 weights (plus offsets), and an activation
//! row's 8-bit levels with their scales and group sums.

use kestrel_gguf::quant::INT_GROUP;

use crate::activations::QuantizedRows;
use crate::factored::UnitLayout;
use crate::ACT_BLOCK;

/// How a row's levels are stored.
#[derive(Clone, Copy)]
pub(crate) enum Levels<'a> {
    /// Two unsigned 4-bit levels per byte: in each block of 32 weights, byte j holds weight j in
    /// its low nibble and weight j + 16 in its high one (llama.cpp's Q4 order).
    Nibbles(&'a [u8]),
    /// One signed level per byte.
    Bytes(&'a [i8]),
}

/// A weight row as `Matrix` keeps it: `w = scale[g] · level + offset[g]` for the weights of
/// group g (`group` of 16 or 32 weights).
#[derive(Clone, Copy)]
pub(crate) struct IntRow<'a> {
    pub levels: Levels<'a>,
    pub group: usize,
    pub scale: &'a [f32],
    pub offset: Option<&'a [f32]>,
}

/// Scales or offsets as a matrix keeps them: f16 where every one of its values is exactly an
/// f16 (the 32-weight formats', which ggml stores as f16: half the bytes a step streams), a byte
/// and a super-block unit each for the K-quants (`factored`), else f32.
#[derive(Clone, Copy)]
pub(crate) enum Scales<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    /// Value i is `units[layout.unit_of(i)] · k[i]`.
    Factored {
        units: &'a [f32],
        k: &'a [i8],
        layout: UnitLayout,
    },
}

impl<'a> Scales<'a> {
    pub(crate) fn len(self) -> usize {
        match self {
            Scales::F32(s) => s.len(),
            Scales::F16(h) => h.len(),
            Scales::Factored { k, .. } => k.len(),
        }
    }

    /// Values `start..start + len`: for factored values, whole unit groups of whole lane groups
    /// (a matrix's whole rows, or whole interleaved groups of rows).
    pub(crate) fn part(self, start: usize, len: usize) -> Self {
        match self {
            Scales::F32(s) => Scales::F32(&s[start..][..len]),
            Scales::F16(h) => Scales::F16(&h[start..][..len]),
            Scales::Factored { units, k, layout } => {
                let (per_unit, whole) = (layout.per_unit(), layout.per_unit() * layout.lanes());
                assert!(start.is_multiple_of(whole) && len.is_multiple_of(whole), "factored scales split inside a unit");
                Scales::Factored { units: &units[start / per_unit..][..len / per_unit], k: &k[start..][..len], layout }
            }
        }
    }

    /// Value i as f32.
    #[inline]
    pub(crate) fn get(self, i: usize) -> f32 {
        match self {
            Scales::F32(s) => s[i],
            Scales::F16(h) => f16_to_f32(h[i]),
            Scales::Factored { units, k, layout } => units[layout.unit_of(i)] * f32::from(k[i]),
        }
    }

    /// The values as f32: borrowed, or converted into `buf`.
    fn to_f32<'b>(self, buf: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        match self {
            Scales::F32(s) => s,
            Scales::F16(h) => {
                buf.clear();
                buf.extend(h.iter().map(|&bits| f16_to_f32(bits)));
                buf
            }
            Scales::Factored { .. } => {
                buf.clear();
                buf.extend((0..self.len()).map(|i| self.get(i)));
                buf
            }
        }
    }
}

/// An f16's value: normal numbers (every scale but the tiniest) by moving the bits, the rest
/// (zeros, subnormals, infinities) through `half`. `half` alone converts in software in a build
/// without F16C (wasm, baseline x86-64), several times slower, and a row converts its scales for
/// every dot product of a decode step.
#[inline]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let exponent = bits & 0x7c00;
    if exponent == 0 || exponent == 0x7c00 {
        return half::f16::from_bits(bits).to_f32();
    }
    let sign = u32::from(bits & 0x8000) << 16;
    // Rebias the exponent from 15 to 127: (127 - 15) << 23 added to the shifted bits.
    f32::from_bits(sign | ((u32::from(bits & 0x7fff) << 13) + 0x3800_0000))
}

/// Consecutive weight rows of `cols` weights: their levels (`L`: `Levels` for rows one after
/// another, `interleaved::bytes::WovenLevels` for interleaved groups of 8 rows), a scale per
/// `group` (16 or 32) weights and, where the format has them, an offset each;
/// `w = scale · level + offset`.
#[derive(Clone, Copy)]
pub(crate) struct WeightRows<'a, L> {
    pub levels: L,
    pub group: usize,
    pub scale: Scales<'a>,
    pub offset: Option<Scales<'a>>,
    pub cols: usize,
}

/// Consecutive weight rows of `cols` weights, one after another (the levels, scales and offsets
/// of all of them).
pub(crate) type IntRows<'a> = WeightRows<'a, Levels<'a>>;

impl<'a> IntRows<'a> {
    pub(crate) fn rows(&self) -> usize {
        self.scale.len() * self.group / self.cols
    }

    /// Row r's levels, scales and offsets.
    #[inline]
    pub(crate) fn row_parts(&self, r: usize) -> (Levels<'a>, Scales<'a>, Option<Scales<'a>>) {
        let (cols, groups) = (self.cols, self.cols / self.group);
        let levels = match self.levels {
            Levels::Nibbles(n) => Levels::Nibbles(&n[r * cols / 2..][..cols / 2]),
            Levels::Bytes(q) => Levels::Bytes(&q[r * cols..][..cols]),
        };
        (levels, self.scale.part(r * groups, groups), self.offset.map(|o| o.part(r * groups, groups)))
    }

    /// Row r, its scales and offsets in f32 (converted into `bufs` where they are f16).
    pub(crate) fn row<'b>(&self, r: usize, bufs: &'b mut [Vec<f32>; 2]) -> IntRow<'b>
    where
        'a: 'b,
    {
        let (levels, scale, offset) = self.row_parts(r);
        let [scale_buf, offset_buf] = bufs;
        IntRow { levels, group: self.group, scale: scale.to_f32(scale_buf), offset: offset.map(|o| o.to_f32(offset_buf)) }
    }
}

/// One activation row of `QuantizedRows`.
#[derive(Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub q: &'a [i8],
    /// One scale per 32 values.
    pub d: &'a [f32],
    /// `Σ q` per 16 values.
    #[cfg_attr(not(target_arch = "x86_64"), expect(dead_code, reason = "only the AVX2 tiles read it"))]
    pub level_sums16: &'a [i16],
    /// `d · Σ q` per 16 and per 32 values.
    pub sums16: &'a [f32],
    pub sums32: &'a [f32],
}

impl QuantizedRows {
    /// Rows of `cols` values.
    pub(crate) fn rows(&self, cols: usize) -> usize {
        self.q.len() / cols
    }

    #[inline]
    pub(crate) fn row(&self, t: usize, cols: usize) -> ActRow<'_> {
        ActRow {
            q: &self.q[t * cols..][..cols],
            d: &self.d[t * cols / ACT_BLOCK..][..cols / ACT_BLOCK],
            level_sums16: &self.level_sums16[t * cols / INT_GROUP..][..cols / INT_GROUP],
            sums16: &self.sums16[t * cols / INT_GROUP..][..cols / INT_GROUP],
            sums32: &self.sums32[t * cols / ACT_BLOCK..][..cols / ACT_BLOCK],
        }
    }
}

impl<'a> ActRow<'a> {
    /// `Σ_{e in g} x[e]` for each group g of `group` (16 or 32) values: what the offsets of a
    /// weight row with that group multiply.
    #[inline]
    pub(crate) fn group_sums(self, group: usize) -> &'a [f32] {
        if group == ACT_BLOCK {
            self.sums32
        } else {
            self.sums16
        }
    }
}
