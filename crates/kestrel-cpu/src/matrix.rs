//! A weight matrix for the CPU kernels: quantized formats as integer levels (two a byte for the
//! formats of at most 4 bits, 6 bits for Q6_K where its rows are interleaved) with a scale and an
//! offset per 32 weights (per 16 for Q6_K), F16 and F32 as f32. `apply` is `y = x·Wᵀ` for rows
//! of x.

use kestrel_gguf::quant::{int_groups, q4_k, super_block_factors, SuperBlockFactors, INT_GROUP};
use kestrel_gguf::GgmlType;

use crate::activations::{ActFormat, QuantizedRows};
use crate::alloc::{split_off, with_capacity, zeroed};
use crate::dot::{f32_products, int_products, IntRows, Levels, Scales};
use crate::error::CpuError;
use crate::factored::UnitLayout;
use crate::interleaved::{self, GroupRows};
use crate::interleaved_bytes::{self, ByteGroupRows, WovenLevels};
use crate::parallel::{for_each_chunk, for_row_chunks, try_each_on_pool};

/// Tokens a task of a product's transposition takes: a cache line of f32 sums.
const TRANSPOSE_TOKENS: usize = 16;
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

/// Scales or offsets: natively, f16 where every value of the matrix is exactly one, and a byte
/// with a unit per super-block for the K-quants (`factored`); f32 otherwise (`dot::Scales`).
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

/// The quantized types kept as integer levels with scales (the ones the GPU runs).
const INT_TYPES: [GgmlType; 8] =
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// Formats of at most 4 bits keep two levels a byte, half the memory a decode step streams.
enum LevelStore {
    /// Block of 32: byte j holds weight j in the low nibble and j + 16 in the high one.
    Nibbles(Vec<u8>),
    Bytes(Vec<i8>),
    /// Nibbles of rows in groups of 8, interleaved for the products that sum 8 rows at once
    /// (`interleaved`'s layout; the scales and offsets are interleaved alike). Where the machine
    /// has their SIMD code, for 4-bit formats of one scale per 32 weights and a multiple of 8 rows.
    Nibbles8(Vec<u8>),
    /// Byte levels of rows in groups of 8, interleaved alike (`interleaved_bytes`' layout), for
    /// the other formats, where the machine has the SIMD code and for a multiple of 8 rows.
    Bytes8(Vec<i8>),
    /// Q6_K's levels in 6 bits, rows in groups of 8 (`interleaved_bytes`' six-bit layout), where
    /// Bytes8 would otherwise hold them: three quarters of the bytes a decode step streams.
    SixBits8(Vec<u8>),
}

/// The formats whose scales and offsets are whole multiples of a unit per super-block
/// (`kestrel_gguf::quant::super_block_factors`).
fn super_blocks_factor(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Whether K-quant scales and offsets are kept factored (`factored`): natively. Not in wasm,
/// whose row kernels would expand a row's scales for each dot product (as they would f16 ones).
const FACTORED_SCALES: bool = cfg!(not(target_arch = "wasm32"));

/// The part of a matrix's level store that one run of rows converts into.
enum LevelRun<'a> {
    Nibbles(&'a mut [u8]),
    Nibbles8(&'a mut [u8]),
    Bytes(&'a mut [i8]),
    Bytes8(&'a mut [i8]),
    SixBits8(&'a mut [u8]),
}

/// The part of a matrix's scales (or offsets) that one run of rows converts into: whole f32
/// values, or a K-quant's integers and its super-blocks' units (`factored`).
enum ValueRun<'a> {
    Whole(&'a mut [f32]),
    Factored { k: &'a mut [i8], units: &'a mut [f32] },
}

/// A matrix's scales (or offsets) as converted: whole f32 values, or factored.
enum ValueStore {
    Whole(Vec<f32>),
    Factored { k: Vec<i8>, units: Vec<f32> },
}

impl ValueStore {
    /// `values` values (`units` units where factored), allocated fallibly.
    fn new(factored: bool, values: usize, units: usize, what: &dyn Fn() -> String) -> Result<Self, CpuError> {
        Ok(if factored {
            ValueStore::Factored { k: zeroed(values, what)?, units: zeroed(units, what)? }
        } else {
            ValueStore::Whole(zeroed(values, what)?)
        })
    }

    /// Runs of `values` values (and `units` units) each.
    fn runs(&mut self, values: usize, units: usize) -> Vec<ValueRun<'_>> {
        match self {
            ValueStore::Whole(v) => v.chunks_mut(values).map(ValueRun::Whole).collect(),
            ValueStore::Factored { k, units: u } => {
                k.chunks_mut(values).zip(u.chunks_mut(units)).map(|(k, units)| ValueRun::Factored { k, units }).collect()
            }
        }
    }
}

/// One run of whole rows of a conversion: the rows' GGUF bytes, and their parts of the stores.
struct RowRun<'a> {
    bytes: &'a [u8],
    levels: LevelRun<'a>,
    scale: ValueRun<'a>,
    offset: Option<ValueRun<'a>>,
}

/// How a matrix's GGUF blocks become its stores.
struct Conversion {
    ty: GgmlType,
    cols: usize,
    group: usize,
    bias: i8,
    /// Rows are interleaved in groups of 8 (levels, scales and offsets alike).
    woven: bool,
}

impl Conversion {
    /// The places of a run's values from value `first` on (`per_row` values a row).
    fn places(&self, first: usize, per_row: usize) -> Places {
        Places { woven: self.woven, per_row, r: first / per_row, c: first % per_row, i: first }
    }

    /// Converts a run of rows, DECODE_BLOCKS blocks at a time.
    fn convert(&self, run: RowRun<'_>) -> Result<(), CpuError> {
        let RowRun { bytes, mut levels, mut scale, mut offset } = run;
        let (ty, bias) = (self.ty, self.bias);
        let per_group = self.group / INT_GROUP;
        let (block_bytes, block) = (ty.type_size() as usize, ty.block_size() as usize);
        let (row_groups, row_supers) = (self.cols / self.group, self.cols / block);
        let mut placer = BlockPlacer { row_blocks: self.cols / ACT_BLOCK, done: 0, r: 0, b: 0 };
        // Q4_K's levels are nibbles already: moved from the block's bytes without decoding them.
        let packed_q4_k = ty == GgmlType::Q4_K && matches!(levels, LevelRun::Nibbles(_) | LevelRun::Nibbles8(_));
        // Groups and super-blocks converted so far in this run.
        let (mut groups, mut supers) = (0, 0);
        for part in bytes.chunks(DECODE_BLOCKS * block_bytes) {
            let part_weights = part.len() / block_bytes * block;
            let g = if packed_q4_k { None } else { Some(int_groups(ty, part, part_weights)?) };
            // A K-quant's scales and offsets from its super-blocks' integers and units: stored
            // so where the values are kept factored, else as their (exact) products.
            if let Some(factors) = super_block_factors(ty, part, part_weights)? {
                let groups_per_super = block / self.group;
                let put = |run: &mut ValueRun<'_>, unit: usize, k: &dyn Fn(&SuperBlockFactors, usize) -> i8| {
                    let (mut unit_places, mut k_places) = (self.places(supers, row_supers), self.places(groups, row_groups));
                    for f in &factors {
                        let u = f.units[unit];
                        match run {
                            ValueRun::Factored { k: ks, units } => {
                                units[unit_places.next_place()] = u;
                                for gg in 0..groups_per_super {
                                    ks[k_places.next_place()] = k(f, gg * per_group);
                                }
                            }
                            ValueRun::Whole(out) => {
                                for gg in 0..groups_per_super {
                                    out[k_places.next_place()] = u * f32::from(k(f, gg * per_group));
                                }
                            }
                        }
                    }
                };
                put(&mut scale, 0, &|f, i| f.scale[i]);
                if let Some(o) = &mut offset {
                    put(o, 1, &|f, i| f.min[i]);
                }
                supers += factors.len();
            } else if let Some(g) = &g {
                let put = |run: &mut ValueRun<'_>, values: &mut dyn Iterator<Item = f32>| {
                    if let ValueRun::Whole(out) = run {
                        let mut places = self.places(groups, row_groups);
                        for v in values {
                            out[places.next_place()] = v;
                        }
                    }
                };
                let scales = || g.scale.iter().step_by(per_group).copied();
                put(&mut scale, &mut scales());
                // The format's min where it has one, else what the stored levels' bias adds.
                if let Some(o) = &mut offset {
                    match &g.min {
                        Some(min) => put(o, &mut min.iter().step_by(per_group).copied()),
                        None => put(o, &mut scales().map(|s| -f32::from(bias) * s)),
                    }
                }
            }
            groups += part_weights / self.group;
            match &g {
                Some(g) => {
                    for block in g.q.chunks_exact(ACT_BLOCK) {
                        placer.place(&mut levels, block, bias);
                    }
                }
                None => {
                    for q4_k in part.chunks_exact(q4_k::BLOCK_BYTES) {
                        for chunk in q4_k[q4_k::OFFSET_QS..].chunks_exact(ACT_BLOCK) {
                            for nibbles in q4_k_nibble_blocks(chunk) {
                                placer.place_nibbles(&mut levels, &nibbles);
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// A Q4_K chunk of 64 weights (32 bytes: weights 0..32 in the low nibbles, 32..64 in the high
/// ones) as two blocks of 32 in the nibble layout (byte j: weight j low, j + 16 high), a whole
/// 16-byte half at a time.
fn q4_k_nibble_blocks(chunk: &[u8]) -> [[u8; ACT_BLOCK / 2]; 2] {
    const LOW: u128 = u128::from_ne_bytes([0x0F; 16]);
    let half = |bytes: Option<&[u8]>| u128::from_le_bytes(bytes.and_then(|b| b.try_into().ok()).unwrap_or_default());
    let (a, b) = (half(chunk.get(..16)), half(chunk.get(16..32)));
    [((a & LOW) | (b & LOW) << 4).to_le_bytes(), ((a >> 4 & LOW) | (b & !LOW)).to_le_bytes()]
}

/// Where a run's blocks of 32 levels go, one after another: the next block's index in the run,
/// its row and its place in the row (counted, not divided out per block).
struct BlockPlacer {
    row_blocks: usize,
    done: usize,
    r: usize,
    b: usize,
}

impl BlockPlacer {
    /// The next block's levels (`bias` added where they are kept as unsigned nibbles).
    fn place(&mut self, levels: &mut LevelRun<'_>, block: &[i8], bias: i8) {
        let (done, r, b, row_blocks) = (self.done, self.r, self.b, self.row_blocks);
        match levels {
            LevelRun::Nibbles(_) | LevelRun::Nibbles8(_) => {
                // Byte j holds level j in its low nibble and j + 16 in its high one.
                let (lo, hi) = block.split_at(ACT_BLOCK / 2);
                let mut bytes = [0u8; ACT_BLOCK / 2];
                for ((byte, &a), &b) in bytes.iter_mut().zip(lo).zip(hi) {
                    *byte = (a + bias) as u8 & 0x0F | ((b + bias) as u8) << 4;
                }
                return self.place_nibbles(levels, &bytes);
            }
            LevelRun::Bytes(q) => q[done * ACT_BLOCK..][..ACT_BLOCK].copy_from_slice(block),
            LevelRun::Bytes8(woven) => {
                // The block's 8 runs of 4 levels, each to its chunk of the row's group.
                for (j, run) in block.chunks_exact(4).enumerate() {
                    let at = interleaved_bytes::level_index(r, b, 4 * j, row_blocks);
                    woven[at..at + 4].copy_from_slice(run);
                }
            }
            LevelRun::SixBits8(bits) => interleaved_bytes::put_six_bit_block(bits, r, b, row_blocks, block),
        }
        self.advance();
    }

    /// The next block's levels, packed two a byte.
    fn place_nibbles(&mut self, levels: &mut LevelRun<'_>, bytes: &[u8; ACT_BLOCK / 2]) {
        match levels {
            LevelRun::Nibbles(packed) => packed[self.done * ACT_BLOCK / 2..][..ACT_BLOCK / 2].copy_from_slice(bytes),
            LevelRun::Nibbles8(woven) => {
                // The block's 4 runs of 4 bytes, each to its chunk of the row's group.
                for (j, run) in bytes.chunks_exact(4).enumerate() {
                    let at = interleaved::byte_index(self.r, self.b, 4 * j, self.row_blocks);
                    woven[at..at + 4].copy_from_slice(run);
                }
            }
            // Byte and 6-bit levels are never packed two a byte.
            LevelRun::Bytes(_) | LevelRun::Bytes8(_) | LevelRun::SixBits8(_) => {}
        }
        self.advance();
    }

    fn advance(&mut self) {
        self.done += 1;
        self.b += 1;
        if self.b == self.row_blocks {
            (self.r, self.b) = (self.r + 1, 0);
        }
    }
}

/// Where a run's values go, one after another: row by row, interleaved where the rows are (runs
/// start at a whole group of 8). Counted rather than divided out for each value.
struct Places {
    woven: bool,
    per_row: usize,
    /// The next value's row and place in it, and its index in rows one after another.
    r: usize,
    c: usize,
    i: usize,
}

impl Places {
    fn next_place(&mut self) -> usize {
        let at = if self.woven { interleaved::value_index(self.r, self.c, self.per_row) } else { self.i };
        self.i += 1;
        self.c += 1;
        if self.c == self.per_row {
            (self.r, self.c) = (self.r + 1, 0);
        }
        at
    }
}

/// Blocks a task converts: a run of whole rows of about this many.
const RUN_BLOCKS: usize = 4096;

/// Blocks decoded to integers at a time within a run: 64K weights of a K-quant, whose transient
/// integers and scales stay in the core's cache until they are repacked. (Decoding a whole matrix
/// at once held one byte per weight beside the result: 525 MB for an 8B model's embedding table,
/// more than 32-bit wasm can spare.)
const DECODE_BLOCKS: usize = 256;

/// How a quantized type is stored: weights per scale (every format but Q6_K has one scale and min
/// per 32, its two groups of 16 agreeing), how its levels are kept, and whether the products have
/// an offset per scale (the formats with a min, and Q4_0, whose signed levels are kept as unsigned
/// nibbles, where its products do not take the bias off themselves).
struct IntLayout {
    group: usize,
    /// Two levels a byte.
    nibbles: bool,
    /// Rows interleaved in groups of 8 (`interleaved`, `interleaved_bytes`): where the machine
    /// has their SIMD products, the format suits them (one scale per 32 for 4-bit levels), and
    /// the rows are whole groups.
    woven: bool,
    /// Q6_K's levels in 6 bits: where they are woven.
    six_bits: bool,
    /// What the stored levels exceed the format's by: 8 for Q4_0's unsigned nibbles.
    bias: i8,
    offset: bool,
}

impl IntLayout {
    /// `ty`'s layout for `rows` rows, in this build (`native`) or in wasm's.
    fn of(ty: GgmlType, rows: u64, native: bool) -> Self {
        let group = if ty == GgmlType::Q6_K { INT_GROUP } else { ACT_BLOCK };
        let nibbles = matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K);
        let woven =
            native && (group == ACT_BLOCK || !nibbles) && interleaved::has_simd() && rows.is_multiple_of(interleaved::GROUP_ROWS as u64);
        let bias = if ty == GgmlType::Q4_0 { 8 } else { 0 };
        let has_offset = matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K);
        // Q4_0's interleaved products apply its bias themselves: no offsets.
        let offset = has_offset && !(woven && bias != 0);
        Self { group, nibbles, woven, six_bits: woven && ty == GgmlType::Q6_K, bias, offset }
    }

    /// Bytes of `n` levels.
    fn level_bytes(&self, n: usize) -> usize {
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
    /// (`interleaved`'s layout); a K-quant's scales and offsets natively straight to their
    /// factored stores (`factored`).
    fn from_ggml(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize, what: &dyn Fn() -> String) -> Result<Self, CpuError> {
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
        let run_rows = (RUN_BLOCKS / row_blocks.max(1)).max(1).next_multiple_of(interleaved::GROUP_ROWS);
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
        let lanes = if woven { interleaved::GROUP_ROWS } else { 1 };
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

    fn bytes(&self) -> usize {
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
                nibble(n[interleaved::byte_index(r, e / ACT_BLOCK, e % (ACT_BLOCK / 2), cols / ACT_BLOCK)])
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
    fn row(&self, r: usize, cols: usize) -> Vec<f32> {
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
    fn products(&self, first: usize, x: &QuantizedRows, out: &mut [f32], n: usize, cols: usize) {
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
                return interleaved_bytes::products(ByteGroupRows { levels, group: self.group, scale, offset, cols }, x, out);
            }
            LevelStore::SixBits8(bits) => {
                let levels = WovenLevels::SixBits(&bits[first * cols / 4 * 3..][..count * cols / 4 * 3]);
                return interleaved_bytes::products(ByteGroupRows { levels, group: self.group, scale, offset, cols }, x, out);
            }
        };
        int_products(IntRows { levels, group: self.group, scale, offset, cols }, x, out)
    }

    /// The rows a product's task takes a multiple of: whole groups, and for 4-bit levels whole
    /// pairs of groups, which the AVX512-VNNI tile takes at once (a lone group costs it a pair).
    fn rows_per_task(&self) -> usize {
        match self.levels {
            LevelStore::Nibbles8(_) => 2 * interleaved::GROUP_ROWS,
            LevelStore::Bytes8(_) | LevelStore::SixBits8(_) => interleaved::GROUP_ROWS,
            LevelStore::Nibbles(_) | LevelStore::Bytes(_) => 1,
        }
    }

    /// Interleaved rows back one after another (`rows` rows of `cols` weights).
    fn deinterleaved(self, rows: usize, cols: usize) -> Self {
        let levels = match &self.levels {
            LevelStore::Nibbles8(n) => LevelStore::Nibbles(interleaved::deinterleave_levels(n, rows, cols)),
            LevelStore::Bytes8(q) => LevelStore::Bytes(interleaved_bytes::deinterleave_levels(WovenLevels::Bytes(q), rows, cols)),
            LevelStore::SixBits8(bits) => LevelStore::Bytes(interleaved_bytes::deinterleave_levels(WovenLevels::SixBits(bits), rows, cols)),
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
    fn split_rows(self, rows: usize, at: usize, cols: usize, what: &dyn Fn() -> String) -> Result<(Self, Self), CpuError> {
        // Interleaved groups split at a group's edge as they are; elsewhere the rows go back in
        // order first.
        let this = if at.is_multiple_of(interleaved::GROUP_ROWS) { self } else { self.deinterleaved(rows, cols) };
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
        // Row-major by weight row first, so each task writes one contiguous run.
        let mut by_row = vec![0f32; rows * n];
        match &self.weights {
            Weights::F32(w) => for_row_chunks(&mut by_row, n, 1, |first, out| {
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
                for_row_chunks(&mut by_row, n, w.rows_per_task(), |first, out| w.products(first, xq, out, n, cols));
            }
        }
        if n == 1 {
            return by_row;
        }
        // Token-major, `TRANSPOSE_TOKENS` tokens a task over the pool: a task reads one short
        // run of every weight row's sums (a cache line) and writes its tokens' rows in order. One
        // pass striding through every row for every token took a tenth of a prompt's time, on one
        // thread.
        let mut y = vec![0f32; n * rows];
        for_each_chunk(&mut y, TRANSPOSE_TOKENS * rows, |i, ys| {
            let (first, tokens) = (i * TRANSPOSE_TOKENS, ys.len() / rows);
            for (r, sums) in by_row.chunks_exact(n).enumerate() {
                for (j, &v) in sums[first..first + tokens].iter().enumerate() {
                    ys[j * rows + r] = v;
                }
            }
        });
        y
    }
}
