//! Q6_K: 256 weights per 210-byte super-block: 128 bytes `ql` (low 4 bits), 64 bytes `qh`
//! (high 2 bits), 16 int8 sub-block scales, f16 `d`; w = d * scale_(e/16) * (q - 32).
//! Each 128-element half h uses 64 `ql` and 32 `qh` bytes: for quarter k = (e % 128) / 32 and
//! l = e % 32, the low bits are in `ql[64h + 32(k % 2) + l]` (low nibble for k < 2, high
//! otherwise) and the high bits in bits 2k..2k+2 of `qh[32h + l]`.

use super::int_block::{IntBlock, INT_GROUP};
use super::kquant::{make_qx_quants, nearest_int, GROUP_MAX_EPS};
use super::{f16_at, f16_bits, f16_value, QK_K};

pub const BLOCK_BYTES: usize = 210;
pub const OFFSET_QL: usize = 0;
pub const OFFSET_QH: usize = QK_K / 2;
pub const OFFSET_SCALES: usize = OFFSET_QH + QK_K / 4;
pub const OFFSET_D: usize = OFFSET_SCALES + QK_K / 16;

pub(super) fn quantize_block(x: &[f32; QK_K]) -> [u8; BLOCK_BYTES] {
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ((xs, ls), scale) in x.chunks_exact(16).zip(levels.chunks_exact_mut(16)).zip(&mut scales) {
        *scale = make_qx_quants(32, xs, ls);
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = *scale;
        }
    }
    let mut out = [0u8; BLOCK_BYTES];
    if max_abs_scale < GROUP_MAX_EPS {
        // An all-zero super-block: every byte 0, d included.
        return out;
    }
    let iscale = -128.0 / max_scale;
    let d = f16_bits(1.0 / iscale);
    out[OFFSET_D..].copy_from_slice(&d);
    for (s, &scale) in out[OFFSET_SCALES..OFFSET_D].iter_mut().zip(&scales) {
        // MIN(127, ...) stored into an int8_t: -128 is reachable, +128 is not.
        *s = nearest_int(iscale * scale).min(127) as i8 as u8;
    }
    for (j, (xs, ls)) in x.chunks_exact(16).zip(levels.chunks_exact_mut(16)).enumerate() {
        let d = f16_value(d) * f32::from(out[OFFSET_SCALES + j] as i8);
        if d == 0.0 {
            // ggml keeps make_qx_quants' levels for a sub-block whose scale rounds to 0.
            continue;
        }
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = (nearest_int(v / d).clamp(-32, 31) + 32) as u8;
        }
    }
    let (ql, qh) = out[OFFSET_QL..OFFSET_SCALES].split_at_mut(QK_K / 2);
    for (e, &l) in levels.iter().enumerate() {
        let (h, k, i) = (e / 128, (e % 128) / 32, e % 32);
        ql[64 * h + 32 * (k % 2) + i] |= (l & 0x0F) << (4 * (k / 2));
        qh[32 * h + i] |= (l >> 4) << (2 * k);
    }
    out
}

pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; QK_K]) {
    int_block(block).expand(out);
}

/// ggml's `d * sc * q` as `(d * sc) * q`: the same f32 operations.
pub(super) fn int_block(block: &[u8; BLOCK_BYTES]) -> IntBlock<QK_K, { QK_K / INT_GROUP }> {
    let d = f16_at(block, OFFSET_D);
    let (ql, rest) = block.split_at(OFFSET_QH);
    let (qh, scales) = rest.split_at(OFFSET_SCALES - OFFSET_QH);
    let mut b = IntBlock::new();
    // Half by half, each byte's bits to their four quarters at once (the layout in the module
    // doc): whole slices, which the compiler vectorizes.
    for ((q, ql), qh) in b.q.chunks_exact_mut(128).zip(ql.chunks_exact(64)).zip(qh.chunks_exact(32)) {
        let (ql0, ql1) = ql.split_at(32);
        let (q01, q23) = q.split_at_mut(64);
        let ((q0, q1), (q2, q3)) = (q01.split_at_mut(32), q23.split_at_mut(32));
        for i in 0..32 {
            let (l0, l1, h) = (ql0[i], ql1[i], qh[i]);
            q0[i] = ((l0 & 0x0F) | (h & 3) << 4) as i8 - 32;
            q1[i] = ((l1 & 0x0F) | (h >> 2 & 3) << 4) as i8 - 32;
            q2[i] = ((l0 >> 4) | (h >> 4 & 3) << 4) as i8 - 32;
            q3[i] = ((l1 >> 4) | (h >> 6) << 4) as i8 - 32;
        }
    }
    for (s, &sc) in b.scale.iter_mut().zip(scales.iter().take(QK_K / INT_GROUP)) {
        *s = d * f32::from(sc as i8);
    }
    b
}
