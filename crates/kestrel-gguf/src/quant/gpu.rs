//! The GPU layout of weight tensors. GGUF blocks are 18/20/34 bytes, not 4-byte aligned, and
//! WGSL has no 8-bit type, so each tensor is repacked into `u32` words: first every block's
//! quants (whole words per block), then a section of f16 scales. Blocks are numbered
//! row-major, b = row * (cols / 32) + block_in_row, which is also their order in the file.
//!
//! - F32: the f32 bit patterns; no scale section.
//! - F16: two elements per word, element 2i in the low half; cols must be even.
//! - Q8_0: 8 words of int8 quants per block (value j in byte j % 4 of word j / 4); scales:
//!   one f16 `d` per block, two per word (block b in word b / 2, low half when b is even).
//! - Q4_0: 4 words per block holding the 16 `qs` bytes as they are; scales as Q8_0.
//! - Q4_1: quants as Q4_0; scales: one word per block, `d` in the low half, `m` in the high.

use super::{blocks, q4_0, q4_1, q8_0};
use crate::error::GgufError;
use crate::types::GgmlType;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPacked {
    /// Quant section, then scale section.
    pub words: Vec<u32>,
    /// Index of the first word of the scale section (`words.len()` when there is none).
    pub scale_offset: u32,
}

/// Types the GPU kernels can read directly.
pub fn is_gpu_supported(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::F32 | GgmlType::F16 | GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1
    )
}

/// Section sizes in words for a `rows` x `cols` tensor: (quant words, scale words).
fn layout(ty: GgmlType, rows: u64, cols: u64) -> Result<(u64, u64), GgufError> {
    if !is_gpu_supported(ty) {
        return Err(GgufError::UnsupportedType {
            ty,
            operation: "GPU packing",
        });
    }
    let bad_shape = |reason: &str| GgufError::SizeMismatch {
        what: format!("GPU packing of a {rows}x{cols} {ty} tensor: {reason}"),
        expected: cols.next_multiple_of(ty.block_size().max(2)),
        found: cols,
    };
    if !cols.is_multiple_of(ty.block_size()) {
        return Err(bad_shape("row length must be a whole number of blocks"));
    }
    if ty == GgmlType::F16 && !cols.is_multiple_of(2) {
        return Err(bad_shape("row length must be even"));
    }
    let too_big = || GgufError::SizeMismatch {
        what: format!("GPU packing of a {rows}x{cols} {ty} tensor: words (limit u32::MAX)"),
        expected: u64::from(u32::MAX),
        found: u64::MAX,
    };
    let n = rows.checked_mul(cols).ok_or_else(too_big)?;
    let blocks = n / 32;
    let sizes = match ty {
        GgmlType::F32 => (n, 0),
        GgmlType::F16 => (n / 2, 0),
        GgmlType::Q8_0 => (blocks * 8, blocks.div_ceil(2)),
        GgmlType::Q4_0 => (blocks * 4, blocks.div_ceil(2)),
        _ => (blocks * 4, blocks),
    };
    if sizes.0 + sizes.1 > u64::from(u32::MAX) {
        return Err(too_big());
    }
    Ok(sizes)
}

fn check_len(what: &str, expected: u64, found: usize) -> Result<(), GgufError> {
    if expected != found as u64 {
        return Err(GgufError::SizeMismatch {
            what: what.to_string(),
            expected,
            found: found as u64,
        });
    }
    Ok(())
}

fn word(b: &[u8; 4]) -> u32 {
    u32::from_le_bytes(*b)
}

/// Two f16 bit patterns in one word, `lo` in the low half.
fn pair(lo: [u8; 2], hi: [u8; 2]) -> u32 {
    u32::from(u16::from_le_bytes(lo)) | (u32::from(u16::from_le_bytes(hi)) << 16)
}

/// Repacks a `rows` x `cols` tensor (GGUF bytes, row-major) into the GPU layout.
pub fn pack_for_gpu(
    ty: GgmlType,
    bytes: &[u8],
    rows: u64,
    cols: u64,
) -> Result<GpuPacked, GgufError> {
    let (quant_words, scale_words) = layout(ty, rows, cols)?;
    let expected_bytes = ty
        .row_bytes(cols)
        .and_then(|r| r.checked_mul(rows))
        .unwrap_or(u64::MAX);
    check_len(
        &format!("{ty} tensor data for {rows}x{cols} (bytes)"),
        expected_bytes,
        bytes.len(),
    )?;
    let mut words = Vec::with_capacity((quant_words + scale_words) as usize);
    let mut scales = Vec::with_capacity(scale_words as usize);
    match ty {
        GgmlType::F32 | GgmlType::F16 => words.extend(blocks::<4>(bytes).map(word)),
        GgmlType::Q8_0 => {
            let mut ds = Vec::new();
            for [d0, d1, qs @ ..] in blocks::<{ q8_0::BLOCK_BYTES }>(bytes) {
                words.extend(blocks::<4>(qs).map(word));
                ds.push([*d0, *d1]);
            }
            pack_scale_pairs(&ds, &mut scales);
        }
        GgmlType::Q4_0 => {
            let mut ds = Vec::new();
            for [d0, d1, qs @ ..] in blocks::<{ q4_0::BLOCK_BYTES }>(bytes) {
                words.extend(blocks::<4>(qs).map(word));
                ds.push([*d0, *d1]);
            }
            pack_scale_pairs(&ds, &mut scales);
        }
        _ => {
            for [d0, d1, m0, m1, qs @ ..] in blocks::<{ q4_1::BLOCK_BYTES }>(bytes) {
                words.extend(blocks::<4>(qs).map(word));
                scales.push(pair([*d0, *d1], [*m0, *m1]));
            }
        }
    }
    let scale_offset = words.len() as u32;
    words.extend(scales);
    Ok(GpuPacked {
        words,
        scale_offset,
    })
}

/// One f16 per block, two per word; an odd count leaves the last high half zero.
fn pack_scale_pairs(ds: &[[u8; 2]], out: &mut Vec<u32>) {
    out.extend(ds.chunks(2).map(|p| match p {
        [lo, hi] => pair(*lo, *hi),
        [lo] => pair(*lo, [0, 0]),
        _ => 0,
    }));
}

/// Inverse of `pack_for_gpu`: the GGUF bytes of the tensor.
pub fn unpack_from_gpu(
    ty: GgmlType,
    packed: &GpuPacked,
    rows: u64,
    cols: u64,
) -> Result<Vec<u8>, GgufError> {
    let (quant_words, scale_words) = layout(ty, rows, cols)?;
    check_len(
        &format!("packed {ty} tensor {rows}x{cols} (words)"),
        quant_words + scale_words,
        packed.words.len(),
    )?;
    check_len(
        "packed scale offset",
        quant_words,
        packed.scale_offset as usize,
    )?;
    let (quants, scales) = packed.words.split_at(quant_words as usize);
    let bytes_of = |w: &u32| w.to_le_bytes();
    let halves = |w: u32| [(w as u16).to_le_bytes(), ((w >> 16) as u16).to_le_bytes()];
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 | GgmlType::F16 => out.extend(quants.iter().flat_map(bytes_of)),
        GgmlType::Q8_0 | GgmlType::Q4_0 => {
            let per_block = if ty == GgmlType::Q8_0 { 8 } else { 4 };
            let ds = scales.iter().flat_map(|&w| halves(w));
            for (qs, d) in quants.chunks_exact(per_block).zip(ds) {
                out.extend(d);
                out.extend(qs.iter().flat_map(bytes_of));
            }
        }
        _ => {
            for (qs, &dm) in quants.chunks_exact(4).zip(scales) {
                out.extend(halves(dm).into_iter().flatten());
                out.extend(qs.iter().flat_map(bytes_of));
            }
        }
    }
    Ok(out)
}
