//! A matrix's quantized weights as the kernels read them: integer levels (nibbles, bytes or 6
//! bits; rows one after another or interleaved in groups of 8) with scales and offsets (f32,
//! f16 or factored), how each GGUF type is kept so, and the products, rows and splits of them.

use kestrel_gguf::quant::INT_GROUP;
use kestrel_gguf::GgmlType;

use super::convert::{Conversion, LevelRun, RowRun, ValueStore, RUN_BLOCKS};
use crate::activations::{ActFormat, QuantizedRows};
use crate::alloc::{split_off, with_capacity, zeroed};
use crate::dot::int_products;
use crate::error::CpuError;
use crate::factored::UnitLayout;
use crate::interleaved::bytes::{self, ByteGroupRows, WovenLevels};
use crate::interleaved::nibbles::{self, GroupRows};
use crate::interleaved::{self, GROUP_ROWS};
use crate::parallel::try_each_on_pool;
use crate::rows::{IntRows, Levels, Scales};
use crate::ACT_BLOCK;

/// `w = scale[g] · (level - bias) + min[g]` for the weights of group g, rows one after another.
pub(super) struct IntWeights {
    levels: LevelStore,
    /// Weights per scale: 32, or 16 where the format's groups of 16 differ (Q6_K).
    group: usize,
    scale: ScaleStore,
    /// The products' offsets: the format's min minus `bias · scale` (None: all zero).
    offset: Option<ScaleStore>,
    /// What the stored levels exceed the format's by: 8 for Q4_0, whose signed levels are kept
    /// as unsigned nibbles (0 otherwise).
    bias: i8,
    pub act: ActFormat,
}

/// Scales or offsets: natively, f16 where every value of the matrix is exactly one, and a byte
/// with a unit per super-block for the K-quants (`factored`); f32 otherwise (`rows::Scales`).
enum ScaleStore {
    F32(Vec<f32>),
    F16(Vec<u16>),
    Factored { units: Vec<f32>, k: Vec<i8>, layout: UnitLayout },
}

impl ScaleStore {
    fn new(values: Vec<f32>, f16: bool, what: &dyn Fn() -> String) -> Result<Self, CpuError> {
        if !f16 {
            return Ok(ScaleStore::F32(values));
        }
        let mut bits = with_capacity(values.len(), what)?;
        bits.extend(values.iter().map(|&v| half::f16::from_f32(v).to_bits()));
        Ok(ScaleStore::F16(bits))
    }

    /// The values mapped by `f32s` or `f16s`, whichever the store holds (factored values as
    /// whole f32s).
    fn map(&self, f32s: impl Fn(&[f32]) -> Vec<f32>, f16s: impl Fn(&[u16]) -> Vec<u16>) -> Self {
        match self {
            ScaleStore::F32(v) => ScaleStore::F32(f32s(v)),
            ScaleStore::F16(h) => ScaleStore::F16(f16s(h)),
            ScaleStore::Factored { .. } => {
                let view = self.view();
                ScaleStore::F32(f32s(&(0..view.len()).map(|i| view.get(i)).collect::<Vec<f32>>()))
            }
        }
    }

    /// Whether every value is exactly an f16.
    fn fits_f16(values: &[f32]) -> bool {
        values.iter().all(|&v| half::f16::from_f32(v).to_f32().to_bits() == v.to_bits())
    }

    fn get(&self, i: usize) -> f32 {
        self.view().get(i)
    }

    fn view(&self) -> Scales<'_> {
        match self {
            ScaleStore::F32(v) => Scales::F32(v),
            ScaleStore::F16(h) => Scales::F16(h),
            ScaleStore::Factored { units, k, layout } => Scales::Factored { units, k, layout: *layout },
        }
    }

    fn bytes(&self) -> usize {
        match self {
            ScaleStore::F32(v) => 4 * v.len(),
            ScaleStore::F16(h) => 2 * h.len(),
            ScaleStore::Factored { units, k, .. } => 4 * units.len() + k.len(),
        }
    }

    /// The values from `at` (whole unit groups of whole lane groups, for factored values).
    fn split_off(&mut self, at: usize, what: &dyn Fn() -> String) -> Result<Self, CpuError> {
        Ok(match self {
            ScaleStore::F32(v) => ScaleStore::F32(split_off(v, at, what)?),
            ScaleStore::F16(h) => ScaleStore::F16(split_off(h, at, what)?),
            ScaleStore::Factored { units, k, layout } => {
                let layout = *layout;
                assert!(at.is_multiple_of(layout.per_unit() * layout.lanes()), "factored scales split inside a unit");
                ScaleStore::Factored { units: split_off(units, at / layout.per_unit(), what)?, k: split_off(k, at, what)?, layout }
            }
        })
    }
}

/// Formats of at most 4 bits keep two levels a byte, half the memory a decode step streams.
enum LevelStore {
    /// Block of 32: byte j holds weight j in the low nibble and j + 16 in the high one.
    Nibbles(Vec<u8>),
    Bytes(Vec<i8>),
    /// Nibbles of rows in groups of 8, interleaved for the products that sum 8 rows at once
    /// (`interleaved::nibbles`' layout; the scales and offsets are interleaved alike). Where the
    /// machine has their SIMD code, for 4-bit formats of one scale per 32 weights and a multiple
    /// of 8 rows.
    Nibbles8(Vec<u8>),
    /// Byte levels of rows in groups of 8, interleaved alike (`interleaved::bytes`' layout), for
    /// the other formats, where the machine has the SIMD code and for a multiple of 8 rows.
    Bytes8(Vec<i8>),
    /// Levels of 5 and 6 bits (Q5_0, Q5_1, Q5_K, Q6_K) in 6 bits, rows in groups of 8
    /// (`interleaved::bytes`' six-bit layout), where Bytes8 would otherwise hold them: three
    /// quarters of the bytes a decode step streams.
    SixBits8(Vec<u8>),
}

/// The formats whose scales and offsets are whole multiples of a unit per super-block
/// (`kestrel_gguf::quant::super_block_factors`).
pub(super) fn super_blocks_factor(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Whether K-quant scales and offsets are kept factored (`factored`): natively. Not in wasm,
/// whose row kernels would expand a row's scales for each dot product (as they would f16 ones).
const FACTORED_SCALES: bool = cfg!(not(target_arch = "wasm32"));

/// How a quantized type is stored: weights per scale (every format but Q6_K has one scale and min
/// per 32, its two groups of 16 agreeing), how its levels are kept, and whether the products have
/// an offset per scale (the formats with a min, and Q4_0, whose signed levels are kept as unsigned
/// nibbles, where its products do not take the bias off themselves).
pub(super) struct IntLayout {
    pub group: usize,
    /// Two levels a byte.
    nibbles: bool,
    /// Rows interleaved in groups of 8 (`interleaved`): where the machine
    /// has their SIMD products, the format suits them (one scale per 32 for 4-bit levels), and
    /// the rows are whole groups.
    woven: bool,
    /// Levels of 5 and 6 bits kept in 6: where they are woven.
    six_bits: bool,
    /// What the stored levels exceed the format's by: 8 for Q4_0's unsigned nibbles.
    bias: i8,
    pub offset: bool,
}

impl IntLayout {
    /// `ty`'s layout for `rows` rows, in this build (`native`) or in wasm's.
    pub(super) fn of(ty: GgmlType, rows: u64, native: bool) -> Self {
        let group = if ty == GgmlType::Q6_K { INT_GROUP } else { ACT_BLOCK };
        let nibbles = matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K);
        let woven = native && (group == ACT_BLOCK || !nibbles) && interleaved::has_simd() && rows.is_multiple_of(GROUP_ROWS as u64);
        let bias = if ty == GgmlType::Q4_0 { 8 } else { 0 };
        let has_offset = matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K);
        // Q4_0's interleaved products apply its bias themselves: no offsets.
        let offset = has_offset && !(woven && bias != 0);
        let six_bits = woven && matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K | GgmlType::Q6_K);
        Self { group, nibbles, woven, six_bits, bias, offset }
    }

    /// Bytes of `n` levels.
    pub(super) fn level_bytes(&self, n: usize) -> usize {
        match (self.nibbles, self.six_bits) {
            (true, _) => n / 2,
            (false, true) => n / 4 * 3,
            (false, false) => n,
        }
    }
}

impl IntWeights {
    /// `rows` x `cols` weights stored as `bytes` of type `ty` (whole blocks: checked by the
    /// caller), converted a run of whole rows at a time, on the CPU pool, into buffers allocated
    /// once, fallibly; `what` names the matrix in an allocation error. Where the machine has the
    /// interleaved products and the format suits them (4-bit levels, one scale per 32, whole
    /// groups of 8 rows), the levels, scales and offsets go straight to their interleaved places
    /// (`interleaved::nibbles`' layout); a K-quant's scales and offsets natively straight to their
    /// factored stores (`factored`).
    pub(super) fn from_ggml(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize, what: &dyn Fn() -> String) -> Result<Self, CpuError> {
        let n = rows * cols;
        let layout = IntLayout::of(ty, rows as u64, cfg!(not(target_arch = "wasm32")));
        let IntLayout { group, woven, bias, .. } = layout;
        let mut levels = match (layout.nibbles, woven, layout.six_bits) {
            (true, true, _) => LevelStore::Nibbles8(zeroed(n / 2, what)?),
            (true, false, _) => LevelStore::Nibbles(zeroed(n / 2, what)?),
            (false, true, true) => LevelStore::SixBits8(zeroed(layout.level_bytes(n), what)?),
            (false, true, false) => LevelStore::Bytes8(zeroed(n, what)?),
            (false, false, _) => LevelStore::Bytes(zeroed(n, what)?),
        };
        let block = ty.block_size() as usize;
        let factored = FACTORED_SCALES && super_blocks_factor(ty);
        let mut scale = ValueStore::new(factored, n / group, n / block, what)?;
        let mut offset = if layout.offset { Some(ValueStore::new(factored, n / group, n / block, what)?) } else { None };

        // Runs of whole rows (whole interleaved groups) of about RUN_BLOCKS blocks, one task
        // each over the pool: each converts its rows into its own part of every store.
        let row_blocks = cols / block;
        let run_rows = (RUN_BLOCKS / row_blocks.max(1)).max(1).next_multiple_of(GROUP_ROWS);
        let row_bytes = row_blocks * ty.type_size() as usize;
        let level_bytes = layout.level_bytes(cols);
        let level_runs: Vec<LevelRun<'_>> = match &mut levels {
            LevelStore::Nibbles(v) => v.chunks_mut(run_rows * level_bytes).map(LevelRun::Nibbles).collect(),
            LevelStore::Nibbles8(v) => v.chunks_mut(run_rows * level_bytes).map(LevelRun::Nibbles8).collect(),
            LevelStore::Bytes(v) => v.chunks_mut(run_rows * level_bytes).map(LevelRun::Bytes).collect(),
            LevelStore::Bytes8(v) => v.chunks_mut(run_rows * level_bytes).map(LevelRun::Bytes8).collect(),
            LevelStore::SixBits8(v) => v.chunks_mut(run_rows * level_bytes).map(LevelRun::SixBits8).collect(),
        };
        let (run_values, run_units) = (run_rows * cols / group, run_rows * row_blocks);
        let mut offset_runs = offset.as_mut().map(|o| o.runs(run_values, run_units).into_iter());
        let runs: Vec<RowRun<'_>> = bytes
            .chunks(run_rows * row_bytes)
            .zip(level_runs)
            .zip(scale.runs(run_values, run_units))
            .map(|((bytes, levels), scale)| RowRun { bytes, levels, scale, offset: offset_runs.as_mut().and_then(Iterator::next) })
            .collect();
        let conversion = Conversion { ty, cols, group, bias, woven };
        try_each_on_pool(runs, |run| conversion.convert(run))?;
        let act = if block == ACT_BLOCK { ActFormat::Q8_0 } else { ActFormat::Q8K };
        let lanes = if woven { GROUP_ROWS } else { 1 };
        let layout = UnitLayout::new(block / group, lanes);
        let store = |values: ValueStore, f16: bool| -> Result<ScaleStore, CpuError> {
            match values {
                ValueStore::Factored { k, units } => Ok(ScaleStore::Factored { units, k, layout }),
                ValueStore::Whole(v) => ScaleStore::new(v, f16, what),
            }
        };
        // Not in wasm: without F16C, converting a row's scales for each dot product costs more
        // than the bytes save (decode in Chromium went from 27 to 20 tok/s).
        let whole_fits_f16 = |v: &Option<&ValueStore>| match v {
            Some(ValueStore::Whole(values)) => ScaleStore::fits_f16(values),
            _ => true,
        };
        let f16 = cfg!(not(target_arch = "wasm32")) && !factored && whole_fits_f16(&Some(&scale)) && whole_fits_f16(&offset.as_ref());
        let scale = store(scale, f16)?;
        let offset = offset.map(|o| store(o, f16)).transpose()?;
        Ok(Self { levels, group, scale, offset, bias, act })
    }

    pub(super) fn bytes(&self) -> usize {
        let levels = match &self.levels {
            LevelStore::Nibbles(n) | LevelStore::Nibbles8(n) | LevelStore::SixBits8(n) => n.len(),
            LevelStore::Bytes(q) | LevelStore::Bytes8(q) => q.len(),
        };
        levels + self.scale.bytes() + self.offset.as_ref().map_or(0, ScaleStore::bytes)
    }

    /// The format's level of weight `i` (counted over the whole matrix, of `cols` weights a row).
    fn level(&self, i: usize, cols: usize) -> i8 {
        let nibble = |byte: u8| (if i % ACT_BLOCK < ACT_BLOCK / 2 { byte & 0x0F } else { byte >> 4 }) as i8 - self.bias;
        let woven_level = |levels: WovenLevels<'_>| {
            let (r, e) = (i / cols, i % cols);
            levels.level(r, e / ACT_BLOCK, e % ACT_BLOCK, cols / ACT_BLOCK)
        };
        match &self.levels {
            LevelStore::Nibbles(n) => nibble(n[i / ACT_BLOCK * (ACT_BLOCK / 2) + i % (ACT_BLOCK / 2)]),
            LevelStore::Nibbles8(n) => {
                let (r, e) = (i / cols, i % cols);
                nibble(n[nibbles::byte_index(r, e / ACT_BLOCK, e % (ACT_BLOCK / 2), cols / ACT_BLOCK)])
            }
            LevelStore::Bytes(q) => q[i],
            LevelStore::Bytes8(q) => woven_level(WovenLevels::Bytes(q)),
            LevelStore::SixBits8(bits) => woven_level(WovenLevels::SixBits(bits)),
        }
    }

    /// Where the scale (and offset) of weight `i` is kept.
    fn group_of(&self, i: usize, cols: usize) -> usize {
        match &self.levels {
            LevelStore::Nibbles8(_) | LevelStore::Bytes8(_) | LevelStore::SixBits8(_) => {
                interleaved::value_index(i / cols, i % cols / self.group, cols / self.group)
            }
            LevelStore::Nibbles(_) | LevelStore::Bytes(_) => i / self.group,
        }
    }

    /// Row `r`'s weights, as ggml's dequantizer computes them.
    pub(super) fn row(&self, r: usize, cols: usize) -> Vec<f32> {
        (r * cols..(r + 1) * cols)
            .map(|i| {
                let g = self.group_of(i, cols);
                let scaled = f32::from(self.level(i, cols)) * self.scale.get(g);
                match (&self.offset, self.bias) {
                    (Some(offset), 0) => scaled + offset.get(g),
                    _ => scaled,
                }
            })
            .collect()
    }

    /// `out = x · Wᵀ` for rows `first..first + out.len() / n` (whole groups of 8 where they are
    /// interleaved: `rows_per_task`), `n` tokens a row.
    pub(super) fn products(&self, first: usize, x: &QuantizedRows, out: &mut [f32], n: usize, cols: usize) {
        let (groups, count) = (cols / self.group, out.len() / n);
        let (start, len) = (first * groups, count * groups);
        let (scale, offset) = (self.scale.view().part(start, len), self.offset.as_ref().map(|o| o.view().part(start, len)));
        let levels = match &self.levels {
            LevelStore::Nibbles(n) => Levels::Nibbles(&n[first * cols / 2..][..count * cols / 2]),
            LevelStore::Bytes(q) => Levels::Bytes(&q[first * cols..][..count * cols]),
            LevelStore::Nibbles8(n) => {
                let levels = &n[first * cols / 2..][..count * cols / 2];
                return interleaved::products(GroupRows { levels, scale, offset, bias: f32::from(self.bias), cols }, x, out);
            }
            LevelStore::Bytes8(q) => {
                let levels = WovenLevels::Bytes(&q[first * cols..][..count * cols]);
                return interleaved::products(ByteGroupRows { levels, group: self.group, scale, offset, cols }, x, out);
            }
            LevelStore::SixBits8(bits) => {
                let levels = WovenLevels::SixBits(&bits[first * cols / 4 * 3..][..count * cols / 4 * 3]);
                return interleaved::products(ByteGroupRows { levels, group: self.group, scale, offset, cols }, x, out);
            }
        };
        int_products(IntRows { levels, group: self.group, scale, offset, cols }, x, out)
    }

    /// The rows a product's task takes a multiple of: whole groups, and for 4-bit, byte and
    /// 6-bit levels of a scale per 32 whole pairs of groups, which their AVX512-VNNI tiles take at
    /// once where they have whole scales (and 4-bit factored ones), a lone group costing them a
    /// pair. (Q5_K's and Q6_K's factored tiles take one group at a time; pairs cost them nothing.)
    pub(super) fn rows_per_task(&self) -> usize {
        match self.levels {
            LevelStore::Nibbles8(_) | LevelStore::Bytes8(_) => 2 * GROUP_ROWS,
            LevelStore::SixBits8(_) if self.group == ACT_BLOCK => 2 * GROUP_ROWS,
            LevelStore::SixBits8(_) => GROUP_ROWS,
            LevelStore::Nibbles(_) | LevelStore::Bytes(_) => 1,
        }
    }

    /// Interleaved rows back one after another (`rows` rows of `cols` weights).
    fn deinterleaved(self, rows: usize, cols: usize) -> Self {
        let levels = match &self.levels {
            LevelStore::Nibbles8(n) => LevelStore::Nibbles(nibbles::deinterleave_levels(n, rows, cols)),
            LevelStore::Bytes8(q) => LevelStore::Bytes(bytes::deinterleave_levels(WovenLevels::Bytes(q), rows, cols)),
            LevelStore::SixBits8(bits) => LevelStore::Bytes(bytes::deinterleave_levels(WovenLevels::SixBits(bits), rows, cols)),
            LevelStore::Nibbles(_) | LevelStore::Bytes(_) => return self,
        };
        let groups = cols / self.group;
        let unweave = |s: &ScaleStore| {
            s.map(|v| interleaved::interleave_values(v, rows, groups, true), |h| interleaved::interleave_values(h, rows, groups, true))
        };
        let scale = unweave(&self.scale);
        // The row kernels take Q4_0's bias as offsets of -bias · scale (exact in f16 too: the
        // bias is a power of two).
        let minus_bias = -f32::from(self.bias);
        let offset = match &self.offset {
            Some(o) => Some(unweave(o)),
            None if self.bias != 0 => Some(scale.map(
                |v| v.iter().map(|s| minus_bias * s).collect(),
                |h| h.iter().map(|&b| half::f16::from_f32(minus_bias * half::f16::from_bits(b).to_f32()).to_bits()).collect(),
            )),
            None => None,
        };
        Self { levels, scale, offset, ..self }
    }

    /// The rows before `at` (of `cols` weights) and the rows from it.
    pub(super) fn split_rows(self, rows: usize, at: usize, cols: usize, what: &dyn Fn() -> String) -> Result<(Self, Self), CpuError> {
        // Interleaved groups split at a group's edge as they are; elsewhere the rows go back in
        // order first.
        let this = if at.is_multiple_of(GROUP_ROWS) { self } else { self.deinterleaved(rows, cols) };
        let Self { levels, group, mut scale, offset, bias, act } = this;
        let (levels, levels_tail) = match levels {
            LevelStore::Nibbles8(mut n) => {
                let tail = split_off(&mut n, at * cols / 2, what)?;
                (LevelStore::Nibbles8(n), LevelStore::Nibbles8(tail))
            }
            LevelStore::Nibbles(mut n) => {
                let tail = split_off(&mut n, at * cols / 2, what)?;
                (LevelStore::Nibbles(n), LevelStore::Nibbles(tail))
            }
            LevelStore::Bytes(mut q) => {
                let tail = split_off(&mut q, at * cols, what)?;
                (LevelStore::Bytes(q), LevelStore::Bytes(tail))
            }
            LevelStore::Bytes8(mut q) => {
                let tail = split_off(&mut q, at * cols, what)?;
                (LevelStore::Bytes8(q), LevelStore::Bytes8(tail))
            }
            LevelStore::SixBits8(mut bits) => {
                let tail = split_off(&mut bits, at * cols / 4 * 3, what)?;
                (LevelStore::SixBits8(bits), LevelStore::SixBits8(tail))
            }
        };
        let scale_tail = scale.split_off(at * cols / group, what)?;
        let (offset, offset_tail) = match offset {
            Some(mut o) => {
                let tail = o.split_off(at * cols / group, what)?;
                (Some(o), Some(tail))
            }
            None => (None, None),
        };
        Ok((
            Self { levels, group, scale, offset, bias, act },
            Self { levels: levels_tail, group, scale: scale_tail, offset: offset_tail, bias, act },
        ))
    }
}
