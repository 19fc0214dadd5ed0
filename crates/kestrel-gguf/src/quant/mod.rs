//! ggml tensor formats on the CPU: conversion to and from f32, bit-exact with ggml's
//! reference code (ggml-quants.c `quantize_row_*_ref` / `dequantize_row_*`), and the
//! repacking of blocks into the aligned layout the GPU kernels read.

mod float;
mod gpu;
mod q4_0;
mod q4_1;
mod q8_0;

pub use gpu::{is_gpu_supported, pack_for_gpu, unpack_from_gpu, GpuPacked};

use crate::error::GgufError;
use crate::types::GgmlType;

/// Elements per block of every block-quantized format handled here.
pub(crate) const QK: usize = 32;

/// Converts `bytes` of type `ty` into `out`, whose length is the element count.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), GgufError> {
    let expected = data_len(ty, out.len() as u64, "dequantize")?;
    if bytes.len() as u64 != expected {
        return Err(GgufError::SizeMismatch {
            what: format!("{ty} data for {} elements (bytes)", out.len()),
            expected,
            found: bytes.len() as u64,
        });
    }
    match ty {
        GgmlType::F32 => float::f32_to_f32(bytes, out),
        GgmlType::F16 => float::f16_to_f32(bytes, out),
        GgmlType::BF16 => float::bf16_to_f32(bytes, out),
        GgmlType::Q8_0 => dequantize_blocks(bytes, out, q8_0::dequantize_block),
        GgmlType::Q4_0 => dequantize_blocks(bytes, out, q4_0::dequantize_block),
        GgmlType::Q4_1 => dequantize_blocks(bytes, out, q4_1::dequantize_block),
        _ => {
            return Err(GgufError::UnsupportedType {
                ty,
                operation: "dequantization",
            })
        }
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
        _ => {
            return Err(GgufError::UnsupportedType {
                ty,
                operation: "quantization",
            })
        }
    }
    Ok(out)
}

/// Byte size of `n` elements of `ty`, or an error if `n` is not a whole number of blocks.
fn data_len(ty: GgmlType, n: u64, operation: &'static str) -> Result<u64, GgufError> {
    ty.row_bytes(n).ok_or_else(|| GgufError::SizeMismatch {
        what: format!(
            "{operation} as {ty}: element count must be a multiple of {}",
            ty.block_size()
        ),
        expected: n.next_multiple_of(ty.block_size()),
        found: n,
    })
}

/// Fixed-size views of the consecutive `N`-byte blocks of `bytes`. Callers check the length
/// first; `chunks_exact` guarantees every chunk converts, so nothing is ever dropped.
pub(crate) fn blocks<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = &[u8; N]> {
    bytes.chunks_exact(N).filter_map(|c| c.try_into().ok())
}

fn dequantize_blocks<const N: usize>(
    bytes: &[u8],
    out: &mut [f32],
    block: fn(&[u8; N], &mut [f32; QK]),
) {
    let outs = out
        .chunks_exact_mut(QK)
        .filter_map(|c| <&mut [f32; QK]>::try_from(c).ok());
    for (src, dst) in blocks::<N>(bytes).zip(outs) {
        block(src, dst);
    }
}

fn quantize_blocks<const N: usize>(
    values: &[f32],
    out: &mut Vec<u8>,
    block: fn(&[f32; QK]) -> [u8; N],
) {
    for src in values
        .chunks_exact(QK)
        .filter_map(|c| <&[f32; QK]>::try_from(c).ok())
    {
        out.extend_from_slice(&block(src));
    }
}

pub(crate) fn f16_bits(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

pub(crate) fn f16_value(bytes: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(bytes)).to_f32()
}
