//! The GPU layout's tests: exact round trips, each section where the module doc says it is.

use kestrel_gguf::quant::dequantize;
use rand::{rngs::StdRng, Rng, SeedableRng};

use super::*;

const PLANE_TYPES: [GgmlType; 5] = [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// (rows, cols) in blocks: one block, odd and even block counts (Q6_K pairs its
/// super-blocks' scales), several rows.
const SHAPES: [(u64, u64); 5] = [(1, 1), (3, 1), (2, 2), (5, 3), (1, 7)];

#[test]
fn gpu_formats_agree_with_the_packer() {
    for ty in GgmlType::ALL {
        let format = gpu_format(ty);
        assert_eq!(format.is_some_and(|f| f.planes), plane_format(ty).is_some(), "{ty}");
        // Every type the kernels read packs (256 columns: whole blocks of every type); the
        // others are refused by the packer.
        assert_eq!(gpu_sections(ty, 1, 256).is_ok(), format.is_some(), "{ty}");
    }
}

fn random_bytes(rng: &mut StdRng, ty: GgmlType, rows: u64, cols: u64) -> Vec<u8> {
    let n = ty.row_bytes(cols).unwrap() * rows;
    (0..n).map(|_| rng.random()).collect()
}

#[test]
fn round_trips_random_blocks() {
    let mut rng = StdRng::seed_from_u64(1);
    for ty in PLANE_TYPES {
        for (rows, blocks) in SHAPES {
            let cols = blocks * ty.block_size();
            // Scales get arbitrary f16 bit patterns, NaN and infinity included.
            let bytes = random_bytes(&mut rng, ty, rows, cols);
            let packed = pack_for_gpu(ty, &bytes, rows, cols).unwrap();
            let sections = gpu_sections(ty, rows, cols).unwrap();
            assert_eq!(packed.words.len() as u64, sections.total(), "{ty}");
            assert_eq!(unpack_from_gpu(ty, &packed, rows, cols).unwrap(), bytes, "{ty} {rows}x{cols}");
        }
    }
}

/// Random quants with unit scales (d = 1, every sub-block scale 1, no minimum), so that
/// ggml's dequantization yields q - offset: the quant of every weight, independently of
/// the packer's element tables.
fn unit_scale_blocks(rng: &mut StdRng, ty: GgmlType, n_blocks: usize) -> Vec<u8> {
    let one = half::f16::ONE.to_le_bytes();
    let mut bytes = random_bytes(rng, ty, n_blocks as u64, ty.block_size());
    for block in bytes.chunks_exact_mut(ty.type_size() as usize) {
        match ty {
            GgmlType::Q5_0 => block[..2].copy_from_slice(&one),
            GgmlType::Q5_1 => block[..4].copy_from_slice(&[one[0], one[1], 0, 0]),
            GgmlType::Q4_K | GgmlType::Q5_K => {
                block[..4].copy_from_slice(&[one[0], one[1], 0, 0]);
                // get_scale_min_k4: scale 1 and min 0 for all 8 sub-blocks.
                block[4..16].copy_from_slice(&[1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
            }
            _ => {
                block[q6_k::OFFSET_SCALES..q6_k::OFFSET_D].fill(1);
                block[q6_k::OFFSET_D..].copy_from_slice(&one);
            }
        }
    }
    bytes
}

#[test]
fn planes_hold_each_weights_bits_in_weight_order() {
    let mut rng = StdRng::seed_from_u64(2);
    for ty in PLANE_TYPES {
        let (rows, cols) = (3u64, 2 * ty.block_size());
        let n = (rows * cols) as usize;
        let bytes = unit_scale_blocks(&mut rng, ty, n / ty.block_size() as usize);
        let mut values = vec![0.0; n];
        dequantize(ty, &bytes, &mut values).unwrap();
        let offset = match ty {
            GgmlType::Q5_0 => 16.0,
            GgmlType::Q6_K => 32.0,
            _ => 0.0,
        };
        let h = match ty {
            GgmlType::Q4_K => 0,
            GgmlType::Q6_K => 2,
            _ => 1,
        };
        let p = pack_for_gpu(ty, &bytes, rows, cols).unwrap();
        let cols = cols as usize;
        for (g, &v) in values.iter().enumerate() {
            let (row, col) = ((g / cols) as u64, g % cols);
            let at = |j: usize, per_row: usize| tiled_index(row, j as u64, per_row as u64) as usize;
            let low = (p.words[at(col / 8, cols / 8)] >> (4 * (col % 8))) & 15;
            let high = 32usize.checked_div(h).map_or(0, |per_word| {
                let word = at(col / per_word, cols / per_word);
                (p.words[p.plane_offset as usize + word] >> (h * (col % per_word))) & ((1 << h) - 1)
            });
            let q = (low | (high << 4)) as f32;
            assert_eq!(q - offset, v, "{ty} weight {g}");
        }
    }
}

/// Word j of row r of a tiled section is at ((r / 32) * per_row + j) * 32 + r % 32: the
/// same word of 32 consecutive rows is contiguous, and rows past the last are zero.
#[test]
fn quant_sections_interleave_rows_in_tiles() {
    // 33 rows of one Q4_0 block each: 4 words a row, word j of row r = 1000 r + j + 1.
    let mut bytes = Vec::new();
    for r in 0..33u32 {
        bytes.extend([0u8, 0x3C]);
        for j in 0..4u32 {
            bytes.extend((1000 * r + j + 1).to_le_bytes());
        }
    }
    let p = pack_for_gpu(GgmlType::Q4_0, &bytes, 33, 32).unwrap();
    assert_eq!(p.plane_offset, 64 * 4, "two tiles of 32 rows x 4 words");
    for j in 0..4u32 {
        for r in 0..32u32 {
            assert_eq!(p.words[(j * 32 + r) as usize], 1000 * r + j + 1);
        }
        assert_eq!(p.words[(128 + j * 32) as usize], 1000 * 32 + j + 1);
        assert!(p.words[(128 + j * 32 + 1) as usize..(128 + j * 32 + 32) as usize].iter().all(|&w| w == 0));
    }
    assert_eq!(unpack_from_gpu(GgmlType::Q4_0, &p, 33, 32).unwrap(), bytes);
}

#[test]
fn scale_sections_are_as_documented() {
    // Q6_K, three super-blocks: [d0 | d1 << 16, scales 0, scales 1], [d2, scales 2].
    let mut bytes = vec![0u8; 3 * q6_k::BLOCK_BYTES];
    for (b, block) in bytes.chunks_exact_mut(q6_k::BLOCK_BYTES).enumerate() {
        let b = b as u8;
        block[q6_k::OFFSET_D..].copy_from_slice(&[0x10 + b, 0xA0 + b]);
        for (i, s) in block[q6_k::OFFSET_SCALES..q6_k::OFFSET_D].iter_mut().enumerate() {
            *s = 16 * b + i as u8;
        }
    }
    // One row of 96 quant and 48 plane words, padded to a tile of 32 rows.
    let p = pack_for_gpu(GgmlType::Q6_K, &bytes, 1, 768).unwrap();
    assert_eq!((p.plane_offset, p.scale_offset), (32 * 96, 32 * (96 + 48)));
    let scales = &p.words[p.scale_offset as usize..];
    assert_eq!(scales.len(), 9 + 5);
    assert_eq!(scales[0], 0xA010 | (0xA111 << 16));
    assert_eq!(scales[1], u32::from_le_bytes([0, 1, 2, 3]));
    assert_eq!(scales[5], u32::from_le_bytes([16, 17, 18, 19]));
    assert_eq!(scales[9], 0xA212);
    assert_eq!(scales[13], u32::from_le_bytes([44, 45, 46, 47]));

    // Q4_K: bytes 0..16 of the block as 4 words; no plane section.
    let mut block = vec![0u8; q4_k::BLOCK_BYTES];
    block[..16].copy_from_slice(&core::array::from_fn::<u8, 16, _>(|i| i as u8 + 1));
    let p = pack_for_gpu(GgmlType::Q4_K, &block, 1, 256).unwrap();
    assert_eq!((p.plane_offset, p.scale_offset, p.words.len()), (32 * 32, 32 * 32, 32 * 32 + 4));
    assert_eq!(p.words[32 * 32], 0x0403_0201);
    assert_eq!(p.words[32 * 32 + 3], 0x100F_0E0D);

    // Q5_0: qh is the block's plane word as it is; d pairs up like Q4_0's.
    let block = [0x01, 0x3C, 0x78, 0x56, 0x34, 0x12].into_iter().chain([0; 16]).collect::<Vec<u8>>();
    let p = pack_for_gpu(GgmlType::Q5_0, &block, 1, 32).unwrap();
    assert_eq!((p.plane_offset, p.scale_offset), (32 * 4, 32 * 5));
    assert_eq!(p.words.len(), 32 * 5 + 1);
    assert_eq!((p.words[32 * 4], p.words[32 * 5]), (0x1234_5678, 0x3C01));
    assert!(p.words[32 * 4 + 1..32 * 5].iter().all(|&w| w == 0), "padding rows");
}

#[test]
fn rejects_rows_of_partial_blocks() {
    let err = gpu_sections(GgmlType::Q4_K, 2, 576).unwrap_err().to_string();
    assert!(err.contains("multiple of 256"), "{err}");
    let err = gpu_sections(GgmlType::Q5_0, 2, 48).unwrap_err().to_string();
    assert!(err.contains("multiple of 32"), "{err}");
    assert!(gpu_sections(GgmlType::Q6_K, 2, 1536).is_ok());
    assert!(matches!(gpu_sections(GgmlType::Q2_K, 1, 256), Err(GgufError::UnsupportedType { .. })));
}

#[test]
fn gpu_pack_round_trips_random_blocks() {
    let mut rng = StdRng::seed_from_u64(4);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
        for (rows, cols) in [(1, 32), (3, 32), (5, 96), (2, 64), (7, 160)] {
            // Random bytes: scales get arbitrary f16 bit patterns, NaN and infinity included.
            let n = ty.row_bytes(cols).unwrap() * rows;
            let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            let packed = pack_for_gpu(ty, &bytes, rows, cols).unwrap();
            assert_eq!(unpack_from_gpu(ty, &packed, rows, cols).unwrap(), bytes, "{ty} {rows}x{cols}");
        }
    }
}

#[test]
fn gpu_layout_is_as_documented() {
    // One row is padded to a tile of 32 rows: quant word j of row 0 is word 32 j.
    let tile = ROW_TILE as usize;
    // Three Q8_0 blocks: 24 quant words, then 2 scale words, the last one's high half zero.
    let mut bytes = Vec::new();
    for b in 0..3u8 {
        bytes.extend([0x11 * (b + 1), 0xA0 + b]); // d
        bytes.extend((0..32).map(|j| j + 32 * b)); // qs
    }
    let p = pack_for_gpu(GgmlType::Q8_0, &bytes, 1, 96).unwrap();
    assert_eq!(p.scale_offset as usize, 24 * tile);
    assert_eq!(p.words.len(), 24 * tile + 2);
    assert_eq!(p.words[0], u32::from_le_bytes([0, 1, 2, 3]));
    assert_eq!(p.words[8 * tile], u32::from_le_bytes([32, 33, 34, 35]));
    assert!(p.words[1..tile].iter().all(|&w| w == 0), "padding rows are zero");
    assert_eq!(p.words[24 * tile], 0xA011 | (0xA122 << 16));
    assert_eq!(p.words[24 * tile + 1], 0xA233);

    // One Q4_1 block: 4 quant words, then d | m << 16.
    let mut block = vec![0x34, 0x12, 0x78, 0x56];
    block.extend(0..16u8);
    let p = pack_for_gpu(GgmlType::Q4_1, &block, 1, 32).unwrap();
    let quants: Vec<u32> = (0..4).map(|j| p.words[j * tile]).collect();
    assert_eq!(quants, [0x0302_0100, 0x0706_0504, 0x0B0A_0908, 0x0F0E_0D0C]);
    assert_eq!((p.scale_offset as usize, p.words[4 * tile]), (4 * tile, 0x5678_1234));

    // Q4_0 scales pair up like Q8_0's.
    let p = pack_for_gpu(GgmlType::Q4_0, &[[0x01, 0x3C].as_slice(), &[0u8; 16]].concat(), 1, 32).unwrap();
    assert_eq!((p.words.len(), p.scale_offset as usize, p.words[4 * tile]), (4 * tile + 1, 4 * tile, 0x3C01));

    // F16: element 2i low, 2i + 1 high; odd row length rejected.
    let p = pack_for_gpu(GgmlType::F16, &[0x01, 0x3C, 0x00, 0x40], 1, 2).unwrap();
    assert_eq!((p.words[0], p.words.len(), p.scale_offset as usize), (0x4000_3C01, tile, tile));
    assert!(matches!(pack_for_gpu(GgmlType::F16, &[0; 6], 1, 3), Err(GgufError::SizeMismatch { .. })));
    assert!(matches!(pack_for_gpu(GgmlType::Q4_1, &[0; 20], 1, 16), Err(GgufError::SizeMismatch { .. })));
    assert!(matches!(pack_for_gpu(GgmlType::Q4_1, &[0; 19], 1, 32), Err(GgufError::SizeMismatch { .. })));
    assert!(matches!(pack_for_gpu(GgmlType::IQ2_XXS, &[0; 66], 1, 256), Err(GgufError::UnsupportedType { .. })));
}
