//! Dot products of one weight row with one activation row: 8-bit levels times integer weights
//! with a scale per 16 (plus the offsets times the activations' group sums), and f32 times f32.
//! The instruction set is chosen once per process: AVX2 with FMA where the CPU has them, else
//! portable code (which the compiler vectorizes as far as it can; wasm builds with simd128).

use std::sync::OnceLock;

use kestrel_gguf::quant::INT_GROUP;

use crate::activations::QuantizedRows;
use crate::ACT_BLOCK;

/// A weight row as `Matrix` keeps it: one level per weight, a scale (and an offset) per 16.
#[derive(Clone, Copy)]
pub(crate) struct IntRow<'a> {
    pub q: &'a [i8],
    pub scale: &'a [f32],
    pub min: Option<&'a [f32]>,
}

/// One activation row of `QuantizedRows`.
#[derive(Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub q: &'a [i8],
    pub d: &'a [f32],
    pub group_sums: &'a [f32],
}

impl QuantizedRows {
    pub(crate) fn row(&self, t: usize, cols: usize) -> ActRow<'_> {
        ActRow {
            q: &self.q[t * cols..][..cols],
            d: &self.d[t * cols / ACT_BLOCK..][..cols / ACT_BLOCK],
            group_sums: &self.group_sums[t * cols / INT_GROUP..][..cols / INT_GROUP],
        }
    }
}

struct Kernels {
    name: &'static str,
    int: fn(IntRow<'_>, ActRow<'_>) -> f32,
    f32: fn(&[f32], &[f32]) -> f32,
}

fn kernels() -> &'static Kernels {
    static CHOSEN: OnceLock<Kernels> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return Kernels { name: "avx2", int: avx2::int_dot_checked, f32: avx2::f32_dot_checked };
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        return Kernels { name: "simd128", int: simd128::int_dot, f32: simd128::f32_dot };
        #[allow(unreachable_code)]
        Kernels { name: "portable", int: int_dot_portable, f32: f32_dot_portable }
    })
}

pub(crate) fn simd_name() -> &'static str {
    kernels().name
}

/// `Σ_e w[e]·x[e]` with `w[e] = scale[e/16]·q[e] + min[e/16]` and `x[e] ≈ d[e/32]·qx[e]`.
pub(crate) fn int_dot(w: IntRow<'_>, x: ActRow<'_>) -> f32 {
    (kernels().int)(w, x)
}

pub(crate) fn f32_dot(a: &[f32], b: &[f32]) -> f32 {
    (kernels().f32)(a, b)
}

fn offsets_dot(w: IntRow<'_>, x: ActRow<'_>) -> f32 {
    w.min.map_or(0.0, |m| f32_dot(m, x.group_sums))
}

fn int_dot_portable(w: IntRow<'_>, x: ActRow<'_>) -> f32 {
    let mut sum = 0f32;
    let blocks = w.q.chunks_exact(ACT_BLOCK).zip(x.q.chunks_exact(ACT_BLOCK)).zip(w.scale.chunks_exact(2)).zip(x.d);
    for (((wq, xq), s), &d) in blocks {
        let (lo, hi) = (group_sum(&wq[..INT_GROUP], &xq[..INT_GROUP]), group_sum(&wq[INT_GROUP..], &xq[INT_GROUP..]));
        sum += d * (s[0] * lo as f32 + s[1] * hi as f32);
    }
    sum + offsets_dot(w, x)
}

fn group_sum(w: &[i8], x: &[i8]) -> i32 {
    w.iter().zip(x).map(|(&a, &b)| i32::from(a) * i32::from(b)).sum()
}

/// Lanes of partial sums: independent chains the compiler can keep in SIMD registers.
const F32_LANES: usize = 8;

fn f32_dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; F32_LANES];
    let (a_body, b_body) = (a.chunks_exact(F32_LANES), b.chunks_exact(F32_LANES));
    let tail: f32 = a_body.remainder().iter().zip(b_body.remainder()).map(|(x, y)| x * y).sum();
    for (a8, b8) in a_body.zip(b_body) {
        for ((lane, x), y) in lanes.iter_mut().zip(a8).zip(b8) {
            *lane += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{offsets_dot, ActRow, IntRow, F32_LANES};
    use crate::ACT_BLOCK;

    // Only chosen by `kernels()` after the CPU reported AVX2 and FMA; the slices' lengths are
    // checked here, so the unchecked loads below stay inside them.
    pub(super) fn int_dot_checked(w: IntRow<'_>, x: ActRow<'_>) -> f32 {
        let blocks = w.q.len() / ACT_BLOCK;
        assert!(x.q.len() == w.q.len() && w.scale.len() >= 2 * blocks && x.d.len() >= blocks, "int_dot: row lengths differ");
        // SAFETY: AVX2 and FMA are present (see above), and every load reads within the
        // slices whose lengths were just checked.
        unsafe { int_dot(w, x, blocks) + offsets_dot(w, x) }
    }

    pub(super) fn f32_dot_checked(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "f32_dot: lengths differ");
        // SAFETY: as above.
        unsafe { f32_dot(a, b) }
    }

    /// Per block of 32: `maddubs` multiplies |w| (unsigned) by x with w's sign (signed) into
    /// pairs of i16 (at most 2·128·127, no saturation), `madd` by ones into 8 i32 lanes, lanes
    /// 0-3 the first 16 weights and 4-7 the second, each scaled by its group's scale times the
    /// block's activation scale.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn int_dot(w: IntRow<'_>, x: ActRow<'_>, blocks: usize) -> f32 {
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        for b in 0..blocks {
            let wq = _mm256_loadu_si256(w.q.as_ptr().add(b * ACT_BLOCK).cast());
            let xq = _mm256_loadu_si256(x.q.as_ptr().add(b * ACT_BLOCK).cast());
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
            let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            let d = *x.d.get_unchecked(b);
            let (s0, s1) = (*w.scale.get_unchecked(2 * b) * d, *w.scale.get_unchecked(2 * b + 1) * d);
            acc = _mm256_fmadd_ps(sums, _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0)), acc);
        }
        horizontal_sum(acc)
    }

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

    #[target_feature(enable = "avx2,fma")]
    unsafe fn horizontal_sum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }
}

/// wasm's 128-bit SIMD, which a wasm build compiled with `+simd128` always has (every browser
/// with WebGPU runs it).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128 {
    use core::arch::wasm32::*;

    use super::{offsets_dot, ActRow, IntRow, F32_LANES};
    use crate::ACT_BLOCK;

    /// The first 16 bytes of `bytes`, or 4 f32s.
    fn load<T>(values: &[T]) -> v128 {
        assert!(std::mem::size_of_val(values) >= 16, "simd128 load past a slice");
        // SAFETY: at least 16 readable bytes (checked); wasm's loads need no alignment.
        unsafe { v128_load(values.as_ptr().cast()) }
    }

    /// The 16 products of a group, summed pairwise into 4 i32 lanes (`i32x4_dot_i16x8` of the
    /// levels widened to i16).
    fn group(w: &[i8], x: &[i8]) -> v128 {
        let (w, x) = (load(w), load(x));
        i32x4_add(
            i32x4_dot_i16x8(i16x8_extend_low_i8x16(w), i16x8_extend_low_i8x16(x)),
            i32x4_dot_i16x8(i16x8_extend_high_i8x16(w), i16x8_extend_high_i8x16(x)),
        )
    }

    pub(super) fn int_dot(w: IntRow<'_>, x: ActRow<'_>) -> f32 {
        let mut acc = f32x4_splat(0.0);
        let blocks = w.q.chunks_exact(ACT_BLOCK).zip(x.q.chunks_exact(ACT_BLOCK)).zip(w.scale.chunks_exact(2)).zip(x.d);
        for (((wq, xq), s), &d) in blocks {
            let lo = f32x4_convert_i32x4(group(&wq[..16], &xq[..16]));
            let hi = f32x4_convert_i32x4(group(&wq[16..], &xq[16..]));
            acc = f32x4_add(acc, f32x4_add(f32x4_mul(lo, f32x4_splat(s[0] * d)), f32x4_mul(hi, f32x4_splat(s[1] * d))));
        }
        horizontal_sum(acc) + offsets_dot(w, x)
    }

    pub(super) fn f32_dot(a: &[f32], b: &[f32]) -> f32 {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activations::{ActFormat, QuantizedRows};

    /// Whichever kernel the machine chose gives the portable code's sums (up to the order of
    /// the f32 additions), with and without offsets.
    #[test]
    fn chosen_kernels_agree_with_the_portable_ones() {
        let cols = 1024;
        let wq: Vec<i8> = (0..cols).map(|i| ((i * 37 % 255) as i32 - 128) as i8).collect();
        let scale: Vec<f32> = (0..cols / INT_GROUP).map(|g| 0.01 + g as f32 * 1e-3).collect();
        let min: Vec<f32> = (0..cols / INT_GROUP).map(|g| -0.02 * g as f32).collect();
        let x: Vec<f32> = (0..cols).map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0).collect();
        for format in [ActFormat::Q8_0, ActFormat::Q8K] {
            let xq = QuantizedRows::new(&x, format);
            for min in [None, Some(min.as_slice())] {
                let w = IntRow { q: &wq, scale: &scale, min };
                let (got, want) = (int_dot(w, xq.row(0, cols)), int_dot_portable(w, xq.row(0, cols)));
                assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{} {format:?}: {got} vs {want}", simd_name());
            }
        }
        let (got, want) = (f32_dot(&x, &scale.repeat(16)), f32_dot_portable(&x, &scale.repeat(16)));
        assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0));
    }
}
