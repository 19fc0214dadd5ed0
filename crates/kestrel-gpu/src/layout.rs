//! The GPU layout of weight tensors, which only this crate's kernels read. GGUF blocks are 18 to 210 bytes, mostly not 4-byte
//! aligned, and WGSL has no 8-bit type, so each tensor is repacked into `u32` words, in up to
//! three sections: quants, a plane of high bits (the 5- and 6-bit types), scales. Blocks are
//! numbered row-major, b = row * (cols / block size) + block_in_row, which is also their order
//! in the file; every section lists the blocks in that order.
//!
//! - F32: the f32 bit patterns; no scale section.
//! - F16: two elements per word, element 2i in the low half; cols must be even.
//! - Q8_0: 8 words of int8 quants per block (value j in byte j % 4 of word j / 4); scales:
//!   one f16 `d` per block, two per word (block b in word b / 2, low half when b is even).
//! - Q4_0: 4 words per block holding the 16 `qs` bytes as they are; scales as Q8_0.
//! - Q4_1: quants as Q4_0; scales: one word per block, `d` in the low half, `m` in the high.
//!
//! The bit-plane types Q5_0, Q5_1, Q4_K, Q5_K and Q6_K split each weight's quant into its low
//! 4 bits and `h` high bits (h = 1 for Q5_0, Q5_1, Q5_K; 2 for Q6_K; 0 for Q4_K) and store both
//! in weight order, g = row * cols + col, whatever order the GGUF block keeps its elements in
//! (ggml pairs elements j and j + 16 or j + 32 in a byte). So 8 consecutive weights are one
//! quant word, and a kernel reading 8 or 32 consecutive columns reads whole words.
//! - Quant section: weight g's low 4 bits at bit 4 (g % 8) of word g / 8 (cols / 8 words a row).
//! - Plane section, from `plane_offset`: weight g's high bits at bit h (g % (32 / h)) of word
//!   g / (32 / h). For Q5_0 and Q5_1 a block's plane word is its `qh` unchanged.
//! - Scale section, the file's scale fields unchanged, so that the kernels compute d * scale in
//!   f32 exactly as ggml does:
//!   - Q5_0: `d` as Q4_0's; Q5_1: `d` and `m` as Q4_1's.
//!   - Q4_K, Q5_K: 4 words per super-block: `d` | `dmin` << 16, then the 12 bytes of packed
//!     6-bit scales and mins (bytes 4..16 of the block, as they are).
//!   - Q6_K: 9 words per pair of super-blocks a, b: `d` of a | `d` of b << 16, then the 16
//!     int8 `scales` of a, then those of b (an odd last super-block: 5 words, the high half of
//!     the first zero).
//!
//! The quant and plane sections are then interleaved in tiles of `ROW_TILE` rows (see
//! `tiled_index`): word j of row r is at ((r / ROW_TILE) * words_per_row + j) * ROW_TILE +
//! r % ROW_TILE of its section, so the same word of ROW_TILE consecutive rows is ROW_TILE
//! consecutive words. A decode matvec gives each thread a row: neighbouring threads then read
//! neighbouring words (coalesced) while they all read the same activations (one broadcast load).
//! The last tile is padded with zero rows. The scale section stays in block order.
//!
//! Row lengths must be whole blocks: 32 for Q*_0/Q*_1, 256 for the K-quants.

use kestrel_gguf::quant::{blocks, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, QK, QK_K};
use kestrel_gguf::{GgmlType, GgufError};

// The scale section copies Q5_1's d and m, and Q4_K's and Q5_K's d, dmin and 12 scale bytes,
// as one run of bytes from OFFSET_D.
const _: () = assert!(
    q5_1::OFFSET_M == q5_1::OFFSET_D + 2
        && q4_k::OFFSET_DMIN == q4_k::OFFSET_D + 2
        && q4_k::OFFSET_SCALES == q4_k::OFFSET_D + 4
        && q4_k::OFFSET_QS == q4_k::OFFSET_D + 16
        && q5_k::OFFSET_DMIN == q5_k::OFFSET_D + 2
        && q5_k::OFFSET_SCALES == q5_k::OFFSET_D + 4
        && q5_k::OFFSET_QH == q5_k::OFFSET_D + 16
);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPacked {
    /// Quant section, plane section, then scale section.
    pub words: Vec<u32>,
    /// Index of the first word of the plane section (the end of the quant section when there
    /// is none).
    pub plane_offset: u32,
    /// Index of the first word of the scale section (`words.len()` when there is none).
    pub scale_offset: u32,
}

/// Rows per tile of the interleaved quant and plane sections.
pub const ROW_TILE: u64 = 32;

/// Index in a tiled section of word `j` of row `row`, rows of `per_row` words.
pub fn tiled_index(row: u64, j: u64, per_row: u64) -> u64 {
    ((row / ROW_TILE) * per_row + j) * ROW_TILE + row % ROW_TILE
}

/// Rows a tiled section holds: `rows` rounded up to whole tiles.
pub fn padded_rows(rows: u64) -> u64 {
    rows.div_ceil(ROW_TILE) * ROW_TILE
}

/// Interleaves a row-major section of `per_row` words a row into tiles (`tiled_index`), in
/// place: a tile's rows occupy the same words before and after, so each tile is transposed
/// through a buffer of one tile, and the section grows only by the padding rows. (A browser
/// packs a vocabulary-sized table this way without a second copy of it in its wasm heap.)
fn tile_rows(section: &mut Vec<u32>, per_row: usize) {
    if per_row == 0 {
        return;
    }
    let rows = section.len() / per_row;
    section.resize(padded_rows(rows as u64) as usize * per_row, 0);
    let tile = ROW_TILE as usize;
    let mut rows_major = vec![0u32; tile * per_row];
    for chunk in section.chunks_exact_mut(tile * per_row) {
        rows_major.copy_from_slice(chunk);
        for (r, row) in rows_major.chunks_exact(per_row).enumerate() {
            for (j, &w) in row.iter().enumerate() {
                chunk[j * tile + r] = w;
            }
        }
    }
}

/// Inverse of `tile_rows`: the first `rows` rows, row-major.
fn untile_rows(tiled: &[u32], rows: usize, per_row: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(rows * per_row);
    for r in 0..rows as u64 {
        out.extend((0..per_row as u64).map(|j| tiled[tiled_index(r, j, per_row as u64) as usize]));
    }
    out
}

/// Section sizes in words of a packed tensor (`gpu_sections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSections {
    /// Quant words of one row (the tiled section holds `padded_rows` of them).
    pub quant_row_words: u64,
    /// Plane words of one row.
    pub plane_row_words: u64,
    pub quant_words: u64,
    pub plane_words: u64,
    pub scale_words: u64,
}

impl GpuSections {
    /// Words of the whole packed tensor.
    pub fn total(&self) -> u64 {
        self.quant_words + self.plane_words + self.scale_words
    }
}

/// The scale section of a packed type, as the kernels decode it (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuScales {
    /// F32 and F16: the values themselves, no scales.
    Dense,
    /// One f16 `d` per 32-weight block (Q8_0, Q4_0, Q5_0).
    D,
    /// `d` and `m` per 32-weight block (Q4_1, Q5_1).
    Dm,
    /// `d`, `dmin` and 6-bit sub-block scales and mins per super-block (Q4_K, Q5_K).
    K,
    /// `d` and 16 int8 scales per super-block, super-blocks in pairs (Q6_K).
    Q6K,
}

/// How the GPU kernels read a packed type: its scale layout and whether it has a plane of high
/// bits. The one list of the types the GPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFormat {
    pub scales: GpuScales,
    pub planes: bool,
}

/// The GPU format of `ty`; `None` for the types the kernels cannot read.
pub fn gpu_format(ty: GgmlType) -> Option<GpuFormat> {
    use GpuScales::*;
    let (scales, planes) = match ty {
        GgmlType::F32 | GgmlType::F16 => (Dense, false),
        GgmlType::Q8_0 | GgmlType::Q4_0 => (D, false),
        GgmlType::Q4_1 => (Dm, false),
        GgmlType::Q5_0 => (D, true),
        GgmlType::Q5_1 => (Dm, true),
        GgmlType::Q4_K | GgmlType::Q5_K => (K, true),
        GgmlType::Q6_K => (Q6K, true),
        _ => return None,
    };
    Some(GpuFormat { scales, planes })
}

/// Types the GPU kernels can read directly.
pub fn is_gpu_supported(ty: GgmlType) -> bool {
    gpu_format(ty).is_some()
}

/// Where each weight's bits sit in a bit-plane type's GGUF block, from ggml's
/// `dequantize_row_*`: `low(e)` and `high(e)` give (byte, shift) of element e's low 4 bits
/// and of its `high_bits` high bits.
struct PlaneFormat {
    block_bytes: usize,
    weights: usize,
    high_bits: u32,
    low: fn(usize) -> (usize, u32),
    high: fn(usize) -> (usize, u32),
}

/// Q5_0's and Q5_1's blocks, which differ only in where their fields sit (`qs` at byte `QS`, `qh`
/// at `QH`): element j is the low nibble of qs[j % 16] (j < 16) or its high nibble, and bit j of qh.
fn q5_format<const QS: usize, const QH: usize>(block_bytes: usize) -> PlaneFormat {
    PlaneFormat {
        block_bytes,
        weights: QK,
        high_bits: 1,
        low: |e| (QS + e % 16, 4 * (e / 16) as u32),
        high: |e| (QH + e / 8, (e % 8) as u32),
    }
}

fn plane_format(ty: GgmlType) -> Option<PlaneFormat> {
    let no_high = |_| (0, 0);
    Some(match ty {
        GgmlType::Q5_0 => q5_format::<{ q5_0::OFFSET_QS }, { q5_0::OFFSET_QH }>(q5_0::BLOCK_BYTES),
        GgmlType::Q5_1 => q5_format::<{ q5_1::OFFSET_QS }, { q5_1::OFFSET_QH }>(q5_1::BLOCK_BYTES),
        // Element 64 j + 32 h + l (j < 4, h < 2, l < 32): nibble h of qs[32 j + l]; for Q5_K
        // bit 2 j + h of qh[l].
        GgmlType::Q4_K => PlaneFormat {
            block_bytes: q4_k::BLOCK_BYTES,
            weights: QK_K,
            high_bits: 0,
            low: |e| (q4_k::OFFSET_QS + 32 * (e / 64) + e % 32, 4 * (e / 32 % 2) as u32),
            high: no_high,
        },
        GgmlType::Q5_K => PlaneFormat {
            block_bytes: q5_k::BLOCK_BYTES,
            weights: QK_K,
            high_bits: 1,
            low: |e| (q5_k::OFFSET_QS + 32 * (e / 64) + e % 32, 4 * (e / 32 % 2) as u32),
            high: |e| (q5_k::OFFSET_QH + e % 32, (e / 32) as u32),
        },
        // Element 128 n + 32 s + l (n < 2, s < 4, l < 32): nibble s / 2 of ql[64 n + 32 (s % 2)
        // + l], bits 2 s .. 2 s + 1 of qh[32 n + l].
        GgmlType::Q6_K => PlaneFormat {
            block_bytes: q6_k::BLOCK_BYTES,
            weights: QK_K,
            high_bits: 2,
            low: |e| {
                let (n, s, l) = (e / 128, e / 32 % 4, e % 32);
                (q6_k::OFFSET_QL + 64 * n + 32 * (s % 2) + l, 4 * (s / 2) as u32)
            },
            high: |e| (q6_k::OFFSET_QH + 32 * (e / 128) + e % 32, 2 * (e / 32 % 4) as u32),
        },
        _ => return None,
    })
}

/// Section sizes in words of a `rows` x `cols` tensor of type `ty` in the GPU layout; an error
/// for a type the kernels cannot read, a row that is not whole blocks, or a tensor too large
/// for u32 word indices.
pub fn gpu_sections(ty: GgmlType, rows: u64, cols: u64) -> Result<GpuSections, GgufError> {
    if !is_gpu_supported(ty) {
        return Err(GgufError::UnsupportedType { ty, operation: "GPU packing" });
    }
    let multiple = if ty == GgmlType::F16 { 2 } else { ty.block_size() };
    if !cols.is_multiple_of(multiple) {
        let blocks = if ty == GgmlType::F16 { "even".to_string() } else { format!("a multiple of {multiple} (whole {ty} blocks)") };
        return Err(GgufError::SizeMismatch {
            what: format!("GPU packing of a {rows}x{cols} {ty} tensor: row length must be {blocks}"),
            expected: cols.next_multiple_of(multiple),
            found: cols,
        });
    }
    let too_big = || GgufError::SizeMismatch {
        what: format!("GPU packing of a {rows}x{cols} {ty} tensor: words (limit u32::MAX)"),
        expected: u64::from(u32::MAX),
        found: u64::MAX,
    };
    let n = rows.checked_mul(cols).ok_or_else(too_big)?;
    let blocks = n / 32;
    let super_blocks = n / 256;
    let (quant_row_words, plane_row_words, scale_words) = match ty {
        GgmlType::F32 => (cols, 0, 0),
        GgmlType::F16 => (cols / 2, 0, 0),
        GgmlType::Q8_0 => (cols / 4, 0, blocks.div_ceil(2)),
        GgmlType::Q4_0 => (cols / 8, 0, blocks.div_ceil(2)),
        GgmlType::Q4_1 => (cols / 8, 0, blocks),
        GgmlType::Q5_0 => (cols / 8, cols / 32, blocks.div_ceil(2)),
        GgmlType::Q5_1 => (cols / 8, cols / 32, blocks),
        GgmlType::Q4_K => (cols / 8, 0, 4 * super_blocks),
        GgmlType::Q5_K => (cols / 8, cols / 32, 4 * super_blocks),
        _ => (cols / 8, cols / 16, 4 * super_blocks + super_blocks.div_ceil(2)),
    };
    let tiled_rows = padded_rows(rows);
    let sections = GpuSections {
        quant_row_words,
        plane_row_words,
        quant_words: tiled_rows.checked_mul(quant_row_words).ok_or_else(too_big)?,
        plane_words: tiled_rows.checked_mul(plane_row_words).ok_or_else(too_big)?,
        scale_words,
    };
    if sections.total() > u64::from(u32::MAX) {
        return Err(too_big());
    }
    Ok(sections)
}

fn check_len(what: &str, expected: u64, found: usize) -> Result<(), GgufError> {
    if expected != found as u64 {
        return Err(GgufError::SizeMismatch { what: what.to_string(), expected, found: found as u64 });
    }
    Ok(())
}

fn word(b: &[u8; 4]) -> u32 {
    u32::from_le_bytes(*b)
}

/// Consecutive little-endian words of `bytes` (a multiple of 4 long).
fn words_of(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    blocks::<4>(bytes).map(word)
}

/// Two f16 bit patterns in one word, `lo` in the low half.
fn pair(lo: [u8; 2], hi: [u8; 2]) -> u32 {
    u32::from(u16::from_le_bytes(lo)) | (u32::from(u16::from_le_bytes(hi)) << 16)
}

/// The two f16 bit patterns of a word, low half first.
fn halves(w: u32) -> [[u8; 2]; 2] {
    [(w as u16).to_le_bytes(), ((w >> 16) as u16).to_le_bytes()]
}

/// Repacks a `rows` x `cols` tensor (GGUF bytes, row-major) into the GPU layout.
pub fn pack_for_gpu(ty: GgmlType, bytes: &[u8], rows: u64, cols: u64) -> Result<GpuPacked, GgufError> {
    let sections = gpu_sections(ty, rows, cols)?;
    let expected_bytes = ty.row_bytes(cols).and_then(|r| r.checked_mul(rows)).unwrap_or(u64::MAX);
    check_len(&format!("{ty} tensor data for {rows}x{cols} (bytes)"), expected_bytes, bytes.len())?;
    let mut words = Vec::with_capacity(sections.total() as usize);
    let mut plane = Vec::with_capacity(sections.plane_words as usize);
    let mut scales = Vec::with_capacity(sections.scale_words as usize);
    if let Some(format) = plane_format(ty) {
        pack_planes(&format, bytes, &mut words, &mut plane);
        pack_plane_scales(ty, format.block_bytes, bytes, &mut scales);
    } else {
        match ty {
            GgmlType::F32 | GgmlType::F16 => words.extend(words_of(bytes)),
            GgmlType::Q8_0 => {
                let mut ds = Vec::new();
                for [d0, d1, qs @ ..] in blocks::<{ q8_0::BLOCK_BYTES }>(bytes) {
                    words.extend(words_of(qs));
                    ds.push([*d0, *d1]);
                }
                pack_scale_pairs(&ds, &mut scales);
            }
            GgmlType::Q4_0 => {
                let mut ds = Vec::new();
                for [d0, d1, qs @ ..] in blocks::<{ q4_0::BLOCK_BYTES }>(bytes) {
                    words.extend(words_of(qs));
                    ds.push([*d0, *d1]);
                }
                pack_scale_pairs(&ds, &mut scales);
            }
            _ => {
                for [d0, d1, m0, m1, qs @ ..] in blocks::<{ q4_1::BLOCK_BYTES }>(bytes) {
                    words.extend(words_of(qs));
                    scales.push(pair([*d0, *d1], [*m0, *m1]));
                }
            }
        }
    }
    tile_rows(&mut words, sections.quant_row_words as usize);
    tile_rows(&mut plane, sections.plane_row_words as usize);
    let plane_offset = words.len() as u32;
    words.extend(plane);
    let scale_offset = words.len() as u32;
    words.extend(scales);
    Ok(GpuPacked { words, plane_offset, scale_offset })
}

/// (byte, shift) of every element of a block, computed once per tensor.
fn positions(format: &PlaneFormat, at: fn(usize) -> (usize, u32)) -> Vec<(usize, u32)> {
    (0..format.weights).map(at).collect()
}

/// The low nibbles (into `quants`) and high bits (into `plane`) of every block, in weight
/// order.
fn pack_planes(format: &PlaneFormat, bytes: &[u8], quants: &mut Vec<u32>, plane: &mut Vec<u32>) {
    let low = positions(format, format.low);
    let high = positions(format, format.high);
    let h = format.high_bits;
    let mask = (1u32 << h) - 1;
    let gather = |block: &[u8], chunk: &[(usize, u32)], bits: u32, mask: u32| {
        chunk.iter().enumerate().fold(0u32, |w, (i, &(byte, shift))| w | ((u32::from(block[byte]) >> shift) & mask) << (bits * i as u32))
    };
    for block in bytes.chunks_exact(format.block_bytes) {
        quants.extend(low.chunks_exact(8).map(|c| gather(block, c, 4, 15)));
        // No plane (h = 0) for Q4_K.
        if let Some(per_word) = 32u32.checked_div(h) {
            let words = high.chunks_exact(per_word as usize);
            plane.extend(words.map(|c| gather(block, c, h, mask)));
        }
    }
}

/// The scale section of a bit-plane type (see the module comment).
fn pack_plane_scales(ty: GgmlType, block_bytes: usize, bytes: &[u8], scales: &mut Vec<u32>) {
    let blocks = bytes.chunks_exact(block_bytes);
    match ty {
        GgmlType::Q5_0 => {
            let at = q5_0::OFFSET_D;
            let ds: Vec<[u8; 2]> = blocks.map(|b| [b[at], b[at + 1]]).collect();
            pack_scale_pairs(&ds, scales);
        }
        GgmlType::Q5_1 => scales.extend(blocks.flat_map(|b| words_of(&b[q5_1::OFFSET_D..][..4]))),
        GgmlType::Q4_K => scales.extend(blocks.flat_map(|b| words_of(&b[q4_k::OFFSET_D..][..16]))),
        GgmlType::Q5_K => scales.extend(blocks.flat_map(|b| words_of(&b[q5_k::OFFSET_D..][..16]))),
        _ => {
            let (d, sc) = (q6_k::OFFSET_D, q6_k::OFFSET_SCALES);
            let blocks: Vec<&[u8]> = blocks.collect();
            for two in blocks.chunks(2) {
                let d_of = |i: usize| two.get(i).map_or([0, 0], |b| [b[d], b[d + 1]]);
                scales.push(pair(d_of(0), d_of(1)));
                for b in two {
                    scales.extend(words_of(&b[sc..][..16]));
                }
            }
        }
    }
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
pub fn unpack_from_gpu(ty: GgmlType, packed: &GpuPacked, rows: u64, cols: u64) -> Result<Vec<u8>, GgufError> {
    let sections = gpu_sections(ty, rows, cols)?;
    check_len(&format!("packed {ty} tensor {rows}x{cols} (words)"), sections.total(), packed.words.len())?;
    check_len("packed plane offset", sections.quant_words, packed.plane_offset as usize)?;
    check_len("packed scale offset", sections.quant_words + sections.plane_words, packed.scale_offset as usize)?;
    let (quants, rest) = packed.words.split_at(sections.quant_words as usize);
    let (plane, scales) = rest.split_at(sections.plane_words as usize);
    let quants = &untile_rows(quants, rows as usize, sections.quant_row_words as usize)[..];
    let plane = &untile_rows(plane, rows as usize, sections.plane_row_words as usize)[..];
    let bytes_of = |w: &u32| w.to_le_bytes();
    let mut out = Vec::new();
    if let Some(format) = plane_format(ty) {
        let n_blocks = (rows * cols) as usize / format.weights;
        out.resize(n_blocks * format.block_bytes, 0);
        unpack_planes(&format, quants, plane, &mut out);
        unpack_plane_scales(ty, format.block_bytes, scales, &mut out);
        return Ok(out);
    }
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

/// Scatters the low nibbles and high bits back into the (zeroed) blocks of `out`; together
/// the two cover every bit of the blocks' quant fields exactly once.
fn unpack_planes(format: &PlaneFormat, quants: &[u32], plane: &[u32], out: &mut [u8]) {
    let low = positions(format, format.low);
    let high = positions(format, format.high);
    let h = format.high_bits as usize;
    let mask = (1u32 << h) - 1;
    let scatter = |block: &mut [u8], words: &[u32], at: &[(usize, u32)], bits: usize, mask: u32| {
        let per_word = 32 / bits;
        for (e, &(byte, shift)) in at.iter().enumerate() {
            let value = (words[e / per_word] >> (bits * (e % per_word))) & mask;
            block[byte] |= (value << shift) as u8;
        }
    };
    let quant_words = format.weights / 8;
    let plane_words = format.weights * h / 32;
    for (i, block) in out.chunks_exact_mut(format.block_bytes).enumerate() {
        scatter(block, &quants[i * quant_words..][..quant_words], &low, 4, 15);
        if h > 0 {
            scatter(block, &plane[i * plane_words..][..plane_words], &high, h, mask);
        }
    }
}

/// Writes the scale fields of every block of `out` back from the scale section.
fn unpack_plane_scales(ty: GgmlType, block_bytes: usize, scales: &[u32], out: &mut [u8]) {
    let mut blocks = out.chunks_exact_mut(block_bytes);
    let put = |block: &mut [u8], at: usize, words: &[u32]| {
        for (dst, src) in block[at..].chunks_exact_mut(4).zip(words) {
            dst.copy_from_slice(&src.to_le_bytes());
        }
    };
    match ty {
        GgmlType::Q5_0 => {
            let at = q5_0::OFFSET_D;
            for (block, d) in blocks.zip(scales.iter().flat_map(|&w| halves(w))) {
                block[at..at + 2].copy_from_slice(&d);
            }
        }
        GgmlType::Q5_1 => blocks.zip(scales).for_each(|(b, w)| put(b, q5_1::OFFSET_D, &[*w])),
        GgmlType::Q4_K => blocks.zip(scales.chunks_exact(4)).for_each(|(b, w)| put(b, q4_k::OFFSET_D, w)),
        GgmlType::Q5_K => blocks.zip(scales.chunks_exact(4)).for_each(|(b, w)| put(b, q5_k::OFFSET_D, w)),
        _ => {
            let (d, sc) = (q6_k::OFFSET_D, q6_k::OFFSET_SCALES);
            for group in scales.chunks(9) {
                let Some((&d_word, sc_words)) = group.split_first() else {
                    continue;
                };
                for (words, d_bytes) in sc_words.chunks_exact(4).zip(halves(d_word)) {
                    let Some(block) = blocks.next() else { return };
                    block[d..d + 2].copy_from_slice(&d_bytes);
                    put(block, sc, words);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
