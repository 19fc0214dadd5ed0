//! The conversion of a matrix's GGUF blocks into its stores, one run of whole rows a task: each
//! block's levels to their places (`BlockPlacer`), its scales and offsets to theirs (`Places`),
//! K-quant ones factored where they are kept so.

use kestrel_gguf::quant::{int_groups, q4_k, super_block_factors, SuperBlockFactors, INT_GROUP};
use kestrel_gguf::GgmlType;

use crate::alloc::zeroed;
use crate::error::CpuError;
use crate::interleaved::{bytes, nibbles, value_index};
use crate::ACT_BLOCK;

/// The part of a matrix's level store that one run of rows converts into.
pub(super) enum LevelRun<'a> {
    Nibbles(&'a mut [u8]),
    Nibbles8(&'a mut [u8]),
    Bytes(&'a mut [i8]),
    Bytes8(&'a mut [i8]),
    SixBits8(&'a mut [u8]),
}

/// The part of a matrix's scales (or offsets) that one run of rows converts into: whole f32
/// values, or a K-quant's integers and its super-blocks' units (`factored`).
pub(super) enum ValueRun<'a> {
    Whole(&'a mut [f32]),
    Factored { k: &'a mut [i8], units: &'a mut [f32] },
}

/// A matrix's scales (or offsets) as converted: whole f32 values, or factored.
pub(super) enum ValueStore {
    Whole(Vec<f32>),
    Factored { k: Vec<i8>, units: Vec<f32> },
}

impl ValueStore {
    /// `values` values (`units` units where factored), allocated fallibly.
    pub(super) fn new(factored: bool, values: usize, units: usize, what: &dyn Fn() -> String) -> Result<Self, CpuError> {
        Ok(if factored {
            ValueStore::Factored { k: zeroed(values, what)?, units: zeroed(units, what)? }
        } else {
            ValueStore::Whole(zeroed(values, what)?)
        })
    }

    /// Runs of `values` values (and `units` units) each.
    pub(super) fn runs(&mut self, values: usize, units: usize) -> Vec<ValueRun<'_>> {
        match self {
            ValueStore::Whole(v) => v.chunks_mut(values).map(ValueRun::Whole).collect(),
            ValueStore::Factored { k, units: u } => {
                k.chunks_mut(values).zip(u.chunks_mut(units)).map(|(k, units)| ValueRun::Factored { k, units }).collect()
            }
        }
    }
}

/// One run of whole rows of a conversion: the rows' GGUF bytes, and their parts of the stores.
pub(super) struct RowRun<'a> {
    pub bytes: &'a [u8],
    pub levels: LevelRun<'a>,
    pub scale: ValueRun<'a>,
    pub offset: Option<ValueRun<'a>>,
}

/// How a matrix's GGUF blocks become its stores.
pub(super) struct Conversion {
    pub ty: GgmlType,
    pub cols: usize,
    pub group: usize,
    pub bias: i8,
    /// Rows are interleaved in groups of 8 (levels, scales and offsets alike).
    pub woven: bool,
}

impl Conversion {
    /// The places of a run's values from value `first` on (`per_row` values a row).
    fn places(&self, first: usize, per_row: usize) -> Places {
        Places { woven: self.woven, per_row, r: first / per_row, c: first % per_row, i: first }
    }

    /// Converts a run of rows, DECODE_BLOCKS blocks at a time.
    pub(super) fn convert(&self, run: RowRun<'_>) -> Result<(), CpuError> {
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
                    let at = bytes::level_index(r, b, 4 * j, row_blocks);
                    woven[at..at + 4].copy_from_slice(run);
                }
            }
            LevelRun::SixBits8(bits) => bytes::put_six_bit_block(bits, r, b, row_blocks, block),
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
                    let at = nibbles::byte_index(self.r, self.b, 4 * j, self.row_blocks);
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
        let at = if self.woven { value_index(self.r, self.c, self.per_row) } else { self.i };
        self.i += 1;
        self.c += 1;
        if self.c == self.per_row {
            (self.r, self.c) = (self.r + 1, 0);
        }
        at
    }
}

/// Blocks a task converts: a run of whole rows of about this many.
pub(super) const RUN_BLOCKS: usize = 4096;

/// Blocks decoded to integers at a time within a run: 64K weights of a K-quant, whose transient
/// integers and scales stay in the core's cache until they are repacked. (Decoding a whole matrix
/// at once held one byte per weight beside the result: 525 MB for an 8B model's embedding table,
/// more than 32-bit wasm can spare.)
const DECODE_BLOCKS: usize = 256;
