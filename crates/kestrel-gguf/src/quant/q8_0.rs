//! Q8_0: 32 weights per 34-byte block: f16 scale `d`, then 32 int8 `qs`; w = qs * d.

use super::int_block::IntBlock;
use super::{f16_bits, f16_value, QK};

pub const BLOCK_BYTES: usize = 34;

pub(super) fn quantize_block(x: &[f32; QK]) -> [u8; BLOCK_BYTES] {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    // ggml scales by the f32 d, not its f16 rounding.
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut out = [0u8; BLOCK_BYTES];
    let (scale, qs) = out.split_at_mut(2);
    scale.copy_from_slice(&f16_bits(d));
    for (q, v) in qs.iter_mut().zip(x) {
        // roundf: half away from zero, like f32::round.
        *q = ((v * id).round() as i8) as u8;
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
    for (o, q) in b.q.iter_mut().zip(qs) {
        *o = *q as i8;
    }
    b
}
