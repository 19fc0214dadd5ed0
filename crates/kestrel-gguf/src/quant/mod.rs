//! ggml tensor formats on the CPU: conversion to and from f32, bit-exact with ggml's
//! reference code (ggml-quants.c `quantize_row_*_ref` / `dequantize_row_*`), and each block
//! format's layout (the `q*` modules' `BLOCK_BYTES` and `OFFSET_*`), which kestrel-gpu's repack
//! into its own layout reads.

mod float;
mod int_block;
mod kquant;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;

pub use int_block::{int_groups, super_block_factors, IntGroups, SuperBlockFactors, INT_GROUP};

use crate::error::GgufError;
use crate::types::GgmlType;

/// Elements per block of the legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
pub const QK: usize = 32;

/// Elements per super-block of the K-quants (Q2_K .. Q6_K), ggml's QK_K.
pub const QK_K: usize = 256;

/// Converts `bytes` of type `ty` into `out`, whose length is the element count.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), GgufError> {
    check_data_len(ty, bytes, out.len(), "dequantize")?;
    match ty {
        GgmlType::F32 => float::f32_to_f32(bytes, out),
        GgmlType::F16 => float::f16_to_f32(bytes, out),
        GgmlType::BF16 => float::bf16_to_f32(bytes, out),
        GgmlType::Q8_0 => dequantize_blocks(bytes, out, q8_0::dequantize_block),
        GgmlType::Q4_0 => dequantize_blocks(bytes, out, q4_0::dequantize_block),
        GgmlType::Q4_1 => dequantize_blocks(bytes, out, q4_1::dequantize_block),
        GgmlType::Q5_0 => dequantize_blocks(bytes, out, q5_0::dequantize_block),
        GgmlType::Q5_1 => dequantize_blocks(bytes, out, q5_1::dequantize_block),
        GgmlType::Q2_K => dequantize_blocks(bytes, out, q2_k::dequantize_block),
        GgmlType::Q3_K => dequantize_blocks(bytes, out, q3_k::dequantize_block),
        GgmlType::Q4_K => dequantize_blocks(bytes, out, q4_k::dequantize_block),
        GgmlType::Q5_K => dequantize_blocks(bytes, out, q5_k::dequantize_block),
        GgmlType::Q6_K => dequantize_blocks(bytes, out, q6_k::dequantize_block),
        _ => return Err(GgufError::UnsupportedType { ty, operation: "dequantization" }),
    }
    Ok(())
}

/// Encodes `values` as `ty` with ggml's reference rounding; the length must be a whole
/// number of blocks.
pub fn quantize(ty: GgmlType, values: &[f32]) -> Result<Vec<u8>, GgufError> {
    let len = data_len(ty, values.len() as u64, "quantization")?;
    let mut out = Vec::with_capacity(len as usize);
    match ty {
        GgmlType::F32 => float::f32_from_f32(values, &mut out),
        GgmlType::F16 => float::f16_from_f32(values, &mut out),
        GgmlType::Q8_0 => quantize_blocks(values, &mut out, q8_0::quantize_block),
        GgmlType::Q4_0 => quantize_blocks(values, &mut out, q4_0::quantize_block),
        GgmlType::Q4_1 => quantize_blocks(values, &mut out, q4_1::quantize_block),
        GgmlType::Q5_0 => quantize_blocks(values, &mut out, q5_0::quantize_block),
        GgmlType::Q5_1 => quantize_blocks(values, &mut out, q5_1::quantize_block),
        GgmlType::Q2_K => quantize_blocks(values, &mut out, q2_k::quantize_block),
        GgmlType::Q3_K => quantize_blocks(values, &mut out, q3_k::quantize_block),
        GgmlType::Q4_K => quantize_blocks(values, &mut out, q4_k::quantize_block),
        GgmlType::Q5_K => quantize_blocks(values, &mut out, q5_k::quantize_block),
        GgmlType::Q6_K => quantize_blocks(values, &mut out, q6_k::quantize_block),
        _ => return Err(GgufError::UnsupportedType { ty, operation: "quantization" }),
    }
    Ok(out)
}

/// `bytes` holds exactly `n` elements of `ty`.
fn check_data_len(ty: GgmlType, bytes: &[u8], n: usize, operation: &'static str) -> Result<(), GgufError> {
    let expected = data_len(ty, n as u64, operation)?;
    if bytes.len() as u64 != expected {
        return Err(GgufError::SizeMismatch { what: format!("{ty} data for {n} elements (bytes)"), expected, found: bytes.len() as u64 });
    }
    Ok(())
}

/// Byte size of `n` elements of `ty`, or an error if `n` is not a whole number of blocks.
fn data_len(ty: GgmlType, n: u64, operation: &'static str) -> Result<u64, GgufError> {
    ty.row_bytes(n).ok_or_else(|| GgufError::SizeMismatch {
        what: format!("{operation} as {ty}: element count must be a multiple of {}", ty.block_size()),
        expected: n.next_multiple_of(ty.block_size()),
        found: n,
    })
}

/// Fixed-size views of the consecutive `N`-byte blocks of `bytes`. Callers check the length
/// first; `chunks_exact` guarantees every chunk converts, so nothing is ever dropped.
pub fn blocks<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = &[u8; N]> {
    bytes.chunks_exact(N).filter_map(|c| c.try_into().ok())
}

/// Runs `block` over every (block bytes, output elements) pair; `E` is the format's
/// elements per block (32 or 256), inferred from `block`.
fn dequantize_blocks<const N: usize, const E: usize>(bytes: &[u8], out: &mut [f32], block: fn(&[u8; N], &mut [f32; E])) {
    let outs = out.chunks_exact_mut(E).filter_map(|c| <&mut [f32; E]>::try_from(c).ok());
    for (src, dst) in blocks::<N>(bytes).zip(outs) {
        block(src, dst);
    }
}

fn quantize_blocks<const N: usize, const E: usize>(values: &[f32], out: &mut Vec<u8>, block: fn(&[f32; E]) -> [u8; N]) {
    for src in values.chunks_exact(E).filter_map(|c| <&[f32; E]>::try_from(c).ok()) {
        out.extend_from_slice(&block(src));
    }
}

/// The element of largest magnitude (the first one on ties) and that magnitude, as ggml's
/// symmetric quantizers pick it (NaNs are never picked).
pub(crate) fn signed_abs_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// (min, max) of `x` as ggml's asymmetric quantizers (Q4_1, Q5_1) compute them.
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

pub(crate) fn f16_bits(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

pub(crate) fn f16_value(bytes: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(bytes)).to_f32()
}

/// The f16 at byte `at` of a block; `at` is always one of a format's constant field offsets.
pub(crate) fn f16_at<const N: usize>(block: &[u8; N], at: usize) -> f32 {
    f16_value([block[at], block[at + 1]])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block sizes and field offsets the (de)quantizers and kestrel-gpu's repack use agree with
    /// ggml's type table, and the fields tile each block.
    #[test]
    fn block_layouts_match_the_type_table() {
        let layouts: [(GgmlType, usize, &[usize]); 7] = [
            (GgmlType::Q5_0, q5_0::BLOCK_BYTES, &[q5_0::OFFSET_D, q5_0::OFFSET_QH, q5_0::OFFSET_QS]),
            (GgmlType::Q5_1, q5_1::BLOCK_BYTES, &[q5_1::OFFSET_D, q5_1::OFFSET_M, q5_1::OFFSET_QH, q5_1::OFFSET_QS]),
            (GgmlType::Q2_K, q2_k::BLOCK_BYTES, &[q2_k::OFFSET_SCALES, q2_k::OFFSET_QS, q2_k::OFFSET_D, q2_k::OFFSET_DMIN]),
            (GgmlType::Q3_K, q3_k::BLOCK_BYTES, &[q3_k::OFFSET_HMASK, q3_k::OFFSET_QS, q3_k::OFFSET_SCALES, q3_k::OFFSET_D]),
            (GgmlType::Q4_K, q4_k::BLOCK_BYTES, &[q4_k::OFFSET_D, q4_k::OFFSET_DMIN, q4_k::OFFSET_SCALES, q4_k::OFFSET_QS]),
            (
                GgmlType::Q5_K,
                q5_k::BLOCK_BYTES,
                &[q5_k::OFFSET_D, q5_k::OFFSET_DMIN, q5_k::OFFSET_SCALES, q5_k::OFFSET_QH, q5_k::OFFSET_QS],
            ),
            (GgmlType::Q6_K, q6_k::BLOCK_BYTES, &[q6_k::OFFSET_QL, q6_k::OFFSET_QH, q6_k::OFFSET_SCALES, q6_k::OFFSET_D]),
        ];
        for (ty, bytes, offsets) in layouts {
            assert_eq!(bytes as u64, ty.type_size(), "{ty}");
            assert_eq!(offsets.first(), Some(&0), "{ty}");
            assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{ty}");
            assert!(offsets.last().is_some_and(|&o| o < bytes), "{ty}");
        }
        assert_eq!(GgmlType::Q4_K.block_size(), QK_K as u64);
        assert_eq!(GgmlType::Q5_0.block_size(), QK as u64);
    }
}
