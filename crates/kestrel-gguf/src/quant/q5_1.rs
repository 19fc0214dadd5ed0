//! Q5_1: 32 weights per 24-byte block: f16 scale `d`, f16 minimum `m`, then `qh` and `qs`
//! as in Q5_0; w = q * d + m.

use super::int_block::IntBlock;
use super::q5_0::{pack_5bit, unpack_5bit};
use super::{f16_at, f16_bits, min_max, QK};

pub const BLOCK_BYTES: usize = 24;
pub const OFFSET_D: usize = 0;
pub const OFFSET_M: usize = 2;
pub const OFFSET_QH: usize = 4;
pub const OFFSET_QS: usize = 8;

pub(super) fn quantize_block(x: &[f32; QK]) -> [u8; BLOCK_BYTES] {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; QK];
    for (q, v) in q.iter_mut().zip(x) {
        // ggml: (uint8_t)(x + 0.5f) with no clamp; the value never exceeds 31.5.
        *q = ((v - min) * id + 0.5) as u8;
    }
    let mut out = [0u8; BLOCK_BYTES];
    out[OFFSET_D..OFFSET_M].copy_from_slice(&f16_bits(d));
    out[OFFSET_M..OFFSET_QH].copy_from_slice(&f16_bits(min));
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
    b.min = Some([f16_at(block, OFFSET_M); 2]);
    for (o, q) in b.q.iter_mut().zip(unpack_5bit(&block[OFFSET_QH..OFFSET_QS], &block[OFFSET_QS..])) {
        *o = q as i8;
    }
    b
}
