//! Weight rows of byte levels (Q8_0) and of 6-bit levels (Q6_K; Q5_0, Q5_1 and Q5_K) in groups of
//! 8, interleaved as `nibbles` does the 4-bit ones: one 32-byte chunk holds 4 levels of each
//! of the 8 rows, and a `maddubs` of it with 4 activation bytes broadcast to every lane sums 4
//! weights of all 8 rows at once; a block's 8 such chunks end as one vector of the 8 rows' integer
//! sums (two for Q6_K's groups of 16), converted, scaled and accumulated once for the 8 rows.
//!
//! Byte layout (`cols` weights a row, `blocks = cols / 32`): level `m` of chunk `k` (0..8) of row
//! `i` (0..8) of row group `g`, block `b`, sits at `((g · blocks + b) · 8 + k) · 32 + 4 · i + m`,
//! and is level `4k + m` of that row's block.
//!
//! Six-bit layout (Q6_K, whose levels are -32..31, and the 5-bit formats, whose levels -16..15 or
//! 0..31 lie within them): a group's block is 192 bytes instead of 256, a quarter less for a
//! decode step to stream. Each level is kept as `level + 32` (0..63): its low 4
//! bits in the first 128 bytes, in `nibbles`' layout (chunk `k`'s in the low nibbles of
//! bytes `32 · (k % 4)..`, in the high ones for `k ≥ 4`), its high 2 bits in the last 64 (chunk
//! `k`'s at bits `2 · (k % 4)` of bytes `128 + 32 · (k / 4)..`), each at `4 · i + m` of its 32. The
//! tiles rebuild a chunk with a few shifts and masks, multiply the unsigned values, and take
//! `32 · Σ x` off each 16 weights' sum in integers.
//!
//! Scales and offsets, one per group of 16 or 32 weights, are interleaved as
//! `super::value_index` says, with the groups of a row for its blocks.

use super::GROUP_ROWS;
use crate::rows::WeightRows;
use crate::ACT_BLOCK;

/// What a 6-bit level is kept above the format's.
pub(crate) const SIX_BIT_BIAS: i8 = 32;
// `put_six_bit_block` adds it as an XOR of bit 5, and the factored tiles take it off as a shift
// by 5.
const _: () = assert!(SIX_BIT_BIAS == 1 << 5);
/// Bytes of one group's block of 6-bit levels: 8 rows of 32, 4 + 2 bits each.
pub(crate) const SIX_BIT_BLOCK_BYTES: usize = GROUP_ROWS * ACT_BLOCK * 6 / 8;
/// Where a group's block of 6-bit levels keeps their high 2 bits.
pub(crate) const SIX_BIT_HIGH: usize = GROUP_ROWS * ACT_BLOCK / 2;

/// Where level `e` (0..32) of row `r`'s block `b` lies in the interleaved levels.
#[inline]
pub(crate) fn level_index(r: usize, b: usize, e: usize, blocks: usize) -> usize {
    let (g, i) = (r / GROUP_ROWS, r % GROUP_ROWS);
    ((g * blocks + b) * 8 + e / 4) * 32 + 4 * i + e % 4
}

/// Where the 6-bit level `e` (0..32) of row `r`'s block `b` keeps its low 4 bits and its high 2:
/// `[(byte, shift); 2]`.
#[inline]
pub(crate) fn six_bit_places(r: usize, b: usize, e: usize, blocks: usize) -> [(usize, u32); 2] {
    let (g, i) = (r / GROUP_ROWS, r % GROUP_ROWS);
    let (k, m) = (e / 4, e % 4);
    let block = (g * blocks + b) * SIX_BIT_BLOCK_BYTES + 4 * i + m;
    [(block + 32 * (k % 4), 4 * (k / 4) as u32), (block + SIX_BIT_HIGH + 32 * (k / 4), 2 * (k % 4) as u32)]
}

/// Stores row `r`'s block `b` of 32 levels (-32..31, `block`) at their places in 6-bit levels:
/// each of the row's 4-byte runs of the group's block (`six_bit_places`) written whole, once.
#[inline]
pub(crate) fn put_six_bit_block(levels: &mut [u8], r: usize, b: usize, blocks: usize, block: &[i8]) {
    // Chunk k's 4 kept values, a byte each: 8 at a time, as `(level & 63) ^ 32`, which is
    // `level + 32` for -32..31 without a carry between bytes.
    let eight = |w: usize| {
        let bytes = block.get(8 * w..8 * w + 8).and_then(|b| <[i8; 8]>::try_from(b).ok()).unwrap_or_default();
        u64::from_le_bytes(bytes.map(|v| v as u8)) & 0x3F3F_3F3F_3F3F_3F3F ^ 0x2020_2020_2020_2020
    };
    let words = [eight(0), eight(1), eight(2), eight(3)];
    let kept: [u32; 8] = std::array::from_fn(|k| (words[k / 2] >> (32 * (k % 2))) as u32);
    let mut put = |at: usize, bits: u32| levels[at..at + 4].copy_from_slice(&bits.to_le_bytes());
    let [(low, _), (high, _)] = six_bit_places(r, b, 0, blocks);
    for k in 0..4 {
        put(low + 32 * k, kept[k] & 0x0F0F_0F0F | (kept[k + 4] & 0x0F0F_0F0F) << 4);
    }
    for half in 0..2 {
        let twos = (0..4).fold(0, |bits, s| bits | (kept[4 * half + s] >> 4 & 0x0303_0303) << (2 * s));
        put(high + 32 * half, twos);
    }
}

/// How a group's blocks keep their levels.
#[derive(Clone, Copy)]
pub(crate) enum WovenLevels<'a> {
    /// A byte a level (`level_index`).
    Bytes(&'a [i8]),
    /// Six bits a level (`six_bit_places`).
    SixBits(&'a [u8]),
}

impl WovenLevels<'_> {
    /// Level `e` of row `r`'s block `b`, as the format has it.
    pub(crate) fn level(&self, r: usize, b: usize, e: usize, blocks: usize) -> i8 {
        match self {
            WovenLevels::Bytes(q) => q[level_index(r, b, e, blocks)],
            WovenLevels::SixBits(bits) => {
                let [(low, low_shift), (high, high_shift)] = six_bit_places(r, b, e, blocks);
                let kept = (bits[low] >> low_shift) & 0x0F | ((bits[high] >> high_shift) & 0x03) << 4;
                kept as i8 - SIX_BIT_BIAS
            }
        }
    }

    /// Weights they hold.
    pub(super) fn len(&self) -> usize {
        match self {
            WovenLevels::Bytes(q) => q.len(),
            WovenLevels::SixBits(bits) => bits.len() / 3 * 4,
        }
    }

    /// Bytes of one group's block (8 rows of 32 levels).
    pub(crate) fn block_bytes(&self) -> usize {
        match self {
            WovenLevels::Bytes(_) => GROUP_ROWS * ACT_BLOCK,
            WovenLevels::SixBits(_) => SIX_BIT_BLOCK_BYTES,
        }
    }

    /// The levels' first byte (for the x86-64 tiles, which walk the blocks by pointer).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn start(&self) -> *const u8 {
        match self {
            WovenLevels::Bytes(q) => q.as_ptr().cast(),
            WovenLevels::SixBits(bits) => bits.as_ptr(),
        }
    }

    /// Whether they are whole groups' blocks of `cols` weights a row.
    pub(super) fn whole(&self, cols: usize) -> bool {
        let bytes = match self {
            WovenLevels::Bytes(q) => q.len(),
            WovenLevels::SixBits(bits) => bits.len(),
        };
        bytes.is_multiple_of(self.block_bytes() * (cols / ACT_BLOCK).max(1))
    }
}

/// The interleaved levels back one row after another.
pub(crate) fn deinterleave_levels(levels: WovenLevels<'_>, rows: usize, cols: usize) -> Vec<i8> {
    let blocks = cols / ACT_BLOCK;
    let mut out = vec![0i8; levels.len()];
    for r in 0..rows {
        for b in 0..blocks {
            for e in 0..ACT_BLOCK {
                out[(r * blocks + b) * ACT_BLOCK + e] = levels.level(r, b, e, blocks);
            }
        }
    }
    out
}

/// Consecutive whole groups of interleaved rows: their levels, scales and offsets, a scale per
/// `group` (16 or 32) weights; `w = scale · level + offset`.
pub(crate) type ByteGroupRows<'a> = WeightRows<'a, WovenLevels<'a>>;
