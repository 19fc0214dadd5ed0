//! Q5_K: 256 weights per 176-byte super-block: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales
//! and mins as in Q4_K, 32 bytes `qh`, 128 bytes `qs`. The low 4 bits of each level are laid
//! out as Q4_K's; bit 4 of element e is bit e / 32 of `qh[e % 32]`.
//! w = d * scale_j * q - dmin * min_j for sub-block j = e / 32.

use super::int_block::{IntBlock, INT_GROUP};
use super::kquant::{self, Search, SCALE_MIN_BYTES};
use super::q4_k::scale_min_groups;
use super::QK_K;

pub const BLOCK_BYTES: usize = 176;
pub const OFFSET_D: usize = 0;
pub const OFFSET_DMIN: usize = 2;
pub const OFFSET_SCALES: usize = 4;
pub const OFFSET_QH: usize = OFFSET_SCALES + SCALE_MIN_BYTES;
pub const OFFSET_QS: usize = OFFSET_QH + QK_K / 8;

/// quantize_row_q5_K_ref's trial scales for make_qkx2_quants.
const SEARCH: Search = Search { rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: false };

pub(super) fn quantize_block(x: &[f32; QK_K]) -> [u8; BLOCK_BYTES] {
    let b = kquant::quantize_scale_min(x, 31, &SEARCH);
    let mut out = [0u8; BLOCK_BYTES];
    out[OFFSET_D..OFFSET_DMIN].copy_from_slice(&b.d);
    out[OFFSET_DMIN..OFFSET_SCALES].copy_from_slice(&b.dmin);
    out[OFFSET_SCALES..OFFSET_QH].copy_from_slice(&b.scales);
    let (qh, qs) = out[OFFSET_QH..].split_at_mut(QK_K / 8);
    for (e, &l) in b.levels.iter().enumerate() {
        qh[e % 32] |= ((l >> 4) & 1) << (e / 32);
        qs[32 * (e / 64) + e % 32] |= (l & 0x0F) << (4 * ((e / 32) % 2));
    }
    out
}

pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; QK_K]) {
    int_block(block).expand(out);
}

/// As Q4_K's, with a fifth bit from `qh`.
pub(super) fn int_block(block: &[u8; BLOCK_BYTES]) -> IntBlock<QK_K, { QK_K / INT_GROUP }> {
    let mut b = IntBlock::new();
    let (qh, qs) = block[OFFSET_QH..].split_at(QK_K / 8);
    for (e, q) in b.q.iter_mut().enumerate() {
        let low = (qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0x0F;
        let high = (qh[e % 32] >> (e / 32)) & 1;
        *q = (low | (high << 4)) as i8;
    }
    (b.scale, b.min) = scale_min_groups(block);
    b
}
