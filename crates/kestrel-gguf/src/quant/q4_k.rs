//! Q4_K: 256 weights per 144-byte super-block: f16 `d`, f16 `dmin`, 12 bytes of 6-bit
//! sub-block scales and mins (`kquant::scale_min_k4`), 128 bytes `qs`. Sub-block j (32
//! elements) has w = d * scale_j * q - dmin * min_j; each 64-element chunk c uses 32 bytes,
//! element 64c + l in the low nibble of byte 32c + l and element 64c + 32 + l in the high one.

use super::int_block::{IntBlock, INT_GROUP};
use super::kquant::{self, scale_min_k4, Search, SCALE_MIN_BYTES};
use super::{f16_at, QK_K};

pub const BLOCK_BYTES: usize = 144;
pub const OFFSET_D: usize = 0;
pub const OFFSET_DMIN: usize = 2;
pub const OFFSET_SCALES: usize = 4;
pub const OFFSET_QS: usize = OFFSET_SCALES + SCALE_MIN_BYTES;

/// quantize_row_q4_K_ref's trial scales for make_qkx2_quants.
const SEARCH: Search = Search { rmin: -1.0, rdelta: 0.1, nstep: 20, use_mad: false };

pub(super) fn quantize_block(x: &[f32; QK_K]) -> [u8; BLOCK_BYTES] {
    let b = kquant::quantize_scale_min(x, 15, &SEARCH);
    let mut out = [0u8; BLOCK_BYTES];
    out[OFFSET_D..OFFSET_DMIN].copy_from_slice(&b.d);
    out[OFFSET_DMIN..OFFSET_SCALES].copy_from_slice(&b.dmin);
    out[OFFSET_SCALES..OFFSET_QS].copy_from_slice(&b.scales);
    for (chunk, qs) in b.levels.chunks_exact(64).zip(out[OFFSET_QS..].chunks_exact_mut(32)) {
        let (lo, hi) = chunk.split_at(32);
        for ((q, a), c) in qs.iter_mut().zip(lo).zip(hi) {
            *q = a | (c << 4);
        }
    }
    out
}

pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; QK_K]) {
    int_block(block).expand(out);
}

/// ggml's `d * sc * q - dmin * m` as `(d * sc) * q + -(dmin * m)`: the same f32 operations.
pub(super) fn int_block(block: &[u8; BLOCK_BYTES]) -> IntBlock<QK_K, { QK_K / INT_GROUP }> {
    let mut b = IntBlock::new();
    // Each 32 bytes hold 64 weights: the first 32 in the low nibbles, the next in the high ones.
    for (q, qs) in b.q.chunks_exact_mut(64).zip(block[OFFSET_QS..].chunks_exact(32)) {
        let (lo, hi) = q.split_at_mut(32);
        for ((lo, hi), &byte) in lo.iter_mut().zip(hi).zip(qs) {
            (*lo, *hi) = ((byte & 0x0F) as i8, (byte >> 4) as i8);
        }
    }
    (b.scale, b.min) = scale_min_groups(block);
    b
}

/// The per-16 scales `d * sc` and offsets `-(dmin * m)` of a Q4_K or Q5_K block (each
/// 32-element sub-block's pair, twice).
pub(super) fn scale_min_groups<const N: usize>(block: &[u8; N]) -> ([f32; QK_K / INT_GROUP], Option<[f32; QK_K / INT_GROUP]>) {
    let d = f16_at(block, OFFSET_D);
    let dmin = f16_at(block, OFFSET_DMIN);
    let scales = scale_bytes(block);
    let (mut scale, mut min) = ([0.0; QK_K / INT_GROUP], [0.0; QK_K / INT_GROUP]);
    for (g, (s, m)) in scale.iter_mut().zip(&mut min).enumerate() {
        let (sc, mn) = scale_min_k4(g / 2, &scales);
        *s = d * f32::from(sc);
        *m = -(dmin * f32::from(mn));
    }
    (scale, Some(min))
}

/// The packed scales and mins of a Q4_K or Q5_K block (both keep them at `OFFSET_SCALES`).
pub(super) fn scale_bytes<const N: usize>(block: &[u8; N]) -> [u8; SCALE_MIN_BYTES] {
    let mut s = [0u8; SCALE_MIN_BYTES];
    s.copy_from_slice(&block[OFFSET_SCALES..OFFSET_QS]);
    s
}
