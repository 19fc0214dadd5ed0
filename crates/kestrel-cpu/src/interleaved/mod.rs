//! Weight rows interleaved in groups of 8 for the products that sum 8 rows at once: 4-bit levels
//! (`nibbles`), and byte and 6-bit ones (`bytes`). What the layouts share: where a row's scales
//! and offsets lie, and the products' shape checks and choice of code (the SIMD tiles are
//! `arch::x86::interleaved` and `arch::x86::interleaved_bytes`).

pub(crate) mod bytes;
pub(crate) mod nibbles;
#[cfg(test)]
mod tests;

use crate::activations::QuantizedRows;
#[cfg(target_arch = "x86_64")]
use crate::arch::x86::{self, tiles::FactoredRows};
use crate::ACT_BLOCK;

/// Rows a group interleaves: one per lane of an AVX2 vector of i32 or f32.
pub(crate) const GROUP_ROWS: usize = 8;

/// Where the scale (or offset) of row `r`'s block `b` lies in the interleaved scales.
#[inline]
pub(crate) fn value_index(r: usize, b: usize, blocks: usize) -> usize {
    (r / GROUP_ROWS * blocks + b) * GROUP_ROWS + r % GROUP_ROWS
}

/// `rows` rows of one value per block (`blocks` a row), interleaved; `back` undoes it.
pub(crate) fn interleave_values<T: Copy + Default>(values: &[T], rows: usize, blocks: usize, back: bool) -> Vec<T> {
    let mut out = vec![T::default(); values.len()];
    for r in 0..rows {
        for b in 0..blocks {
            let (plain, woven) = (r * blocks + b, value_index(r, b, blocks));
            if back {
                out[plain] = values[woven];
            } else {
                out[woven] = values[plain];
            }
        }
    }
    out
}

/// Whether this machine runs the interleaved products with SIMD (else a matrix keeps its rows
/// one after another, for the row-by-row kernels).
pub(crate) fn has_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::has_avx2();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Consecutive whole groups of interleaved rows in one of the layouts (`nibbles::GroupRows`,
/// `bytes::ByteGroupRows`): what `products` needs of each.
pub(crate) trait WovenRows: Copy {
    /// The products' name in a shape panic.
    const PRODUCTS: &'static str;

    fn cols(&self) -> usize;

    fn rows(&self) -> usize;

    /// Whether the levels, scales and offsets are those of `rows` whole rows (which the SIMD
    /// code's unchecked loads rely on).
    fn holds(&self, rows: usize) -> bool;

    /// The products one weight at a time: the reference the SIMD code is tested against.
    fn products_portable(self, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize);

    /// The products of the AVX2 tiles that read whole scales and offsets of any storage.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present, and `self`, `x` and `out` have the shapes `products`
    /// checks.
    #[cfg(target_arch = "x86_64")]
    unsafe fn products_avx2(self, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize);

    /// The rows with their factored scales and offsets, where a K-quant's products with `x`
    /// take the factored tiles that sum a super-block in i32 (None: another case).
    #[cfg(target_arch = "x86_64")]
    fn factored(&self, x: &QuantizedRows) -> Option<FactoredRows<'_, Self>>;

    /// The products of the factored tiles, with AVX512-VNNI's `dpbusd` where `vnni`.
    ///
    /// # Safety
    /// As `products_avx2`'s, `w` is `factored`'s, and AVX512-VNNI (`x86::has_avx512_vnni`) is
    /// present where `vnni`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn factored_products(w: FactoredRows<'_, Self>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize, vnni: bool);
}

/// `out[r·n + t] = Σ_e w_r[e]·x_t[e]` for the rows of `w` and the `n` rows of `x` (as
/// `dot::int_products`).
pub(crate) fn products<W: WovenRows>(w: W, x: &QuantizedRows, out: &mut [f32]) {
    let (rows, n) = (w.rows(), x.rows(w.cols()));
    assert!(
        w.cols().is_multiple_of(ACT_BLOCK)
            && rows.is_multiple_of(GROUP_ROWS)
            && w.holds(rows)
            && out.len() == rows * n
            && x.d.len() * ACT_BLOCK == x.q.len(),
        "{}: shapes differ",
        W::PRODUCTS
    );
    #[cfg(target_arch = "x86_64")]
    if has_simd() {
        // SAFETY: AVX2, FMA and F16C are present (and AVX512-VNNI where the factored tiles take
        // it); the shapes were checked above, and every load reads within the group's levels and
        // scales and a token's activation row.
        unsafe {
            match w.factored(x) {
                Some(factored) => W::factored_products(factored, x, out, rows, n, x86::has_avx512_vnni()),
                None => w.products_avx2(x, out, rows, n),
            }
        }
        return;
    }
    w.products_portable(x, out, rows, n);
}
