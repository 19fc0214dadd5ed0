//! Q4_1: 32 weights per 20-byte block: f16 scale `d`, f16 minimum `m`, then 16 bytes `qs`
//! packed as in Q4_0; w = q * d + m.

use super::int_block::IntBlock;
use super::{f16_bits, f16_value, min_max, QK};

pub const BLOCK_BYTES: usize = 20;

pub(super) fn quantize_block(x: &[f32; QK]) -> [u8; BLOCK_BYTES] {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut out = [0u8; BLOCK_BYTES];
    let (scales, qs) = out.split_at_mut(4);
    scales[..2].copy_from_slice(&f16_bits(d));
    scales[2..].copy_from_slice(&f16_bits(min));
    let (lo, hi) = x.split_at(QK / 2);
    for ((q, a), b) in qs.iter_mut().zip(lo).zip(hi) {
        let qa = (((a - min) * id + 0.5) as i8).min(15) as u8;
        let qb = (((b - min) * id + 0.5) as i8).min(15) as u8;
        *q = qa | (qb << 4);
    }
    out
}

pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; QK]) {
    int_block(block).expand(out);
}

pub(super) fn int_block(block: &[u8; BLOCK_BYTES]) -> IntBlock<QK, 2> {
    let [d0, d1, m0, m1, qs @ ..] = block;
    let mut b = IntBlock::new();
    b.scale = [f16_value([*d0, *d1]); 2];
    b.min = Some([f16_value([*m0, *m1]); 2]);
    let (lo, hi) = b.q.split_at_mut(QK / 2);
    for ((q, a), c) in qs.iter().zip(lo).zip(hi) {
        *a = (q & 0x0F) as i8;
        *c = (q >> 4) as i8;
    }
    b
}
