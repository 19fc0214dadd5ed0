//! Plain float formats. ggml converts f32 -> f16 with round-to-nearest-even, as `half` does.

use super::{blocks, f16_bits, f16_value};

pub(super) fn f32_to_f32(bytes: &[u8], out: &mut [f32]) {
    for (src, dst) in blocks::<4>(bytes).zip(out) {
        *dst = f32::from_le_bytes(*src);
    }
}

pub(super) fn f16_to_f32(bytes: &[u8], out: &mut [f32]) {
    for (src, dst) in blocks::<2>(bytes).zip(out) {
        *dst = f16_value(*src);
    }
}

/// bf16 is the top half of an f32, so widening is exact.
pub(super) fn bf16_to_f32(bytes: &[u8], out: &mut [f32]) {
    for (src, dst) in blocks::<2>(bytes).zip(out) {
        *dst = f32::from_bits(u32::from(u16::from_le_bytes(*src)) << 16);
    }
}

pub(super) fn f32_from_f32(values: &[f32], out: &mut Vec<u8>) {
    out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
}

pub(super) fn f16_from_f32(values: &[f32], out: &mut Vec<u8>) {
    out.extend(values.iter().flat_map(|&v| f16_bits(v)));
}
