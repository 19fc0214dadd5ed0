//! Q5_0: 32 weights per 22-byte block: f16 scale `d`, 4 bytes `qh` (bit j of the
//! little-endian u32 is bit 4 of element j), 16 bytes `qs` packed as in Q4_0 (element j low
//! nibble, element j + 16 high nibble); w = (q - 16) * d.

use super::int_block::IntBlock;
use super::{f16_at, f16_bits, signed_abs_max, QK};

pub const BLOCK_BYTES: usize = 22;
pub const OFFSET_D: usize = 0;
pub const OFFSET_QH: usize = 2;
pub const OFFSET_QS: usize = 6;

pub(super) fn quantize_block(x: &[f32; QK]) -> [u8; BLOCK_BYTES] {
    // As Q4_0: the value of largest magnitude, with its sign, maps to -16.
    let (_, max) = signed_abs_max(x);
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; QK];
    for (q, v) in q.iter_mut().zip(x) {
        // (int8_t)(x + 16.5f) truncates toward zero, as `as i8` does.
        *q = ((v * id + 16.5) as i8).min(31) as u8;
    }
    let mut out = [0u8; BLOCK_BYTES];
    out[OFFSET_D..OFFSET_QH].copy_from_slice(&f16_bits(d));
    let (qh, qs) = pack_5bit(&q);
    out[OFFSET_QH..OFFSET_QS].copy_from_slice(&qh);
    out[OFFSET_QS..].copy_from_slice(&qs);
    out
}

pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; QK]) {
    int_block(block).expand(out);
}

pub(super) fn int_block(block: &[u8; BLOCK_BYTES]) -> IntBlock<QK, 2> {
    let mut b = IntBlock::new();
    b.scale = [f16_at(block, OFFSET_D); 2];
    for (o, q) in b.q.iter_mut().zip(unpack_5bit(&block[OFFSET_QH..OFFSET_QS], &block[OFFSET_QS..])) {
        *o = q as i8 - 16;
    }
    b
}

/// 32 five-bit levels as Q5_0 and Q5_1 store them: (`qh`, `qs`).
pub(super) fn pack_5bit(q: &[u8; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let qh = q.iter().enumerate().fold(0u32, |qh, (j, &l)| qh | (u32::from((l >> 4) & 1) << j));
    let mut qs = [0u8; QK / 2];
    let (lo, hi) = q.split_at(QK / 2);
    for ((b, a), c) in qs.iter_mut().zip(lo).zip(hi) {
        *b = (a & 0x0F) | ((c & 0x0F) << 4);
    }
    (qh.to_le_bytes(), qs)
}

/// The inverse of `pack_5bit`.
pub(super) fn unpack_5bit(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let qh = qh.iter().rev().fold(0u32, |qh, &b| (qh << 8) | u32::from(b));
    let mut q = [0u8; QK];
    let (lo, hi) = q.split_at_mut(QK / 2);
    for (j, ((a, c), b)) in lo.iter_mut().zip(hi).zip(qs).enumerate() {
        *a = (b & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        *c = (b >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}
