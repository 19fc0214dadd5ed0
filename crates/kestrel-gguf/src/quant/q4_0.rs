//! Q4_0: 32 weights per 18-byte block: f16 scale `d`, then 16 bytes `qs`; byte j holds
//! element j in its low nibble and element j + 16 in its high nibble; w = (q - 8) * d.

use super::int_block::IntBlock;
use super::{f16_bits, f16_value, signed_abs_max, QK};

pub const BLOCK_BYTES: usize = 18;

pub(super) fn quantize_block(x: &[f32; QK]) -> [u8; BLOCK_BYTES] {
    // The value of largest magnitude, with its sign, maps to -8.
    let (_, max) = signed_abs_max(x);
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut out = [0u8; BLOCK_BYTES];
    let (scale, qs) = out.split_at_mut(2);
    scale.copy_from_slice(&f16_bits(d));
    let (lo, hi) = x.split_at(QK / 2);
    for ((q, a), b) in qs.iter_mut().zip(lo).zip(hi) {
        // (int8_t)(x + 8.5f) truncates toward zero, as `as i8` does.
        let qa = ((a * id + 8.5) as i8).min(15) as u8;
        let qb = ((b * id + 8.5) as i8).min(15) as u8;
        *q = qa | (qb << 4);
    }
    out
}

pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; QK]) {
    int_block(block).expand(out);
}

pub(super) fn int_block(block: &[u8; BLOCK_BYTES]) -> IntBlock<QK, 2> {
    let [d0, d1, qs @ ..] = block;
    let mut b = IntBlock::new();
    b.scale = [f16_value([*d0, *d1]); 2];
    let (lo, hi) = b.q.split_at_mut(QK / 2);
    for ((q, a), c) in qs.iter().zip(lo).zip(hi) {
        *a = (q & 0x0F) as i8 - 8;
        *c = (q >> 4) as i8 - 8;
    }
    b
}
