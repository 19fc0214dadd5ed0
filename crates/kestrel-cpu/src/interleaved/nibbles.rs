//! Weight rows of 4-bit levels in groups of 8, interleaved so that one 32-byte load holds 4 level
//! bytes (8 weights) of each of the 8 rows, as llama.cpp's CPU build repacks Q4_0 for AVX2. A
//! `maddubs` of that load with 4 activation bytes broadcast to every lane then sums weights of
//! all 8 rows at once, so a block's integer sums end in the lanes as one vector of the 8 rows,
//! and the float work (convert, scale, accumulate) is done once per block for 8 rows instead of
//! once per row: about half the instructions per weight of the row-by-row tiles, for a decode
//! step (one token) and a prompt (a tile of up to 4) alike. Each group's blocks are one stream
//! of memory.
//!
//! Layout (`cols` weights a row, `blocks = cols / 32`): byte `m` of chunk `k` (0..4) of row `i`
//! (0..8) of row group `g`, block `b`, sits at `((g · blocks + b) · 4 + k) · 32 + 4 · i + m`, and
//! is byte `4k + m` of that row's block in `Levels::Nibbles` order (weight `4k + m` in its low
//! nibble, `16 + 4k + m` in its high one). Scales and offsets, one per 32 weights, are
//! interleaved alike: the value of row `i`, block `b` of group `g` at `(g · blocks + b) · 8 + i`.

use super::GROUP_ROWS;
use crate::rows::Scales;
use crate::ACT_BLOCK;

/// Bytes of one row's block (32 levels, two a byte).
pub(crate) const ROW_BLOCK_BYTES: usize = ACT_BLOCK / 2;

/// Where byte `j` (0..16) of row `r`'s block `b` lies in the interleaved levels.
#[inline]
pub(crate) fn byte_index(r: usize, b: usize, j: usize, blocks: usize) -> usize {
    let (g, i) = (r / GROUP_ROWS, r % GROUP_ROWS);
    ((g * blocks + b) * 4 + j / 4) * 32 + 4 * i + j % 4
}

/// `rows` (a multiple of 8) rows of `Levels::Nibbles` levels, interleaved (a matrix writes its
/// levels to their places as it converts them; the tests build layouts with this).
#[cfg(test)]
pub(crate) fn interleave_levels(nibbles: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let blocks = cols / ACT_BLOCK;
    let mut out = vec![0u8; nibbles.len()];
    for r in 0..rows {
        for b in 0..blocks {
            let block = &nibbles[(r * blocks + b) * ROW_BLOCK_BYTES..][..ROW_BLOCK_BYTES];
            for (j, &byte) in block.iter().enumerate() {
                out[byte_index(r, b, j, blocks)] = byte;
            }
        }
    }
    out
}

/// The interleaved levels back in `Levels::Nibbles` order.
pub(crate) fn deinterleave_levels(levels: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let blocks = cols / ACT_BLOCK;
    let mut out = vec![0u8; levels.len()];
    for r in 0..rows {
        for b in 0..blocks {
            for j in 0..ROW_BLOCK_BYTES {
                out[(r * blocks + b) * ROW_BLOCK_BYTES + j] = levels[byte_index(r, b, j, blocks)];
            }
        }
    }
    out
}

/// Consecutive whole groups of interleaved rows: their levels, scales and offsets;
/// `w = scale · (level - bias) + offset` per block.
#[derive(Clone, Copy)]
pub(crate) struct GroupRows<'a> {
    pub levels: &'a [u8],
    pub scale: Scales<'a>,
    pub offset: Option<Scales<'a>>,
    /// What the stored levels exceed the format's by (8 for Q4_0, whose signed levels are kept
    /// as unsigned nibbles; 0 otherwise): applied as `-bias · scale` times the activations' block
    /// sums, so that Q4_0 needs no stored offsets (a tenth of the bytes a decode step streams).
    pub bias: f32,
    pub cols: usize,
}
