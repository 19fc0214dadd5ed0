//! Q3_K: 256 weights per 110-byte super-block: 32 bytes `hmask`, 64 bytes `qs` of 2-bit low
//! levels (`kquant::pack_2bit`), 12 bytes of 6-bit signed sub-block scales, f16 `d`.
//! Element e has level (qs bits) - 4 unless bit (e / 32) of `hmask[e % 32]` is set, and
//! w = d * (scale_(e/16) - 32) * level. Scale j keeps its low nibble in byte j (j < 8, low
//! nibble) or j - 8 (high nibble), and its top 2 bits in bits 2(j/4).. of byte 8 + j % 4.

use super::kquant::{level_2bit, make_q3_quants, nearest_int, pack_2bit};
use super::{f16_at, f16_bits, f16_value, QK_K};

pub const BLOCK_BYTES: usize = 110;
pub const OFFSET_HMASK: usize = 0;
pub const OFFSET_QS: usize = QK_K / 8;
pub const OFFSET_SCALES: usize = OFFSET_QS + QK_K / 4;
pub const OFFSET_D: usize = OFFSET_SCALES + 12;

pub(super) fn quantize_block(x: &[f32; QK_K]) -> [u8; BLOCK_BYTES] {
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for ((xs, ls), scale) in x.chunks_exact(16).zip(levels.chunks_exact_mut(16)).zip(&mut scales) {
        *scale = make_q3_quants(4, xs, ls);
        if scale.abs() > amax {
            amax = scale.abs();
            max_scale = *scale;
        }
    }
    let mut out = [0u8; BLOCK_BYTES];
    let mut packed = [0u8; 12];
    let d = if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &scale) in scales.iter().enumerate() {
            // ggml assigns nearest_int's int to an int8_t before clamping.
            let l = ((nearest_int(iscale * scale) as i8).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                packed[j] = l & 0x0F;
            } else {
                packed[j - 8] |= (l & 0x0F) << 4;
            }
            packed[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        f16_bits(1.0 / iscale)
    } else {
        f16_bits(0.0)
    };
    out[OFFSET_SCALES..OFFSET_D].copy_from_slice(&packed);
    out[OFFSET_D..].copy_from_slice(&d);
    for (j, (xs, ls)) in x.chunks_exact(16).zip(levels.chunks_exact_mut(16)).enumerate() {
        let d = f16_value(d) * f32::from(scale(&packed, j));
        if d == 0.0 {
            // ggml keeps make_q3_quants' levels for a sub-block whose scale rounds to 0.
            continue;
        }
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = (nearest_int(v / d).clamp(-4, 3) + 4) as u8;
        }
    }
    let (hmask, rest) = out.split_at_mut(OFFSET_QS);
    for (e, l) in levels.iter_mut().enumerate() {
        if *l > 3 {
            hmask[e % 32] |= 1 << (e / 32);
            *l -= 4;
        }
    }
    pack_2bit(&levels, &mut rest[..OFFSET_SCALES - OFFSET_QS]);
    out
}

/// Signed 6-bit scale `j` (0..16), already offset by -32.
fn scale(packed: &[u8], j: usize) -> i8 {
    let low = if j < 8 { packed[j] & 0x0F } else { packed[j - 8] >> 4 };
    let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(block, OFFSET_D);
    let hmask = &block[OFFSET_HMASK..OFFSET_QS];
    let qs = &block[OFFSET_QS..OFFSET_SCALES];
    let packed = &block[OFFSET_SCALES..OFFSET_D];
    for (e, y) in out.iter_mut().enumerate() {
        let dl = d * f32::from(scale(packed, e / 16));
        let high_set = (hmask[e % 32] >> (e / 32)) & 1 != 0;
        let q = level_2bit(qs, e) as i8 - if high_set { 0 } else { 4 };
        *y = dl * f32::from(q);
    }
}
