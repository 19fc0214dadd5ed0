//! The f32 products of F16 and F32 matrices (`dot::f32_products`) in AVX2 with FMA: tiles of two
//! weight rows times two tokens whose results have the bits of one dot product at a time.

use std::arch::x86_64::*;

use kestrel_ops::F32_LANES;

use super::horizontal_sum;

/// Tokens a block of `f32_products_checked` takes: their rows (a few tens of KiB) stay in the
/// cache while every weight row of the task passes over them.
const TOKEN_BLOCK: usize = 32;

/// `dot::f32_products` (whose asserts checked the shapes) by tiles of two weight rows and
/// two tokens (`f32_tile`, each of its four results the bits `f32_dot` gives), over blocks of
/// `TOKEN_BLOCK` tokens; the rows and tokens left over one dot product at a time.
pub(crate) fn f32_products_checked(w: &[f32], x: &[f32], cols: usize, out: &mut [f32]) {
    let (rows, n) = (w.len() / cols, x.len() / cols);
    let w_row = |r: usize| &w[r * cols..][..cols];
    let x_row = |t: usize| &x[t * cols..][..cols];
    for t0 in (0..n).step_by(TOKEN_BLOCK) {
        let t_end = (t0 + TOKEN_BLOCK).min(n);
        for r in (0..rows).step_by(2) {
            let pair = r + 1 < rows;
            let mut t = t0;
            while pair && t + 1 < t_end {
                let [[a, b], [c, d]] = f32_tile_checked(w_row(r), w_row(r + 1), x_row(t), x_row(t + 1));
                out[r * n + t] = a;
                out[r * n + t + 1] = b;
                out[(r + 1) * n + t] = c;
                out[(r + 1) * n + t + 1] = d;
                t += 2;
            }
            for t in t..t_end {
                out[r * n + t] = f32_dot_checked(w_row(r), x_row(t));
                if pair {
                    out[(r + 1) * n + t] = f32_dot_checked(w_row(r + 1), x_row(t));
                }
            }
        }
    }
}

fn f32_tile_checked(w0: &[f32], w1: &[f32], x0: &[f32], x1: &[f32]) -> [[f32; 2]; 2] {
    assert!(w1.len() == w0.len() && x0.len() == w0.len() && x1.len() == w0.len(), "f32_tile: lengths differ");
    // SAFETY: available() offers these kernels only where AVX2 and FMA were detected; the
    // rows have one length, and every load is within it.
    unsafe { f32_tile(w0, w1, x0, x1) }
}

fn f32_dot_checked(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "f32_dot: lengths differ");
    // SAFETY: as above.
    unsafe { f32_dot(a, b) }
}

/// `[[w0·x0, w0·x1], [w1·x0, w1·x1]]`, each as `f32_dot` computes it: four dot products,
/// each with `f32_dot`'s two accumulators and order of operations (so the same bits), eight
/// chains of FMAs in flight where one dot product has two.
#[target_feature(enable = "avx2,fma")]
unsafe fn f32_tile(w0: &[f32], w1: &[f32], x0: &[f32], x1: &[f32]) -> [[f32; 2]; 2] {
    let body = w0.len() / (2 * F32_LANES) * (2 * F32_LANES);
    let mut acc = [[[_mm256_setzero_ps(); 2]; 2]; 2];
    let mut i = 0;
    while i < body {
        let xs = [x0, x1].map(|x| [_mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(x.as_ptr().add(i + 8))]);
        for (acc_r, w) in acc.iter_mut().zip([w0, w1]) {
            let wv = [_mm256_loadu_ps(w.as_ptr().add(i)), _mm256_loadu_ps(w.as_ptr().add(i + 8))];
            for (a, xv) in acc_r.iter_mut().zip(&xs) {
                a[0] = _mm256_fmadd_ps(wv[0], xv[0], a[0]);
                a[1] = _mm256_fmadd_ps(wv[1], xv[1], a[1]);
            }
        }
        i += 2 * F32_LANES;
    }
    let finish = |a: [__m256; 2], w: &[f32], x: &[f32]| {
        let tail: f32 = w[body..].iter().zip(&x[body..]).map(|(x, y)| x * y).sum();
        horizontal_sum(_mm256_add_ps(a[0], a[1])) + tail
    };
    [[finish(acc[0][0], w0, x0), finish(acc[0][1], w0, x1)], [finish(acc[1][0], w1, x0), finish(acc[1][1], w1, x1)]]
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn f32_dot(a: &[f32], b: &[f32]) -> f32 {
    let body = a.len() / (2 * F32_LANES) * (2 * F32_LANES);
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i < body {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i + 8)), _mm256_loadu_ps(b.as_ptr().add(i + 8)), acc1);
        i += 2 * F32_LANES;
    }
    let tail: f32 = a[body..].iter().zip(&b[body..]).map(|(x, y)| x * y).sum();
    horizontal_sum(_mm256_add_ps(acc0, acc1)) + tail
}
