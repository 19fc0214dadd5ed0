//! The integer and f32 dot products (`dot::int_products`, `dot::f32_products`) in wasm's
//! simd128.

use core::arch::wasm32::*;

use kestrel_ops::F32_LANES;

use crate::activations::QuantizedRows;
use crate::rows::{ActRow, IntRow, IntRows, Levels};
use crate::ACT_BLOCK;

/// Activation rows a tile computes: each weight block is widened once for all of them (four
/// sums and a block's weights stay in registers on x86's 16 and ARM's 32).
const TOKENS: usize = 4;

/// The first 16 bytes of `values`.
fn load<T>(values: &[T]) -> v128 {
    assert!(std::mem::size_of_val(values) >= 16, "simd128 load past a slice");
    // SAFETY: at least 16 readable bytes (checked); wasm's loads need no alignment.
    unsafe { v128_load(values.as_ptr().cast()) }
}

/// `int_products` in tiles of one weight row times up to `TOKENS` activation rows. The
/// activations are widened to i16 once per call rather than once per weight row, and each
/// weight block once per tile, so the products are `i32x4_dot_i16x8` of ready operands.
pub(crate) fn products(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32]) {
    let (cols, n) = (w.cols, x.rows(w.cols));
    let wide: Vec<i16> = x.q.iter().map(|&q| i16::from(q)).collect();
    let acts: Vec<(ActRow<'_>, &[i16])> = (0..n).map(|t| (x.row(t, cols), &wide[t * cols..][..cols])).collect();
    let mut bufs = [Vec::new(), Vec::new()];
    for (r, ys) in out.chunks_exact_mut(n).enumerate().take(w.rows()) {
        let row = w.row(r, &mut bufs);
        for (ys, acts) in ys.chunks_mut(TOKENS).zip(acts.chunks(TOKENS)) {
            match ys.len() {
                4 => ys.copy_from_slice(&tile::<4>(row, acts)),
                3 => ys.copy_from_slice(&tile::<3>(row, acts)),
                2 => ys.copy_from_slice(&tile::<2>(row, acts)),
                _ => ys.copy_from_slice(&tile::<1>(row, acts)),
            }
        }
    }
}

/// Weight row `w` times the first `T` of `acts` (each an activation row and its levels as i16).
#[inline]
fn tile<const T: usize>(w: IntRow<'_>, acts: &[(ActRow<'_>, &[i16])]) -> [f32; T] {
    let acts: [(ActRow<'_>, &[i16]); T] = std::array::from_fn(|j| acts[j]);
    let mut acc = [f32x4_splat(0.0); T];
    for b in 0..acts[0].1.len() / ACT_BLOCK {
        let levels = widened_block(w.levels, b);
        for (acc, (act, wide)) in acc.iter_mut().zip(&acts) {
            let xs = &wide[b * ACT_BLOCK..][..ACT_BLOCK];
            let dot = |i: usize| i32x4_dot_i16x8(levels[i], load(&xs[8 * i..]));
            let (lo, hi) = (i32x4_add(dot(0), dot(1)), i32x4_add(dot(2), dot(3)));
            let d = act.d[b];
            *acc = if w.group == ACT_BLOCK {
                f32x4_add(*acc, f32x4_mul(f32x4_convert_i32x4(i32x4_add(lo, hi)), f32x4_splat(w.scale[b] * d)))
            } else {
                let (s0, s1) = (w.scale[2 * b] * d, w.scale[2 * b + 1] * d);
                let scaled =
                    f32x4_add(f32x4_mul(f32x4_convert_i32x4(lo), f32x4_splat(s0)), f32x4_mul(f32x4_convert_i32x4(hi), f32x4_splat(s1)));
                f32x4_add(*acc, scaled)
            };
        }
    }
    // The offsets term in f32 lanes too: a scalar loop is about a tenth of a tile's operations
    // at 576 weights a row.
    std::array::from_fn(|j| horizontal_sum(acc[j]) + w.offset.map_or(0.0, |o| f32_dot(o, acts[j].0.group_sums(w.group))))
}

/// Block b's 32 levels as four i16x8 vectors.
fn widened_block(levels: Levels<'_>, b: usize) -> [v128; 4] {
    let (lo, hi) = match levels {
        Levels::Nibbles(n) => {
            let raw = load(&n[b * ACT_BLOCK / 2..]);
            (v128_and(raw, u8x16_splat(0x0F)), u8x16_shr(raw, 4))
        }
        Levels::Bytes(q) => (load(&q[b * ACT_BLOCK..]), load(&q[b * ACT_BLOCK + 16..])),
    };
    [i16x8_extend_low_i8x16(lo), i16x8_extend_high_i8x16(lo), i16x8_extend_low_i8x16(hi), i16x8_extend_high_i8x16(hi)]
}

pub(crate) fn f32_dot(a: &[f32], b: &[f32]) -> f32 {
    let (mut acc0, mut acc1) = (f32x4_splat(0.0), f32x4_splat(0.0));
    let (a_body, b_body) = (a.chunks_exact(F32_LANES), b.chunks_exact(F32_LANES));
    let tail: f32 = a_body.remainder().iter().zip(b_body.remainder()).map(|(x, y)| x * y).sum();
    for (a8, b8) in a_body.zip(b_body) {
        acc0 = f32x4_add(acc0, f32x4_mul(load(&a8[..4]), load(&b8[..4])));
        acc1 = f32x4_add(acc1, f32x4_mul(load(&a8[4..]), load(&b8[4..])));
    }
    horizontal_sum(f32x4_add(acc0, acc1)) + tail
}

fn horizontal_sum(v: v128) -> f32 {
    f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<1>(v) + f32x4_extract_lane::<2>(v) + f32x4_extract_lane::<3>(v)
}
