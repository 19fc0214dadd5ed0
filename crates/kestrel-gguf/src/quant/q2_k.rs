//! Q2_K: 256 weights per 84-byte super-block: 16 bytes of 4-bit sub-block scales (low
//! nibble) and mins (high nibble), 64 bytes `qs` of 2-bit levels (`kquant::pack_2bit`), f16
//! `d`, f16 `dmin`. Sub-block j = e / 16: w = d * scale_j * q - dmin * min_j.

use super::kquant::{level_2bit, make_qkx2_quants, nearest_int, pack_2bit, Search};
use super::{f16_at, f16_bits, f16_value, QK_K};

pub const BLOCK_BYTES: usize = 84;
pub const OFFSET_SCALES: usize = 0;
pub const OFFSET_QS: usize = QK_K / 16;
pub const OFFSET_D: usize = OFFSET_QS + QK_K / 4;
pub const OFFSET_DMIN: usize = OFFSET_D + 2;

/// quantize_row_q2_K_ref's trial scales for make_qkx2_quants.
const SEARCH: Search = Search { rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: true };

pub(super) fn quantize_block(x: &[f32; QK_K]) -> [u8; BLOCK_BYTES] {
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let mut mins = [0f32; QK_K / 16];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for (((xs, ls), scale), min) in x.chunks_exact(16).zip(levels.chunks_exact_mut(16)).zip(&mut scales).zip(&mut mins) {
        let mut weights = [0f32; 16];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        (*scale, *min) = make_qkx2_quants(3, xs, &weights, ls, &SEARCH);
        if *scale > max_scale {
            max_scale = *scale;
        }
        if *min > max_min {
            max_min = *min;
        }
    }
    let mut out = [0u8; BLOCK_BYTES];
    // ggml stores nearest_int's int into the uint8_t scale byte (mod 256), unclamped.
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for (s, &scale) in out[OFFSET_SCALES..OFFSET_QS].iter_mut().zip(&scales) {
            *s = nearest_int(iscale * scale) as u8;
        }
    }
    let d = f16_bits(if max_scale > 0.0 { max_scale / 15.0 } else { 0.0 });
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for (s, &min) in out[OFFSET_SCALES..OFFSET_QS].iter_mut().zip(&mins) {
            *s |= (nearest_int(iscale * min) << 4) as u8;
        }
    }
    let dmin = f16_bits(if max_min > 0.0 { max_min / 15.0 } else { 0.0 });
    out[OFFSET_D..OFFSET_DMIN].copy_from_slice(&d);
    out[OFFSET_DMIN..].copy_from_slice(&dmin);
    for ((xs, ls), &sc) in x.chunks_exact(16).zip(levels.chunks_exact_mut(16)).zip(&out[OFFSET_SCALES..OFFSET_QS]) {
        let d = f16_value(d) * f32::from(sc & 0x0F);
        if d == 0.0 {
            // ggml keeps the levels of the first fit for a sub-block whose scale rounds to 0.
            continue;
        }
        let dm = f16_value(dmin) * f32::from(sc >> 4);
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&levels, &mut out[OFFSET_QS..OFFSET_D]);
    out
}

pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(block, OFFSET_D);
    let dmin = f16_at(block, OFFSET_DMIN);
    let scales = &block[OFFSET_SCALES..OFFSET_QS];
    let qs = &block[OFFSET_QS..OFFSET_D];
    for (e, y) in out.iter_mut().enumerate() {
        let sc = scales[e / 16];
        let dl = d * f32::from(sc & 0x0F);
        let ml = dmin * f32::from(sc >> 4);
        *y = dl * f32::from(level_2bit(qs, e)) - ml;
    }
}
