//! The interleaved products of both layouts against the row-by-row kernels on the same weights,
//! and each instruction set of their SIMD tiles against their portable code.

use super::bytes::{deinterleave_levels as deinterleave_bytes, level_index, put_six_bit_block, ByteGroupRows, WovenLevels};
use super::nibbles::{deinterleave_levels as deinterleave_nibbles, interleave_levels, GroupRows};
use super::*;
use crate::activations::{ActFormat, QuantizedRows, Q8K_BLOCK};
use crate::dot::int_products;
use crate::factored::{test_factors, UnitLayout};
use crate::rows::{IntRows, Levels, Scales};
use crate::ACT_BLOCK;

/// The interleaved products give the row-by-row kernels' sums for the same weights (up to
/// the order of the f32 additions), with f32 and f16 scales, with and without offsets, for
/// tiles of every width (1 to 8 tokens) and a run of whole tiles with a remainder; the SIMD
/// code gives the portable code's.
#[test]
fn interleaved_products_are_the_row_layouts() {
    let (rows, cols) = (24, 256);
    let blocks = cols / ACT_BLOCK;
    let nibbles: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 53 % 251) as u8).collect();
    let woven = interleave_levels(&nibbles, rows, cols);
    assert_eq!(deinterleave_nibbles(&woven, rows, cols), nibbles);
    // Exact in f16, so both storages give the same sums.
    let scale: Vec<f32> = (0..rows * blocks).map(|g| (1 + g % 11) as f32 / 256.0).collect();
    let offset: Vec<f32> = (0..rows * blocks).map(|g| -((g % 13) as f32) / 64.0).collect();
    let to_f16 = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect::<Vec<u16>>();
    let (scale_w, offset_w) = (interleave_values(&scale, rows, blocks, false), interleave_values(&offset, rows, blocks, false));
    assert_eq!(interleave_values(&scale_w, rows, blocks, true), scale);
    let (scale16, offset16, scale16_w, offset16_w) = (to_f16(&scale), to_f16(&offset), to_f16(&scale_w), to_f16(&offset_w));
    let x: Vec<f32> = (0..19 * cols).map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0 * (1 + i % 7) as f32).collect();
    let stores = [
        (Scales::F32(&scale), Scales::F32(&offset), Scales::F32(&scale_w), Scales::F32(&offset_w)),
        (Scales::F16(&scale16), Scales::F16(&offset16), Scales::F16(&scale16_w), Scales::F16(&offset16_w)),
    ];
    for (format, n) in [ActFormat::Q8_0, ActFormat::Q8K].into_iter().flat_map(|f| [1, 2, 3, 4, 5, 6, 7, 8, 19].map(|n| (f, n))) {
        let xq = QuantizedRows::new(&x[..n * cols], format);
        for (with_offset, (s, o, s_w, o_w)) in [false, true].into_iter().flat_map(|o| stores.map(|s| (o, s))) {
            let plain = IntRows { levels: Levels::Nibbles(&nibbles), group: ACT_BLOCK, scale: s, offset: with_offset.then_some(o), cols };
            let w = GroupRows { levels: &woven, scale: s_w, offset: with_offset.then_some(o_w), bias: 0.0, cols };
            check(w, plain, &xq, &format!("{format:?} n {n} offset {with_offset}"));
        }
        // Q4_0's bias, against the row layout's offsets of -8 · scale.
        for (s, s_w) in [(Scales::F32(&scale), Scales::F32(&scale_w)), (Scales::F16(&scale16), Scales::F16(&scale16_w))] {
            let minus8: Vec<f32> = (0..scale.len()).map(|i| -8.0 * s.get(i)).collect();
            let plain = IntRows { levels: Levels::Nibbles(&nibbles), group: ACT_BLOCK, scale: s, offset: Some(Scales::F32(&minus8)), cols };
            let w = GroupRows { levels: &woven, scale: s_w, offset: None, bias: 8.0, cols };
            check(w, plain, &xq, &format!("{format:?} n {n} bias 8"));
        }
        // K-quant scales and offsets kept factored (the i32 super-block tile with Q8_K
        // activations), integers over i8's whole range.
        let per_unit = Q8K_BLOCK / ACT_BLOCK;
        let (scale, units, k) = test_factors(rows, blocks, per_unit, 1);
        let (offset, offset_units, offset_k) = test_factors(rows, blocks, per_unit, 2);
        let layout = UnitLayout::new(per_unit, GROUP_ROWS);
        for with_offset in [false, true] {
            let plain = IntRows {
                levels: Levels::Nibbles(&nibbles),
                group: ACT_BLOCK,
                scale: Scales::F32(&scale),
                offset: with_offset.then_some(Scales::F32(&offset)),
                cols,
            };
            let o_w = with_offset.then_some(Scales::Factored { units: &offset_units, k: &offset_k, layout });
            let w = GroupRows { levels: &woven, scale: Scales::Factored { units: &units, k: &k, layout }, offset: o_w, bias: 0.0, cols };
            check(w, plain, &xq, &format!("factored {format:?} n {n} offset {with_offset}"));
        }
    }
}

/// The interleaved byte products give the row kernels' sums for the same weights (up to the
/// order of the f32 additions), with byte and 6-bit levels, with scales per 32 and per 16,
/// f32 and f16, with and without offsets, for one token, a whole tile and a tile's remainder,
/// on a pair of groups and on a lone one (the AVX512-VNNI tiles of whole scales take two at
/// once, and a lone group alone).
#[test]
fn interleaved_byte_products_are_the_row_layouts() {
    for rows in [16, 8] {
        check_byte_rows(rows, 256);
    }
}

/// `interleaved_byte_products_are_the_row_layouts` for `rows` rows of `cols` weights.
fn check_byte_rows(rows: usize, cols: usize) {
    let blocks = cols / ACT_BLOCK;
    let byte_levels: Vec<i8> = (0..rows * cols).map(|i| ((i * 37 % 255) as i32 - 127) as i8).collect();
    let mut woven = vec![0i8; rows * cols];
    // Every 6-bit level (-32..31), in no simple order.
    let six_bit_levels: Vec<i8> = (0..rows * cols).map(|i| ((i * 37 % 64) as i32 - 32) as i8).collect();
    let mut six_bits = vec![0u8; rows * cols * 3 / 4];
    for r in 0..rows {
        for b in 0..blocks {
            let at = (r * blocks + b) * ACT_BLOCK;
            for e in 0..ACT_BLOCK {
                woven[level_index(r, b, e, blocks)] = byte_levels[at + e];
            }
            put_six_bit_block(&mut six_bits, r, b, blocks, &six_bit_levels[at..at + ACT_BLOCK]);
        }
    }
    let kinds = [("bytes", &byte_levels, WovenLevels::Bytes(&woven)), ("6-bit", &six_bit_levels, WovenLevels::SixBits(&six_bits))];
    for (kind, plain_levels, levels) in kinds {
        assert_eq!(&deinterleave_bytes(levels, rows, cols), plain_levels, "{kind}");
        check_layout(&format!("{kind} rows {rows}"), plain_levels, levels, rows, cols);
    }
}

/// `interleaved_byte_products_are_the_row_layouts` for one kind of levels.
fn check_layout(kind: &str, plain_levels: &[i8], woven: WovenLevels<'_>, rows: usize, cols: usize) {
    // Every token count up to 8 (the AVX2 tiles take up to 4, the factored AVX512-VNNI ones
    // 8), and several tiles with a short last one (19).
    let counts = [1, 2, 3, 4, 5, 6, 7, 8, 19];
    let x: Vec<f32> = (0..19 * cols).map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0 * (1 + i % 7) as f32).collect();
    for group in [32, 16] {
        let groups = cols / group;
        // Exact in f16, so both storages give the same sums.
        let scale: Vec<f32> = (0..rows * groups).map(|g| (1 + g % 11) as f32 / 256.0).collect();
        let offset: Vec<f32> = (0..rows * groups).map(|g| -((g % 13) as f32) / 64.0).collect();
        let (scale_w, offset_w) = (interleave_values(&scale, rows, groups, false), interleave_values(&offset, rows, groups, false));
        let to_f16 = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect::<Vec<u16>>();
        let (scale16, scale16_w) = (to_f16(&scale), to_f16(&scale_w));
        for (format, n) in [ActFormat::Q8_0, ActFormat::Q8K].into_iter().flat_map(|f| counts.map(|n| (f, n))) {
            let xq = QuantizedRows::new(&x[..n * cols], format);
            let offsets = if group == ACT_BLOCK { vec![false, true] } else { vec![false] };
            for with_offset in offsets {
                for (s, s_w) in [(Scales::F32(&scale), Scales::F32(&scale_w)), (Scales::F16(&scale16), Scales::F16(&scale16_w))] {
                    let (o, o_w) = (with_offset.then_some(Scales::F32(&offset)), with_offset.then_some(Scales::F32(&offset_w)));
                    let plain = IntRows { levels: Levels::Bytes(plain_levels), group, scale: s, offset: o, cols };
                    let w = ByteGroupRows { levels: woven, group, scale: s_w, offset: o_w, cols };
                    check(w, plain, &xq, &format!("{kind} group {group} {format:?} n {n} offset {with_offset}"));
                }
                // K-quant scales and offsets kept factored (the i32 super-block tiles with
                // Q8_K activations), integers over i8's whole range.
                let per_unit = Q8K_BLOCK / group;
                let (scale, units, k) = test_factors(rows, groups, per_unit, 1);
                let (offset, offset_units, offset_k) = test_factors(rows, groups, per_unit, 2);
                let layout = UnitLayout::new(per_unit, GROUP_ROWS);
                let s_w = Scales::Factored { units: &units, k: &k, layout };
                let o_w = with_offset.then_some(Scales::Factored { units: &offset_units, k: &offset_k, layout });
                let plain = IntRows {
                    levels: Levels::Bytes(plain_levels),
                    group,
                    scale: Scales::F32(&scale),
                    offset: with_offset.then_some(Scales::F32(&offset)),
                    cols,
                };
                let w = ByteGroupRows { levels: woven, group, scale: s_w, offset: o_w, cols };
                check(w, plain, &xq, &format!("{kind} factored group {group} {format:?} n {n} offset {with_offset}"));
            }
        }
    }
}

/// The products `products` chooses for `w` and its portable ones give the row kernels' of
/// `plain` (the same weights), and so does each instruction set this machine has of the tiles
/// `products` takes for `w` (factored, or of whole scales): up to the order of the f32
/// additions.
fn check<W: WovenRows>(w: W, plain: IntRows<'_>, xq: &QuantizedRows, what: &str) {
    let (rows, n) = (w.rows(), xq.rows(w.cols()));
    let run = |f: &dyn Fn(&mut [f32])| {
        let mut out = vec![0f32; rows * n];
        f(&mut out);
        out
    };
    let close = |got: &[f32], reference: &[f32], which: &str| {
        for (i, (g, r)) in got.iter().zip(reference).enumerate() {
            assert!((g - r).abs() <= 1e-4 * r.abs().max(1.0), "{what} {which} [{i}]: {g} vs {r}");
        }
    };
    let (want, portable) = (run(&|out| int_products(plain, xq, out)), run(&|out| w.products_portable(xq, out, rows, n)));
    close(&run(&|out| products(w, xq, out)), &want, "chosen");
    close(&portable, &want, "portable");
    #[cfg(target_arch = "x86_64")]
    {
        let sets = [(has_simd(), false), (has_simd() && x86::has_avx512_vnni(), true)];
        for (_, vnni) in sets.into_iter().filter(|&(present, _)| present) {
            // SAFETY: only the instruction sets present, on the shapes `products` checked.
            let (tiles, which) = match w.factored(xq) {
                Some(factored) => (run(&|out| unsafe { W::factored_products(factored, xq, out, rows, n, vnni) }), "factored"),
                None => (run(&|out| unsafe { w.whole_products(xq, out, rows, n, vnni) }), "whole scales"),
            };
            close(&tiles, &want, &format!("{which}, vnni {vnni}"));
        }
    }
}
