//! The integer dot products of rows one after another (`dot::int_products`) in AVX2: tiles of
//! weight rows times activation rows, a block of 32 weights at a time, with AVX-VNNI's `dpbusd`
//! where the CPU has it.

use std::arch::x86_64::*;

use super::{prefetch_ahead, scales::eight_scales};
use crate::activations::QuantizedRows;
use crate::rows::{ActRow, IntRows, Levels, Scales};
use crate::ACT_BLOCK;

// Only chosen by `dot::kernels()` after the CPU reported AVX2, FMA and F16C (and AVX-VNNI for the
// second); the slices' lengths are checked here, so the unchecked loads below stay inside them.
pub(crate) fn int_products_checked(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32]) {
    let (rows, n) = checked_shapes(&w, x, out);
    // SAFETY: AVX2, FMA and F16C are present (see above); `IntRows::row_parts` and
    // `QuantizedRows::row` slice whole rows, and every load reads within a row's slices.
    unsafe { plain::products(w, x, out, rows, n) }
}

pub(crate) fn int_products_vnni_checked(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32]) {
    let (rows, n) = checked_shapes(&w, x, out);
    // SAFETY: as above, and AVX-VNNI is present.
    unsafe { vnni::products(w, x, out, rows, n) }
}

/// The rows of `w` and of `x`, after checking that the slices hold exactly them.
fn checked_shapes(w: &IntRows<'_>, x: &QuantizedRows, out: &[f32]) -> (usize, usize) {
    let (rows, n) = (w.rows(), x.rows(w.cols));
    let levels = match w.levels {
        Levels::Nibbles(n) => n.len() * 2,
        Levels::Bytes(q) => q.len(),
    };
    assert!(
        w.cols.is_multiple_of(ACT_BLOCK) && levels == rows * w.cols && out.len() == rows * n && x.d.len() * ACT_BLOCK == x.q.len(),
        "int_products: shapes differ"
    );
    (rows, n)
}

/// The tiled products, compiled once per instruction set (`$features`), with AVX-VNNI's
/// `dpbusd` where `$vnni`.
macro_rules! tiled_products {
    ($features:literal, $vnni:literal) => {
        use std::arch::x86_64::*;

        use super::{add_offsets, prefetch_row_ahead, weight_block, weight_scales, RowView, ROWS, TOKENS};
        use crate::activations::QuantizedRows;
        use crate::arch::x86::horizontal_sum;
        use crate::rows::{ActRow, IntRows, Levels};
        use crate::ACT_BLOCK;

        /// Tiles of up to `ROWS` weight rows times `TOKENS` activation rows: each weight block is
        /// expanded once for all the tile's tokens and each activation block loaded once for its
        /// rows, so a batch (prefill, or several sequences' decode steps) costs fewer instructions per
        /// product than one token at a time.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn products(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize) {
            let act_rows: Vec<ActRow<'_>> = (0..n).map(|t| x.row(t, w.cols)).collect();
            let mut r = 0;
            while r < rows {
                let tile_rows = (rows - r).min(ROWS);
                let row0 = RowView::of(&w, r);
                let row1 = if tile_rows == 2 { Some(RowView::of(&w, r + 1)) } else { None };
                let mut t = 0;
                while t < n {
                    let tile_tokens = (n - t).min(TOKENS);
                    // A tile of fewer tokens repeats its last row in the unused places.
                    let acts: [ActRow<'_>; TOKENS] = std::array::from_fn(|i| act_rows[t + i.min(tile_tokens - 1)]);
                    macro_rules! run {
                        ($nibbles:literal, $t:literal) => {
                            match row1 {
                                Some(row1) => store(tile::<$nibbles, 2, $t>([row0, row1], &acts, w.cols), out, r, t, n),
                                None => store(tile::<$nibbles, 1, $t>([row0], &acts, w.cols), out, r, t, n),
                            }
                        };
                    }
                    match (matches!(w.levels, Levels::Nibbles(_)), tile_tokens) {
                        (true, 4) => run!(true, 4),
                        (true, 3) => run!(true, 3),
                        (true, 2) => run!(true, 2),
                        (true, _) => run!(true, 1),
                        (false, 4) => run!(false, 4),
                        (false, 3) => run!(false, 3),
                        (false, 2) => run!(false, 2),
                        (false, _) => run!(false, 1),
                    }
                    t += tile_tokens;
                }
                r += tile_rows;
            }
        }

        /// A tile's sums into `out` (row-major by weight row, `n` tokens a row).
        #[inline]
        unsafe fn store<const R: usize, const T: usize>(sums: [[f32; T]; R], out: &mut [f32], r: usize, t: usize, n: usize) {
            for (i, row) in sums.iter().enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    *out.get_unchecked_mut((r + i) * n + t + j) = v;
                }
            }
        }

        /// `R` rows times `T` tokens over every block: per block, each row's levels expanded once,
        /// each token's activations loaded once; then the offsets.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn tile<const NIBBLES: bool, const R: usize, const T: usize>(
            rows: [RowView<'_>; R],
            acts: &[ActRow<'_>; TOKENS],
            cols: usize,
        ) -> [[f32; T]; R] {
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            for b in 0..cols / ACT_BLOCK {
                for row in &rows {
                    prefetch_row_ahead(row.levels, b);
                }
                let mut weights = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
                let mut scales = [_mm256_setzero_ps(); R];
                for i in 0..R {
                    weights[i] = weight_block::<NIBBLES>(rows[i].levels, b);
                    scales[i] = weight_scales(&rows[i], b);
                }
                for j in 0..T {
                    let xq = _mm256_loadu_si256(acts[j].q.as_ptr().add(b * ACT_BLOCK).cast());
                    let d = _mm256_set1_ps(*acts[j].d.get_unchecked(b));
                    for i in 0..R {
                        let (u, sign) = weights[i];
                        let x = if NIBBLES { xq } else { _mm256_sign_epi8(xq, sign) };
                        acc[i][j] = _mm256_fmadd_ps(pair_sums(u, x), _mm256_mul_ps(scales[i], d), acc[i][j]);
                    }
                }
            }
            let mut sums = add_offsets(&rows, acts, &mut acc);
            for i in 0..R {
                for j in 0..T {
                    sums[i][j] += horizontal_sum(acc[i][j]);
                }
            }
            sums
        }

        /// The 8 i32 sums of 4 adjacent `u · s` products (u unsigned, s signed): AVX-VNNI's
        /// `dpbusd`, or `maddubs` into i16 pairs (at most 2·255·127 apart from the levels used here,
        /// 2·15·127 or 2·128·127: no saturation) and `madd` of those. Exact either way.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn pair_sums(u: __m256i, s: __m256i) -> __m256 {
            let sums = if $vnni {
                _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
            } else {
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
            };
            _mm256_cvtepi32_ps(sums)
        }
    };
}

mod plain {
    tiled_products!("avx2,fma,f16c", false);
}

mod vnni {
    tiled_products!("avx2,fma,f16c,avxvnni", true);
}

/// Weight rows a tile computes.
const ROWS: usize = 2;
/// Activation rows a tile computes.
const TOKENS: usize = 4;

/// Asks for the cache line `PREFETCH_BYTES` past block b of a row's levels.
#[inline(always)]
fn prefetch_row_ahead(levels: Levels<'_>, b: usize) {
    let at = match levels {
        Levels::Nibbles(n) => n.as_ptr().wrapping_add(b * ACT_BLOCK / 2),
        Levels::Bytes(q) => q.as_ptr().cast::<u8>().wrapping_add(b * ACT_BLOCK),
    };
    prefetch_ahead(at, 64);
}

/// Block b of a row as unsigned levels for `maddubs`, and the signs to give the activations
/// (signed byte levels: |w|, and w whose sign moves to x; nibbles are unsigned already).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn weight_block<const NIBBLES: bool>(levels: Levels<'_>, b: usize) -> (__m256i, __m256i) {
    match levels {
        Levels::Nibbles(n) if NIBBLES => {
            let raw = _mm_loadu_si128(n.as_ptr().add(b * ACT_BLOCK / 2).cast());
            (_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F)), _mm256_setzero_si256())
        }
        Levels::Bytes(q) if !NIBBLES => {
            let wq = _mm256_loadu_si256(q.as_ptr().add(b * ACT_BLOCK).cast());
            (_mm256_sign_epi8(wq, wq), wq)
        }
        _ => unreachable!("the tile's layout is the matrix's"),
    }
}

/// A weight row's levels, and its scales and offsets: f16 ones are converted by F16C as the
/// products read them.
#[derive(Clone, Copy)]
struct RowView<'a> {
    levels: Levels<'a>,
    group: usize,
    scale: Scales<'a>,
    offset: Option<Scales<'a>>,
}

impl<'a> RowView<'a> {
    #[inline]
    fn of(w: &IntRows<'a>, r: usize) -> Self {
        let (levels, scale, offset) = w.row_parts(r);
        Self { levels, group: w.group, scale, offset }
    }
}

/// The tile's offsets terms (`offsets_dot`: each row's offsets times each token's group sums)
/// added to its accumulators' lanes, 8 groups a step, each row's 8 offsets loaded (and
/// converted from f16) once for all the tile's tokens; the groups after the last whole 8 in one
/// more step over the row's last 8 groups, with the lanes already added masked off. A row of
/// under 8 groups gets its terms as scalars, returned per row and token (0 otherwise); the
/// lanes' sum plus that scalar is the offsets term. (A scalar loop of dependent additions here
/// cost as much as the products of a 576-weight row, and converting the offsets again for each
/// token a sixth of a batched decode step.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_offsets<const R: usize, const T: usize>(
    rows: &[RowView<'_>; R],
    acts: &[ActRow<'_>; TOKENS],
    acc: &mut [[__m256; T]; R],
) -> [[f32; T]; R] {
    let mut scalars = [[0f32; T]; R];
    for (row, (acc, scalars)) in rows.iter().zip(acc.iter_mut().zip(&mut scalars)) {
        let Some(offset) = row.offset else { continue };
        let sums: [&[f32]; T] = std::array::from_fn(|j| acts[j].group_sums(row.group));
        let groups = offset.len().min(sums[0].len());
        if groups < 8 {
            for (scalar, sums) in scalars.iter_mut().zip(sums) {
                *scalar = (0..groups).map(|g| offset.get(g) * sums[g]).sum();
            }
            continue;
        }
        let body = groups / 8 * 8;
        let mut g = 0;
        while g < body {
            let o = eight_scales(offset, g);
            for (acc, sums) in acc.iter_mut().zip(sums) {
                *acc = _mm256_fmadd_ps(o, _mm256_loadu_ps(sums.as_ptr().add(g)), *acc);
            }
            g += 8;
        }
        if body < groups {
            let last = groups - 8;
            // Lane k is group last + k: added above where last + k < body.
            let added = _mm256_set1_epi32((body - last) as i32 - 1);
            let fresh = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), added));
            let o = _mm256_and_ps(eight_scales(offset, last), fresh);
            for (acc, sums) in acc.iter_mut().zip(sums) {
                *acc = _mm256_fmadd_ps(o, _mm256_loadu_ps(sums.as_ptr().add(last)), *acc);
            }
        }
    }
    scalars
}

/// Value i of `s` in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn broadcast(s: Scales<'_>, i: usize) -> __m256 {
    match s {
        Scales::F32(v) => _mm256_set1_ps(*v.get_unchecked(i)),
        Scales::F16(h) => _mm256_cvtph_ps(_mm_set1_epi16(*h.get_unchecked(i) as i16)),
        Scales::Factored { .. } => _mm256_set1_ps(s.get(i)),
    }
}

/// Block b's weight scales in the 8 lanes of its pair sums: one scale, or (groups of 16)
/// lanes 0-3 for the first 16 weights and 4-7 for the second.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weight_scales(row: &RowView<'_>, b: usize) -> __m256 {
    if row.group == ACT_BLOCK {
        broadcast(row.scale, b)
    } else {
        _mm256_set_m128(_mm256_castps256_ps128(broadcast(row.scale, 2 * b + 1)), _mm256_castps256_ps128(broadcast(row.scale, 2 * b)))
    }
}
